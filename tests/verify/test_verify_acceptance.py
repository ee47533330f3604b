"""Acceptance keeps a margin at the band edges: the eager median must be inside the band less
its margins (`edge_margin_low`, `edge_margin`), and a first timing near an edge is repeated, the
median deciding."""

from __future__ import annotations

import pytest

from opsynth.verify import VerifyConfig, WorkerPool
from opsynth.verify.worker import Worker

GOOD = "batch_size = 4\n"  # the pool's decision below never runs the source


def test_the_window_is_the_band_less_its_margin():
    cfg = VerifyConfig()
    assert cfg.accept_window("cuda") == pytest.approx((1.2, 90.0))  # the low edge keeps more
    assert cfg.accept_window("cpu") == pytest.approx((0.06, 90.0))
    with pytest.raises(ValueError, match="edge_margin"):
        VerifyConfig(edge_margin=0.6)


def _worker(cfg: VerifyConfig, timings: list[float]) -> Worker:
    w = Worker.__new__(Worker)  # no torch process: only the timing decision is under test
    w.cfg, w.device = cfg, "cpu"
    seq = iter(timings)
    w._time = lambda fn, since: (next(seq), 10)
    return w


@pytest.mark.parametrize("timings, want, n", [
    ([10.0], 10.0, 1),  # far from both edges: one timing
    ([1.3, 1.1, 1.4], 1.3, 3),  # near the low edge (1.2 ms): three, the median
    ([1.15, 1.3, 1.25], 1.25, 3),  # just outside at first, inside on the median
    ([85.0, 95.0, 99.0], 95.0, 3),  # near the high edge (90 ms)
])
def test_a_timing_near_an_edge_is_repeated_and_the_median_decides(timings, want, n):
    cfg = VerifyConfig(cpu_min_ms=1.0, cpu_max_ms=100.0)
    ms, _, got = _worker(cfg, timings)._time_eager(lambda: None, 0.0)
    assert ms == want and got == timings[:n]


@pytest.mark.parametrize("eager_ms, reason", [(0.99, "too_fast"), (1.15, "too_fast"), (1.25, "accepted"),
                                              (89.0, "accepted"), (95.0, "too_slow")])
def test_the_pool_accepts_only_inside_the_window(monkeypatch, eager_ms, reason):
    pool = WorkerPool(VerifyConfig(device="cpu", cpu_min_ms=1.0, cpu_max_ms=100.0, check_compile=False))
    monkeypatch.setattr(pool, "_request", lambda index, msg: {
        "ok": True, "eager_ms": eager_ms, "peak_mem_mb": 1.0, "timings": [eager_ms], "outputs": []})
    r = pool._run_checks(0, GOOD, 0.0)
    assert r.reason == reason, r.evidence
    if reason != "accepted":
        assert "acceptance window [1.2, 90]" in r.evidence["message"]
