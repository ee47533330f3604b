"""Fast checks of the reward environment's pieces: extraction, static pre-check, comparison, rule."""

from __future__ import annotations

from pathlib import Path

import json

import pytest
import torch

from opsynth.reward import RewardConfig, extract_candidate
from opsynth.reward.candidate import resolve_candidate
from opsynth.reward.compare import judge_outputs
from opsynth.reward.eval_types import reward_from_times
from opsynth.reward.static_check import static_check
from opsynth.render.task_file import with_second_shape

CANDS = Path(__file__).parent / "candidates"
PRELUDE = (CANDS / "cpu" / "ext_prelude.py").read_text()


def cpu_candidate(name: str) -> str:
    return PRELUDE + "\n" + (CANDS / "cpu" / f"{name}.py").read_text()


# ---- extraction --------------------------------------------------------------------------------------

def test_extract_takes_last_block_defining_model_new():
    completion = (
        "First a sketch:\n```python\nprint('draft')\n```\nThen the answer:\n"
        "```python\nclass ModelNew:\n    pass\n```\nand some prose with ```inline``` ticks."
    )
    assert extract_candidate(completion) == "class ModelNew:\n    pass\n"


def test_extract_handles_truncated_fence_and_no_code():
    assert extract_candidate("```python\nclass ModelNew(nn.Module):\n    def f(self):") .startswith("class ModelNew")
    assert extract_candidate("I cannot do that.") is None
    assert extract_candidate("") is None
    assert extract_candidate("```cpp\nint main(){}\n```") is None


def test_resolve_workspace(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "add.cu").write_text("// kernel")
    (tmp_path / "kernels" / "add_binding.cpp").write_text("// binding")
    (tmp_path / "model_new.py").write_text("import cuda_extension\nclass ModelNew: pass\n")
    spec = resolve_candidate(tmp_path)
    assert spec.origin == "workspace"
    assert set(spec.kernel_files) == {"add.cu", "add_binding.cpp"}
    assert "import cuda_extension" in spec.source


# ---- static pre-check --------------------------------------------------------------------------------

STATIC_EXPECT = {
    "fast": "ok",
    "slow_linear": "ok",
    "wrong": "ok",
    "functional": "forbidden_op:F.relu",
    "torch_compute": "forbidden_op:torch.abs",
    "fallback": "fallback",
    "subclass_model": "uses_model",
    "thread": "side_stream",
    "timer_patch": "timer_patched",
    "sync_patch": "timer_patched",
    "lazy_subclass": "tensor_subclass",
    # Only the dynamic checks can see these:
    "cached": "ok",
    "freed_memory": "ok",
    "inplace": "ok",
    "aten_in_cpp": "ok",
    "low_precision": "ok",
    "hardcoded_shape": "ok",
    "not_launched": "ok",
}


@pytest.mark.parametrize("name,expected", sorted(STATIC_EXPECT.items()))
def test_static_check(name, expected):
    spec = resolve_candidate(cpu_candidate(name))
    assert static_check(spec)[0] == expected


def test_static_check_syntax_and_missing_class():
    assert static_check(resolve_candidate("class ModelNew(:\n"))[0] == "syntax_error"
    assert static_check(resolve_candidate("class ModelNew: pass\nx = (\n"))[0] == "syntax_error"
    spec = resolve_candidate("```python\nclass Other: pass\n```")
    assert static_check(spec)[0] == "no_model_new"


def test_static_check_native_side_work():
    src = PRELUDE.replace("#include <cmath>", "#include <cmath>\n#include <thread>\nstatic void bg(){ std::thread t([]{}); t.detach(); }")
    src += "\n" + (CANDS / "cpu" / "fast.py").read_text()
    assert static_check(resolve_candidate(src))[0] == "side_stream"


# ---- comparison --------------------------------------------------------------------------------------

def _judge(ref_trials, cand_trials, second=None, cand_second=None, reused=None):
    ref = {"trials": ref_trials, "second": second}
    cand = {"trials": cand_trials, "second": cand_second, "trial_reused": reused or []}
    return judge_outputs(ref, cand, RewardConfig())[0]


