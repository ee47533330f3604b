"""The feedback turn: the reward environment's verdict on a program, as the policy reads it.

After each candidate of a multi-turn episode the policy is told what the environment found, in the
words of the environment's own table (`opsynth.reward.reasons`, the table the prompt brief lists):
the trimmed compiler output of a failed build, the traceback of a crash, which output was wrong by
how much on which input set, the anti-hacking rule that fired, or the timings against eager and
torch.compile with the profiler's top kernels. It reads `EvalResult.details` (structured extras:
`kernels`, mismatch numbers) when the environment gives them, and otherwise parses `reason` and `log`.
The numbers it quotes (input sets, tolerance, the 5 % margin) are the settings the verdict was
reached with (`details["settings"]`, which `evaluate_many` records), not the defaults.
"""

from __future__ import annotations

import ast
import dataclasses
import math
import re
from typing import Any

from opsynth.reward.eval_types import SETTINGS_QUOTED, RewardConfig
from opsynth.reward.reasons import RULES, lookup

BUILD_LINES = 25  # compiler error lines kept (each with a line of context)
TEXT_LIMIT = 2000  # characters of compiler output or traceback kept
DETAIL_LIMIT = 400  # characters of a one-line detail kept
TOP_KERNELS = 5
ASK = "Revise the program and answer with the complete file in one fenced ```python block."


def _details(result: Any) -> dict:
    d = getattr(result, "details", None)
    return d if isinstance(d, dict) else {}


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) else None


def _clip(text: str, limit: int) -> str:
    text = text.strip()
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def reason_detail(result: Any) -> str:
    """The one-line detail the environment gave for its verdict (what, where), or ''."""
    d = _details(result).get("detail")
    if isinstance(d, str) and d.strip():
        return _clip(d, DETAIL_LIMIT)
    reason = str(getattr(result, "reason", "") or "")
    log = str(getattr(result, "log", "") or "")
    hits = re.findall(r"\[candidate\] rejected: " + re.escape(reason) + r": (.*)", log)
    if hits:
        return _clip(hits[-1], DETAIL_LIMIT)
    lines = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith("[candidate] copied")]
    return _clip(lines[-1], DETAIL_LIMIT) if lines else ""


def compiler_errors(log: str) -> str:
    """The compiler's error lines (each with the line after it, usually the code and caret), trimmed;
    the log's tail when no line says `error`."""
    lines = log.splitlines()
    keep: list[int] = []
    for i, ln in enumerate(lines):
        low = ln.lower()
        if "error" in low and "error building extension" not in low and not low.startswith("subprocess.calledprocesserror"):
            keep += [i, i + 1]
    picked: list[str] = []
    for i in sorted(set(keep)):
        if i < len(lines) and lines[i].strip() and lines[i] not in picked:
            picked.append(lines[i])
        if len(picked) >= 2 * BUILD_LINES:
            break
    text = "\n".join(picked) if picked else log[-TEXT_LIMIT:]
    return _clip(text, TEXT_LIMIT)


def traceback_tail(log: str) -> str:
    """The end of a Python traceback in the log (the exception and the frames just above it)."""
    lines = [ln for ln in log.splitlines() if ln.strip() and not ln.startswith(("[candidate]", "[sandbox]"))]
    return _clip("\n".join(lines[-12:]), TEXT_LIMIT) if lines else ""


_MISMATCH = re.compile(r"(?:trial (?P<trial>\d+): )?(?:(?P<second>second shape)[^:]*: (?:\w+: )?)?output (?P<output>\d+): "
                       r"max abs error (?P<abs>[-+0-9.eE]+|nan|inf)")


def mismatch(result: Any) -> dict[str, Any]:
    """Which output was wrong, on which input set, by how much: from `details`, else parsed from the log."""
    d = _details(result)
    out: dict[str, Any] = {}
    for key, names in (("output", ("output", "output_index")), ("trial", ("trial", "input", "input_index")),
                       ("max_abs_error", ("max_abs_error", "max_abs")), ("max_rel_error", ("max_rel_error", "max_rel"))):
        for n in names:
            if d.get(n) is not None:
                out[key] = d[n]
                break
    if out:
        return out
    m = None
    for m in _MISMATCH.finditer(str(getattr(result, "log", "") or "")):
        pass
    if m is None:
        return {}
    out = {"output": int(m["output"]), "max_abs_error": float(m["abs"])}
    if m["trial"] is not None:
        out["trial"] = int(m["trial"])
    if m["second"]:
        out["input"] = "the second shape (batch_size changed)"
    return out


