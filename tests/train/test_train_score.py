"""Scoring and the reward function's bookkeeping: rates, speedups, histogram, order, no-code.

The unit tests feed known verdicts through `KernelReward` and `summarize` (the arithmetic a user
reads in the table); the slow test scores a folder of real candidate files with the reward
environment.
"""

from __future__ import annotations

import math
import os
from types import SimpleNamespace

import pytest

from opsynth.train.score import EvalRecord, format_table, record_from_result, summarize
from opsynth.train.reward_fn import KernelReward


def _verdict(reward, cand_ms=None, eager_ms=4.0, compile_ms=2.0):
    return SimpleNamespace(reward=reward, correct=reward > 0, reason="ok" if reward > 0 else "incorrect: max abs 3",
                           times={"candidate_ms": cand_ms, "eager_ms": eager_ms, "compile_ms": compile_ms})


def test_summary_rates_geomeans_and_histogram():
    recs = [record_from_result(_verdict(3, 1.0)), record_from_result(_verdict(2, 2.0)),
            record_from_result(_verdict(1, 8.0)), record_from_result(_verdict(-1))]
    s = summarize(recs)
    assert s["pass_rate"] == 0.75 and s["faster_than_eager_rate"] == 0.5 and s["faster_than_compile_rate"] == 0.25
    assert s["reward_mean"] == pytest.approx(1.25)
    assert s["geomean_speedup_eager"] == pytest.approx((4.0 * 2.0 * 0.5) ** (1 / 3))
    assert s["geomean_speedup_compile"] == pytest.approx((2.0 * 1.0 * 0.25) ** (1 / 3))
    assert s["reward_histogram"] == {"-1": 1, "1": 1, "2": 1, "3": 1}
    assert s["failure_reasons"] == {"incorrect": 1}
    table = format_table(s)
    assert "faster than torch.compile" in table and "0.250" in table


def test_reward_fn_keeps_order_skips_codeless_completions_and_logs_exact_rates(tmp_path):
    seen = []

    def fake_many(pairs, cfg):
        seen.extend(pairs)
        return [_verdict(3, 1.0) if "fast" in c else _verdict(-1) for _, c in pairs]

    fn = KernelReward(evaluate_many_fn=fake_many, log_path=str(tmp_path / "evals.jsonl"))
    completions = [
        "```python\nclass ModelNew: pass  # fast\n```",
        "I cannot do that.",
        [{"role": "assistant", "content": "```python\nclass ModelNew: pass  # wrong\n```"}],
    ]
    metrics: dict[str, list[float]] = {}
    rewards = fn(prompts=["p"] * 3, completions=completions, task_code=["T1", "T2", "T3"], task_id=["a", "b", "c"],
                 log_metric=lambda k, v: metrics.setdefault(k, []).append(v))
    assert rewards == [3.0, -1.0, -1.0]
    assert [t for t, _ in seen] == ["T1", "T3"]  # the code-less completion never reached the environment
    assert all(c.endswith("\n") and "```" not in c for _, c in seen)
    assert fn.history[1].reason == "no_code"
    mean = {k: sum(v) / len(v) for k, v in metrics.items()}
    assert mean["kernel/pass_rate"] == pytest.approx(1 / 3) and mean["kernel/reward_frac_-1"] == pytest.approx(2 / 3)
    assert math.exp(mean["kernel/log_speedup_compile"]) == pytest.approx(2.0)
    assert len((tmp_path / "evals.jsonl").read_text().splitlines()) == 3


def test_reward_env_crash_is_a_named_minus_one():
    def boom(pairs, cfg):
        raise RuntimeError("sandbox down")

    (rec,) = KernelReward(evaluate_many_fn=boom).evaluate_batch(["T"], ["```python\nclass ModelNew: pass\n```"])
    assert rec.reward == -1 and rec.reason.startswith("reward_env_error")


