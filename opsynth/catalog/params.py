"""Values for operator parameters, chosen by parameter *name* and the input shape.

Operators are mined from torch, so nobody writes a per-operator recipe: a parameter called
`in_channels` is always the input's dimension 1, `kernel_size` is always a small odd number, and
so on. An operator whose required parameters have no rule here is excluded from the catalog
(with that reason), rather than guessed at.
"""

from __future__ import annotations

import random
from dataclasses import dataclass


class NoRule(KeyError):
    """A required parameter has no value rule; the operator cannot be sampled."""


@dataclass
class ParamContext:
    shape: tuple[int, ...]
    rng: random.Random
    scale: float = 1.0
    values: dict | None = None  # parameters chosen so far for this operator (e.g. kernel_size before padding)

    def size(self, choices, floor: int = 1) -> int:
        return max(floor, int(round(self.rng.choice(choices) * self.scale)))

    @property
    def rank(self) -> int:
        return len(self.shape)

    def feature_dim(self) -> int:
        """A non-batch dimension index (1 for ranks >= 2)."""
        return 1 if self.rank >= 2 else 0


# Parameters that copy a dimension of the input: name -> index into the input shape.
DERIVED_DIMS = {
    "in_channels": 1,
    "num_features": 1,
    "num_channels": 1,
    "in_features": -1,
    "embed_dim": -1,
    "hidden_size": -1,
    "dim_model": -1,
}

# Size-like parameters: their values are normalised away in canonical signatures.
SIZE_PARAMS = frozenset(
    {"out_channels", "out_features", "num_embeddings", "embedding_dim", "intermediate_size", "output_size",
     "normalized_shape", "num_attention_heads", "num_key_value_heads", "head_dim"}
    | set(DERIVED_DIMS)
)


def _divisor(n: int, choices, rng: random.Random) -> int:
    ok = [c for c in choices if n % c == 0]
    return rng.choice(ok) if ok else 1


def _dim(ctx: ParamContext) -> int:
    if ctx.rank <= 1:
        return 0
    return ctx.rng.randrange(1, ctx.rank)


def value_for(name: str, ctx: ParamContext):
    """Return (value, derived_dim) for parameter `name`; derived_dim is set when it copies an input dim."""
    rng, shape = ctx.rng, ctx.shape
    if name in DERIVED_DIMS:
        idx = DERIVED_DIMS[name]
        if ctx.rank < 2 and idx == 1:
            raise NoRule(name)
        return int(shape[idx]), idx % ctx.rank
    if name == "out_channels":
        return ctx.size([8, 16, 32, 64, 128], floor=2), None
    if name == "out_features":
        return ctx.size([64, 128, 256, 512, 1024], floor=4), None
    if name == "kernel_size":
        return rng.choice([1, 3, 3, 3, 5]), None
    if name == "stride":
        return rng.choice([1, 1, 2]), None
    if name == "padding":
        k = (ctx.values or {}).get("kernel_size")
        if k is None:  # padding modules: a pad width
            return rng.choice([1, 2]), None
        return rng.choice([0, k // 2]), None
    if name == "num_groups":
        return _divisor(shape[1], [2, 4, 8], rng), None
    if name == "groups":  # ChannelShuffle
        return _divisor(shape[1], [2, 4], rng), None
    if name == "normalized_shape":
        return int(shape[-1]), None
    if name in ("dim", "axis"):
        return _dim(ctx), None
    if name in ("dim0", "dim1"):
        dims = list(range(1, ctx.rank)) if ctx.rank > 2 else [0, 1]
        a, b = rng.sample(dims, 2) if len(dims) >= 2 else (0, 1)
        chosen = (ctx.values or {}).get("dim0")
        return (a if name == "dim0" else (b if b != chosen else a)), None
    if name == "dims":  # a permutation that keeps the batch dimension first (also valid for flip)
        rest = list(range(1, ctx.rank))
        rng.shuffle(rest)
        return tuple([0, *rest]), None
    if name == "keepdim":
        return rng.choice([False, True]), None
    if name == "start_dim":
        return 1, None
    if name == "negative_slope":
        return rng.choice([0.01, 0.1, 0.2]), None
    if name in ("alpha", "beta"):
        return rng.choice([0.5, 1.0, 2.0]), None
    if name == "lambd":
        return rng.choice([0.25, 0.5]), None
    if name == "threshold":
        return rng.choice([0.0, 0.5]), None
    if name == "value":
        return rng.choice([0.0, 0.1]), None
    if name in ("min_val", "min"):
        return rng.choice([-1.0, -0.5]), None
    if name in ("max_val", "max"):
        return rng.choice([0.5, 1.0]), None
    if name == "exponent":
        return rng.choice([2.0, 3.0]), None
    if name == "output_size":
        return rng.choice([1, 2, 4, 8]), None
    if name == "scale_factor":
        return 2, None
    if name in ("upscale_factor", "downscale_factor"):
        return 2, None
    if name == "num_embeddings":
        return ctx.size([1000, 5000, 10000], floor=16), None
    if name == "embedding_dim":
        return ctx.size([64, 128, 256], floor=4), None
    if name == "size":  # LocalResponseNorm
        return rng.choice([3, 5]), None
    if name == "norm_type":
        return 2.0, None
    if name == "diagonal":
        return 0, None
    if name == "p":
        return 2.0, None
    if name == "k":
        return 1, None
    if name == "maxnorm":  # renorm
        return rng.choice([0.5, 1.0]), None
    if name == "shifts":  # roll
        return rng.choice([1, 2, 3]), None
    if name == "repeats":  # repeat_interleave
        return 2, None
    if name in ("source", "destination"):  # movedim: two different non-batch dimensions
        if ctx.rank < 3:  # only the batch and one other dimension: nothing to move (this rank fails)
            raise ValueError("movedim needs two non-batch dimensions")
        taken = (ctx.values or {}).get("source")
        return rng.choice([d for d in range(1, ctx.rank) if d != taken]), None
    if name == "start":  # narrow: from the start or one in, along the chosen dim
        return rng.choice([0, 1]), None
    if name == "length":
        v = ctx.values or {}
        if "dim" not in v or "start" not in v:
            raise NoRule(name)
        return max(1, (int(shape[v["dim"]]) - v["start"]) // 2), None
    raise NoRule(name)


def fill_params(names, ctx: ParamContext) -> tuple[dict, dict]:
    """Values for `names` in order (later rules may read earlier values); returns (values, derived)."""
    values: dict = {}
    derived: dict = {}
    ctx.values = values
    for name in names:
        v, d = value_for(name, ctx)
        values[name] = v
        if d is not None:
            derived[name] = d
    return values, derived
