"""One table of the reward environment's reasons, drawn on by the brief and by the feedback turns.

Every reason string the reward room's source can return must be in `opsynth.reward.reasons`
(so a new check cannot ship without the rule the policy is told), every entry must still be
returned somewhere (no stale rules), and every rule must be in the prompt brief.
"""

from __future__ import annotations

import ast
from pathlib import Path

from opsynth.reward import reasons
from opsynth.reward.reasons import REASONS, RULES, lookup
from opsynth.train.feedback import format_feedback
from opsynth.train.prompts import KERNEL_BRIEF

REWARD_ROOM = Path(reasons.__file__).parent
RUNTIME_ROOM = REWARD_ROOM.parent / "runtime"  # its children's verdicts (timeout, crashed, isolation_failed) reach the reward
REASON_CALLS = {"Reject", "rejected", "ChildResult"}  # first argument is a reason
IDENT = set("abcdefghijklmnopqrstuvwxyz0123456789_:")  # reason names: lower case, digits (fp32_upcast), _ and :


def _strings(node) -> set[str]:
    """The reason strings an expression can produce: constants, both arms of `a if c else b`, and
    f-strings up to their first free field (`f"forbidden_op:{name}"` -> `forbidden_op:`)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.IfExp):
        return _strings(node.body) | _strings(node.orelse)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):  # "task_" + res.reason
        return {s + "*" for s in _strings(node.left)}
    if isinstance(node, ast.JoinedStr):
        heads = {""}
        for part in node.values:
            if isinstance(part, ast.Constant):
                heads = {h + part.value for h in heads}
            elif isinstance(part, ast.FormattedValue) and isinstance(part.value, ast.IfExp) and _strings(part.value):
                heads = {h + s for h in heads for s in _strings(part.value)}
            else:
                return {h + "*" for h in heads}
        return heads
    return set()


def reasons_in_source() -> dict[str, str]:
    """reason string -> file:line, for every place the reward room's code names a verdict:
    `Reject(...)`, `EvalResult.rejected(...)`, `ChildResult(...)`, `_Reference(ok, reason, ...)`,
    `{"reason": ...}`, `return reason, detail` tuples, and the bare returns of check functions."""
    found: dict[str, str] = {}
    for path in sorted([*REWARD_ROOM.glob("*.py"), *RUNTIME_ROOM.glob("*.py")]):
        if path.name == "reasons.py" or path == RUNTIME_ROOM / "timing.py":  # timing returns clock names, not verdicts
            continue
        tree = ast.parse(path.read_text())
        for fn in ast.walk(tree):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
                continue
            checker = isinstance(fn, ast.FunctionDef) and ("check" in fn.name or fn.name == "changed")
            for n in ast.walk(fn):
                cands: set[str] = set()
                if isinstance(n, ast.Call):
                    name = n.func.attr if isinstance(n.func, ast.Attribute) else getattr(n.func, "id", "")
                    if name in REASON_CALLS and n.args:
                        cands = _strings(n.args[0])
                    elif name == "_Reference" and len(n.args) > 1:
                        cands = _strings(n.args[1])
                elif isinstance(n, ast.Dict):
                    for k, v in zip(n.keys, n.values):
                        if isinstance(k, ast.Constant) and k.value == "reason":
                            cands |= _strings(v)
                elif isinstance(n, ast.Return) and n.value is not None:
                    if isinstance(n.value, ast.Tuple) and n.value.elts:
                        cands = _strings(n.value.elts[0])
                    elif checker:
                        cands = _strings(n.value)
                for c in cands:  # a name with no literal head (f"{path}.gate") names no reason
                    if c.rstrip("*") and set(c.rstrip("*")) <= IDENT:
                        found.setdefault(c, f"{path.name}:{n.lineno}")
    return found


def _covered(s: str) -> bool:
    if s.endswith("*"):  # a prefix: "forbidden_op:" + name, "task_" + reason
        s = s[:-1]
        return s in REASONS or (s.endswith(":") and s[:-1] in REASONS)
    return lookup(s)[1] is not None


def test_every_reason_in_the_reward_source_is_in_the_table():
    found = reasons_in_source()
    # The collector itself must see the environment's verdicts, or this test would pass on nothing.
    for known in ("ok", "no_code", "build_error", "incorrect", "side_stream", "input_mutated", "uninitialized_output",
                  "timeout", "output_cached", "shape_hardcoded", "forbidden_op:*", "task_*", "timer_patched:*"):
        assert known in found, (known, sorted(found))
    assert len(found) >= 30, sorted(found)
    missing = {s: where for s, where in found.items() if not _covered(s)}
    assert not missing, f"reasons returned by the reward room but missing from opsynth/reward/reasons.py: {missing}"


def test_every_table_entry_is_still_returned_somewhere():
    found = {s.rstrip("*") for s in reasons_in_source()}
    stale = [name for name in REASONS if name not in found and name.rstrip(":") not in found]
    assert not stale, f"entries no code returns any more: {stale}"


def test_every_rule_is_told_in_the_brief_and_every_reason_names_one():
    for key, text in RULES.items():
        assert text in KERNEL_BRIEF, key
    for name, entry in REASONS.items():
        assert entry.kind in reasons.KINDS, name
        assert entry.rule is None or entry.rule in RULES, name
        assert (entry.rule is None) == (entry.kind == "environment"), name
    used = {e.rule for e in REASONS.values()}
    assert set(RULES) <= used, set(RULES) - used


def test_lookup_resolves_details_and_prefixes():
    assert lookup("forbidden_op:aten.relu")[0::2] == ("forbidden_op:", "aten.relu")
    assert lookup("timer_patched:time.perf_counter")[0] == "timer_patched"
    assert lookup("task_timeout")[0::2] == ("task_", "timeout")
    assert lookup("task_error")[0] == "task_error"
    assert lookup("no_such_reason")[1] is None


def test_feedback_quotes_the_rule_of_every_rejecting_reason():
    from opsynth.reward.eval_types import EvalResult

    for name, entry in REASONS.items():
        if entry.rule is None or entry.kind == "ok":
            continue
        reason = name + "x" if name.endswith(":") else name
        text = format_feedback(EvalResult.rejected(reason, "detail"))
        assert RULES[entry.rule] in text, name
        assert reason in text and entry.what in text, name


def test_the_tasks_failures_and_the_programs_verdicts_cannot_collide():
    """The evaluate command tells "the task does not run" (exit 2) from a verdict on the program
    (reward -1) by the table's kind; the names keep the two apart too: every environment reason is
    task_*, and no verdict on a program is, so a prefix test can never take one for the other."""
    for name, entry in REASONS.items():
        assert (entry.kind == "environment") == name.startswith("task_"), name
    assert lookup("fallback")[1].kind == "anti_hacking"
    # Names written by older runs (metrics, JSON) still resolve, to the same entries as the new ones.
    assert lookup("reference_fallback")[0] == "fallback"
    assert lookup("reference_timeout")[0::2] == ("task_", "timeout")
    assert lookup("reference_task_error")[0] == "task_error"
