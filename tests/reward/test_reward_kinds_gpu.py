"""The reward on bf16 and backward tasks with CUDA candidates (run on the H200; skipped without a GPU).

One nvcc build (tests/reward/candidates/kinds/cuda_prelude.py) serves every candidate; the
candidates are the CPU test's (tests/reward/candidates/kinds/), on the GPU tasks below. Defaults
(static pre-check on, isolation on), as in training.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, evaluate_many

pytestmark = [pytest.mark.gpu, pytest.mark.slow]

KINDS = Path(__file__).parent / "candidates" / "kinds"
PRELUDE = (KINDS / "cuda_prelude.py").read_text()
AUTOGRAD = (KINDS / "autograd.py").read_text()
BF16 = (KINDS / "chain_bf16.py").read_text().replace("batch_size = 64\ndim = 4096", "batch_size = 1024\ndim = 65536")
BACKWARD = (KINDS / "scale_relu_backward.py").read_text().replace("batch_size = 64\ndim = 1024", "batch_size = 4096\ndim = 4096")
FORWARD = BACKWARD.replace('task_pass = "backward"\n', "")


def candidate(name: str) -> str:
    body = (KINDS / f"{name}.py").read_text()
    return PRELUDE + "\n" + (AUTOGRAD + "\n" if "ScaleRelu" in body else "") + body


CASES = {  # (task, candidate): (reason prefix, allowed rewards)
    ("bf16", "bf16_fast"): ("ok", {2, 3}),  # one pass over bf16 memory against eager's six
    ("bf16", "bf16_upcast"): ("fp32_upcast", {-1}),
    ("backward", "backward_fast"): ("ok", {1, 2, 3}),
    ("backward", "backward_wrong_grad"): ("incorrect", {-1}),
    ("backward", "backward_torch_autograd"): ("forbidden_op:aten.", {-1}),
    ("backward", "backward_no_grad"): ("missing_gradient", {-1}),
    ("forward", "backward_torch_autograd"): ("ok", {1, 2, 3}),  # control: the forward task alone
}
TASKS = {"bf16": BF16, "backward": BACKWARD, "forward": FORWARD}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    cfg = RewardConfig(device="cuda", cache_dir=str(tmp_path_factory.mktemp("gpu_kinds_cache")))
    keys = list(CASES)
    out = evaluate_many([(TASKS[t], candidate(c)) for t, c in keys], cfg)
    control = evaluate_many([(BF16, candidate("bf16_upcast"))],
                            RewardConfig(device="cuda", cache_dir=cfg.cache_dir, disabled_guards=["upcast"]))[0]
    for k, r in zip(keys, out):
        print(f"{'/'.join(k):34s} {r.reward:3d} {r.reason:30s} {r.times}")
    print(f"{'control: bf16/bf16_upcast, no guard':34s} {control.reward:3d} {control.reason:30s} {control.times}")
    if os.environ.get("OPSYNTH_KINDS_GPU_JSON"):  # the H200 run's record (benchmarks/h200_kinds.sh)
        rows = [{"task": t, "candidate": c, "reward": r.reward, "reason": r.reason, "times": r.times,
                 "expected_reason": CASES[(t, c)][0], "expected_rewards": sorted(CASES[(t, c)][1])}
                for (t, c), r in zip(keys, out)]
        rows.append({"task": "bf16", "candidate": "bf16_upcast (guard off: control)", "reward": control.reward,
                     "reason": control.reason, "times": control.times})
        Path(os.environ["OPSYNTH_KINDS_GPU_JSON"]).write_text(json.dumps(rows, indent=1, default=str))
    return {**dict(zip(keys, out)), "control_upcast": control}


@pytest.mark.parametrize("key", list(CASES), ids=["/".join(k) for k in CASES])
def test_gpu_kind_candidate(results, key):
    reason, rewards = CASES[key]
    r = results[key]
    assert r.reason.startswith(reason), r.log[-4000:]
    assert r.reward in rewards, (r.times, r.log[-2000:])


def test_the_upcast_attack_works_without_its_guard(results):
    r = results["control_upcast"]
    assert r.correct and r.reward >= 1, r.log[-3000:]


def test_backward_baselines_time_forward_and_backward(results):
    t = results[("backward", "backward_fast")].times
    fwd = results[("forward", "backward_torch_autograd")].times
    assert t["eager_ms"] > fwd["eager_ms"]  # the same Model: forward plus gradients costs more than forward
    # torch.compile is timed only once a candidate clearly beats eager (it decides nothing before),
    # so a backward candidate slower than eager has the cache's figure or none
    assert t["compile_ms"] is not None or t["eager_ratio"] > 0.95