@pytest.mark.slow
def test_evaluate_mode_score_scores_a_folder_of_candidate_files(tmp_path):
    from opsynth.train.data import load_rows
    from bandit import candidates, task_source, write_task_shards
    from pipelines.evaluate import run

    shards = write_task_shards(str(tmp_path / "shards"), task_source(), n=3)
    cand = candidates("cpu")
    rows = load_rows(shards)
    cands = tmp_path / "cands"
    cands.mkdir()
    (cands / f"{rows[0]['task_id']}.py").write_text(cand["A"])
    (cands / f"{rows[1]['task_id']}.txt").write_text(f"Here it is:\n```python\n{cand['C']}```\n")
    # rows[2] has no candidate file at all.

    s = run({"mode": "score", "shards": shards, "split": "all", "candidates": str(cands),
             "out": str(tmp_path / "out"), "reward": {"device": "cpu"}})
    assert s["n"] == 3
    assert s["reward_histogram"]["-1"] == 2 and s["pass_rate"] == pytest.approx(1 / 3)
    # The correct candidate was timed against eager (whether it wins by 5 % on a loaded 2-core
    # machine is noise; the rate is consistent with its speedup either way).
    assert s["geomean_speedup_eager"] > 0
    # Faster than eager is decided on the ratio's interval: a reward of 2 needs the point speedup past
    # 1/0.95; one near the threshold may stay 1 (its interval across 0.95).
    assert s["faster_than_eager_rate"] in (0, pytest.approx(1 / 3))
    if s["faster_than_eager_rate"]:
        assert s["geomean_speedup_eager"] > 1 / 0.95
    assert s["failure_reasons"].get("missing_candidate") == 1
    assert (tmp_path / "out" / "score.json").exists()


def test_identical_completions_share_one_evaluation():
    calls = []

    def fake_many(pairs, cfg):
        calls.append(list(pairs))
        return [_verdict(2, 3.0) for _ in pairs]

    fence = "```python\nclass ModelNew: pass\n```"
    recs = KernelReward(evaluate_many_fn=fake_many).evaluate_batch(["T", "T", "U"], [fence, fence, fence],
                                                                 ["t1", "t2", "u"])
    assert len(calls) == 1 and len(calls[0]) == 2  # (T, code) once, (U, code) once
    assert [r.task_id for r in recs] == ["t1", "t2", "u"] and all(r.reward == 2 for r in recs)


def test_each_rank_evaluates_on_its_own_gpu(monkeypatch):
    seen = []
    fn = KernelReward(evaluate_many_fn=lambda pairs, cfg: seen.append(os.environ.get("CUDA_VISIBLE_DEVICES"))
                      or [_verdict(1, 4.0) for _ in pairs])
    fence = ["```python\nclass ModelNew: pass\n```"]
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    fn.evaluate_batch(["T"], fence)
    assert seen == ["6"] and os.environ["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    fn.evaluate_batch(["U"], fence)
    assert seen[-1] == "2" and "CUDA_VISIBLE_DEVICES" not in os.environ


# ---- scoring as the README documents it, through the command lines --------------------------------

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OFFLINE = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}


def _cli(*args, timeout=600):
    import subprocess
    import sys

    return subprocess.run([sys.executable, *args], cwd=REPO, env={**os.environ, **OFFLINE}, capture_output=True,
                          text=True, timeout=timeout)


def _one_line_error(p, *needles):
    assert p.returncode == 2, (p.returncode, p.stdout[-1000:], p.stderr[-2000:])
    assert "Traceback" not in p.stdout + p.stderr
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), p.stderr[-2000:]
    for n in needles:
        assert n in lines[0], lines[0]


@pytest.fixture(scope="module")
def eight_tasks(tmp_path_factory):
    """A folder of 8 tasks none of whose hashes falls in the held-out 10 % (the issue's folder)."""
    from bandit import task_source, write_task_shards
    from opsynth.train.data import heldout_fraction_of

    shards = write_task_shards(str(tmp_path_factory.mktemp("eight") / "shards"), task_source(), n=8)
    assert min(heldout_fraction_of(f"bandit_{i}") for i in range(8)) > 0.1  # the case the split must handle
    return shards


