"""README, GPUs: `cluster=local_cuda` starts one Dask worker per visible GPU, each advertising a
`GPU` resource and pinning its own device, and `verify=cuda` measures every row on the GPU inside
Ops-6K's 1 to 100 ms band at full size. Skipped without CUDA (marked `gpu`)."""

from __future__ import annotations

import json

import pytest
from pipeline_cli import generate_cmd, run_env, run_generate

from opsynth.generate import candidate
from opsynth.cluster import ClusterConfig, cluster_workers, start_cluster
from opsynth.shards import read_rows

pytestmark = pytest.mark.gpu


def test_local_cuda_starts_one_pinned_gpu_worker_per_device():
    import torch

    n = torch.cuda.device_count()
    handle = start_cluster(ClusterConfig(kind="local_cuda", threads_per_worker=2))
    try:
        workers = cluster_workers(handle.client)
        assert len(workers) == n and handle.gpu_resource and handle.slots == 2 * n
        assert all(w["resources"] == {"GPU": 2} for w in workers.values())
        # the device each worker's verify pool gets, asked from inside a task on that worker
        futures = [handle.client.submit(candidate._worker_gpu, workers=[addr], resources={"GPU": 1}, pure=False)
                   for addr in workers]
        pinned = handle.client.gather(futures)
        assert sorted(pinned) == list(range(n)), pinned
    finally:
        handle.close()


@pytest.mark.slow
def test_generate_on_local_cuda_measures_every_row_on_the_gpu_in_the_gpu_band(tmp_path, kernelbench):
    import torch

    out = tmp_path / "ds"
    cmd = generate_cmd(out, "n_tasks=2", "cluster=local_cuda", "verify=cuda", "verify.compile_backend=eager",
                       "cluster.threads_per_worker=4", "progress=false")
    proc = run_generate(cmd, run_env(kernelbench), timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    rows = read_rows(out)
    assert len(rows) == 2
    names = {torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())}
    assert all(r["device"] in names for r in rows), [r["device"] for r in rows]
    assert all(1.0 <= r["eager_ms"] <= 100.0 for r in rows), [r["eager_ms"] for r in rows]
    report = json.loads((out / "report.json").read_text())
    th = report["run"]["thresholds"]
    assert (th["verify_device"], th["eager_ms_min"], th["eager_ms_max"]) == ("cuda", 1.0, 100.0)
    assert report["run"]["cluster"] == "local_cuda"
