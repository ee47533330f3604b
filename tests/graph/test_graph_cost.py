"""The cost model counts what a forward does on meta tensors: FLOPs of a Linear, bytes of a
pointwise op, nothing for views; resizing a graph moves only the batch dimension; predictions grow
with the batch and are the same on every call (no clock, no randomness)."""

from __future__ import annotations

import pytest

from opsynth.catalog import load_catalog
from opsynth.graph import OpGraph, Sampler, SamplerConfig
from opsynth.graph.cost import (
    Rates,
    graph_batch,
    kernel_class,
    predict_ms,
    replay_cost,
    with_batch,
)
from opsynth.render import render_task
from opsynth.render.task_file import read_batch_size


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


def linear_relu(batch: int, fin: int = 64, fout: int = 32) -> OpGraph:
    g = OpGraph()
    x = g.add_input([batch, fin], dim_names=["batch_size", "features"])
    h = g.add_op("nn.Linear", x, {"in_features": fin, "out_features": fout}, [batch, fout], [batch, fin],
                 category="linear")
    g.add_op("torch.relu", h, {}, [batch, fout], [batch, fout], category="activation")
    return g


def test_a_linear_then_relu_costs_its_flops_and_bytes(catalog):
    b, fin, fout = 16, 64, 32
    cost = replay_cost(linear_relu(b, fin, fout), catalog)
    names = [k.name for k in cost.kernels]
    assert names == ["addmm", "relu"], names  # the weight transpose is a view: no kernel
    mm, relu = cost.kernels
    assert mm.flops == 2 * b * fin * fout
    assert mm.bytes == 4 * (b * fin + fin * fout + fout + b * fout)  # x, W, bias in; y out
    assert relu.flops == 0 and relu.bytes == 4 * 2 * b * fout and relu.elements == b * fout
    assert cost.persistent_bytes == 4 * (b * fin + fin * fout + fout)  # the input and the parameters
    assert (cost.input_bytes, cost.output_bytes) == (4 * b * fin, 4 * b * fout)
    assert cost.request_bytes == cost.peak_bytes + 2 * cost.input_bytes + 4 * cost.output_bytes
    assert kernel_class("addmm") == "mm" and kernel_class("relu") == "other"


def test_with_batch_moves_only_the_leading_dimension(catalog):
    g = linear_relu(16)
    g2 = with_batch(g, 1000)
    assert graph_batch(g2) == 1000 and graph_batch(g) == 16  # a copy; the original is unchanged
    for n in g2.op_nodes():
        assert g2.node(n)["in_shape"][1:] == g.node(n)["in_shape"][1:]
        assert g2.node(n)["out_shape"][0] == 1000
    assert g2.signature() == g.signature()  # sizes are not part of a task's identity
    assert read_batch_size(render_task(g2, catalog)) == 1000
    with pytest.raises(ValueError):
        with_batch(g, 0)


def test_predictions_grow_with_the_batch_and_repeat_exactly(catalog):
    rates = Rates(1e12, 1e11, 1e11, 5e-6, (("mm", 2.0),))
    sampler = Sampler(SamplerConfig(scale=0.1), catalog)
    for seed in range(6):
        g = sampler.sample(seed).graph
        b = graph_batch(g)
        p = [predict_ms(replay_cost(g, catalog, k * b), rates) for k in (1, 2, 8)]
        assert p[0] <= p[1] <= p[2], (g.ops(), p)
        assert p == [predict_ms(replay_cost(g, catalog, k * b), rates) for k in (1, 2, 8)]


def test_the_class_slowdown_scales_its_kernels(catalog):
    g = linear_relu(256, 1024, 1024)
    cost = replay_cost(g, catalog)
    fast, slow = Rates(1e12, 1e15, 1e15, 0.0), Rates(1e12, 1e15, 1e15, 0.0, (("mm", 3.0),))
    assert predict_ms(cost, slow) == pytest.approx(3 * predict_ms(cost, fast), rel=1e-3)


def test_the_affine_fit_gives_the_replayed_counts_at_any_batch(catalog):
    from opsynth.graph.cost import AffineCost

    sampler = Sampler(SamplerConfig(scale=0.1), catalog)
    fitted = 0
    for seed in range(10):
        g = sampler.sample(seed).graph
        model = AffineCost.fit(lambda b, g=g: replay_cost(g, catalog, b), 2)
        if model is None:
            continue
        fitted += 1
        for b in (3, 77, 5000):
            got, want = model.at(b), replay_cost(g, catalog, b)
            assert [k.name for k in got.kernels] == [k.name for k in want.kernels]
            for kg, kw in zip(got.kernels, want.kernels):
                assert (kg.flops, kg.bytes, kg.elements, kg.numel) == pytest.approx(
                    (kw.flops, kw.bytes, kw.elements, kw.numel), rel=1e-9)
            assert got.peak_bytes == pytest.approx(want.peak_bytes, rel=1e-9)
            assert got.request_bytes == pytest.approx(want.request_bytes, rel=1e-9)
    assert fitted >= 8
