"""The worker pool end to end on CPU: one hand-written faulty task per failure mode, each rejected
with its reason in the same batch as good tasks, which are still accepted, with the pool alive
afterwards; calibration of a too-fast task into the band; and one task through inductor."""

from __future__ import annotations

import pytest

from opsynth.verify import VerifyConfig, WorkerPool
from opsynth.verify.calibrate import read_batch_size

HEADER = "import torch\nimport torch.nn as nn\n\n"


def task(forward: str, init: str = "", sizes: str = "batch_size = 32\nfeatures = 512\n",
         inputs: str = "[torch.randn(batch_size, features)]", init_inputs: str = "[features]",
         imports: str = "") -> str:
    body = init or "        self.lin = nn.Linear(features, features)\n"
    return (
        HEADER + imports + "\nclass Model(nn.Module):\n"
        "    def __init__(self, features):\n        super().__init__()\n" + body + "\n"
        "    def forward(self, x):\n" + forward + "\n\n" + sizes + "\n\n"
        "def get_inputs():\n    return " + inputs + "\n\n\n"
        "def get_init_inputs():\n    return " + init_inputs + "\n"
    )


GOOD = task("        return torch.relu(self.lin(x))\n")

FAULTY = {
    # name: (source, expected reason)
    "segfault": (task("        ctypes.string_at(0)\n        return x\n", imports="import ctypes\n"), "crashed"),
    "infinite_loop": (task("        while True:\n            pass\n"), "timeout"),
    "huge_allocation": (task("        return x + torch.ones(2**33)[: x.shape[1]]\n"), "oom"),
    "exception": (task("        raise ValueError('task bug')\n"), "eager_error"),
    "sys_exit": (task("        sys.exit(3)\n", imports="import sys\n"), "exit_called"),
    "dropout_training": (task("        return self.drop(self.lin(x))\n",
                              init="        self.lin = nn.Linear(features, features)\n"
                                   "        self.drop = nn.Dropout(0.5)\n"), "nondeterministic"),
    "constant_output": (task("        return torch.zeros_like(self.lin(x))\n"), "constant_output"),
    "nan_output": (task("        return self.lin(x) * float('nan')\n"), "non_finite"),
    "compile_mismatch": (task("        y = self.lin(x)\n"
                              "        if torch.compiler.is_compiling():\n            return y + 1.0\n"
                              "        return y\n"), "compile_mismatch"),
    "input_insensitive": (task("        return self.lin.weight * 2.0 + 0.0 * x.sum()\n"), "input_insensitive"),
    # Model.__init__ makes a Linear that forward never reads (a kernel ignoring it is still correct).
    "unused_state": (task("        return torch.relu(x) * 2.0\n"), "unused_state"),
    # get_inputs() ignores the random generator: the same values under every seed.
    "fixed_inputs": (task("        return torch.relu(self.lin(x))\n",
                          inputs="[torch.linspace(-1, 1, batch_size * features).reshape(batch_size, features)]"),
                     "fixed_inputs"),
    "syntax_error": (GOOD.replace("def forward(self, x):", "def forward(self, x)"), "syntax_error"),
    "missing_get_inputs": (GOOD.replace("def get_inputs", "def get_inputz"), "missing_definitions"),
    # A few microseconds, and no batch_size to scale: cannot be calibrated into the band.
    "too_fast_no_batch": (task("        return x * 2.0 + 1.0\n", init="        pass\n",
                               sizes="rows = 4\nfeatures = 8\n", inputs="[torch.randn(rows, features)]"),
                          "too_fast"),
    # 1.6 GB of activations with a 1 GB cap, and no batch_size to shrink.
    "over_mem_cap": (task("        return x.unsqueeze(0).expand(100000, -1, -1).contiguous().sum(0)\n",
                          init="        pass\n", sizes="rows = 4\nfeatures = 1024\n",
                          inputs="[torch.randn(rows, features)]"), "mem_cap"),
}

# Floods stdout and stderr on every call; the protocol lives on other fds, so it is still accepted.
FLOOD = task("        print('x' * 200000)\n        os.write(2, b'y' * 200000)\n        return torch.relu(self.lin(x))\n",
             imports="import os\n")

# Far below the CPU band at batch_size 1, linear in batch_size: calibration must scale it up.
TOO_FAST_SCALABLE = task("        return torch.tanh(x * 1.5 + 0.5) * x\n", init="        pass\n",
                         sizes="batch_size = 1\nfeatures = 1024\n")

