"""Judge the candidate's outputs against the reference's, in the trusted parent process.

Order: structure (count, type, shape, dtype), poisoned memory, cached outputs, near-constant
outputs, tolerance (atol = rtol = 1e-2), the second shape. The timed calls are judged after these
(opsynth.reward.rounds.judge_rounds).

`_cmp` is the one definition of a verdict on a tensor. Judging runs in the parent for every
candidate (measured on the H200: 2 s one at a time, 8-10 s with 8 in flight, the largest part of an
evaluation), so `_cmp_fast` goes first: facts about a reference tensor computed once (`RefFacts`,
kept in a `FactsMemo` with the reference: a GRPO group judges 8 candidates against one), then one
chunked numpy pass over the candidate that can only answer "ok". Whenever it is not sure (an
element outside the tolerance, a non-finite value, a near-constant output, a reference where a
constant would pass, any structural difference) `_cmp` decides, so verdicts and reasons are `_cmp`'s.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

CHUNK = 1 << 16  # elements per numpy pass: the temporaries stay in cache and each call releases the GIL


def as_output_list(out) -> list:
    """A forward's result as a list of outputs (a lone tensor becomes a one-item list)."""
    if isinstance(out, (tuple, list)):
        return list(out)
    return [out]


def _close(o, r, finite, atol: float, rtol: float) -> bool:
    """torch.allclose(o, r, atol, rtol, equal_nan=True), in fewer passes over memory (3x faster on CPU).

    Finite reference values need |o - r| <= atol + rtol |r|; NaN and infinities must match exactly.
    """
    import torch

    if bool(finite.all()):
        return bool(((o - r).abs() <= atol + rtol * r.abs()).all())
    of, rf = o[finite], r[finite]
    if not bool(((of - rf).abs() <= atol + rtol * rf.abs()).all()):
        return False
    on, rn = o[~finite], r[~finite]
    return bool(((on == rn) | (torch.isnan(on) & torch.isnan(rn))).all())


def _cmp(ref, out, cfg) -> tuple[str, str]:
    """'ok' or a named reason for one output tensor."""
    import torch

    if type(out) is not torch.Tensor:
        return "tensor_subclass", f"output is {type(out).__name__}"
    if tuple(out.shape) != tuple(ref.shape):
        return "wrong_shape", f"shape {tuple(out.shape)}, expected {tuple(ref.shape)}"
    if out.dtype != ref.dtype:
        if (ref.dtype in (torch.bfloat16, torch.float16) and out.is_floating_point()
                and torch.finfo(out.dtype).bits > torch.finfo(ref.dtype).bits):
            return "fp32_upcast", f"dtype {out.dtype}, expected {ref.dtype}: computed in a wider precision than the task's"
        return "wrong_dtype", f"dtype {out.dtype}, expected {ref.dtype}"
    if not (ref.is_floating_point() or ref.is_complex()):
        return ("ok", "") if torch.equal(out, ref) else ("incorrect", "integer/bool output differs")
    # float32 is exact enough for a 1e-2 tolerance and moves half the bytes of float64: judging runs
    # in the parent for every candidate (measured on the H200: the parent's judging was the bottleneck).
    wide = torch.float64 if ref.dtype == torch.float64 else torch.float32
    o, r = out.to(wide), ref.to(wide)
    ref_nan = torch.isnan(r)
    if bool((torch.isnan(o) & ~ref_nan).any()):
        return "uninitialized_output", "NaN where the reference has none: output left unwritten (memory was poisoned with NaN)"
    finite = torch.isfinite(r)
    r_var = r[finite]
    o_var = o[finite]
    if r_var.numel() > 1:
        r_spread = float(r_var.max() - r_var.min())
        o_spread = float(o_var.max() - o_var.min()) if o_var.numel() else 0.0
        if r_spread > 0 and o_spread <= 1e-6 * max(1.0, r_spread):
            return "near_constant_output", f"output is constant ({o_spread:.3g} spread) while the reference spreads {r_spread:.3g}"
    if not _close(o, r, finite, cfg.atol, cfg.rtol):
        d = (o - r).abs()[finite]
        err = float(d.max()) if d.numel() else float("nan")
        if d.numel():
            k = int(d.argmax())
            rel = float(d[k] / r[finite][k].abs().clamp_min(1e-12))
            where = f"max abs error {err:.3g}, relative {rel:.3g} at flat index {k}"
        else:
            where = "non-finite values differ"
        if _close(o, r, finite, 10 * cfg.atol, 10 * cfg.rtol):
            return "low_precision", f"{where}: within 10x the tolerance only (reduced-precision compute)"
        return "incorrect", f"{where} (atol={cfg.atol}, rtol={cfg.rtol})"
    # Loose tolerances accept anything for near-zero outputs: then the candidate must also beat the
    # trivial constant answer by a clear margin (capture nearly all of the reference's variation).
    if r_var.numel() > 1:
        mean = float(r_var.mean())
        if bool(((r_var - mean).abs() <= cfg.atol + cfg.rtol * r_var.abs()).all()):  # a constant would pass
            resid = float(torch.linalg.vector_norm(o_var - r_var))
            spread = float(torch.linalg.vector_norm(r_var - r_var.mean()))
            if spread == 0 or resid > 0.1 * spread:
                o_spread = float(torch.linalg.vector_norm(o_var - o_var.mean()))
                why = f"tolerance is uninformative here (a constant passes) and the output misses {resid / max(spread, 1e-30):.0%} of the reference's variation"
                return ("near_constant_output" if o_spread < 0.1 * spread else "incorrect"), why
    return "ok", ""


