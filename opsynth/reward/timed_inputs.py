"""Fresh inputs for every timed call, and fingerprints of the outputs (the same code in both children).

Why: a timing loop that cycles a handful of input sets lets a cache keyed on a few input elements
hit after one pass, and a call that returns an earlier result goes unnoticed unless it is checked.
So every timed call gets inputs of its own, made outside the timed region from a seed the parent
reveals only when that call is due, and every timed output is fingerprinted; the reference child
computes the same fingerprints for the same seeds, and the parent compares them.

Fresh inputs are an element-wise random choice among the trial input sets: each element keeps its
position and comes from one trial, so dtype, value set and per-position distribution are the
trials' own (integer indices stay in range; what all trials share, position ids or masks, stays as
it is). Inputs of one shape share one choice, so element-wise pairs (x_i, y_i) come from one trial.

A fingerprint of a floating output is a few random-sign projections of its finite values, and the
count and a hash of where it is NaN or infinite. An output within atol + rtol |r| of the reference element
by element moves a projection by at most FP_SIGMAS standard deviations of such an error (Hoeffding:
a false alarm about 3e-8 per projection); a stale output, off by O(|r|), misses it.

A round's numbers (every output's projections or hash, the inputs' hash) are computed on the device
and read on the host together, in one transfer (`fingerprints_and_key`): on CUDA every read of a
device value (`int(t)`, `bool(t)`, `.tolist()`) waits for the device, and a round used to wait once
per output, per input and per chunk. The values are exactly the ones read one by one: the same
device ops make each projection and each chunk's integer sum, and the host adds them up in the same
order, in the same float64 or integer arithmetic (tests/reward/test_timed_inputs_one_transfer.py
holds them to a frozen copy of the functions that read them one by one). Only an output whose
projections come out NaN or infinite (NaN or infinity in it: rare, and wrong unless the reference
has them too) takes the slower path that separates its non-finite values (`_float_fingerprint_synced`).
"""

from __future__ import annotations

import math

FP_PROJECTIONS = 3  # random-sign projections of each floating output, beyond the first
FP_SIGMAS = 6.0
_CHUNK = 1 << 22  # elements per projection chunk (bounds the signs' memory)
_COMMON_SEED = 0x5EED_C0DE  # the projections' weights (the same in every call and child)
_MIX = 0x9E3779B97F4A7C15


def _gen(device, seed: int):
    import torch

    g = torch.Generator(device=device)
    g.manual_seed(int(seed) % (2**63 - 1))
    return g


def fresh_inputs(buffers: list, stacked: list, seed: int) -> None:
    """Write call `seed`'s inputs into `buffers`: an element-wise choice among the trial sets
    (`stacked[i]`: input i of every trial, stacked on a new leading dimension; None for non-tensors)."""
    import torch

    choices: dict = {}
    for i, (b, s) in enumerate(zip(buffers, stacked)):
        if s is None or not isinstance(b, torch.Tensor) or b.numel() == 0:
            continue
        key = (tuple(b.shape), str(b.device))
        if key not in choices:
            g = _gen(b.device, (seed * 1000003 + len(choices) * _MIX) & (2**62 - 1))
            pick = torch.randint(0, s.shape[0], (1, *b.shape), generator=g, device=b.device, dtype=torch.uint8)
            choices[key] = pick.long()  # uint8 draws are several times cheaper than int64 ones
        if b.dtype == s.dtype and b.is_contiguous():
            torch.gather(s, 0, choices[key], out=b.unsqueeze(0))  # straight into the buffer: one kernel less
        else:
            b.copy_(torch.gather(s, 0, choices[key]).squeeze(0))


def stack_trials(trials: list[list]) -> list:
    """Per input position, the trials' tensors stacked (what fresh_inputs draws from)."""
    import torch

    out = []
    for i, x in enumerate(trials[0]):
        if isinstance(x, torch.Tensor):
            out.append(torch.stack([t[i] for t in trials]))
        else:
            out.append(None)
    return out


def _flat(o):
    import torch

    x = o.detach()
    if x.is_complex():
        x = torch.view_as_real(x)
    return x.reshape(-1)


_WEIGHTS: dict = {}


def _weights(n: int, device):
    """(FP_PROJECTIONS + 1) rows of random signs (float64) and one row of random int64 multipliers
    for `n` elements, drawn once per child from a fixed seed: the reference and the candidate get
    the same ones. Public is fine: matching a projection of the reference's output still takes
    that output; what matters is that an honest error does not depend on them."""
    import torch

    key = (n, str(device))
    if key not in _WEIGHTS:
        g = _gen(device, _COMMON_SEED)
        signs = torch.randint(0, 2, (FP_PROJECTIONS + 1, n), generator=g, device=device, dtype=torch.int8)
        mult = torch.randint(1, 2**31 - 1, (n,), generator=g, device=device, dtype=torch.int64)
        _WEIGHTS[key] = (signs.to(torch.float64).mul_(2).sub_(1), mult)
    return _WEIGHTS[key]


