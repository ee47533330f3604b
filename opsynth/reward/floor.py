"""The physical floor: the least time a forward can take on the device, below which a timing is a lie.

Enforced: the bytes of the outputs, which every correct forward must write, over the device's peak
memory bandwidth. Reported, not enforced: the task's FLOPs (counted on the reference Model by
`opsynth.render.cost.forward_cost`) over the peak throughput for the output dtype. FLOPs are no
floor: an algebraic rewrite (a matmul followed by a sum is a matrix-vector product) legitimately
does far fewer, and so do reads of inputs a task only slices. A candidate time below the floor is
re-measured (`opsynth.reward.rounds`) and, when it holds, rejected (`below_physical_floor`).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Peak:
    bandwidth: float  # bytes per second
    flops: dict  # dtype name -> FLOP per second


# The one place the device peaks live. H200 SXM: 4.8 TB/s HBM3e, ~67 TFLOP/s fp32 (non-tensor),
# ~990 TFLOP/s dense bf16/fp16 tensor cores (tf32 ~495). The CPU figures are generous on purpose
# (caches of a large server, all cores): a floor that is too low only lets more through.
PEAKS: dict[str, Peak] = {
    "cuda": Peak(4.8e12, {"float32": 67e12, "float64": 34e12, "bfloat16": 990e12, "float16": 990e12}),
    "cpu": Peak(1.0e12, {"float32": 10e12, "float64": 5e12, "bfloat16": 20e12, "float16": 20e12}),
}
REMEASURE_SLACK = 1.0  # the re-measured median must also be below floor * this to be rejected


_ITEM = {"float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "int64": 8, "int32": 4, "int16": 2,
         "int8": 1, "uint8": 1, "bool": 1, "complex64": 8, "complex128": 16}


def output_bytes(meta: list) -> int:
    """Bytes of the outputs from their [shape, dtype] records (the reference child's output_meta)."""
    total = 0
    for shape, dtype in meta or []:
        n = 1
        for d in shape:
            n *= int(d)
        total += n * _ITEM.get(str(dtype), 4)
    return total


def floor_ms(meta: list, device: str) -> float:
    """The enforced floor: outputs written at peak bandwidth, in milliseconds."""
    return output_bytes(meta) / PEAKS[device].bandwidth * 1e3


def flop_bound_ms(flops: float | None, meta: list, device: str) -> float | None:
    """The task's FLOPs at the device's peak for the first output's dtype (reported only)."""
    if not flops:
        return None
    dtype = str(meta[0][1]) if meta else "float32"
    peak = PEAKS[device].flops.get(dtype, PEAKS[device].flops["float32"])
    return flops / peak * 1e3