def test_compare_reasons():
    g = torch.Generator().manual_seed(0)
    refs = [[torch.randn(8, 16, generator=g)] for _ in range(3)]
    assert _judge(refs, [[r[0] + 1e-4] for r in refs]) == "ok"
    assert _judge(refs, [[r[0] + 1.0] for r in refs]) == "incorrect"
    assert _judge(refs, [[r[0] * 1.05] for r in refs]) == "low_precision"
    assert _judge(refs, [[r[0].double()] for r in refs]) == "wrong_dtype"
    assert _judge(refs, [[r[0].t()] for r in refs]) == "wrong_shape"
    assert _judge(refs, [[torch.full_like(r[0], 0.3)] for r in refs]) == "near_constant_output"
    nan = [[r[0].clone().index_fill_(0, torch.tensor([2]), float("nan"))] for r in refs]
    assert _judge(refs, nan) == "uninitialized_output"
    assert _judge(refs, [refs[0], refs[0], refs[0]]) == "output_cached"
    # NaN in a trial whose output tensor is one the harness poisoned after an earlier call: returned unwritten.
    assert _judge(refs, nan, reused=[False, True, True]) == "uninitialized_output"  # trial 0 was a fresh tensor
    assert _judge(refs, [refs[0], nan[1], nan[2]], reused=[False, True, True]) == "stale_output"
    # Second shape wrong while the first is right: shapes were hard-coded.
    assert _judge(refs, refs, second=[torch.ones(3, 16)], cand_second=[torch.ones(4, 16)]) == "shape_hardcoded"


def test_compare_near_zero_outputs_need_more_than_loose_tolerance():
    # Reference values far below atol: any constant passes allclose, so the relative check decides.
    refs = [[torch.randn(64, generator=torch.Generator().manual_seed(k)) * 1e-4] for k in range(2)]
    assert _judge(refs, [[torch.zeros(64) + 1e-7 * k] for k in range(2)]) == "near_constant_output"
    wrong_but_varied = [[torch.randn(64, generator=torch.Generator().manual_seed(k + 9)) * 1e-4] for k in range(2)]
    assert _judge(refs, wrong_but_varied) == "incorrect"
    assert _judge(refs, [[r[0] * 1.001] for r in refs]) == "ok"


# ---- reward rule -------------------------------------------------------------------------------------

def test_reward_rule_is_cuda_agents():
    assert reward_from_times(0.90, 1.0, 1.0) == 3
    assert reward_from_times(0.96, 1.0, 1.0) == 1  # within 5 %: not faster
    assert reward_from_times(0.90, 1.0, 0.5) == 2
    assert reward_from_times(1.5, 1.0, 0.5) == 1
    assert reward_from_times(0.5, 1.0, None) == 2  # no compile baseline: 3 is out of reach


def test_second_shape_rewrites_batch_size_only():
    src = (CANDS / "tasks" / "chain.py").read_text()
    new = with_second_shape(src)
    assert "batch_size = 65" in new and "dim = 8192" in new
    assert with_second_shape("x = 1\n") is None


# ---- settings ----------------------------------------------------------------------------------------

def test_reward_config_rejects_unknown_keys():
    """A typo in conf/evaluate.yaml's reward block (or reward_env in training) must not pass silently."""
    assert RewardConfig.from_dict({"measure_workers": 3}).measure_workers == 3
    with pytest.raises(ValueError, match="unknown reward setting\\(s\\) \\['timeout_s'\\]"):
        RewardConfig.from_dict({"timeout_s": 120})


def test_per_device_defaults_leave_cores_to_the_compilers(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 16)
    cfg = RewardConfig()
    # cuda: a top-level child per candidate (its builds go to the build service), one per core, then
    # up to 12 measuring children (3/4 of the cores); children fork from a warm server, so the second child is cheap
    assert cfg.resolved_prebuild("cuda") and cfg.resolved_build_workers("cuda") == 16 and cfg.resolved_measure_workers("cuda") == 12
    inline = RewardConfig(prebuild=False)
    assert inline.resolved_measure_workers("cuda") == 16
    # cpu: builds first (they would skew timings), half the cores, one measurement at a time
    assert cfg.resolved_prebuild("cpu") and cfg.resolved_build_workers("cpu") == 8 and cfg.resolved_measure_workers("cpu") == 1
    assert cfg.resolved_cpu_threads("cuda") == 2 and cfg.resolved_cpu_threads("cpu") is None
    assert RewardConfig(cpu_threads=4, measure_workers=2).resolved_cpu_threads("cuda") == 4


