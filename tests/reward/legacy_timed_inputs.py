"""A frozen copy of the timed rounds' harness functions as they were before issue 28's cuts
(opsynth.reward.timed_inputs at 5f795c9: a device sync per output and per input; the child's
channel reading a reply a byte at a time): what tests/reward/test_timed_inputs_one_transfer.py
holds the current functions to, value for value, and what benchmarks/round_overhead.py times
beside them. Not used by the reward."""

from __future__ import annotations

import os

FP_PROJECTIONS = 3
FP_SIGMAS = 6.0
_CHUNK = 1 << 22
_COMMON_SEED = 0x5EED_C0DE
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
        b.copy_(torch.gather(s, 0, choices[key]).squeeze(0))


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


def fingerprint(outs: list) -> list[list]:
    """Per output: [projection x (FP_PROJECTIONS + 1), non-finite count, non-finite hash] for
    floating outputs, [exact hash, element count] for integer and bool ones (plain numbers).
    One pass in the usual case (no NaN or infinity: the projections come out finite)."""
    import torch

    res = []
    for o in outs:
        x = _flat(o)
        if not x.is_floating_point():
            h = sum(int((c.to(torch.int64) * m).sum()) for c, _, m in _chunks(x)) if x.numel() else 0
            res.append([h & (2**62 - 1), x.numel()])
            continue
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
        res.append([*proj.tolist(), bad, code_hash])
    return res


def tolerance(outs: list, atol: float, rtol: float) -> list[float]:
    """Per output: the standard deviation of a projection when every finite element is off by its
    full tolerance atol + rtol |r| (0 for integer outputs, compared exactly). Chunks share weights,
    so their tolerances add up per weight before squaring."""
    import torch

    res = []
    for o in outs:
        x = _flat(o)
        if not x.is_floating_point():
            res.append(0.0)
            continue
        acc = None
        for c, _, _ in _chunks(x):
            c = c.to(torch.float64)
            t = torch.where(torch.isfinite(c), atol + rtol * c.abs(), torch.zeros((), dtype=torch.float64, device=c.device))
            if acc is None:
                acc = t
            else:
                acc[:t.numel()] += t
        res.append(float((acc * acc).sum()) ** 0.5 if acc is not None else 0.0)
    return res


def input_key(buffers: list) -> int:
    """An exact hash of the bits of every tensor input: distinct keys, distinct input sets."""
    import torch

    h = 0
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
        part = sum(int((c.to(torch.int64) * m).sum()) for c, _, m in _chunks(bits.reshape(-1)))
        h = (h * 1000003 + part) & (2**63 - 1)
    return h


class Channel:  # reads its reply a byte at a time (raw FileIO.readline)
    """JSON lines to the parent over the child's channel (the build channel's socket); the parent
    answers every line, in order."""

    def __init__(self, fd: int | None):
        if fd is None:
            raise RuntimeError("no channel to the parent in this child")
        self.f = os.fdopen(fd, "r+b", buffering=0, closefd=False)

    def request(self, req: dict) -> dict:
        import json

        self.f.write(json.dumps(req).encode() + b"\n")
        line = b""
        while not line.endswith(b"\n"):
            chunk = self.f.readline()
            if not chunk:
                raise RuntimeError("the parent closed the channel")
            line += chunk
        return json.loads(line)