def test_score_command_on_a_small_folder_says_why_heldout_is_empty_and_scores_all(eight_tasks, tmp_path):
    """No traceback: the split is a hash of task_id (a held-out task never leaks into training), so
    8 tasks at heldout_fraction=0.1 may hold none out; the line says so and what to do, and the
    other splits score as documented."""
    (tmp_path / "none").mkdir()  # no candidate files: every task scores -1 without an evaluation
    base = ["-m", "pipelines.score", "--shards", eight_tasks, "--candidates", str(tmp_path / "none")]
    _one_line_error(_cli(*base, "--split", "heldout"), "none of its 8 tasks falls in the held-out 10%",
                    "split all", "larger heldout_fraction")
    p = _cli(*base, "--split", "all")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "on all (8 tasks)" in p.stdout and "missing_candidate 8" in p.stdout, p.stdout
    p = _cli(*base, "--split", "heldout", "--heldout-fraction", "0.5")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "on heldout (" in p.stdout, p.stdout


def test_the_old_score_command_names_the_new_one(tmp_path):
    _one_line_error(_cli("-m", "opsynth.train.score", "--shards", str(tmp_path)), "python -m pipelines.score")


def test_score_command_mistakes_are_one_line(tmp_path):
    _one_line_error(_cli("-m", "pipelines.score", "--shards", str(tmp_path / "nope"), "--candidates", str(tmp_path)),
                    "nope")


@pytest.fixture(scope="module")
def smoke_checkpoint(tmp_path_factory, eight_tasks):
    """A policy folder as training leaves one (`final/`): the smoke policy, saved with its tokenizer."""
    from opsynth.train.data import load_rows
    from opsynth.train.policy import smoke_policy
    from opsynth.train.prompts import KERNEL_BRIEF

    folder = str(tmp_path_factory.mktemp("policy") / "final")
    smoke_policy([KERNEL_BRIEF] + [r["code"] for r in load_rows(eight_tasks)], folder)
    return folder


@pytest.mark.slow
def test_evaluate_mode_score_takes_a_policy(eight_tasks, smoke_checkpoint, tmp_path):
    """`pipelines.evaluate mode=score ... policy=PATH`, as the README writes it (`policy` is also the
    train command's config group, which Hydra would take it for)."""
    import json

    p = _cli("-m", "pipelines.evaluate", "mode=score", f"shards={eight_tasks}", f"policy={smoke_checkpoint}",
             "split=all", "limit=2", "turns=1", "max_new_tokens=8", "reward.device=cpu",
             f"hydra.run.dir={tmp_path / 'hydra'}")
    assert p.returncode == 0, p.stderr[-3000:]
    summary = json.loads(p.stdout.strip().splitlines()[-1])
    assert summary["n"] == 2 and summary["split"] == "all" and summary["scored"].startswith("policy ")
    # the long form is the same setting
    p = _cli("-m", "pipelines.evaluate", "mode=score", f"score.shards={eight_tasks}", f"score.policy={tmp_path / 'x'}",
             f"hydra.run.dir={tmp_path / 'hydra2'}")
    _one_line_error(p, f"policy={tmp_path / 'x'}: no such folder")


def test_evaluate_mode_score_mistakes_are_one_line(eight_tasks, tmp_path):
    _one_line_error(_cli("-m", "pipelines.evaluate", "mode=score", f"shards={eight_tasks}",
                         f"policy={tmp_path / 'nope'}", f"hydra.run.dir={tmp_path / 'h'}"), "policy=", "no such folder")
    _one_line_error(_cli("-m", "pipelines.evaluate", "mode=score", f"shards={eight_tasks}",
                         f"hydra.run.dir={tmp_path / 'h2'}"), "exactly one of policy")
