"""Training metrics: one JSON line per logged step, and a plot of them.

TRL already averages the reward and our per-completion `kernel/*` values across ranks at each
logging step; this callback writes them (with TRL's loss, KL, clip ratios) to `metrics.jsonl` on
the main process, so a run's curve survives the run, and plots the file at the end.
"""

from __future__ import annotations

import json
import math
import os
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


class MetricsJsonl(TrainerCallback):
    """Append each `on_log` payload, with its step, to a JSON-lines file (main process only)."""

    def __init__(self, path: str, resume_step: int | None = None):
        self.path = path
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
        if resume_step is not None:
            truncate_after(path, resume_step)

    def on_log(self, args, state, control, logs=None, **kwargs):
        if not state.is_world_process_zero or not logs:
            return
        row = {"step": state.global_step, "epoch": state.epoch, **logs, **_derived(logs)}
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=float) + "\n")

    def on_train_end(self, args, state, control, **kwargs):
        if state.is_world_process_zero and os.path.exists(self.path):
            try:
                plot_metrics(self.path, os.path.splitext(self.path)[0] + ".png")
            except Exception as exc:  # a missing plot must not fail a finished run
                print(f"[train] plot skipped: {exc!r}")


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
    """Reward mean, pass / faster rates and the reward distribution against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_metrics(path)
    steps = [r["step"] for r in rows]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(15, 4))
    a.plot(steps, [r.get("reward") for r in rows], marker="o", label="mean reward")
    a.set(xlabel="step", ylabel="reward", title="mean reward", ylim=(-1.1, 3.1))
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
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png
