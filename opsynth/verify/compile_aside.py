"""A verifier request's memory share let go while torch.compile generates code, and only then.

Why: under quiet timing (`verify.quiet_timing`) a timing section waits until no request holds a
share, so a compile request that held its share through inductor's code generation (seconds of CPU
work) held every timing up: 44 accepted/min on the H200 (benchmarks/results/quiet_timing_h200/).
Letting the share go around the whole first compiled call (2026-12-02) gave 103/min, but that call
also runs the compiled graph, its eager segments and triton's autotuning on the device, and those
landed beside other workers' timings: 14 of 100 rows of that run read more than 10 % high against a
quiet re-measure (p10 of quiet / row eager_ms 0.64, down to 0.24;
benchmarks/results/generate_window_h200/). Dynamo tells us exactly when it compiles: its compile
callbacks (`torch._dynamo.callback_handler`, start and end of a frame's compile: tracing,
AOTAutograd, inductor's lowering and code generation, all on fake tensors) and of a backward
compiled lazily at its first call. The share is let go between those two callbacks and held for
everything else, so every launch of the request happens under its share.

A torch without those callbacks keeps the share through the compile (quiet data, slower): the
request's timing is right either way.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

# Compiles that do no device work (a CUDA-graph recording does: it runs the graph).
CODEGEN_TRIGGERS = ("DYNAMO", "LAZY_BACKWARD")


class CompileAside:
    """Dynamo compile callbacks that let a `HeldShare` go while armed (`armed(share)`)."""

    def __init__(self) -> None:
        self._share = None
        self._dropped = False
        self._lock = threading.Lock()
        self.let_go_count = 0
        self.wait_s = 0.0  # seconds spent taking the share again after a compile (timings went first)

    def install(self) -> bool:
        """Register the callbacks in this process (again after `torch._dynamo.reset()`, which
        clears them: the verifier resets Dynamo for every compile request); False when this torch
        has none (then `armed` holds the share through the compile)."""
        try:
            from torch._dynamo.callback import callback_handler
        except ImportError:
            return False
        if self._start not in callback_handler.start_callbacks:
            callback_handler.register_start_callback(self._start)
        if self._end not in callback_handler.end_callbacks:
            callback_handler.register_end_callback(self._end)
        return True

    def _start(self, *args) -> None:
        trigger = getattr(getattr(args[0], "callback_trigger", None), "name", None) if args else None
        if trigger is not None and trigger not in CODEGEN_TRIGGERS:
            return
        with self._lock:
            if self._share is not None and not self._dropped and self._share.let_go():
                self._dropped = True
                self.let_go_count += 1

    def _end(self, *args) -> None:
        with self._lock:
            if self._dropped:
                self._dropped = False
                t = time.perf_counter()
                self._share.take_again()
                self.wait_s += time.perf_counter() - t

    @contextmanager
    def armed(self, share) -> Iterator[None]:
        """While inside: each compile lets `share` go and takes it again at its end."""
        with self._lock:
            self._share, self._dropped = share, False
        try:
            yield
        finally:
            with self._lock:
                if self._dropped:  # a compile that never reported its end (it cannot, but hold the share again)
                    self._dropped = False
                    share.take_again()
                self._share = None