@dataclass(frozen=True)
class RefFacts:
    """What the fast path needs to know about one reference tensor, computed as `_cmp` computes it.

    `eligible` is False for anything the fast path leaves to `_cmp`: a non-float dtype, a tensor
    that is not a plain CPU one, a non-finite value in it, no elements, or a reference where a
    constant passes the tolerance (then `_cmp`'s variation test decides, and it needs the candidate's norms)."""

    eligible: bool
    flat: object = None  # numpy, the values in row-major order (bfloat16 as its uint16 bits)
    spread: float = 0.0  # float(max - min) in the compared dtype, as `_cmp`'s r_spread


_FLOATS = ("float32", "float64", "float16", "bfloat16")


def _np_flat(t):
    """A numpy view of a plain CPU float tensor's values in row-major order (a copy only if strided)."""
    import numpy as np
    import torch

    flat = t.detach().reshape(-1)
    if t.dtype == torch.bfloat16:
        return flat.view(torch.int16).numpy().view(np.uint16)
    return flat.numpy()


def _plain(t) -> bool:
    import torch

    return (type(t) is torch.Tensor and t.device.type == "cpu" and t.layout == torch.strided
            and str(t.dtype).removeprefix("torch.") in _FLOATS and not t.is_neg() and not t.is_conj())


def ref_facts(ref, cfg) -> RefFacts:
    """RefFacts of one reference tensor under cfg's tolerance, as `_cmp` computes them: the mean
    by torch (its summation order), everything elementwise or order-free (finite, max, min, does a
    constant pass) in numpy chunks, rounded as torch rounds it (tests: against torch, at the boundary)."""
    import numpy as np
    import torch

    if not _plain(ref) or ref.numel() == 0:
        return RefFacts(False)
    wide = np.float64 if ref.dtype == torch.float64 else np.float32
    flat = _np_flat(ref)
    n = flat.shape[0]
    c = min(CHUNK, n)
    bw, bt, bd = (np.empty(c, wide) for _ in range(3))
    ok = np.empty(c, bool)
    lo = hi = None
    for s in range(0, n, CHUNK):
        rc = _widen(flat, s, min(s + CHUNK, n), bw)
        if not np.isfinite(rc, out=ok[: rc.shape[0]]).all():
            return RefFacts(False)  # `_cmp` handles non-finite references
        cmin, cmax = rc.min(), rc.max()
        lo = cmin if lo is None or cmin < lo else lo
        hi = cmax if hi is None or cmax > hi else hi
    if n == 1:
        return RefFacts(True, flat, 0.0)
    spread = float(hi - lo)  # r_var.max() - r_var.min(), in the compared dtype
    # float(r_var.mean()): r_var = r[finite] is r's values in row-major order, 1-D and contiguous,
    # which is what reshape(-1).contiguous() gives; the same reduction over the same memory layout.
    twide = torch.float64 if ref.dtype == torch.float64 else torch.float32
    mean = wide(float(ref.to(twide).reshape(-1).contiguous().mean()))
    atol, rtol = wide(cfg.atol), wide(cfg.rtol)
    for s in range(0, n, CHUNK):  # a constant (the mean) passes the tolerance: `_cmp`'s variation test decides
        rc = _widen(flat, s, min(s + CHUNK, n), bw)
        m = rc.shape[0]
        d = np.subtract(rc, mean, out=bd[:m])
        np.abs(d, out=d)
        t = np.abs(rc, out=bt[:m])
        np.multiply(t, rtol, out=t)
        np.add(t, atol, out=t)
        if not np.less_equal(d, t, out=ok[:m]).all():
            return RefFacts(True, flat, spread)
    return RefFacts(False)


