"""The sampler: deterministic, Ops-6K mixture, broad coverage, valid shapes, stable signatures."""

from collections import Counter

import pytest

from opsynth.catalog import load_catalog
from opsynth.graph import OPS6K_MIXTURE, OpGraph, Sampler, SamplerConfig


@pytest.fixture(scope="module")
def sampler():
    return Sampler(SamplerConfig(scale=0.1), load_catalog())


class Draws:
    """What the counting tests read of seeds 0..n-1 of one fresh sampler: (ops, data_source, num_ops)
    per seed, drawn once and extended on demand, so that tests over the same seeds and settings
    (2,000 and 10,000 draws at scale 0.1; 2,000 and 6,000 at scale 1.0) share the draws."""

    def __init__(self, cfg: SamplerConfig):
        self.sampler = Sampler(cfg, load_catalog())
        self.drawn: list[tuple[tuple[str, ...], str, int]] = []

    def upto(self, n: int) -> list[tuple[tuple[str, ...], str, int]]:
        for seed in range(len(self.drawn), n):
            st = self.sampler.sample(seed)
            self.drawn.append((tuple(st.graph.ops()), st.data_source, st.num_ops))
        return self.drawn[:n]


@pytest.fixture(scope="module")
def draws_small():
    return Draws(SamplerConfig(scale=0.1))


@pytest.fixture(scope="module")
def draws_full():
    return Draws(SamplerConfig(scale=1.0))


def test_same_seed_same_graph(sampler):
    other = Sampler(SamplerConfig(scale=0.1), load_catalog())
    for seed in range(50):
        assert sampler.sample(seed).graph.to_json() == other.sample(seed).graph.to_json()


def test_mixture_matches_ops6k_within_2_points(draws_small):
    n = 2000
    counts = Counter()
    for ops, data_source, num_ops in draws_small.upto(n):
        counts["transformers" if data_source.startswith("transformers") else str(num_ops)] += 1
        assert len(ops) == num_ops
    for k, share in OPS6K_MIXTURE.items():
        assert abs(counts[k] / n - share) <= 0.02, (k, counts[k] / n, share)


def test_json_round_trip_and_signature(sampler):
    st = sampler.sample(3)
    g2 = OpGraph.from_json(st.graph.to_json())
    assert g2.ops() == st.graph.ops()
    assert g2.signature() == st.graph.signature()
    assert g2.input_specs() == st.graph.input_specs()


def _structure(g: OpGraph):
    """Everything the signature must keep, read from the JSON independently of `signature()`:
    operators, non-size attribute values, operand kinds, wiring, input roles, dtypes and ranks."""
    import json

    from opsynth.catalog.params import SIZE_PARAMS

    d = json.loads(g.to_json())
    nodes = []
    for n in d["nodes"]:
        if n["kind"] == "input":
            nodes.append((n["id"], n["role"], n["dtype"], len(n["shape"])))
        else:
            attrs = tuple(sorted((k, None if k in SIZE_PARAMS else json.dumps(v)) for k, v in n["params"].items()))
            operand = n.get("operand") or {}
            nodes.append((n["id"], n["op"], attrs, operand.get("kind"), operand.get("node")))
    return tuple(nodes), tuple(sorted((e["source"], e["target"], e.get("arg")) for e in d["edges"]))


def _sizes(g: OpGraph):
    return [g.g.nodes[n]["shape"] for n in g.input_nodes()]


def test_signature_ignores_sizes_but_not_operators():
    """Candidate i at two size scales: wherever the two graphs agree on everything but sizes (most
    seeds), the signatures must be equal; and within one run, equal signatures mean equal structure."""
    a = Sampler(SamplerConfig(scale=0.1), load_catalog())
    b = Sampler(SamplerConfig(scale=0.5), load_catalog())
    n, same_structure, resized = 200, 0, 0
    for seed in range(n):
        ga, gb = a.sample(seed).graph, b.sample(seed).graph
        if _structure(ga) == _structure(gb):
            same_structure += 1
            resized += _sizes(ga) != _sizes(gb)
            assert ga.signature() == gb.signature(), (seed, ga.to_json(), gb.to_json())
        else:
            assert ga.signature() != gb.signature(), seed
    assert same_structure >= 0.8 * n and resized >= 0.8 * same_structure, (same_structure, resized)
    seen = {}
    for seed in range(n):
        g = a.sample(seed).graph
        seen.setdefault(g.signature(), set()).add(_structure(g))
    assert all(len(structures) == 1 for structures in seen.values())


def test_resampling_reasons_are_counted(sampler):
    for seed in range(300):
        sampler.sample(seed)
    assert sampler.rejections and all(isinstance(k, str) for k in sampler.rejections)