def _chunks(x):
    """(chunk, its weights) over x: chunks of _CHUNK elements share the first chunk's weights."""
    n = x.numel()
    width = max(1, min(n, _CHUNK))
    signs, mult = _weights(width, x.device)
    for lo in range(0, max(1, n), width):
        c = x[lo:lo + width]
        yield c, signs[:, :c.numel()], mult[:c.numel()]


# ---- one transfer a round ----------------------------------------------------------------------------
# Device values are queued (`_queue`: a float64 vector or an int64 scalar, kept as int64 bits) and
# read on the host together (`_fetch`: one copy per device), then made into the same numbers the
# one-by-one reads gave. Module functions and no module state that changes (the harness snapshot,
# opsynth.reward.guards.HarnessSnapshot, takes any rebinding of this module's names for a patch).

# Devices whose values are read at once (no device to wait for): on the CPU a small result kept
# alive while the next output's large temporaries come and go made glibc return and re-fault them
# (four times the page faults, twice the time). Tests empty it to run the transfer on the CPU.
_READ_NOW = ("cpu",)


def _int_sum(c, m):
    """sum(c * m) in int64 (wrapping), as `(c.to(torch.int64) * m).sum()`: the same values. A
    narrow integer chunk is widened inside the product (type promotion: each element cast to int64
    exactly as `.to` does) instead of by a copy first."""
    import torch

    if c.dtype in (torch.int8, torch.int16, torch.int32, torch.uint8):
        return (c * m).sum()
    return (c.to(torch.int64) * m).sum()


def _queue(q: dict, t) -> tuple:
    """Queue a float64 vector or an int64 scalar for the round's transfer: its slot, (device, first,
    end) in the transfer, or (None, its values) read at once (`_READ_NOW`)."""
    import torch

    v = t.reshape(-1)
    if v.device.type in _READ_NOW:
        return None, v.tolist()
    if v.dtype == torch.float64:
        v = v.view(torch.int64)  # its bits: floats and integers travel in one buffer
    parts = q.setdefault(v.device, [])
    lo = sum(p.numel() for p in parts)
    parts.append(v)
    return v.device, lo, lo + v.numel()


def _fetch(q: dict) -> dict:
    """{device: (the slots as ints, the slots as floats)}: one copy to the host per device (one sync)."""
    import torch

    got = {}
    for dev, parts in q.items():
        flat = parts[0] if len(parts) == 1 else torch.cat(parts)
        host = flat.cpu()
        got[dev] = (host.tolist(), host.view(torch.float64).tolist())
    return got


def _ints(got: dict, slots: list) -> list[int]:
    return [s[1][0] if s[0] is None else got[s[0]][0][s[1]] for s in slots]


def _floats(got: dict, slot: tuple) -> list[float]:
    if slot[0] is None:
        return slot[1]
    d, lo, hi = slot
    return got[d][1][lo:hi]


def _queue_fingerprint(q: dict, o):
    """Queue output o's device work; returns what makes its fingerprint from the fetched values."""
    import torch

    x = _flat(o)
    n = x.numel()
    if not x.is_floating_point():
        slots = [_queue(q, _int_sum(c, m)) for c, _, m in _chunks(x)] if n else []
        return lambda got: [sum(_ints(got, slots)) & (2**62 - 1), n]
    if n == 0:  # an empty projection is +0.0 (and 0.0 + 0.0 is too)
        return lambda got: [0.0] * (FP_PROJECTIONS + 1) + [0, 0]
    slots = [_queue(q, w @ c.to(torch.float64)) for c, w, _ in _chunks(x)]

    def make(got):
        proj = [0.0] * (FP_PROJECTIONS + 1)
        for slot in slots:
            p = _floats(got, slot)
            if not all(map(math.isfinite, p)):  # NaN or infinity in this output (or a projection's overflow)
                return _float_fingerprint_synced(x)
            proj = [a + b for a, b in zip(proj, p)]  # float64, in chunk order: as `proj += p` on the device
        return [*proj, 0, 0]

    return make


