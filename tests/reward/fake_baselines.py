"""Stand-ins for a task's baseline children (`opsynth.reward.baselines.TaskBaselines`): blocks of
lognormal times around a set figure, so the pacing and decision logic is tested without a child."""

from __future__ import annotations

import random


class FakeServer:
    """One baseline child: `ms` per call, 3 % spread; `ready` says whether its compile is done."""

    ready = True  # compiled already (a prestarted or pooled compile child)

    def __init__(self, ms: float, seed: int):
        self.ms, self.rng, self.pid, self.warmed, self.blocks = ms, random.Random(seed), None, False, []
        self.last_quiet = None  # the CPU backend: no wait for an idle device

    def is_ready(self):
        return self.ready

    def wait_ready(self, timeout=None):
        self.ready = True

    def block(self, n: int, quiet_cap_ms: float | None = None) -> list[float]:
        self.blocks.append(n)
        return [self.ms * self.rng.lognormvariate(0.0, 0.03) for _ in range(n)]


class FakeBaselines:
    """A task's baselines: a FakeServer per kind given in `ms` (or `servers`), `cached` figures
    (the same as `ms` unless given), and which servers were asked for (`started`)."""

    def __init__(self, cached: dict | None = None, servers: dict | None = None, **ms):
        self.servers = servers or {k: FakeServer(v, i) for i, (k, v) in enumerate(ms.items())}
        self.cached = {"eager_ms": ms.get("eager"), "compile_ms": ms.get("compile")} if cached is None else cached
        self.started: list[str] = []

    def uses_cache(self):
        return False

    def server(self, kind):
        self.started.append(kind)
        return self.servers[kind]
