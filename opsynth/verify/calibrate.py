"""Runtime calibration: move a task's eager runtime into the band by rescaling ``batch_size``.

The task contract (docs/INTERFACES.md) makes ``batch_size`` the leading dimension of every input
and keeps it out of ``get_init_inputs()``, so runtime is close to linear in it once the task is
large enough to fill the device, and weights do not change with it. Calibration therefore only
rewrites that one module-level constant, located with ``ast`` and spliced into the original text
so the rest of the file (formatting, comments) is untouched.
"""

from __future__ import annotations

import hashlib
import math
import random

from opsynth.render.task_file import read_batch_size, set_batch_size  # noqa: F401 - re-exported

from .config import VerifyConfig


def draw_target_ms(source: str, cfg: VerifyConfig, min_ms: float, max_ms: float) -> float:
    """The runtime this task is calibrated toward: log-normal (median ``target_median_ms``, 90 %
    under ``target_p90_ms``), seeded by the task's source so reruns agree, clipped to the band
    shrunk by ``band_margin``."""
    seed = int.from_bytes(hashlib.sha256(source.encode()).digest()[:8], "big")
    t = random.Random(seed).lognormvariate(math.log(cfg.target_median_ms), cfg.target_sigma())
    lo = min_ms * cfg.band_margin
    hi = max_ms / cfg.band_margin
    if lo > hi:  # a band narrower than the margins: aim at its geometric middle
        lo = hi = math.sqrt(min_ms * max_ms)
    return min(max(t, lo), hi)


def next_batch_size(
    batch_size: int, measured_ms: float, target_ms: float, peak_bytes: float | None, cap_bytes: float
) -> int:
    """One geometric step toward ``target_ms`` assuming runtime proportional to batch size, capped
    so that the memory estimate stays under ``cap_bytes``. The estimate treats all of the measured
    peak as proportional to batch size, which over-estimates (weights do not grow), so the cap is
    respected; later steps re-measure and correct."""
    ratio = target_ms / max(measured_ms, 1e-6)
    new = max(1, int(round(batch_size * ratio)))
    if peak_bytes and peak_bytes > 0 and new > batch_size:
        fit = int(batch_size * cap_bytes / peak_bytes)
        new = max(batch_size, min(new, fit))
    return new
