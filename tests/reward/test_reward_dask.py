"""evaluate_many through a Dask LocalCluster (two worker processes) gives the in-process rewards."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.cluster import cluster_workers
from opsynth.reward import RewardConfig, evaluate_many

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

CANDS = Path(__file__).parent / "candidates"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
CHAIN = (CANDS / "tasks" / "chain.py").read_text()
LINEAR = (CANDS / "tasks" / "matmul_bias.py").read_text()


def _cand(name: str) -> str:
    return PRELUDE + "\n" + (CANDS / "cpu" / f"{name}.py").read_text()


PAIRS = [(CHAIN, "fast"), (LINEAR, "slow_linear"), (CHAIN, "wrong"), (CHAIN, "functional")]


def test_cluster_rewards_equal_in_process(tmp_path):
    from distributed import Client, LocalCluster

    cfg = RewardConfig(device="cpu", cache_dir=str(tmp_path / "cache"), compile_baseline=False, static_check=False,
                       warmup=5, repeats=21, cpu_threads=1)
    pairs = [(task, _cand(name)) for task, name in PAIRS]
    local = evaluate_many(pairs, cfg)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, Client(cluster) as client:
        seen = []
        remote = evaluate_many(pairs, cfg, client=client, on_result=lambda i, r: seen.append(i))
        workers = len(cluster_workers(client))
    assert workers == 2
    assert sorted(seen) == list(range(len(pairs)))
    got = [(r.reward, r.reason.split(":")[0]) for r in remote]
    want = [(r.reward, r.reason.split(":")[0]) for r in local]
    assert got == want, (got, want)
    assert want[1] == (1, "ok") and want[2] == (-1, "incorrect") and want[3][0] == -1 and want[0][0] >= 1
