"""Training metrics: one JSON line per logged step, a short console line per step, and a plot.

TRL already averages the reward and our per-completion `kernel/*`, per-turn `turn/<t>/*` and
`episode/*` values across ranks at each logging step; `MetricsJsonl` writes them (with TRL's loss,
KL, clip ratios, and the step's wall time) to `metrics.jsonl` on the main process, so a run's curve
survives the run, writes each rank's rollout time split to `rollouts-rank<r>.jsonl`, and plots the
file at the end. `StepPrinter` prints one line per step instead of TRL's whole log dict.
"""

from __future__ import annotations

import json
import math
import os
import time
from typing import Any

from transformers import TrainerCallback


def _derived(logs: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for src, dst in (("kernel/log_speedup_eager", "kernel/geomean_speedup_eager"),
                     ("kernel/log_speedup_compile", "kernel/geomean_speedup_compile")):
        v = logs.get(src)
        if isinstance(v, (int, float)) and math.isfinite(v):
            out[dst] = math.exp(v)
    return out


class _StepClock(TrainerCallback):
    """Wall time of the last optimiser step (generation, evaluation and update)."""

    step_time_s: float | None = None
    _t0: float | None = None

    def on_step_begin(self, args, state, control, **kwargs):
        self._t0 = time.perf_counter()

    def on_step_end(self, args, state, control, **kwargs):
        if self._t0 is not None:
            self.step_time_s = time.perf_counter() - self._t0


class MetricsJsonl(_StepClock):
    """Append each `on_log` payload, with its step and step time, to a JSON-lines file (main process
    only); `rollouts` (a `MultiTurnRollout`) has its per-step time split appended to `rollouts_path`."""

    def __init__(self, path: str, resume_step: int | None = None, rollouts: Any = None, rollouts_path: str | None = None):
        self.path = path
        self.rollouts = rollouts
        self.rollouts_path = rollouts_path
        self._written = 0
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if resume_step is not None:
            truncate_after(path, resume_step)
            if rollouts_path:
                truncate_after(rollouts_path, resume_step)

    def _write_rollouts(self) -> None:
        if self.rollouts is None or not self.rollouts_path:
            return
        new = self.rollouts.history[self._written:]
        self._written = len(self.rollouts.history)
        if new:
            with open(self.rollouts_path, "a") as f:
                for r in new:
                    f.write(json.dumps(r.to_dict()) + "\n")

    def on_log(self, args, state, control, logs=None, **kwargs):
        self._write_rollouts()
        if not state.is_world_process_zero or not logs:
            return
        row = {"step": state.global_step, "epoch": state.epoch, **logs, **_derived(logs)}
        if "reward" in logs and self.step_time_s is not None:
            row["step_time_s"] = round(self.step_time_s, 3)
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and os.path.exists(self.path):
            try:
                plot_metrics(self.path, os.path.splitext(self.path)[0] + ".png")
            except Exception as exc:  # a missing plot must not fail a finished run
                print(f"[train] plot skipped: {exc!r}")


def step_line(row: dict[str, Any], max_steps: int | None = None, turns: int = 1) -> str:
    """One console line for a step's metrics: reward, pass and faster rates, per-turn reward, times."""

    def f(key: str, fmt: str = "{:.2f}") -> str:
        v = row.get(key)
        return fmt.format(v) if isinstance(v, (int, float)) and math.isfinite(v) else "-"

    step = f"{row.get('step')}" + (f"/{max_steps}" if max_steps else "")
    parts = [f"[train] step {step}", f"reward {f('reward')}", f"pass {f('kernel/pass_rate')}",
             f">eager {f('kernel/faster_than_eager')}", f">compile {f('kernel/faster_than_compile')}"]
    if turns > 1:
        parts.append("by turn " + " ".join(f("turn/%d/reward" % t) for t in range(1, turns + 1)))
        parts.append(f"improved {f('episode/improved')}")
    parts += [f"gen {f('time/generation_s', '{:.1f}')} s", f"eval {f('time/evaluation_s', '{:.1f}')} s",
              f"step {f('step_time_s', '{:.1f}')} s"]
    return "  ".join(parts)


class StepPrinter(_StepClock):
    """Print `step_line` for every logged step (main process only)."""

    def __init__(self, turns: int = 1):
        self.turns = turns

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs or "reward" not in logs:
            return
        row = {"step": state.global_step, **logs}
        if self.step_time_s is not None:
            row["step_time_s"] = self.step_time_s
        print(step_line(row, state.max_steps or None, self.turns), flush=True)



def read_metrics(path: str) -> list[dict[str, Any]]:
    """The per-step rows of a metrics file (the end-of-run summary row excluded)."""
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r for r in rows if "reward" in r]


def truncate_after(path: str, step: int) -> None:
    """Drop rows logged after `step`: a resumed run re-logs them from its checkpoint."""
    if not os.path.exists(path):
        return
    with open(path) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    with open(path, "w") as f:
        for r in rows:
            if int(r.get("step", 0)) <= step:
                f.write(json.dumps(r) + "\n")


def plot_metrics(path: str, png: str) -> str:
    """Reward mean (and by turn), pass / faster rates and the reward distribution against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    rows = read_metrics(path)
    steps = [r["step"] for r in rows]
    turns = sorted({int(k.split("/")[1]) for r in rows for k in r if k.startswith("turn/") and k.endswith("/reward")})
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    a.plot(steps, [r.get("reward") for r in rows], marker="o", label="episode reward" if len(turns) > 1 else "mean reward")
    if len(turns) > 1:
        for t in turns:
            a.plot(steps, [r.get(f"turn/{t}/reward") for r in rows], marker=".", linestyle="--", label=f"after turn {t}")
    a.set(xlabel="step", ylabel="reward", title="mean reward", ylim=(-1.1, 3.1))
    a.legend(fontsize="small")
    for key, label in (("kernel/pass_rate", "correct"), ("kernel/faster_than_eager", "faster than eager"),
                       ("kernel/faster_than_compile", "faster than compile")):
        b.plot(steps, [r.get(key) for r in rows], marker=".", label=label)
    b.set(xlabel="step", ylabel="rate", title="pass / faster rates", ylim=(-0.05, 1.05))
    b.legend()
    bottom = [0.0] * len(rows)
    for level, color in ((-1, "tab:red"), (1, "tab:gray"), (2, "tab:blue"), (3, "tab:green")):
        vals = [r.get(f"kernel/reward_frac_{level}") or 0.0 for r in rows]
        c.bar(steps, vals, bottom=bottom, color=color, label=f"reward {level}")
        bottom = [x + y for x, y in zip(bottom, vals)]
    c.set(xlabel="step", ylabel="fraction", title="reward distribution")
    c.legend(fontsize="small")
    for ax in (a, b, c):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole numbers
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
