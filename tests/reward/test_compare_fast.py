"""The fast path of judging (compare._cmp_fast with a FactsMemo) against `_cmp` alone.

Every case is judged twice: by `_cmp` and by the fast path with its fallback (`_cmp_memo`); the
(reason, detail) must be identical. For the cases the fast path should settle, `_cmp` is replaced
by one that raises, so a fast path that silently falls back fails the test; and the elementwise
tolerance test is checked element for element against torch's at the boundary, where a rounding
difference would turn into a different verdict.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

from opsynth.render.task_file import tolerance
from opsynth.reward import compare
from opsynth.reward.compare import CHUNK, FactsMemo, _cmp, _cmp_memo, judge_outputs
from opsynth.reward.eval_types import RewardConfig
from opsynth.reward.rounds import RoundSession, TimingPlan, judge_rounds

CFG = RewardConfig()
BF16 = RewardConfig(atol=tolerance("bfloat16").atol, rtol=tolerance("bfloat16").rtol)  # as evaluate.task_cfg


def _g(seed=0):
    return torch.Generator().manual_seed(seed)


def _tol(r, cfg):
    return cfg.atol + cfg.rtol * r.float().abs()


def _just_over(r, i, cfg, factor=1.001):
    o = r.clone()
    o.view(-1)[i] = r.view(-1)[i] + _tol(r.view(-1)[i], cfg) * factor
    return o


class Sub(torch.Tensor):
    pass


R = torch.randn(300, 70, generator=_g())  # 21000 elements: one chunk
BIG = torch.randn(3 * CHUNK + 17, generator=_g(1))  # crosses chunk boundaries, a short last chunk
INF_REF = R.clone().index_fill_(0, torch.tensor([3]), float("inf"))
NAN_REF = R.clone().index_fill_(0, torch.tensor([5]), float("nan"))
SMALL = torch.randn(4096, generator=_g(2)) * 1e-4  # near zero: a constant passes atol
RB, RH = R.bfloat16(), R.half()
RD = R.double()
OUTLIER = torch.zeros(4096).index_fill_(0, torch.tensor([7]), 0.015)
NONCONTIG = torch.randn(70, 300, generator=_g(3)).t()  # a transposed (non-contiguous) reference

# name -> (reference, output, cfg, reason, the fast path settles it)
CASES = {
    "ok": (R, R + 1e-4 * torch.randn(R.shape, generator=_g(9)), CFG, "ok", True),
    "ok_identical": (R, R.clone(), CFG, "ok", True),
    "just_over_one_element": (R, _just_over(R, 777, CFG), CFG, "low_precision", False),
    "far_off_one_element": (R, _just_over(R, 777, CFG, 100.0), CFG, "incorrect", False),
    "low_precision_all": (R, R * 1.05, CFG, "low_precision", False),
    "nan_injected": (R, R.clone().index_fill_(1, torch.tensor([4]), float("nan")), CFG, "uninitialized_output", False),
    "inf_injected": (R, R.clone().index_fill_(0, torch.tensor([8]), float("inf")), CFG, "incorrect", False),
    "inf_matches": (INF_REF, INF_REF.clone(), CFG, "ok", False),
    "inf_mismatch": (INF_REF, INF_REF.clone().index_fill_(0, torch.tensor([3]), float("-inf")), CFG, "incorrect", False),
    "nan_in_reference_matches": (NAN_REF, NAN_REF.clone(), CFG, "ok", False),
    "constant": (R, torch.full_like(R, 0.3), CFG, "near_constant_output", False),
    "nearly_constant": (R, 0.3 + 1e-9 * torch.randn(R.shape, generator=_g(4)), CFG, "near_constant_output", False),
    # within the tolerance everywhere, while the reference's mean is not (one outlier): the spread test decides
    "near_constant_within_tolerance": (OUTLIER, torch.full_like(OUTLIER, 0.006), CFG, "near_constant_output", False),
    "near_zero_constant_passes": (SMALL, torch.zeros_like(SMALL), CFG, "near_constant_output", False),
    "near_zero_varied_wrong": (SMALL, torch.randn(4096, generator=_g(5)) * 1e-4, CFG, "incorrect", False),
    "near_zero_ok": (SMALL, SMALL * 1.001, CFG, "ok", False),
    # _cmp calls even an exact copy of a constant reference incorrect (its variation test divides by 0 spread)
    "constant_reference": (torch.full((500,), 2.5), torch.full((500,), 2.5), CFG, "incorrect", False),
    "bf16_ok": (RB, (R + 1e-3).bfloat16(), BF16, "ok", True),
    "bf16_off": (RB, _just_over(RB, 12, BF16, 1.5), BF16, "low_precision", False),
    "bf16_upcast": (RB, R, BF16, "fp32_upcast", False),
    "fp16_ok": (RH, (R + 1e-3).half(), BF16, "ok", True),
    "fp16_off": (RH, _just_over(RH, 12, BF16, 30.0), BF16, "incorrect", False),
    "fp16_nan": (RH, RH.clone().index_fill_(0, torch.tensor([0]), float("nan")), BF16, "uninitialized_output", False),
    "fp64_ok": (RD, RD + 1e-5, CFG, "ok", True),
    "fp64_off": (RD, _just_over(RD, 100, CFG), CFG, "low_precision", False),
    "int_equal": (torch.arange(1000), torch.arange(1000), CFG, "ok", False),
    "int_differs": (torch.arange(1000), torch.arange(1000) + 1, CFG, "incorrect", False),
    "bool_differs": (torch.arange(10) > 4, torch.arange(10) > 5, CFG, "incorrect", False),
    "wrong_shape": (R, R.t().contiguous(), CFG, "wrong_shape", False),
    "wrong_dtype": (R, RD, CFG, "wrong_dtype", False),
    "subclass": (R, R.clone().as_subclass(Sub), CFG, "tensor_subclass", False),
    "empty": (torch.empty(0, 5), torch.empty(0, 5), CFG, "ok", False),
    "zero_dim_ok": (torch.tensor(1.5), torch.tensor(1.5001), CFG, "ok", True),
    "zero_dim_off": (torch.tensor(1.5), torch.tensor(2.5), CFG, "incorrect", False),
    "non_contiguous_output": (R, R.t().contiguous().t(), CFG, "ok", True),
    "non_contiguous_reference": (NONCONTIG, NONCONTIG.contiguous() + 1e-4, CFG, "ok", True),
    "non_contiguous_off": (NONCONTIG, _just_over(NONCONTIG.contiguous(), 4321, CFG), CFG, "low_precision", False),
    "requires_grad": (R, (R + 1e-4).requires_grad_(), CFG, "ok", True),
    "large_ok": (BIG, BIG + 1e-4, CFG, "ok", True),
    "large_off_in_last_chunk": (BIG, _just_over(BIG, BIG.numel() - 3, CFG, 30.0), CFG, "incorrect", False),
    "large_nan_in_last_chunk": (BIG, BIG.clone().index_fill_(0, torch.tensor([BIG.numel() - 1]), float("nan")), CFG,
                                "uninitialized_output", False),
    "large_near_constant": (BIG, 0.3 + 1e-9 * torch.randn(BIG.shape, generator=_g(6)), CFG, "near_constant_output", False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_fast_path_and_fallback_give_cmps_verdict(name):
    ref, out, cfg, reason, _ = CASES[name]
    exact = _cmp(ref, out, cfg)
    assert exact[0] == reason, exact  # the case is what it says it is
    memo = FactsMemo()
    assert _cmp_memo(ref, out, cfg, memo) == exact
    assert _cmp_memo(ref, out, cfg, memo) == exact  # again, from the memo's facts
    assert memo.computed == 1


@pytest.mark.parametrize("name", [n for n, c in CASES.items() if c[4]])
def test_fast_path_settles_the_ok_cases(name, monkeypatch):
    ref, out, cfg, _, _ = CASES[name]

    def no_exact(*a):
        raise AssertionError("fell back to _cmp")

    monkeypatch.setattr(compare, "_cmp", no_exact)
    memo = FactsMemo()
    assert _cmp_memo(ref, out, cfg, memo) == ("ok", "")
    assert memo.fast == 1


def test_fast_path_can_only_say_ok():
    """Not one case the fast path settles is anything but ok, and it settles at least the ok ones."""
    for name, (ref, out, cfg, reason, fast) in CASES.items():
        got = compare._cmp_fast(ref, out, cfg, compare.ref_facts(ref, cfg))
        assert got == fast, name
        assert not got or reason == "ok", name


@pytest.mark.parametrize("dtype,cfg", [(torch.float32, CFG), (torch.float64, CFG), (torch.bfloat16, BF16),
                                       (torch.float16, BF16)])
def test_elementwise_test_matches_torch_at_the_boundary(dtype, cfg):
    """Outputs placed a few ulps either side of atol + rtol |r|: the fast path's float test must
    round as torch's does, element by element (a verdict hangs on one element)."""
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    r = (torch.randn(CHUNK + 999, generator=_g(7), dtype=torch.float64) * 3).to(dtype)
    rw = r.to(wide)
    tol = cfg.atol + cfg.rtol * rw.abs()
    steps = torch.tensor([-3, -2, -1, 0, 1, 2, 3], dtype=wide).repeat(r.numel() // 7 + 1)[: r.numel()]
    sign = torch.where(torch.arange(r.numel()) % 2 == 0, 1.0, -1.0).to(wide)
    o = (rw + sign * (tol + steps * torch.finfo(wide).eps * tol)).to(dtype)
    expect = ((o.to(wide) - rw).abs() <= cfg.atol + cfg.rtol * rw.abs()).numpy()
    npw = np.float64 if wide == torch.float64 else np.float32
    facts = compare.ref_facts(r, cfg)
    buf = np.empty(r.numel(), npw), np.empty(r.numel(), npw)
    oc = compare._widen(compare._np_flat(o), 0, r.numel(), buf[0])
    rc = compare._widen(facts.flat, 0, r.numel(), buf[1])
    got = np.abs(oc - rc) <= np.abs(rc) * npw(cfg.rtol) + npw(cfg.atol)
    assert 0 < expect.sum() < expect.size  # both sides of the boundary are there
    assert (got == expect).all(), int((got != expect).sum())
    # and per element, the fast path agrees: failing elements are never called ok
    for i in np.flatnonzero(~expect)[:5]:
        one = r.clone()
        one_o = r.clone()
        one_o.view(-1)[i] = o.view(-1)[i]
        assert not compare._cmp_fast(one, one_o, cfg, compare.ref_facts(one, cfg))


def _group(seed, n_trials=3, shape=(64, 256)):
    g = _g(seed)
    return [[torch.randn(shape, generator=g), torch.randn(shape[0], generator=g)] for _ in range(n_trials)]


def test_judge_outputs_same_verdicts_with_the_memo_and_facts_once_per_reference():
    ref_trials = _group(0)
    ref = {"trials": ref_trials, "second": [torch.randn(32, 256, generator=_g(1)), torch.randn(32, generator=_g(2))]}
    ok = {"trials": [[t + 1e-4 for t in tr] for tr in ref_trials], "second": [t + 1e-4 for t in ref["second"]]}
    cached = {"trials": [ok["trials"][0]] * 3, "second": ok["second"]}
    nan = {"trials": [tr[:1] + [tr[1].clone().fill_(float("nan"))] for tr in ok["trials"]], "second": ok["second"],
           "trial_reused": [False, True, True]}
    bad_second = {"trials": ok["trials"], "second": [ok["second"][0] * 2, ok["second"][1]]}
    memo = FactsMemo()
    group = [ok, cached, nan, bad_second]
    for cand in group:
        assert judge_outputs(ref, cand, CFG, memo) == judge_outputs(ref, cand, CFG)
    assert [judge_outputs(ref, c, CFG, memo)[0] for c in group] == ["ok", "output_cached", "uninitialized_output", "shape_hardcoded"]
    # every reference tensor once (3 trials and the second shape, 2 outputs each), trials 0 and 1 compared once
    assert memo.computed == 4 * 2 + 1
    for cand in group:  # the rest of a GRPO group of 8: nothing new to compute
        judge_outputs(ref, cand, CFG, memo)
    assert memo.computed == 4 * 2 + 1


def test_memo_is_shared_safely_by_threads():
    ref = {"trials": _group(3, 5, (256, 1024)), "second": None}
    cand = {"trials": [[t + 1e-4 for t in tr] for tr in ref["trials"]], "second": None}
    memo = FactsMemo()
    got = []
    ts = [threading.Thread(target=lambda: got.append(judge_outputs(ref, cand, CFG, memo))) for _ in range(8)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    assert got == [("ok", "")] * 8
    assert memo.computed == 5 * 2 and memo.fast == 8 * 5 * 2


def test_memo_is_keyed_by_the_reference_object():
    """A different tensor with the same id (the first one freed) must not reuse its facts."""
    memo = FactsMemo()
    a = torch.randn(1000, generator=_g(1))
    assert memo.facts(a, CFG).eligible
    b = torch.full((1000,), float("nan"))
    memo._facts[("facts", id(b), CFG.atol, CFG.rtol)] = (a, memo.facts(a, CFG))  # a stale entry under b's id
    assert not memo.facts(b, CFG).eligible


def test_judge_rounds_kept_outputs_through_the_memo(monkeypatch):
    plan = TimingPlan(warmup=1, repeats=2, seeds=[1, 2, 3], keep=[1, 2], atol=CFG.atol, rtol=CFG.rtol)
    outs = {1: [torch.randn(128, 512, generator=_g(1))], 2: [torch.randn(128, 512, generator=_g(2))]}
    ref = {"rounds": [{"fp": [[0.0, 0.0, 0.0]], "scale": [1.0]}] * 3, "round_outputs": outs}
    session = RoundSession(plan)
    session.fps = {j: [[0.0, 0.0, 0.0]] for j in range(3)}
    session.keys = {j: "k" for j in range(3)}
    session.done = True
    keys = {j: "k" for j in range(3)}
    good = {j: [o[0] + 1e-4] for j, o in outs.items()}
    bad = {1: good[1], 2: [outs[2][0] * 1.05]}
    memo = FactsMemo()
    for kept in (good, bad):
        assert judge_rounds(ref, session, kept, CFG, keys, memo) == judge_rounds(ref, session, kept, CFG, keys)
    assert judge_rounds(ref, session, bad, CFG, keys, memo)[0] == "incorrect_under_timing"

    def no_exact(*a):
        raise AssertionError("fell back to _cmp")

    monkeypatch.setattr(compare, "_cmp", no_exact)
    assert judge_rounds(ref, session, good, CFG, keys, memo) == ("ok", "")


def _torch_facts(ref, cfg):
    """`_cmp`'s own expressions for what RefFacts holds: (all finite, r_spread, a constant passes)."""
    r = ref.to(torch.float64 if ref.dtype == torch.float64 else torch.float32)
    finite = torch.isfinite(r)
    r_var = r[finite]
    if not bool(finite.all()) or r_var.numel() < 2:
        return bool(finite.all()), 0.0, False
    mean = float(r_var.mean())
    passes = bool(((r_var - mean).abs() <= cfg.atol + cfg.rtol * r_var.abs()).all())
    return True, float(r_var.max() - r_var.min()), passes


@pytest.mark.parametrize("dtype,cfg", [(torch.float32, CFG), (torch.float64, CFG), (torch.bfloat16, BF16)])
def test_reference_facts_match_torch_where_a_constant_starts_to_pass(dtype, cfg):
    """References scaled across the point where their mean passes the tolerance (a few thousand
    elements, and one crossing chunks, non-contiguous too): eligible exactly when `_cmp` would not
    run its variation test, and the same spread."""
    base = torch.randn(2 * CHUNK + 5, generator=_g(11), dtype=torch.float64)
    flips = 0
    for scale in np.geomspace(1e-3, 5e-3, 40):
        for r in ((base * scale).to(dtype), (base[:6000] * scale).to(dtype).view(60, 100).t()):
            finite, spread, passes = _torch_facts(r, cfg)
            f = compare.ref_facts(r, cfg)
            assert f.eligible == (finite and not passes), (scale, r.shape)
            if f.eligible:
                assert f.spread == spread
            flips += passes
    assert 0 < flips < 80  # both sides were seen


def test_warm_computes_every_reference_fact_once():
    ref = {"trials": _group(0), "second": [torch.randn(32, 256, generator=_g(1))],
           "round_outputs": {4: [torch.randn(64, 256, generator=_g(2))]}}
    memo = FactsMemo()
    memo.warm(ref, CFG)
    n = memo.computed
    assert n == 3 * 2 + 1 + 1 + 2  # six trial tensors, the second shape, one kept round, two trial pairs
    cand = {"trials": [[t + 1e-4 for t in tr] for tr in ref["trials"]], "second": [ref["second"][0] + 1e-4]}
    assert judge_outputs(ref, cand, CFG, memo) == ("ok", "")
    assert memo.computed == n