# Two workers; aot_eager compiles in about a second (inductor has its own test below); small
# memory limits so the huge allocation and the memory cap trigger quickly; a low calibration target.
CFG = VerifyConfig(
    device="cpu", n_workers=2, timeout_s=15.0, compile_backend="aot_eager", cpu_mem_cap_gb=1.0,
    cpu_mem_limit_gb=3.0, warmup=2, repeats=10, timing_budget_ms=200.0,
    cpu_min_ms=0.3, target_median_ms=1.0, target_p90_ms=2.0, preload_compiler=False,
    calibrate=True,  # hand-written sources have no op graph to size them by: rescale from timings
)


@pytest.fixture(scope="module")
def pool():
    with WorkerPool(CFG) as p:
        yield p


def test_each_failure_mode_is_rejected_with_its_reason_and_good_tasks_survive(pool):
    names = list(FAULTY)
    batch = [GOOD] + [FAULTY[n][0] for n in names] + [FLOOD, GOOD]
    results = pool.verify_many(batch)
    got = {n: r.reason for n, r in zip(names, results[1:-2])}
    want = {n: FAULTY[n][1] for n in names}
    assert got == want, {n: results[1 + i].evidence.get("message") for i, n in enumerate(names)}
    for r in (results[0], results[-2], results[-1]):
        assert r.accepted, (r.reason, r.evidence)
        assert CFG.cpu_min_ms <= r.eager_ms <= CFG.cpu_max_ms
        assert r.compile_ms is not None and r.compile_ms > 0
        assert r.device == "cpu" and r.torch_version
    assert all(not r.accepted for r in results[1:-2])
    # Evidence names what happened.
    by_name = dict(zip(names, results[1:-2]))
    assert by_name["segfault"].evidence["signal"] == "SIGSEGV"
    assert "first_attempt" in by_name["segfault"].evidence  # retried once on a fresh worker
    assert "task bug" in by_name["exception"].evidence["message"]
    assert by_name["dropout_training"].evidence["max_abs_diff"] > 0
    assert by_name["compile_mismatch"].evidence["max_abs_diff"] == pytest.approx(1.0, abs=1e-4)
    assert by_name["over_mem_cap"].peak_mem_mb > 1024
    # Past the checks, a band rejection names the forward (the generate committer decides semantic duplicates
    # before the band's verdict); a task that failed its checks has no forward to name.
    assert by_name["too_fast_no_batch"].signature and by_name["too_fast_no_batch"].calls == ["mul", "add"]
    assert by_name["nan_output"].signature is None
    # The pool is whole again and still verifies.
    assert pool.alive() == CFG.n_workers
    assert pool.restarts >= 4  # segfault twice, timeout, sys.exit
    again = pool.verify(GOOD)
    assert again.accepted, again.evidence
    assert again.to_dict()["reason"] == "accepted"


def test_too_fast_task_is_calibrated_into_the_band(pool):
    r = pool.verify(TOO_FAST_SCALABLE)
    assert r.accepted, (r.reason, r.evidence)
    assert r.calib_steps >= 1
    first = r.evidence["history"][0]
    assert first["batch_size"] == 1 and first["eager_ms"] < CFG.cpu_min_ms
    assert read_batch_size(r.source) > 1
    assert CFG.cpu_min_ms <= r.eager_ms <= CFG.cpu_max_ms
    # Same task, same target: the calibration is reproducible up to timing noise.
    assert r.evidence["target_ms"] == pool.verify(TOO_FAST_SCALABLE).evidence["target_ms"]


def test_stage_seconds_account_for_the_verification(pool):
    """Where a calibrated task's time went: every stage measured, none negative, together no more
    than the wall time, and the device sections inside it."""
    import time

    t0 = time.time()
    r = pool.verify(TOO_FAST_SCALABLE)
    t1 = time.time()
    s = r.stage_s
    assert r.accepted and r.calib_steps >= 1
    assert all(v >= 0 for v in s.values()), s
    assert s["calibration"] > 0 and s["eager_checks"] > 0 and s["compile"] > 0 and s["timing"] > 0, s
    assert sum(s.values()) == pytest.approx(r.elapsed_s, abs=0.05)
    assert s["pipes"] > 0 and s["worker_gaps"] > 0, s  # the real worker reports handle_s, the parent round trips
    assert r.gpu_sections and all(t0 <= a <= b <= t1 for a, b in r.gpu_sections)
    rej = pool.verify(FAULTY["nan_output"][0])
    assert rej.reason == "non_finite" and rej.stage_s["eager_checks"] > 0 and rej.stage_s["compile"] == 0


