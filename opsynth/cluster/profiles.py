"""Dask clusters for the generate pipeline, one kind per `conf/cluster/*.yaml`.

local       a `distributed.LocalCluster` on this machine (CPU verification when there is no GPU)
local_cuda  one worker process per visible GPU, each advertising a `GPU` resource, so candidate
            verification lands on a GPU worker and each worker pins its own device
slurm       `dask_jobqueue.SLURMCluster`, `jobs` jobs of one Dask worker each (`gpu: true`: one GPU per
            job, the worker advertising the `GPU` resource as on local_cuda); the lifecycle (checked
            submission, start deadline, SIGTERM, job logs) is in opsynth/cluster/slurm.py
scheduler   an existing cluster at `address`
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from typing import Any, Callable

from opsynth.cluster.slurm import ClusterError, ClusterLost  # noqa: F401  (re-exported: what a run may raise)
from opsynth.cluster.workers import cluster_workers

KINDS = ("local", "local_cuda", "slurm", "scheduler")


@dataclass
class ClusterConfig:
    kind: str = "local"
    n_workers: int = 0  # local: worker processes (0: one); local_cuda: ignored (one per GPU)
    threads_per_worker: int = 0  # candidates in flight per worker (0: CPU cores per worker; 8 per GPU)
    memory_limit: str = "auto"
    address: str | None = None  # scheduler: tcp://host:8786
    jobs: int = 1  # slurm: number of jobs, one Dask worker each
    gpu: bool = False  # slurm: each job holds one GPU and its worker advertises the GPU resource
    start_timeout_s: float = 300.0  # slurm: stop (exit 2) when no worker has joined by then
    slurm: dict = field(default_factory=dict)  # passed to dask_jobqueue.SLURMCluster
    dashboard: bool = False

    def validate(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"cluster.kind must be one of {KINDS}, got {self.kind!r}")
        if self.kind == "scheduler" and not self.address:
            raise ValueError("cluster=scheduler needs cluster.address=tcp://host:port of a running Dask scheduler")
        if self.n_workers < 0 or self.threads_per_worker < 0:
            raise ValueError("cluster.n_workers and cluster.threads_per_worker must be >= 0")
        if self.kind == "slurm":
            from opsynth.cluster.slurm import check_settings

            if self.jobs < 1:
                raise ValueError(f"cluster.jobs must be >= 1, got {self.jobs}")
            if not self.start_timeout_s > 0:
                raise ValueError(f"cluster.start_timeout_s must be > 0, got {self.start_timeout_s}")
            check_settings(self.slurm)
            if self.gpu and int(self.slurm.get("processes") or 1) != 1:
                raise ValueError("cluster.gpu=true runs one worker per job (one GPU): "
                                 "cluster.slurm.processes must be 1")


def visible_gpus() -> int:
    try:
        import torch

        return torch.cuda.device_count()
    except Exception:
        return 0


@dataclass
class ClusterHandle:
    client: Any
    cluster: Any  # None for an external scheduler
    kind: str
    slots: int  # candidates the cluster can work on at once
    gpu_resource: bool
    cleanup: Callable[[], None] | None = None  # after the cluster closed (slurm: cancel leftovers, restore SIGTERM)

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            try:
                if self.cluster is not None:
                    self.cluster.close()
            finally:
                if self.cleanup is not None:
                    self.cleanup()


def start_cluster(cfg: ClusterConfig, run_dir: str | os.PathLike | None = None) -> ClusterHandle:
    """Start (or connect to) the cluster; the caller closes it. `run_dir` (the run's output folder)
    holds Slurm's job scripts and logs unless cluster.slurm.log_directory says otherwise. A cluster
    that cannot start raises ClusterError (one line naming the setting)."""
    import dask
    from distributed import Client, LocalCluster

    cfg.validate()
    # A candidate that kills its worker is retried once elsewhere; the second death is final
    # (the pipeline records it as rejected, reason "killed_worker").
    dask.config.set({"distributed.scheduler.allowed-failures": 1,
                     "distributed.worker.daemon": False})
    dash = ":0" if cfg.dashboard else None
    # Without a dashboard the scheduler still serves HTTP (health, metrics), on 8787 unless told:
    # any free port, so a second run (or an open dashboard) brings no "Port 8787 is already in use".
    quiet_http = None if cfg.dashboard else {"dashboard_address": ":0"}
    cores = os.cpu_count() or 1
    if cfg.kind == "local":
        n = cfg.n_workers or 1
        threads = cfg.threads_per_worker or max(1, cores // n)
        cluster = LocalCluster(n_workers=n, threads_per_worker=threads, processes=True,
                               memory_limit=cfg.memory_limit, dashboard_address=dash,
                               silence_logs=logging.ERROR, scheduler_kwargs=quiet_http)
        return ClusterHandle(Client(cluster), cluster, cfg.kind, n * threads, False)
    if cfg.kind == "local_cuda":
        gpus = visible_gpus()
        if gpus == 0:
            raise RuntimeError("cluster=local_cuda but no CUDA GPU is visible; use cluster=local for CPU")
        threads = cfg.threads_per_worker or 8
        cluster = LocalCluster(n_workers=gpus, threads_per_worker=threads, processes=True,
                               memory_limit=cfg.memory_limit, dashboard_address=dash,
                               resources={"GPU": threads}, silence_logs=logging.ERROR, scheduler_kwargs=quiet_http)
        return ClusterHandle(Client(cluster), cluster, cfg.kind, gpus * threads, True)
    if cfg.kind == "slurm":
        from opsynth.cluster.slurm import start_slurm

        client, cluster, slots, cleanup = start_slurm(cfg, run_dir)
        return ClusterHandle(client, cluster, cfg.kind, slots, cfg.gpu, cleanup)
    client = Client(cfg.address)
    workers = cluster_workers(client)
    slots = sum(w.get("nthreads", 1) for w in workers.values()) or 1
    gpu = any("GPU" in (w.get("resources") or {}) for w in workers.values())
    return ClusterHandle(client, None, cfg.kind, slots, gpu)