def test_training_keeps_the_rewards_build_workers_unless_told():
    from opsynth.train.trainer import TrainSettings, reward_env_config

    assert reward_env_config(TrainSettings(shards=".")).build_workers is None
    assert reward_env_config(TrainSettings(shards=".", reward_workers=3)).build_workers == 3
    assert reward_env_config(TrainSettings(shards=".", reward_workers=3, reward_env={"build_workers": 5})).build_workers == 5
    # Without prebuild candidates build inside the measuring children, so those are what reward_workers bounds.
    assert reward_env_config(TrainSettings(shards=".", reward_workers=3, reward_env={"device": "cuda", "prebuild": False})).measure_workers == 3
    assert reward_env_config(TrainSettings(shards=".", reward_workers=3, reward_env={"device": "cpu"})).measure_workers is None


# ---- the reward rule as the defaults apply it ----------------------------------------------------
# Each test below fails when one number or branch of the rule changes (mutation testing found these
# unpinned): the 5 % margin, 2 only for beating eager, the forbidden modules, the sandbox's own
# check, atol = rtol = 1e-2 and five input sets.

def test_faster_means_more_than_five_percent_with_the_default_margin():
    margin = RewardConfig().margin
    assert reward_from_times(0.96, 1.0, 1.0, margin) == 1  # 4 % faster than both: not faster
    assert reward_from_times(0.97, 1.0, 0.5, margin) == 1
    assert reward_from_times(0.94, 1.0, 1.0, margin) == 3  # 6 %: faster than both
    assert reward_from_times(0.94, 1.0, 0.5, margin) == 2


def test_beating_only_torch_compile_is_not_reward_2():
    """2 means faster than eager; a candidate slower than eager but faster than a slow compiled
    baseline (compile can lose to eager on small tasks) is merely correct."""
    assert reward_from_times(0.9, 0.5, 1.0) == 1
    assert reward_from_times(0.9, 0.5, None) == 1
    assert reward_from_times(0.4, 0.5, 1.0) == 3


@pytest.mark.parametrize("line", ["import ctypes", "import ctypes.util", "from ctypes import CDLL",
                                  "import cffi", "import gc", "import inspect", "import importlib",
                                  "import builtins", "import subprocess", "import socket", "import signal",
                                  "import torch._C", "from torch._dynamo import optimize",
                                  "import torch._inductor", "import torch.fx", "from torch.overrides import TorchFunctionMode"])
def test_the_modules_the_brief_forbids_are_refused(line):
    """Every module the brief names (reasons.RULES["forbidden_imports"]) is refused by name; ctypes
    above all, which would let a program call into libc or patch the harness's memory."""
    spec = resolve_candidate(line + "\n" + cpu_candidate("fast"))
    reason = static_check(spec)[0]
    mod = line.split()[1]
    assert reason == f"forbidden_import:{mod}", (line, reason)


def test_fast_candidate_without_forbidden_imports_passes_the_import_check():  # control for the test above
    assert static_check(resolve_candidate(cpu_candidate("fast")))[0] == "ok"


def _enter_in_child(confine_mounts) -> str:
    """`isolation.enter` in a forked child with `_confine_mounts` replaced; what it said."""
    import os
    import tempfile

    from opsynth.runtime import isolation

    scratch = tempfile.mkdtemp(prefix="opsynth_iso_test_")
    guarded = tempfile.mkdtemp(prefix="opsynth_iso_guarded_")
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            if confine_mounts is not None:
                isolation._confine_mounts = confine_mounts
            isolation.enter([scratch], must_not_write=[guarded], private=[])  # guarded stays in view
            msg = "entered"
        except BaseException as e:  # noqa: BLE001
            msg = f"{type(e).__name__}: {e}"
        os.write(w, msg.encode()[:500])
        os._exit(0)
    os.close(w)
    with os.fdopen(r) as f:
        msg = f.read()
    os.waitpid(pid, 0)
    os.rmdir(scratch)
    os.rmdir(guarded)
    return msg