@pytest.mark.slow
def test_inductor_backend_accepts_a_good_task_and_rejects_a_mismatch():
    cfg = VerifyConfig(device="cpu", n_workers=1, timeout_s=300.0, compile_backend="inductor",
                       warmup=2, repeats=10)
    with WorkerPool(cfg) as p:
        good, bad = p.verify_many([GOOD, FAULTY["compile_mismatch"][0]])
    assert good.accepted, (good.reason, good.evidence)
    assert good.evidence["compile_backend"] == "inductor"
    assert good.compile_ms > 0
    assert bad.reason == "compile_mismatch"


@pytest.mark.gpu
def test_cuda_device_side_assert_is_recycled():
    bad = task("        return x[torch.tensor([10**9], device=x.device)]\n")
    cfg = VerifyConfig(device="cuda", n_workers=1, compile_backend="aot_eager")
    with WorkerPool(cfg) as p:
        r_bad, r_good = p.verify_many([bad, GOOD])
        assert r_bad.reason == "cuda_error", r_bad.evidence
        assert r_good.accepted, r_good.evidence
        assert p.alive() == 1


# BatchNorm in train mode normalises by the batch's statistics, in eval mode by its running ones.
BATCHNORM = task("        return torch.relu(self.bn(self.lin(x)))\n",
                 init="        self.lin = nn.Linear(features, features)\n        self.bn = nn.BatchNorm1d(features)\n")
# GOOD respelled: F.relu for torch.relu, another size: the same call graph.
RESPELLED = task("        y = self.lin(x)\n        return F.relu(y)\n", sizes="batch_size = 16\nfeatures = 256\n",
                 imports="import torch.nn.functional as F\n")


def test_the_mode_and_call_graph_come_back_with_an_accepted_task(pool):
    good, bn, respelled = pool.verify_many([GOOD, BATCHNORM, RESPELLED])
    for r in (good, bn, respelled):
        assert r.accepted, (r.reason, r.evidence)
    assert good.mode == "eval" and bn.mode == "train"  # outputs differ between modes: train, as constructed
    assert good.calls == ["linear", "relu"] and "batch_norm" in bn.calls
    assert respelled.signature == good.signature != bn.signature


def test_go_timing_is_asked_once_with_the_checks_facts_and_no_stops_the_task_untimed(pool):
    """Issue 29 (generate): the caller is asked from inside the eager request, once the checks passed
    and before anything is timed (the device held alone), with the forward's facts; no ends it as
    `timing_skipped` with those facts and nothing timed, yes times it as before. A calibrated task
    is asked once, not at each of its timings; a callback that raises counts as yes."""
    asked: list[dict] = []

    def no(facts):
        asked.append(facts)
        return False

    stopped = pool.verify(GOOD, go_timing=no)
    assert (stopped.accepted, stopped.reason) == (False, "timing_skipped"), stopped.evidence
    assert stopped.timed == [] and stopped.eager_ms is None and stopped.compiles == 0
    assert stopped.evidence["stage"] == "timing" and stopped.stage_s["timing"] == 0
    assert len(asked) == 1 and asked[0]["calls"] == ["linear", "relu"] and asked[0]["mode"] == "eval"
    assert stopped.signature == asked[0]["signature"] and stopped.calls == asked[0]["calls"]

    asked.clear()
    calibrated = pool.verify(TOO_FAST_SCALABLE, go_timing=lambda f: asked.append(f) or True)
    assert calibrated.accepted and calibrated.calib_steps >= 1, calibrated.evidence
    assert len(asked) == 1 and len(calibrated.timed) >= 2  # timed at each batch size, asked before the first

    def broken(facts):
        raise ConnectionError("the caller is gone")

    timed = pool.verify(GOOD, go_timing=broken)
    assert timed.accepted and timed.timed, (timed.reason, timed.evidence)
    assert pool.alive() == CFG.n_workers  # the protocol stayed in step: the workers serve the next task
    assert pool.verify(GOOD).accepted