# The reward environment's defaults, for a verdict that does not say its settings.
DEFAULT_SETTINGS = {f.name: f.default for f in dataclasses.fields(RewardConfig) if f.name in SETTINGS_QUOTED}
_TABLE_TOLERANCE = "atol = rtol = 1e-2"  # as the reasons table words the default tolerance
_TABLE_MARGIN = "5%"  # and the default margin


def settings_of(result: Any) -> dict[str, float]:
    """The settings a verdict was reached with (`details["settings"]`), defaults for the rest."""
    given = _details(result).get("settings")
    out = dict(DEFAULT_SETTINGS)
    if isinstance(given, dict):
        out.update({k: given[k] for k in DEFAULT_SETTINGS if _num(given.get(k)) is not None})
    return out


def _short_num(x: float) -> str:
    """1e-2 for a power of ten (as the table writes it), else the shortest plain form (0.05)."""
    mantissa, _, exponent = f"{x:e}".partition("e")
    return f"1e{int(exponent)}" if float(mantissa) == 1.0 and x < 1 else f"{x:g}"


def tolerance_text(s: dict) -> str:
    a, r = _short_num(s["atol"]), _short_num(s["rtol"])
    return f"atol = rtol = {a}" if a == r else f"atol = {a}, rtol = {r}"


def margin_text(s: dict) -> str:
    return f"{(1 - s['margin']) * 100:.3g}%"


def with_settings(text: str, s: dict) -> str:
    """A line of the reasons table with the tolerance and margin the verdict was reached with."""
    return text.replace(_TABLE_TOLERANCE, tolerance_text(s)).replace(_TABLE_MARGIN, margin_text(s))


def _mismatch_line(mm: dict[str, Any], s: dict | None = None) -> str:
    s = s or DEFAULT_SETTINGS
    if not mm:
        return ""
    where = f"output {mm['output']}" if "output" in mm else "an output"
    if "input" in mm and isinstance(mm["input"], str):
        where += f" on {mm['input']}"
    elif "trial" in mm:
        where += f" on input set {mm['trial']} (of {int(s['num_trials'])} random input sets)"
    errs = []
    if _num(mm.get("max_abs_error")) is not None:
        errs.append(f"max abs error {mm['max_abs_error']:.3g}")
    if _num(mm.get("max_rel_error")) is not None:
        errs.append(f"max rel error {mm['max_rel_error']:.3g}")
    return f"Mismatch: {where}: {', '.join(errs) or 'differs'} (tolerance {tolerance_text(s)})."


def top_kernels(result: Any) -> list[tuple[str, float | None]]:
    """(kernel name, device ms or None) of the candidate's own kernels, longest first.

    `details["kernels"]` may list names or dicts with a time (`ms`, `time_ms`, `cuda_time_ms`,
    `self_ms`); without details, the kernel names the candidate child printed from its profiler run.
    """
    ks = _details(result).get("kernels")
    if ks is None:
        m = None
        for m in re.finditer(r"own kernels seen by the profiler: (\[.*\])", str(getattr(result, "log", "") or "")):
            pass
        try:
            ks = ast.literal_eval(m.group(1)) if m else []
        except (ValueError, SyntaxError):
            ks = []
    out: list[tuple[str, float | None]] = []
    for k in ks or []:
        if isinstance(k, str):
            out.append((k, None))
        elif isinstance(k, dict) and k.get("name"):
            t = next((_num(k.get(n)) for n in ("ms", "time_ms", "cuda_time_ms", "self_ms", "device_ms") if _num(k.get(n)) is not None), None)
            out.append((str(k["name"]), t))
    out.sort(key=lambda kt: -(kt[1] or 0.0))
    return out[:TOP_KERNELS]