def test_the_sandbox_refuses_to_run_when_a_guarded_folder_is_still_writable():
    """`isolation.enter` checks its own work: when the read-only remount silently did not happen
    (here: replaced by a no-op), it raises instead of running untrusted code."""
    from opsynth.runtime.isolation import probe

    ok, why = probe()
    if not ok:
        pytest.skip(f"namespaces are not available here: {why}")
    assert _enter_in_child(None) == "entered"  # control: the real confinement passes its own check
    said = _enter_in_child(lambda writable, hidden: None)
    assert said.startswith("IsolationError") and "still writable" in said, said


def test_default_tolerance_is_atol_rtol_1e_2():
    """An error of 3e-2 on unit-scale outputs fails at atol = rtol = 1e-2 (it is 'low_precision':
    within 10x); 5e-3 passes."""
    g = torch.Generator().manual_seed(1)
    refs = [[torch.randn(64, 64, generator=g)] for _ in range(2)]
    assert _judge(refs, [[r[0] + 5e-3] for r in refs]) == "ok"
    assert _judge(refs, [[r[0] + 3e-2] for r in refs]) == "low_precision"
    # rtol alone: a 3 % relative error on values far above atol
    big = [[r[0].sign() * (r[0].abs() + 10.0)] for r in refs]
    assert _judge(big, [[r[0] * 1.003] for r in big]) == "ok"
    assert _judge(big, [[r[0] * 1.03] for r in big]) == "low_precision"


def test_each_evaluation_draws_five_fresh_input_sets(monkeypatch, tmp_path):
    """The reference child is asked for num_trials (5) input sets, each from its own fresh seed."""
    import importlib

    from opsynth.runtime import sandbox

    ev = importlib.import_module("opsynth.reward.evaluate")  # the module (the package exports the function)

    jobs = []

    def fake_run_child(module, job, scratch, timeout, cfg, **kw):
        jobs.append(job)
        return sandbox.ChildResult("crashed", {}, "", 0.0)

    monkeypatch.setattr(sandbox, "run_child", fake_run_child)
    task = (CANDS / "tasks" / "chain.py").read_text()
    for _ in range(2):
        ref = ev._prepare_reference(task, RewardConfig(device="cpu", cache_dir=str(tmp_path)), "cpu")
        assert not ref.ok
    seeds = [job["trial_seeds"] for job in jobs]
    assert [len(s) for s in seeds] == [5, 5]
    assert len(set(seeds[0]) | set(seeds[1])) == 10  # fresh every time, none repeated


def test_every_verdict_records_the_settings_it_was_reached_with():
    """The feedback turn quotes these (input sets, tolerance, margin), not fixed numbers."""
    from opsynth.reward.evaluate import evaluate_many

    cfg = RewardConfig(device="cpu", atol=5e-2, rtol=2e-2, num_trials=3, margin=0.9)
    (res,) = evaluate_many([("x = 1\n", "no code here")], cfg)
    assert res.reason == "no_code"
    assert res.details["settings"] == {"num_trials": 3, "atol": 5e-2, "rtol": 2e-2, "margin": 0.9}


# ---- the build cache's key ---------------------------------------------------------------------

def _workspace_request(folder: Path, monkeypatch, extra_header: str = "") -> dict:
    """The build request a workspace candidate's child sends (the runner's own load path, with the
    trusted side replaced by a recorder)."""
    import shutil
    import sys

    import torch.utils.cpp_extension as ce

    from opsynth.reward import candidate_runner, guards

    monkeypatch.setattr(ce, "load", ce.load)  # restored after the test: install() patches both
    monkeypatch.setattr(ce, "load_inline", ce.load_inline)
    ws = folder / "scratch"
    shutil.copytree(CANDS / "cpu_workspace", ws)
    if extra_header:
        (ws / "kernels" / "extra.h").write_text(extra_header)
    monkeypatch.chdir(ws)  # as in the candidate's child: its folder is the working folder
    sent = []

    class Recorder(guards.ExtensionTracker):
        def _build(self, req, is_python_module):
            sent.append(req)
            raise RuntimeError("recorded")

    tracker = Recorder(guards.OpAudit(), None)
    tracker.install()
    path = list(sys.path)
    try:
        with pytest.raises(candidate_runner.Reject):
            candidate_runner._load_candidate({"candidate_path": str(ws / "model_new.py"), "workspace": True}, tracker)
    finally:
        sys.path[:] = path
    (req,) = sent
    return req