def _queue_key(q: dict, buffers: list):
    """Queue the inputs' hash's device work; returns what makes the hash from the fetched values."""
    import torch

    per_input = []
    for b in buffers:
        if not isinstance(b, torch.Tensor) or b.numel() == 0:
            continue
        x = b.detach().contiguous()
        if x.is_complex():
            x = torch.view_as_real(x).contiguous()
        if x.dtype == torch.bool:
            bits = x.to(torch.uint8)
        else:
            bits = x.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[x.element_size()])
        per_input.append([_queue(q, _int_sum(c, m)) for c, _, m in _chunks(bits.reshape(-1))])

    def make(got):
        h = 0
        for slots in per_input:
            h = (h * 1000003 + sum(_ints(got, slots))) & (2**63 - 1)
        return h

    return make


def fingerprint(outs: list) -> list[list]:
    """Per output: [projection x (FP_PROJECTIONS + 1), non-finite count, non-finite hash] for
    floating outputs, [exact hash, element count] for integer and bool ones (plain numbers).
    Read on the host in one transfer in the usual case (no NaN or infinity)."""
    return fingerprints_and_key(outs, [])[0]


def input_key(buffers: list) -> int:
    """An exact hash of the bits of every tensor input: distinct keys, distinct input sets."""
    return fingerprints_and_key([], buffers)[1]


def fingerprints_and_key(outs: list, buffers: list) -> tuple[list[list], int]:
    """(fingerprint(outs), input_key(buffers)) with one transfer to the host between them: what a
    timed round reports (opsynth.reward.rounds.run_rounds)."""
    q: dict = {}
    makes = [_queue_fingerprint(q, o) for o in outs]
    make_key = _queue_key(q, buffers)
    got = _fetch(q)
    return [m(got) for m in makes], make_key(got)


def _float_fingerprint_synced(x) -> list:
    """One floating output's fingerprint, chunk by chunk with a read of each (the path of an output
    with NaN or infinity: its non-finite values are counted and hashed by where they are)."""
    import torch

    proj = torch.zeros(FP_PROJECTIONS + 1, dtype=torch.float64, device=x.device)
    bad = code_hash = 0
    for c, w, _ in _chunks(x):
        v = c.to(torch.float64)
        p = w @ v
        if not bool(torch.isfinite(p).all()):
            fin = torch.isfinite(v)
            p = w @ torch.where(fin, v, torch.zeros((), dtype=torch.float64, device=v.device))
            code = torch.where(fin, 0.0, torch.where(torch.isnan(v), 1.0, torch.where(v > 0, 2.0, 3.0))).to(torch.float64)
            bad += int((~fin).sum())
            code_hash += float(w[0] @ code)  # small integers: exact in float64, whatever the order
        proj += p
    return [*proj.tolist(), bad, code_hash]


def tolerance(outs: list, atol: float, rtol: float) -> list[float]:
    """Per output: the standard deviation of a projection when every finite element is off by its
    full tolerance atol + rtol |r| (0 for integer outputs, compared exactly). Chunks share weights,
    so their tolerances add up per weight before squaring. Read on the host in one transfer."""
    import torch

    q: dict = {}
    slots: list = []
    for o in outs:
        x = _flat(o)
        if not x.is_floating_point():
            slots.append(None)
            continue
        acc = None
        for c, _, _ in _chunks(x):
            c = c.to(torch.float64)
            t = torch.where(torch.isfinite(c), atol + rtol * c.abs(), torch.zeros((), dtype=torch.float64, device=c.device))
            if acc is None:
                acc = t
            else:
                acc[:t.numel()] += t
        slots.append(_queue(q, (acc * acc).sum()) if acc is not None else None)
    got = _fetch(q)
    return [0.0 if s is None else _floats(got, s)[0] ** 0.5 for s in slots]


def fingerprints_match(cand: list, ref: list, scale: list[float]) -> tuple[bool, int, str]:
    """(match, output index, what differs) for one call's fingerprints."""
    if len(cand) != len(ref):
        return False, 0, f"{len(cand)} outputs, expected {len(ref)}"
    for k, (c, r, s) in enumerate(zip(cand, ref, scale)):
        if len(c) != len(r):
            return False, k, "integer/floating output kind differs"
        if len(r) == 2:  # integer or bool: exact
            if list(c) != list(r):
                return False, k, "integer/bool output differs"
            continue
        if c[-2:] != r[-2:]:
            return False, k, f"NaN/infinity pattern differs ({int(c[-2])} non-finite, expected {int(r[-2])})"
        bound = FP_SIGMAS * s + 1e-9 * (1.0 + max(abs(v) for v in r[:-2]))
        for a, b in zip(c[:-2], r[:-2]):
            if not abs(a - b) <= bound:
                return False, k, f"projection off by {abs(a - b):.4g} (allowed {bound:.4g})"
    return True, -1, ""
