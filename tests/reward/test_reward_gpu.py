"""The CUDA and Triton side of the reward environment (run on the H200; skipped without a GPU).

One nvcc build (tests/reward/candidates/cuda/ext_prelude.py) serves all CUDA candidates.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, evaluate_many

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

CANDS = Path(__file__).parent / "candidates"
PRELUDE = (CANDS / "cuda" / "ext_prelude.py").read_text()
CHAIN = (CANDS / "tasks" / "chain_gpu.py").read_text()
LINEAR = (CANDS / "tasks" / "matmul_bias_gpu.py").read_text()


def cuda_candidate(name: str) -> str:
    if name.startswith("triton_"):
        return (CANDS / "cuda" / f"{name}.py").read_text()
    return PRELUDE + "\n" + (CANDS / "cuda" / f"{name}.py").read_text()


CASES = {
    # name: (task, expected reason prefix, allowed rewards)
    "fast": (CHAIN, "ok", {2, 3}),
    "triton_fast": (CHAIN, "ok", {2, 3}),
    "wrong": (CHAIN, "incorrect", {-1}),
    "triton_wrong": (CHAIN, "incorrect", {-1}),
    "side_stream": (CHAIN, "side_stream", {-1}),
    "functional": (CHAIN, "forbidden_op:F.relu", {-1}),
    "not_launched": (CHAIN, "kernel_not_launched", {-1}),
    "slow_linear": (LINEAR, "ok", {1}),
    "cublas": (LINEAR, "forbidden_op:aten.addmm", {-1}),
}


@pytest.fixture(scope="module")
def gpu_results(tmp_path_factory):
    # The defaults (static pre-check on, isolation on): what training uses.
    cfg = RewardConfig(device="cuda", cache_dir=str(tmp_path_factory.mktemp("gpu_reward_cache")))
    names = list(CASES)
    results = evaluate_many([(CASES[n][0], cuda_candidate(n)) for n in names], cfg)
    for n, r in zip(names, results):
        print(f"{n:14s} {r.reward:3d} {r.reason:30s} {r.times}")
    return dict(zip(names, results))


@pytest.mark.parametrize("name", list(CASES))
def test_gpu_candidate(gpu_results, name):
    _, reason, rewards = CASES[name]
    r = gpu_results[name]
    assert r.reason.startswith(reason), r.log[-4000:]
    assert r.reward in rewards, (r.times, r.log[-2000:])


def test_gpu_baselines_measured(gpu_results):
    t = gpu_results["fast"].times
    assert t["eager_ms"] > 0 and t["compile_ms"] is not None and t["candidate_ms"] < 0.95 * t["eager_ms"]