class FactsMemo:
    """Facts about reference tensors (RefFacts per tensor and tolerance; whether two reference
    trials are equal), for every candidate judged against the same reference. Keyed by the
    reference object's identity, which the memo holds so the id stays its own. Thread-safe: the
    first thread to ask computes, the others wait for it."""

    def __init__(self):
        self._lock = threading.Lock()
        self._facts: dict = {}  # key -> (the reference object, its fact)
        self._busy: dict = {}  # key -> lock of the thread computing it
        self.computed = 0  # facts computed (tests: once per reference tensor)
        self.fast = 0  # tensors the fast path judged ok

    def _once(self, key, owner, compute):
        with self._lock:
            hit = self._facts.get(key)
            if hit is not None and hit[0] is owner:
                return hit[1]
            busy = self._busy.setdefault(key, threading.Lock())
        with busy:
            with self._lock:
                hit = self._facts.get(key)
                if hit is not None and hit[0] is owner:
                    return hit[1]
            fact = compute()
            with self._lock:
                self._facts[key] = (owner, fact)
                self._busy.pop(key, None)
                self.computed += 1
            return fact

    def facts(self, ref, cfg) -> RefFacts:
        return self._once(("facts", id(ref), cfg.atol, cfg.rtol), ref, lambda: ref_facts(ref, cfg))

    def same(self, ref_trials: list, k: int) -> bool:
        """_same(ref_trials[k], ref_trials[k - 1])."""
        return self._once(("same", id(ref_trials), k), ref_trials, lambda: _same(ref_trials[k], ref_trials[k - 1]))

    def warm(self, outputs: dict, cfg) -> None:
        """Compute the facts of every tensor of a reference's outputs now (trials, second shape, kept
        rounds): the reference is ready before its candidates, so none of them waits for them."""
        import torch

        def walk(x):
            if isinstance(x, torch.Tensor):
                self.facts(x, cfg)
            elif isinstance(x, (list, tuple)):
                for v in x:
                    walk(v)
            elif isinstance(x, dict):
                for v in x.values():
                    walk(v)

        walk([outputs.get("trials"), outputs.get("second"), outputs.get("round_outputs")])
        trials = outputs.get("trials") or []
        for k in range(1, len(trials)):
            self.same(trials, k)

    def count_fast(self) -> None:
        with self._lock:
            self.fast += 1


def _widen(a, start: int, end: int, buf):
    """float32 (or float64) values of a[start:end]: a view for float32/float64, else converted into buf."""
    import numpy as np

    part = a[start:end]
    if part.dtype == np.uint16:  # bfloat16 bits: the high half of a float32
        u = buf.view(np.uint32)[: end - start]
        np.copyto(u, part)
        np.left_shift(u, 16, out=u)
        return buf[: end - start]
    if part.dtype == np.float16:
        out = buf[: end - start]
        np.copyto(out, part)
        return out
    return part


