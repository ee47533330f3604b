"""Precisions and passes in the sampler: the kind is drawn from the seed apart from the graph (the
default draws exactly the graphs it always has), the mixture holds, and the catalog excludes per
kind on the device the operators that do not run that way there, before anything is drawn."""

from collections import Counter

import pytest

from opsynth.catalog import load_catalog
from opsynth.catalog.precision import exclusions
from opsynth.graph import Sampler, SamplerConfig
from opsynth.render import render_task
from opsynth.render.task_file import TaskKind, task_kind

MIXED = dict(dtypes={"fp32": 0.5, "bf16": 0.4, "fp16": 0.1}, passes={"forward": 0.7, "backward": 0.3})


@pytest.fixture(scope="module")
def catalog():
    return load_catalog()


@pytest.fixture(scope="module")
def mixed(catalog):
    return Sampler(SamplerConfig(scale=0.1, **MIXED), catalog, device="cpu")


def test_the_kind_mixture_holds_within_2_points(mixed):
    n = 4000
    kinds = Counter(mixed.draw_kind(seed) for seed in range(n))
    for (dt, p), share in {("float32", "forward"): 0.35, ("bfloat16", "forward"): 0.28, ("float16", "forward"): 0.07,
                           ("float32", "backward"): 0.15, ("bfloat16", "backward"): 0.12,
                           ("float16", "backward"): 0.03}.items():
        assert abs(kinds[(dt, p)] / n - share) <= 0.02, (dt, p, kinds[(dt, p)] / n)


def test_a_float32_forward_seed_draws_the_graph_the_default_draws(catalog, mixed):
    default = Sampler(SamplerConfig(scale=0.1), catalog)
    same = [s for s in range(60) if mixed.draw_kind(s) == ("float32", "forward")]
    assert len(same) > 10
    for seed in same:
        assert mixed.sample(seed).graph.to_json() == default.sample(seed).graph.to_json()
    st = default.sample(0)
    assert st.graph.g.graph == {} and (st.dtype, st.task_pass) == ("float32", "forward")  # nothing stored


def test_the_code_states_the_kind_the_sampler_drew(catalog, mixed):
    for seed in range(40):
        st = mixed.sample(seed)
        src = render_task(st.graph, catalog)
        assert task_kind(src) == TaskKind(st.dtype, st.task_pass), src
        assert ("dtype = torch." in src) == (st.dtype != "float32")
        assert (f"dtype=dtype" in src) == (st.dtype != "float32")


def test_the_catalog_excludes_per_kind_what_the_cpu_cannot_run(catalog, mixed):
    assert exclusions(catalog, "fp32", "forward", "cpu") == {}  # the catalog's own kind: nothing probed
    bf16 = exclusions(catalog, "bf16", "forward", "cpu")
    assert "not implemented for 'BFloat16'" in bf16["nn.AvgPool3d"]  # no bf16 CPU kernel in torch
    backward = exclusions(catalog, "fp32", "backward", "cpu")
    assert "nonzero gradient" in backward["torch.floor"] and "derivative" in backward["torch.heaviside"]
    assert "nn.Conv2d" not in bf16 and "nn.Conv2d" not in backward
    for seed in range(300):  # nothing excluded for its kind is ever drawn
        st = mixed.sample(seed)
        off = exclusions(catalog, st.dtype, st.task_pass, "cpu")
        assert not set(st.graph.ops()) & set(off), (seed, st.dtype, st.task_pass, st.graph.ops())


@pytest.mark.parametrize("bad", [dict(dtypes={"fp8": 1.0}), dict(passes={"sideways": 1.0}), dict(dtypes={"fp32": 0}),
                                 dict(passes={})])
def test_bad_kinds_are_a_clear_error(catalog, bad):
    with pytest.raises(ValueError, match="sampler.(dtypes|passes)"):
        Sampler(SamplerConfig(**bad), catalog)
