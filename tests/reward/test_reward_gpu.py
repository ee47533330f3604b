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
    if name == "launch_fail_swallowed":  # the same extension, and the candidate clears the error itself
        return cuda_candidate("launch_fail").replace("SWALLOW = False", "SWALLOW = True")
    if name == "baseline_hog_honest":  # the same forward without the thread
        return cuda_candidate("baseline_hog").replace("HOG = True", "HOG = False")
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
    for name in ("fast", "triton_fast", "slow_linear"):  # honest: the device read idle before every baseline block
        assert gpu_results[name].times["baseline_disturbed_blocks"] == 0, gpu_results[name].times


# ---- the 2026 classes on the GPU (issue 23): with the defaults and with the static pre-check off -----

HACKS = {
    "fast": ("ok", {2, 3}),  # the correct candidate beside them
    "graph_replay": ("output_cached", {-1}),  # a CUDA graph over a private input copy, replayed stale
    "l2_persist": ("persisting_cache", {-1}),  # persisting-L2 set-aside and an access-policy window
    "launch_fail": ("launch_failed", {-1}),  # a persistent output buffer, then a launch that fails unchecked
    "launch_fail_swallowed": ("stale_output", {-1}),  # ... and the error cleared: the poisoned buffer comes back
    "event_patch": ("timer_patched", {-1}),  # py::exec from a static initialiser swaps Event.elapsed_time's code
    "precompute": ("harness_patched", {-1}),  # a gc callback (from C++) runs the slow kernel between inputs and clock
}

CONTROLS = [  # (guards off, candidate, reason prefix, rewards): each attack succeeds without its guard
    (("fresh_inputs",), "graph_replay", "ok", {2, 3}),
    (("l2_reset",), "l2_persist", "ok", {2, 3}),
    (("poison_outputs",), "launch_fail_swallowed", "incorrect_under_timing", {-1}),  # the fingerprints still see it
    (("poison_outputs", "fresh_inputs"), "launch_fail_swallowed", "ok", {2, 3}),
    (("harness_snapshot", "wall_clock"), "event_patch", "below_physical_floor", {-1}),  # claims 1 us: the floor, measured twice
    (("harness_snapshot", "physical_floor", "wall_clock"), "event_patch", "ok", {2, 3}),
    (("harness_snapshot",), "precompute", "implausible_timing", {-1}),  # the parent's clock before the call alone
    (("harness_snapshot", "wall_clock"), "precompute", "ok", {2, 3}),  # the attack pays: a slow kernel scores as a copy
]


def _report(label, names, results):
    import json
    import os

    for n, r in zip(names, results):
        print(f"{label:28s} {n:22s} {r.reward:3d} {r.reason:24s} cand {r.times.get('candidate_ms')} floor {r.times.get('floor_ms')} "
              f"wall {r.times.get('measure_wall_s')} sets {r.details.get('timed_input_sets')}")
    path = os.environ.get("OPSYNTH_GPU_HACKS_REPORT")  # e.g. benchmarks/results/reward_hacks_gpu.json
    if path:
        rows = json.loads(open(path).read()) if os.path.exists(path) else []
        rows += [{"run": label, "candidate": n, "reward": r.reward, "reason": r.reason, "times": r.times,
                  "timed_input_sets": r.details.get("timed_input_sets"), "timed_outputs_checked": r.details.get("timed_outputs_checked")}
                 for n, r in zip(names, results)]
        with open(path, "w") as f:
            json.dump(rows, f, indent=1, default=str)


@pytest.fixture(scope="module", params=[True, False], ids=["defaults", "static_check_off"])
def hack_results(request, tmp_path_factory):
    cfg = RewardConfig(device="cuda", cache_dir=str(tmp_path_factory.mktemp("gpu_hacks_cache")), static_check=request.param)
    names = list(HACKS)
    results = evaluate_many([(CHAIN, cuda_candidate(n)) for n in names], cfg)
    _report("static_check=" + str(request.param), names, results)
    return dict(zip(names, results))


@pytest.mark.parametrize("name", list(HACKS))
def test_gpu_hack(hack_results, name):
    reason, rewards = HACKS[name]
    r = hack_results[name]
    assert r.reason.startswith(reason), (r.reason, r.details.get("detail"), r.log[-4000:])
    assert r.reward in rewards, (r.times, r.log[-2000:])


def test_gpu_timed_calls_are_fresh_and_checked(hack_results):
    r = hack_results["fast"]
    # 40 rounds at least (more where the decision's interval needs them), each on its own inputs, each checked
    assert r.details["timed_input_sets"] == r.details["timed_outputs_checked"] >= 40, r.details
    assert 0 < r.times["floor_ms"] < r.times["candidate_ms"], r.times