def _ms(v: float | None) -> str:
    return "-" if v is None else f"{v:.4g} ms"


def _timings(result: Any, s: dict) -> list[str]:
    times = getattr(result, "times", None) or {}
    cand, eager, comp = (_num(times.get(k)) for k in ("candidate_ms", "eager_ms", "compile_ms"))
    parts = [f"your ModelNew {_ms(cand)}"]
    for label, base in (("eager PyTorch", eager), ("torch.compile", comp)):
        if base is not None:
            parts.append(f"{label} {_ms(base)}" + (f" (you are {base / cand:.2f}x as fast)" if cand else ""))
        elif label == "torch.compile" and cand:
            # the reward times torch.compile only once a program clearly beats eager (it decides nothing before)
            parts.append("torch.compile not timed yet (it is timed once you beat eager PyTorch)")
    lines = ["Timings (median of the timed calls): " + "; ".join(parts) + "."]
    kernels = top_kernels(result)
    if kernels:
        total = sum(t for _, t in kernels if t) or None
        shown = [f"{name} {_ms(t)}" + (f" ({t / total:.0%})" if t and total else "") if t is not None else name
                 for name, t in kernels]
        lines.append("Your kernels by device time: " + ", ".join(shown) + ".")
    reward = int(getattr(result, "reward", 1))
    target = comp if reward == 2 else eager
    if cand and target and reward < 3:
        which = "torch.compile" if reward == 2 else "eager PyTorch"
        lines.append(f"To score {reward + 1}, get under {s['margin'] * target:.4g} ms "
                     f"(more than {margin_text(s)} faster than {which}).")
    return lines


def format_feedback(result: Any, attempt: int | None = None) -> str:
    """The text of the feedback turn for one verdict (an `EvalResult`, or anything with its fields)."""
    reason = str(getattr(result, "reason", "") or "")
    reward = getattr(result, "reward", -1)
    name, entry, extra = lookup(reason)
    s = settings_of(result)
    head = f"Attempt {attempt}: " if attempt else ""
    lines: list[str] = []
    if entry is not None and entry.kind == "ok":
        m = margin_text(s)
        level = {1: f"correct, but not more than {m} faster than eager PyTorch",
                 2: f"correct and faster than eager PyTorch, but not more than {m} faster than torch.compile",
                 3: "correct and faster than both eager PyTorch and torch.compile"}.get(int(reward), "correct")
        lines.append(f"{head}the environment ran your program: {level} (reward {int(reward)}).")
        lines += _timings(result, s)
        lines.append("Keep it correct and make it faster. " + ASK if int(reward) < 3 else ASK)
        return "\n".join(lines)
    what = with_settings(entry.what, s) if entry is not None else "the environment rejected the program"
    lines.append(f"{head}the environment rejected your program: {reason or 'unknown'} (reward {int(reward)}): {what}"
                 + (f" ({extra})" if extra and name.endswith(":") else "") + ".")
    if entry is not None and entry.rule:
        lines.append(f"Rule: {with_settings(RULES[entry.rule], s)}")
    log = str(getattr(result, "log", "") or "")
    kind = entry.kind if entry is not None else ""
    if name == "build_error":
        lines.append("Compiler output (trimmed):\n```\n" + compiler_errors(log) + "\n```")
    elif name in ("import_error", "init_error", "runtime_error", "crashed") and traceback_tail(log):
        lines.append("Error (trimmed):\n```\n" + traceback_tail(log) + "\n```")
    elif kind == "correctness" or name in ("incorrect_under_timing", "uninitialized_output"):
        mm = mismatch(result)
        lines.append(_mismatch_line(mm, s) if mm else f"Detail: {reason_detail(result)}")
    elif kind == "environment":
        lines.append("This is the task's failure, not your program's; detail: " + (reason_detail(result) or reason))
    elif name != "no_code":
        detail = reason_detail(result)
        if detail:
            lines.append(f"Detail: {detail}")
    lines.append(ASK)
    return "\n".join(ln for ln in lines if ln)
