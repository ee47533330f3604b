"""The Slurm profiles and settings, without a Slurm: what the shipped profiles list, which settings
are refused before anything is submitted, how Slurm's messages map to the setting to change, and
that the sampler's scale is decided by the worker's device rather than the launching machine's."""

from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from pipeline_cli import REPO

from opsynth.generate import candidate, driver
from opsynth.generate import config as generate_settings
from opsynth.generate.config import CPU_SCALE, generate_config
from opsynth.cluster.slurm import _lifetime_args, explain, walltime_seconds

EDITED = {"queue", "account", "cores", "memory", "walltime", "log_directory", "job_extra_directives"}


def _compose(*overrides: str):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return generate_config(compose(config_name="generate", overrides=list(overrides)))


def test_both_profiles_list_the_settings_a_user_edits():
    cpu, gpu = _compose("cluster=slurm").cluster, _compose("cluster=slurm_gpu").cluster
    local_cuda = _compose("cluster=local_cuda").cluster
    for c in (cpu, gpu):
        assert c.kind == "slurm" and EDITED <= set(c.slurm) and c.jobs >= 1 and c.start_timeout_s > 0
        c.validate()
    assert not cpu.gpu and not any("gres" in d or "gpu" in d for d in cpu.slurm["job_extra_directives"])
    assert cpu.slurm["queue"] is None  # the cluster's default partition: accepted anywhere
    assert gpu.gpu and gpu.slurm["job_extra_directives"] == ["--gres=gpu:1"] and gpu.slurm["processes"] == 1
    assert gpu.slurm["cores"] == local_cuda.threads_per_worker  # candidates in flight per GPU, as on local_cuda


@pytest.mark.parametrize("override,says", [
    ("++cluster.slurm.partition=gpu", "the partition is `queue`"),
    ("++cluster.slurm.cpus=4", "unknown cluster.slurm setting"),
    ("cluster.slurm.cores=0", "cluster.slurm.cores must be an integer >= 1"),
    ("cluster.jobs=0", "cluster.jobs must be >= 1"),
    ("cluster.start_timeout_s=0", "cluster.start_timeout_s must be > 0"),
])
def test_a_bad_slurm_setting_is_refused_before_submitting(override, says):
    cfg = _compose("cluster=slurm", override)
    with pytest.raises(ValueError) as e:
        cfg.validate()
    assert says in str(e.value)


def test_a_gpu_job_runs_one_worker():
    with pytest.raises(ValueError, match="processes must be 1"):
        _compose("cluster=slurm_gpu", "cluster.slurm.processes=2").validate()


@pytest.mark.parametrize("message,setting", [
    ("invalid partition specified: gpu", "cluster.slurm.queue"),
    ("Invalid generic resource (gres) specification", "cluster.slurm.job_extra_directives"),
    ("Memory specification can not be satisfied", "cluster.slurm.memory"),
    ("Requested node configuration is not available", "cluster.slurm.cores"),
    ("Invalid account or account/partition combination specified", "cluster.slurm.account"),
    ("Requested time limit is invalid (missing or exceeds some limit)", "cluster.slurm.walltime"),
])
def test_slurm_errors_name_the_setting_to_change(message, setting):
    line = explain(message)
    assert line.startswith(message) and setting in line and "\n" not in line


@pytest.mark.parametrize("walltime,seconds", [
    ("30", 1800), ("30:15", 1815), ("01:00:00", 3600), ("2-00", 172800), ("1-02:03", 93780),
    ("1-00:00:30", 86430), ("bogus", None), (None, None),
])
def test_walltime_formats(walltime, seconds):
    assert walltime_seconds(walltime) == seconds


def test_workers_retire_before_the_walltime_unless_told_otherwise():
    assert _lifetime_args("01:00:00", []) == ["--lifetime", "3240s", "--lifetime-stagger", "120s"]
    assert _lifetime_args("00:10:00", []) == []  # too short to leave a margin
    assert _lifetime_args("01:00:00", ["--lifetime", "50m"]) == []


def test_sampler_scale_null_is_decided_by_the_workers_device(monkeypatch):
    from opsynth.verify import pool

    plain = generate_settings.plain(_compose("verify=auto").sampler)
    assert plain["scale"] is None
    monkeypatch.setattr(pool, "detect_device", lambda requested: "cpu")
    assert candidate._worker_sampler_config(plain, "auto").scale == CPU_SCALE
    monkeypatch.setattr(pool, "detect_device", lambda requested: "cuda")
    assert candidate._worker_sampler_config(plain, "auto").scale == 1.0
    assert candidate._worker_sampler_config({**plain, "scale": 0.5}, "auto").scale == 0.5


def test_the_launching_machine_does_not_decide_the_scale(monkeypatch, tmp_path):
    """A GPU on the driver (or none, on a login node) must not fix the sizes: the candidates reach
    the workers with scale=null and the worker decides."""
    import torch
    from distributed import Client, LocalCluster

    from opsynth.cluster import ClusterHandle

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    seen = tmp_path / "scales.txt"

    def process(index, seed, sampler_cfg, verify_cfg, dedup_cfg, kb_check=True, committed=None, prepare_processes=None, claims=None):
        seen.write_text(repr(sampler_cfg["scale"]))
        return {"index": index, "seed": seed, "accepted": False, "reason": "too_fast", "row": None,
                "signature": None, "evidence": None}

    def start_cluster(cfg, run_dir=None):
        cluster = LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=None)
        return ClusterHandle(Client(cluster), cluster, "local", 1, False)

    monkeypatch.setattr(driver, "process_candidate", process)
    monkeypatch.setattr(driver, "start_cluster", start_cluster)
    cfg = _compose("verify=auto", f"output_dir={tmp_path / 'ds'}", "n_tasks=1", "max_candidates=1",
                   "kb_check=false", "progress=false", "write_card=false")
    driver.run(cfg)
    assert seen.read_text() == "None"


def test_a_run_left_without_workers_stops_with_the_supervisors_line(monkeypatch):
    """Mid-run, when every worker has gone and none comes back within start_timeout_s, the main
    thread (blocked waiting for results) gets ClusterLost instead of waiting forever."""
    import threading
    import time

    from opsynth.cluster import slurm

    class Cluster:
        scaled = 0

        def scale(self, jobs):
            Cluster.scaled += 1

    class Client:
        def nthreads(self):
            return {}

    monkeypatch.setattr(slurm, "SUPERVISE_EVERY_S", 0.05)
    monkeypatch.setattr(slurm, "queue_states", lambda name: {"41": ("PENDING", "Resources")})
    assert threading.current_thread() is threading.main_thread()
    term = slurm._Termination()
    term.install()
    try:
        sup = slurm.Supervisor(Cluster(), Client(), 2, "opsynth-x", REPO, 0.3, term.fail_main)
        with pytest.raises(slurm.ClusterLost) as e:
            sup.start()
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
        assert "every Dask worker left" in str(e.value) and "job 41 PENDING (Resources)" in str(e.value)
        assert Cluster.scaled >= 2  # it kept asking for the jobs meanwhile
    finally:
        term.restore()