def test_a_workspace_candidate_gets_the_same_build_key_from_any_scratch_folder(tmp_path, monkeypatch):
    """Its kernels/ folder is an include path, under a fresh scratch folder on every evaluation: the
    key must follow the files' text, not that path, or the same workspace is rebuilt every run."""
    from opsynth.reward.builds import BuildService

    svc = BuildService(RewardConfig(device="cpu", cache_dir=str(tmp_path / "cache"), ccache="false"), "cpu")
    first = _workspace_request(tmp_path / "a", monkeypatch)
    second = _workspace_request(tmp_path / "b", monkeypatch)
    assert str(tmp_path / "a") not in json.dumps(first) and str(tmp_path / "b") not in json.dumps(second)  # no path travels
    key = lambda req: svc.key(BuildService.normalise(req))  # noqa: E731
    assert key(first) == key(second)
    # control: other text is another key, and so is a header in the include folder (it travels as text)
    changed = dict(second, files={**second["files"], "chain.cpp": second["files"]["chain.cpp"] + "\n// edit\n"})
    assert key(changed) != key(second)
    assert key(_workspace_request(tmp_path / "c", monkeypatch, extra_header="#define X 1\n")) != key(first)


def test_a_pair_carries_its_tasks_mode_and_one_reference_serves_each_code_and_mode():
    """The row's `mode` reaches the reference and candidate jobs; a train-mode task is its own
    reference run and its own baseline-cache entry (an eval-mode task keeps its old key)."""
    from opsynth.reward import baseline_cache
    from opsynth.reward.eval_types import RewardConfig
    from opsynth.reward.evaluate import _task_of, _with_mode

    assert _with_mode(("code", "cand")) == ("code", "cand", "eval")
    assert _with_mode(("code", "cand", "train")) == ("code", "cand", "train")
    assert _task_of(_with_mode(("code", "a", "train"))) != _task_of(_with_mode(("code", "b")))
    with pytest.raises(ValueError, match="task mode must be one of train, eval"):
        _with_mode(("code", "cand", "inference"))
    cfg = RewardConfig(device="cpu")
    eval_key = baseline_cache.cache_key(cfg, "code", "cpu")
    assert baseline_cache.cache_key(cfg, "code", "cpu", "eval") == eval_key
    assert baseline_cache.cache_key(cfg, "code", "cpu", "train") == eval_key + "|mode=train"


def test_the_full_fork_server_imports_every_module_a_measuring_childs_set_up_imports():
    """A measuring child's `_prepare` binds the harness modules before its candidate runs; a module it
    imports there that the fork server has not is imported again in every child (the networkx behind
    opsynth.render and the rest were 1.3-1.5 s of each child's set-up on a loaded H100 host,
    benchmarks/results/issue28_h100/2026-12-08)."""
    import ast
    import importlib
    import importlib.util
    import inspect
    import textwrap

    from opsynth.reward import candidate_runner
    from opsynth.reward.eval_types import RUNNERS

    imported = set()
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(candidate_runner._prepare)))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("opsynth"):
            package = hasattr(importlib.import_module(node.module), "__path__")
            for alias in node.names:  # `from package import module` names the module, `from module import x` the module
                sub = f"{node.module}.{alias.name}"
                imported.add(sub if package and importlib.util.find_spec(sub) is not None else node.module)
    assert "opsynth.render.task_file" in imported and "opsynth.reward.rounds" in imported  # what the scan must see
    assert imported <= set(RUNNERS), sorted(imported - set(RUNNERS))
