"""A progress bar for a generate run: accepted rows against the target, with rejections and rate.

A thin layer over tqdm driven by RunStats, so the bar shows exactly the numbers the report and the
card will later print. When the stream is not a terminal (`generate ... 2> run.log`, a batch job)
a redrawn bar would be one `\r`-joined line; there it prints whole lines instead, one every
`line_interval_s` seconds while the count moves, and one at the end.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import IO

from tqdm.auto import tqdm

from opsynth.shards.stats import RunStats


class RunProgress:
    """`with RunProgress(stats, total=n_tasks) as bar: ... stats.accept(); bar.update()`.

    The bar counts rows in the folder (`rows`, rows from earlier runs included); the postfix
    shows rejections, the acceptance rate and candidates per minute of this run.
    """

    def __init__(self, stats: RunStats, total: int, *, file: IO[str] | None = None, disable: bool | None = None,
                 mininterval: float = 0.5, rows: Callable[[], int] | None = None, line_interval_s: float = 30.0):
        self.stats = stats
        # Rows in the folder, from the writer (the files) when the caller passes it.
        self._rows = rows or (lambda: stats.adopted_rows + stats.accepted)
        self._t0 = time.monotonic()
        self._c0 = stats.candidates  # a resumed run's rate counts its own candidates only
        self._total = total
        stream = file if file is not None else sys.stderr
        isatty = getattr(stream, "isatty", None)
        self._lines = disable is not True and not (callable(isatty) and isatty())
        self._bar = None
        if self._lines:
            self._file, self._every, self._said, self._said_at = stream, line_interval_s, None, None
            self._line(force=True)
        else:
            self._bar = tqdm(total=total, initial=self._rows(), desc="accepted", unit="task",
                             file=file, disable=disable, mininterval=mininterval, dynamic_ncols=True)

    def _line(self, force: bool = False) -> None:
        """One whole line, when the numbers moved and the last line is `line_interval_s` old (or `force`)."""
        now = time.monotonic()
        text = f"accepted {self._rows()}/{self._total} " + " ".join(f"{k}={v}" for k, v in self.postfix().items()
                                                                 if k != "cand/min")
        if text == self._said or not (force or self._said_at is None or now - self._said_at >= self._every):
            return
        rate = self.postfix()["cand/min"]
        print(f"{text} cand/min={rate} elapsed={now - self._t0:.0f}s", file=self._file, flush=True)
        self._said, self._said_at = text, now

    def postfix(self) -> dict[str, str]:
        s = self.stats
        elapsed = max(time.monotonic() - self._t0, 1e-9)
        rate = s.acceptance_rate
        return {
            "rejected": str(s.num_rejected),
            "accept_rate": "-" if rate is None else f"{100 * rate:.0f}%",
            "cand/min": f"{60.0 * (s.candidates - self._c0) / elapsed:.1f}",
        }

    def update(self) -> None:
        """Redraw from the stats (call after each accepted or rejected candidate)."""
        if self._bar is None:
            self._line()
            return
        self._bar.n = self._rows()
        self._bar.set_postfix(self.postfix(), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        if self._bar is None:
            self._line(force=True)
            return
        self.update()
        self._bar.close()

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
