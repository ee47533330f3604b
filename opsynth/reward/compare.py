"""Judge the candidate's outputs against the reference's, in the trusted parent process.

Order: structure (count, type, shape, dtype), poisoned memory, cached outputs, near-constant
outputs, tolerance (atol = rtol = 1e-2), the second shape. The timed calls are judged after these
(opsynth.reward.rounds.judge_rounds).
"""

from __future__ import annotations


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


def _cmp_list(refs: list, outs: list, cfg) -> tuple[str, str]:
    if len(refs) != len(outs):
        return "wrong_shape", f"{len(outs)} outputs, expected {len(refs)}"
    for i, (r, o) in enumerate(zip(refs, outs)):
        reason, detail = _cmp(r, o, cfg)
        if reason != "ok":
            return reason, f"output {i}: {detail}"
    return "ok", ""


def _same(a: list, b: list) -> bool:
    import torch

    return len(a) == len(b) and all(
        x.shape == y.shape and x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b)
    )


def judge_outputs(ref: dict, cand: dict, cfg) -> tuple[str, str]:
    """('ok', '') or (reason, detail) for a candidate's saved outputs."""
    ref_trials, cand_trials = ref["trials"], cand["trials"]
    if len(cand_trials) != len(ref_trials):
        return "crashed", "candidate produced a different number of trials"
    for k, (r, o) in enumerate(zip(ref_trials, cand_trials)):
        if k > 0 and _same(o, cand_trials[k - 1]) and not _same(r, ref_trials[k - 1]):
            return "output_cached", f"trial {k} returned the previous trial's output for new inputs"
        reason, detail = _cmp_list(r, o, cfg)
        if reason == "uninitialized_output" and k < len(cand.get("trial_reused") or []) and cand["trial_reused"][k]:
            return "stale_output", f"trial {k} returned an earlier call's output tensor again without writing it (it was poisoned after that call): {detail}"
        if reason != "ok":
            return reason, f"trial {k}: {detail}"
    if ref.get("second") is not None:
        if cand.get("second") is None:
            return "shape_hardcoded", "no output for the second shape"
        reason, detail = _cmp_list(ref["second"], cand["second"], cfg)
        if reason != "ok":
            return "shape_hardcoded", f"second shape (batch_size changed): {reason}: {detail}"
    return "ok", ""
