"""The reward on tasks of other precisions and passes, CPU backend: a bf16 chain and a backward
task (forward and gradients), with C++ `load_inline` candidates on the CPU tests' shared extension
(tests/reward/candidates/cpu/ext_prelude.py: built once per session, with test_reward_cpu.py's). The static pre-check is off: the runtime
guards decide. Each refusal comes with its control (the same program with the guard off, or on the
forward task): the attack works without the guard, so the guard is what stops it."""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.reward import RewardConfig, evaluate_many

pytestmark = pytest.mark.timeout(1800)

CANDS = Path(__file__).parent / "candidates"
KINDS = CANDS / "kinds"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()
AUTOGRAD = (KINDS / "autograd.py").read_text()
BF16 = (KINDS / "chain_bf16.py").read_text()
BACKWARD = (KINDS / "scale_relu_backward.py").read_text()
FORWARD = BACKWARD.replace('task_pass = "backward"\n', "")  # the same Model, forward only


def candidate(name: str) -> str:
    body = (KINDS / f"{name}.py").read_text()
    return PRELUDE + "\n" + (AUTOGRAD + "\n" if "ScaleRelu" in body else "") + body


def _cfg(cache, **kw) -> RewardConfig:
    # As tests/reward/test_reward_cpu.py: one thread per child and enough timed calls that the
    # parent's wall-clock check sees at least one unloaded round on a busy 2-core machine.
    base = dict(device="cpu", cache_dir=str(cache), compile_baseline=False, static_check=False, warmup=3, repeats=15,
                cpu_threads=1, prebuild=False, num_trials=3)
    base.update(kw)
    return RewardConfig(**base)


CASES = [  # (task, candidate, disabled guards) -> expected reason prefix, reward at least / exactly
    ("bf16", "bf16_fast", ()),
    ("bf16", "bf16_upcast", ()),
    ("bf16", "bf16_f32_output", ()),
    ("backward", "backward_fast", ()),
    ("backward", "backward_wrong_grad", ()),
    ("backward", "backward_torch_autograd", ()),
    ("backward", "backward_no_grad", ()),
    ("forward", "backward_torch_autograd", ()),  # control: on the forward task its forward is fine
]
TASKS = {"bf16": BF16, "backward": BACKWARD, "forward": FORWARD}


@pytest.fixture(scope="module")
def results(reward_cache):
    cache = reward_cache
    pairs = [(TASKS[t], candidate(c)) for t, c, _ in CASES]
    out = dict(zip([(t, c) for t, c, _ in CASES], evaluate_many(pairs, _cfg(cache))))
    # The upcast guard's control: the same program with the guard off is scored as correct.
    out["control_upcast"] = evaluate_many([(BF16, candidate("bf16_upcast"))], _cfg(cache, disabled_guards=["upcast"]))[0]
    return out


def _show(r) -> str:
    return f"{r.reason}: {r.details.get('detail', '')[:600]} {r.log[-1500:]}"


def test_a_correct_bf16_kernel_scores_at_least_1(results):
    r = results[("bf16", "bf16_fast")]
    assert r.correct and r.reward >= 1, _show(r)


def test_a_float32_computation_cast_back_to_bf16_is_fp32_upcast(results):
    r = results[("bf16", "bf16_upcast")]
    assert r.reason == "fp32_upcast" and r.reward == -1, _show(r)
    assert "aten._to_copy widened a bfloat16 tensor" in r.log
    control = results["control_upcast"]
    assert control.correct and control.reward >= 1, _show(control)  # the attack works without the guard


def test_a_float32_output_for_a_bf16_task_is_fp32_upcast(results):
    r = results[("bf16", "bf16_f32_output")]
    assert r.reason == "fp32_upcast" and r.reward == -1, _show(r)


def test_a_correct_backward_kernel_scores_at_least_1(results):
    r = results[("backward", "backward_fast")]
    assert r.correct and r.reward >= 1, _show(r)


def test_a_wrong_gradient_scores_minus_1(results):
    r = results[("backward", "backward_wrong_grad")]
    assert r.reason == "incorrect" and r.reward == -1, _show(r)
    assert "output 2" in r.details.get("detail", "")  # the weight's gradient, after the output and x's


def test_a_backward_by_autograd_over_torch_ops_is_a_forbidden_op(results):
    r = results[("backward", "backward_torch_autograd")]
    assert r.reason.startswith("forbidden_op:aten.") and r.reward == -1, _show(r)
    control = results[("forward", "backward_torch_autograd")]  # the same program, forward task only
    assert control.correct and control.reward >= 1, _show(control)


def test_an_output_without_gradient_is_missing_gradient(results):
    r = results[("backward", "backward_no_grad")]
    assert r.reason == "missing_gradient" and r.reward == -1, _show(r)