@pytest.fixture(scope="module")
def gpu_control_results(tmp_path_factory):
    """Each control evaluated when its test first asks (a fresh server per configuration, about 30 s
    each), so `-k precompute` runs only that attack's controls."""
    cache = str(tmp_path_factory.mktemp("gpu_controls_cache"))
    out = {}

    def result(off, name):
        if (off, name) not in out:
            cfg = RewardConfig(device="cuda", cache_dir=cache, static_check=False, disabled_guards=list(off))
            [out[(off, name)]] = evaluate_many([(CHAIN, cuda_candidate(name))], cfg)
            _report("without " + "+".join(off), [name], [out[(off, name)]])
        return out[(off, name)]

    return result


@pytest.mark.parametrize("off,name,reason,rewards", CONTROLS, ids=[f"{n}-without-{'+'.join(o)}" for o, n, _, _ in CONTROLS])
def test_gpu_control(gpu_control_results, off, name, reason, rewards):
    r = gpu_control_results(off, name)
    assert r.reason.startswith(reason), (r.reason, r.details.get("detail"), r.log[-4000:])
    assert r.reward in rewards, (r.times, r.log[-2000:])


# ---- the quiet device: a baseline timed beside a stopped candidate's queued kernel ------------------
# baseline_hog's forward is honest and slow (about 1.3x eager, reward 1 as its twin baseline_hog_honest);
# its native thread queues a kernel that lives while the candidate is stopped for a baseline block. With
# the baseline child's wait for an idle device off (the control) the baseline reads slow and the candidate
# scores above its twin; with it on, the block is never timed as quiet and a speed-up is not counted.
QUIET_CASES = [((), "baseline_hog_honest"), ((), "baseline_hog"), (("quiet_device",), "baseline_hog")]


@pytest.fixture(scope="module")
def quiet_results(tmp_path_factory):
    cache = str(tmp_path_factory.mktemp("gpu_quiet_cache"))
    out = {}
    for off in ((), ("quiet_device",)):
        names = [n for o, n in QUIET_CASES if o == off]
        cfg = RewardConfig(device="cuda", cache_dir=cache, static_check=False, disabled_guards=list(off))
        results = evaluate_many([(CHAIN, cuda_candidate(n)) for n in names], cfg)
        _report("without " + ("+".join(off) or "nothing"), names, results)
        for n, r in zip(names, results):
            print(n, off, r.reward, r.reason, {k: v for k, v in r.times.items() if "baseline" in k or k.endswith("ratio")})
            out[(off, n)] = r
    return out


def test_a_stopped_candidates_queued_kernel_does_not_slow_its_baseline(quiet_results):
    """What must hold on any GPU: the honest twin's blocks read quiet and keep its reward, and the
    attack's baseline does not read slow with the guard on. The control (guard off) is printed, not
    asserted: on the H200 (2026-12-04b) the attack did not pay without the guard either (eager
    0.855 ms beside it, 0.893 ms for the twin). There another context's kernels time-slice the device
    (the probe's host reading 2.43 ms beside a 10 ms kernel, 0.075 ms idle) but do not stretch an
    event-timed kernel (0.94x idle; `benchmarks/quiet_probe.py`), and baselines are timed with
    events. The CPU test with fake servers shows the attack paying when the guard is off
    (`test_baselines_timed_on_a_busy_device_cannot_show_a_speed_up`)."""
    honest = quiet_results[((), "baseline_hog_honest")]
    hog = quiet_results[((), "baseline_hog")]
    control = quiet_results[(("quiet_device",), "baseline_hog")]
    assert honest.reason == "ok" and honest.reward == 1 and honest.times["baseline_disturbed_blocks"] == 0, honest.times
    print(f"control (quiet_device off): reward {control.reward} {control.reason}, eager {control.times.get('eager_ms')} ms "
          f"against the twin's {honest.times['eager_ms']} ms")
    # the guard: no speed-up counted, and the baseline timed beside the attack reads as the twin's did
    assert hog.reason == "ok" and hog.reward <= honest.reward, (hog.times, hog.details.get("decision"))
    assert hog.times["eager_ms"] < 1.2 * honest.times["eager_ms"], (hog.times, honest.times)


def test_kernels_built_with_the_front_ends_side_by_side_are_right(tmp_path):
    """reward.parallel_nvcc (opsynth.reward.nvcc_parallel): kernels built that way are judged as when
    nvcc builds them (the fused kernel correct and fast, a wrong one wrong, a slow one slow), a
    KernelBench-layout candidate (its own .cu, torch headers in it, an anonymous-namespace-free
    kernel beside its torch::Tensor wrapper) too."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    from cli_eval_kb import CANDIDATE as KB

    cfg = RewardConfig(device="cuda", cache_dir=str(tmp_path / "cache"), parallel_nvcc=True)
    names = ["fast", "wrong", "slow_linear"]
    results = evaluate_many([(CASES[n][0], cuda_candidate(n)) for n in names] + [(CHAIN, KB.replace("BLOCK", "256"))], cfg)
    for n, r in zip(names, results):
        _, reason, rewards = CASES[n]
        assert r.reason.startswith(reason) and r.reward in rewards, (n, r.reason, r.log[-3000:])
    kb = results[-1]
    assert kb.reason == "ok" and kb.reward >= 2, (kb.reason, kb.log[-3000:])
