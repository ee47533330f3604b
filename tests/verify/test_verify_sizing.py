"""Sizes from the seed and the cost model: the same seed and settings give the same batch_size on
every call; the prediction lands inside the target window and the memory budget; a task that no
batch_size can bring into the window is rejected, without running, with a reason."""

from __future__ import annotations

import math
import statistics

import pytest

from opsynth.generate.config import candidate_seed
from opsynth.catalog import load_catalog
from opsynth.graph import OpGraph, Sampler, SamplerConfig
from opsynth.graph.cost import predict_ms, replay_cost
from opsynth.verify import VerifyConfig
from opsynth.verify.sizing import MEM_SHARE, choose_batch, draw_target_ms, target_window


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def linear(batch: int, fin: int, fout: int) -> OpGraph:
    g = OpGraph()
    x = g.add_input([batch, fin], dim_names=["batch_size", "features"])
    g.add_op("nn.Linear", x, {"in_features": fin, "out_features": fout}, [batch, fout], [batch, fin], category="linear")
    return g


def test_targets_come_from_the_seed_and_stay_in_the_window():
    cfg = VerifyConfig()
    lo, hi = target_window(cfg, "cuda")
    assert (lo, hi) == (cfg.min_ms * cfg.band_margin, cfg.max_ms / cfg.band_margin)
    targets = [draw_target_ms(s, cfg, "cuda") for s in range(3000)]
    assert targets == [draw_target_ms(s, cfg, "cuda") for s in range(3000)]
    assert all(lo <= t <= hi for t in targets)
    # The log-normal (median 4 ms, 90 % under 20 ms) truncated to the window: its quantiles.
    z = statistics.NormalDist(math.log(cfg.target_median_ms), cfg.target_sigma("cuda"))
    a, b = z.cdf(math.log(lo)), z.cdf(math.log(hi))
    for q in (0.1, 0.5, 0.9):
        want = math.exp(z.inv_cdf(a + q * (b - a)))
        assert 0.85 * want < sorted(targets)[int(q * 3000)] < 1.15 * want, q
    assert min(targets) > lo and sum(t < lo * 1.05 for t in targets) < 100  # no pile-up at the edge


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_sizes_are_deterministic_and_inside_the_window(catalog, device):
    cfg = VerifyConfig()
    lo, hi = target_window(cfg, device)
    cap = cfg.limits(device).mem_cap_gb * 2**30 * MEM_SHARE
    sampler = Sampler(SamplerConfig(scale=0.1 if device == "cpu" else 1.0), catalog)
    sized = 0
    for i in range(12):
        seed = candidate_seed(0, i)
        g = sampler.sample(seed).graph
        a, b = choose_batch(g, catalog, seed, cfg, device), choose_batch(g, catalog, seed, cfg, device)
        assert a == b
        if a.reason is None:
            sized += 1
            cost = replay_cost(g, catalog, a.batch)
            assert lo <= a.predicted_ms == predict_ms(cost, cfg.rates(device)) <= hi
            assert cost.peak_bytes <= cap
    assert sized >= 9


def test_a_target_out_of_reach_is_rejected_before_anything_runs(catalog):
    g = linear(16, 4096, 4096)
    # Even batch_size 2 is predicted slower than a 0.05 ms ceiling.
    slow = choose_batch(g, catalog, 1, VerifyConfig(cpu_max_ms=0.1), "cpu")
    assert slow.reason == "too_slow" and slow.batch == 2 and "above" in slow.message
    # 64 MB of weights against a 0.1 GB cap (half of it for the prediction): no batch_size fits.
    mem = choose_batch(g, catalog, 1, VerifyConfig(cpu_mem_cap_gb=0.1), "cpu")
    assert mem.reason == "mem_cap"
    # A tiny Linear whose memory budget stops the batch before the target is reached.
    tiny = choose_batch(linear(16, 2048, 8), catalog, 1, VerifyConfig(cpu_mem_cap_gb=0.001, cpu_min_ms=1.0), "cpu")
    assert tiny.reason == "too_fast" and "memory budget" in tiny.message
