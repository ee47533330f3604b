"""A progress bar for a generate run: accepted rows against the target, with rejections and rate.

A thin layer over tqdm driven by RunStats, so the bar shows exactly the numbers the report and the
card will later print.
"""

from __future__ import annotations

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
                 mininterval: float = 0.5, rows: Callable[[], int] | None = None):
        self.stats = stats
        # Rows in the folder, from the writer (the files) when the caller passes it.
        self._rows = rows or (lambda: stats.adopted_rows + stats.accepted)
        self._t0 = time.monotonic()
        self._c0 = stats.candidates  # a resumed run's rate counts its own candidates only
        self._bar = tqdm(total=total, initial=self._rows(), desc="accepted", unit="task",
                         file=file, disable=disable, mininterval=mininterval, dynamic_ncols=True)

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
        self._bar.n = self._rows()
        self._bar.set_postfix(self.postfix(), refresh=False)
        self._bar.refresh()

    def close(self) -> None:
        self.update()
        self._bar.close()

    def __enter__(self) -> RunProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