def test_extra_edges_create_residuals_and_second_inputs():
    s = Sampler(SamplerConfig(scale=0.1, extra_edges=True, p_extra_edge=1.0), load_catalog())
    kinds = Counter()
    for seed in range(300):
        g = s.sample(seed).graph
        for n in g.op_nodes():
            op = g.node(n).get("operand") or {}
            if op.get("kind") == "node":
                kinds[op["edge"]] += 1
    assert kinds["residual"] > 0 and kinds["second_input"] > 0


@pytest.mark.parametrize("bad", [dict(mixture={"7": 1.0}), dict(scale=0), dict(p_extra_edge=2.0),
                                 dict(exclude_ops=["nn.NotAnOp"]), dict(partner_flatness=-1),
                                 dict(first_op_flatness=3)])
def test_bad_config_is_a_clear_error(bad):
    with pytest.raises(ValueError):
        Sampler(SamplerConfig(**bad), load_catalog())


@pytest.mark.slow
def test_10000_samples_cover_100_ops_in_10_categories(draws_small):
    cat = draws_small.sampler.catalog
    ops = set()
    for seq, _, _ in draws_small.upto(10_000):
        ops.update(seq)
    torch_ops = {o for o in ops if cat[o].source == "torch"}
    assert len(torch_ops) >= 100, len(torch_ops)
    assert len({cat[o].category for o in torch_ops}) >= 10


def _distinct_sequences(cfg: SamplerConfig, n: int) -> int:
    s = Sampler(cfg, load_catalog())
    return len({tuple(s.sample(seed).graph.ops()) for seed in range(n)})


def test_mixture_holds_at_full_scale_with_flat_partners(draws_full):
    """The GPU setting (scale 1.0) with the default flatness keeps Ops-6K's operator counts."""
    assert draws_full.sampler.cfg.partner_flatness == 1.0
    n = 2000
    counts = Counter()
    for _, data_source, num_ops in draws_full.upto(n):
        counts["transformers" if data_source.startswith("transformers") else str(num_ops)] += 1
    for k, share in OPS6K_MIXTURE.items():
        assert abs(counts[k] / n - share) <= 0.02, (k, counts[k] / n, share)


def test_flat_partners_spread_the_operator_pairs():
    """Drawing a partner by category alone piles the pairs onto the few-operator categories
    (conv x conv); weighing each fitting operator spreads them."""
    mix = {"2": 1.0}
    peaked = _distinct_sequences(SamplerConfig(scale=0.1, mixture=mix, partner_flatness=0.0), 1000)
    flat = _distinct_sequences(SamplerConfig(scale=0.1, mixture=mix, partner_flatness=1.0), 1000)
    assert flat >= peaked + 50, (peaked, flat)


@pytest.mark.slow
def test_diversity_does_not_fall_back(draws_full):
    """6,000 draws at Ops-6K's scale gave 4,260 distinct operator sequences before the flat partners
    and the admitted operators, 5,289 at the defaults (benchmarks/results/sampler_diversity.json)."""
    n = len({seq for seq, _, _ in draws_full.upto(6000)})
    assert n >= 5100, n


def test_draw_slot_is_the_slot_sample_draws(sampler):
    """One copy of the slot draw: the generate driver asks `draw_slot` (no graph drawn) what the
    sampler's `sample` then gives, for every seed and with a kind mixture too."""
    mixed = Sampler(SamplerConfig(scale=0.1, passes={"forward": 0.6, "backward": 0.4}), sampler.catalog)
    for s in (sampler, mixed):
        for seed in range(300):
            assert s.draw_slot(seed) == s.sample(seed).data_source, seed


def test_slot_shares_are_the_kinds_weighted_renormalised_mixtures():
    """A kind whose catalog has no transformers operator draws its slots over the torch counts
    alone: the expected shares are the kind-weighted average, which the draws follow."""
    from opsynth.graph import SlotPlan

    with_tf, no_tf = ("float32", "forward"), ("bfloat16", "backward")
    plan = SlotPlan(((no_tf, 1.0), (with_tf, 3.0)),
                    {with_tf: (("1", 0.25), ("2", 0.25), ("transformers", 0.5)), no_tf: (("1", 0.5), ("2", 0.5))})
    shares = plan.shares()
    assert shares == pytest.approx({"torch#1": 0.75 * 0.25 + 0.25 * 0.5, "torch#2": 0.75 * 0.25 + 0.25 * 0.5,
                                    "transformers#1": 0.75 * 0.5})
    n = 20000
    drawn = Counter(plan.slot(seed) for seed in range(n))
    assert all(abs(drawn[s] / n - v) < 0.01 for s, v in shares.items()), drawn
    # The default sampler's shares are the configured mixture (every slot can be filled).
    assert Sampler(SamplerConfig(scale=0.1)).slot_shares() == pytest.approx(
        {("transformers#1" if k == "transformers" else f"torch#{k}"): v for k, v in OPS6K_MIXTURE.items()})