def _cmp_fast(ref, out, cfg, facts: RefFacts) -> bool:
    """True only when `_cmp(ref, out, cfg)` is ("ok", ""): the same float32/float64 elementwise
    test (|o - r| <= atol + rtol |r|, each step rounded as torch rounds it) and the same
    near-constant test, in chunks; False means "not sure", never "wrong"."""
    import numpy as np
    import torch

    if not facts.eligible or not _plain(out) or out.dtype != ref.dtype or tuple(out.shape) != tuple(ref.shape):
        return False
    wide = np.float64 if ref.dtype == torch.float64 else np.float32
    o, r = _np_flat(out), facts.flat
    n = r.shape[0]
    atol, rtol = wide(cfg.atol), wide(cfg.rtol)  # torch casts a Python scalar to the tensor's dtype
    c = min(CHUNK, n)
    bo, br, bd, bt = (np.empty(c, wide) for _ in range(4))
    ok = np.empty(c, bool)
    lo, hi = None, None
    for s in range(0, n, CHUNK):
        e = min(s + CHUNK, n)
        m = e - s
        oc, rc = _widen(o, s, e, bo), _widen(r, s, e, br)
        d = np.subtract(oc, rc, out=bd[:m])
        np.abs(d, out=d)
        t = np.abs(rc, out=bt[:m])
        np.multiply(t, rtol, out=t)
        np.add(t, atol, out=t)
        if not np.less_equal(d, t, out=ok[:m]).all():  # also False for NaN or an infinity in out
            return False
        cmin, cmax = oc.min(), oc.max()
        lo = cmin if lo is None or cmin < lo else lo
        hi = cmax if hi is None or cmax > hi else hi
    if n > 1 and facts.spread > 0 and float(hi - lo) <= 1e-6 * max(1.0, facts.spread):
        return False  # near-constant: `_cmp` words it
    return True


def _cmp_memo(ref, out, cfg, memo: FactsMemo | None) -> tuple[str, str]:
    """`_cmp`, through the fast path when a memo of the reference's facts is at hand."""
    if memo is not None and _cmp_fast(ref, out, cfg, memo.facts(ref, cfg)):
        memo.count_fast()
        return "ok", ""
    return _cmp(ref, out, cfg)


def _cmp_list(refs: list, outs: list, cfg, memo: FactsMemo | None = None) -> tuple[str, str]:
    if len(refs) != len(outs):
        return "wrong_shape", f"{len(outs)} outputs, expected {len(refs)}"
    for i, (r, o) in enumerate(zip(refs, outs)):
        reason, detail = _cmp_memo(r, o, cfg, memo)
        if reason != "ok":
            return reason, f"output {i}: {detail}"
    return "ok", ""


def _same(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)
    )


def judge_outputs(ref: dict, cand: dict, cfg, memo: FactsMemo | None = None) -> tuple[str, str]:
    """('ok', '') or (reason, detail) for a candidate's saved outputs. `memo`: the reference's
    FactsMemo, shared by every candidate judged against `ref` (the verdict is the same without it)."""
    ref_trials, cand_trials = ref["trials"], cand["trials"]
    if len(cand_trials) != len(ref_trials):
        return "crashed", "candidate produced a different number of trials"
    for k, (r, o) in enumerate(zip(ref_trials, cand_trials)):
        if k > 0 and _same(o, cand_trials[k - 1]) and not (memo.same(ref_trials, k) if memo is not None else _same(r, ref_trials[k - 1])):
            return "output_cached", f"trial {k} returned the previous trial's output for new inputs"
        reason, detail = _cmp_list(r, o, cfg, memo)
        if reason == "uninitialized_output" and k < len(cand.get("trial_reused") or []) and cand["trial_reused"][k]:
            return "stale_output", f"trial {k} returned an earlier call's output tensor again without writing it (it was poisoned after that call): {detail}"
        if reason != "ok":
            return reason, f"trial {k}: {detail}"
    if ref.get("second") is not None:
        if cand.get("second") is None:
            return "shape_hardcoded", "no output for the second shape"
        reason, detail = _cmp_list(ref["second"], cand["second"], cfg, memo)
        if reason != "ok":
            return "shape_hardcoded", f"second shape (batch_size changed): {reason}: {detail}"
    return "ok", ""
