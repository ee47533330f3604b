"""What one forward of a graph costs, counted on meta tensors: FLOPs, bytes moved and kernels.

The graph is replayed with the catalog's own call path (as the sampler's shape propagation does)
on the meta device under a dispatch mode that sees every aten call: each call that is not a view
is one kernel that reads its tensor inputs and writes its outputs, and the FLOPs of matmuls,
convolutions and attention come from torch's own FLOP formulas (`torch.utils.flop_counter`).
Nothing is allocated and nothing runs, so a replay costs milliseconds and gives the same numbers
on every machine: the basis for choosing sizes without reading a clock (`opsynth.verify.sizing`).

Sizes scale through ``batch_size`` alone (the task contract: the leading dimension of every input,
checked batch-independent by the sampler), so :func:`with_batch` rewrites a graph to another batch.
"""

from __future__ import annotations

import copy
import warnings
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from .opgraph import OpGraph

# Calls that only read metadata or allocate without writing: no kernel, nothing moved.
_FREE = {"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "empty", "empty_like", "empty_strided",
         "new_empty", "new_empty_strided", "_local_scalar_dense", "lift_fresh", "resize_", "_unsafe_view"}


@dataclass(frozen=True)
class Kernel:
    """One aten call that does work: its name, FLOPs, bytes read and written, elements produced,
    and the elements of the largest tensor it touches."""

    name: str
    flops: float
    bytes: float
    elements: float
    numel: float = 0.0


@dataclass(frozen=True)
class GraphCost:
    """The kernels of one forward at one batch size, and an estimate of its peak memory."""

    batch: int
    kernels: tuple[Kernel, ...]
    persistent_bytes: float  # inputs and parameters, alive for the whole forward
    peak_bytes: float  # persistent + the largest (inputs + outputs) of any one kernel
    input_bytes: float = 0.0  # the forward's inputs (part of persistent_bytes)
    output_bytes: float = 0.0  # what the forward returns

    @property
    def request_bytes(self) -> float:
        """What one verifier request holds at its worst, by what its eager checks keep alive
        (opsynth.verify.worker.Worker.eager): weights, two input sets (two seeds) and the clone a
        forward runs on, the outputs kept for comparison (the first forward's, the mode trace's,
        the other seed's) while another forward runs, and that forward's largest kernel.
        `peak_bytes` is the first forward alone (what the acceptance cap measures). The output
        count, 4, is a least-squares fit to CPU measurements (benchmarks/peak_memory.py): the
        allocator's free lists hold some of what the checks dropped."""
        return self.peak_bytes + 2 * self.input_bytes + 4 * self.output_bytes

    @property
    def max_numel(self) -> float:
        """Elements of the largest tensor any kernel reads or writes."""
        return max((k.numel for k in self.kernels), default=0.0)

    @property
    def flops(self) -> float:
        return sum(k.flops for k in self.kernels)

    @property
    def bytes(self) -> float:
        return sum(k.bytes for k in self.kernels)


class _Recorder(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.kernels: list[Kernel] = []
        self.largest = 0.0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        packet = func.overloadpacket
        name = packet.__name__
        if func.is_view or name in _FREE:
            return out
        ins = [t for t in tree_flatten((args, kwargs))[0] if isinstance(t, torch.Tensor)]
        outs = [t for t in tree_flatten(out)[0] if isinstance(t, torch.Tensor)]
        b_in = sum(_nbytes(t) for t in ins)
        b_out = sum(_nbytes(t) for t in outs)
        flops = 0.0
        formula = _flop_registry().get(packet)
        if formula is not None:
            try:
                flops = float(formula(*args, **kwargs, out_val=out))
            except Exception:  # noqa: BLE001 - a formula that does not cover this overload: count bytes only
                flops = 0.0
        self.kernels.append(Kernel(_kernel_name(name, args), flops, float(b_in + b_out),
                                   float(sum(t.numel() for t in outs)),
                                   float(max((t.numel() for t in ins + outs), default=0))))
        self.largest = max(self.largest, float(b_in + b_out))
        return out


def _kernel_name(name: str, args) -> str:
    """The aten name, with convolutions told apart by kind and rank (their speed differs most)."""
    if name in ("convolution", "_convolution") and len(args) > 6:
        dims = max(1, args[0].dim() - 2) if isinstance(args[0], torch.Tensor) else 0
        return f"conv_transpose{dims}d" if args[6] else f"conv{dims}d"
    return name


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


_REGISTRY: dict | None = None


def _flop_registry() -> dict:
    global _REGISTRY
    if _REGISTRY is None:
        from torch.utils.flop_counter import flop_registry

        _REGISTRY = dict(flop_registry)
    return _REGISTRY


def graph_batch(graph: OpGraph) -> int:
    """The graph's batch size: the leading dimension of its first input."""
    return int(graph.node(graph.input_nodes()[0])["shape"][0])


def with_batch(graph: OpGraph, batch: int) -> OpGraph:
    """A copy of ``graph`` whose batch size is ``batch``: the leading dimension of every input, and
    of every operator's input and output (the sampler checked that each follows the batch one for
    one; a scalar output has none)."""
    if batch < 1:
        raise ValueError(f"batch must be >= 1, got {batch}")
    g = OpGraph(copy.deepcopy(graph.g))
    delta = int(batch) - graph_batch(graph)
    for n in g.input_nodes():
        g.node(n)["shape"][0] += delta
    for n in g.op_nodes():
        d = g.node(n)
        for key in ("in_shape", "out_shape"):
            if d[key]:
                d[key][0] += delta
    return g


def replay_cost(graph: OpGraph, catalog, batch: int | None = None) -> GraphCost:
    """Run the graph on meta tensors at ``batch`` (default: its own) and count what it does."""
    from opsynth.catalog.call import apply, instantiate

    if batch is not None and batch != graph_batch(graph):
        graph = with_batch(graph, batch)
    meta = torch.device("meta")
    env: dict[str, torch.Tensor] = {}
    persistent = 0.0
    fdt = getattr(torch, graph.dtype)  # the task's precision: float tensors move its bytes
    for n in graph.input_nodes():
        d = graph.node(n)
        dtype = torch.int64 if d["dtype"] == "int64" else fdt
        env[n] = torch.empty(tuple(d["shape"]), dtype=dtype, device=meta)
        persistent += _nbytes(env[n])
    inputs = persistent
    rec = _Recorder()
    for n in graph.op_nodes():
        d = graph.node(n)
        spec = catalog.ops[d["op"]]
        src = next(u for u, _, e in graph.g.in_edges(n, data=True) if e["arg"] == 0)
        operand = d.get("operand")
        other = None
        if operand:
            kind = operand["kind"]
            if kind == "scalar":
                other = operand["value"]
            elif kind in ("param", "weight"):
                other = torch.empty(tuple(operand["shape"]), dtype=fdt, device=meta)
                persistent += _nbytes(other)
            elif kind == "node":
                other = env[operand["node"]]
        module = None
        if spec.kind == "module":
            with meta:  # built outside the recorder: initialisation is not part of the forward
                module = instantiate(spec, d["params"])
                if fdt != torch.float32:
                    module = module.to(fdt)
            persistent += sum(_nbytes(p) for p in module.parameters()) + sum(_nbytes(b) for b in module.buffers())
        with torch.no_grad(), rec, warnings.catch_warnings():
            warnings.simplefilter("ignore")  # e.g. losses' reduction notices: meta replay is not the task
            env[n] = apply(spec, env[src], d["params"], operand=other, module=module)
    outputs = float(sum(_nbytes(t) for t in tree_flatten(env[graph.output()])[0] if isinstance(t, torch.Tensor)))
    return GraphCost(graph_batch(graph), tuple(rec.kernels), persistent, persistent + rec.largest, inputs, outputs)


class AffineCost:
    """A graph's cost at any batch size from replays at two: every count of every kernel is affine
    in the batch size (each tensor's size is, by the batch-independence the sampler checks), so
    two replays determine them all; a third, far away, confirms it (else :meth:`fit` gives None and
    the caller replays each batch size it needs)."""

    def __init__(self, a: GraphCost, b: GraphCost):
        self.b0 = a.batch
        d = b.batch - a.batch
        self.names = [k.name for k in a.kernels]
        self.base = [(k.flops, k.bytes, k.elements, k.numel) for k in a.kernels]
        self.slope = [tuple((y - x) / d for x, y in zip(ka, kb)) for ka, kb in
                      zip(self.base, [(k.flops, k.bytes, k.elements, k.numel) for k in b.kernels])]
        self.persistent = (a.persistent_bytes, (b.persistent_bytes - a.persistent_bytes) / d)
        self.io = [(x, (y - x) / d) for x, y in ((a.input_bytes, b.input_bytes), (a.output_bytes, b.output_bytes))]

    @classmethod
    def fit(cls, replay, b0: int) -> "AffineCost | None":
        """From ``replay(batch) -> GraphCost | None`` at b0, b0 + 1024 and b0 + 2**20 + 7."""
        points = [replay(b) for b in (b0, b0 + 1024, b0 + (1 << 20) + 7)]
        if any(p is None for p in points) or len({tuple(k.name for k in p.kernels) for p in points}) != 1:
            return None
        model = cls(points[0], points[1])
        got, want = model.at(points[2].batch), points[2]
        exact = all(_close(x, y) for kg, kw in zip(got.kernels, want.kernels)
                    for x, y in zip((kg.flops, kg.bytes, kg.elements, kg.numel),
                                    (kw.flops, kw.bytes, kw.elements, kw.numel)))
        return model if exact and all(_close(x, y) for x, y in (
            (got.peak_bytes, want.peak_bytes), (got.input_bytes, want.input_bytes),
            (got.output_bytes, want.output_bytes))) else None

    def at(self, batch: int) -> GraphCost:
        t = batch - self.b0
        kernels = tuple(Kernel(n, *(x + s * t for x, s in zip(base, slope)))
                        for n, base, slope in zip(self.names, self.base, self.slope))
        persistent = self.persistent[0] + self.persistent[1] * t
        ins, outs = (x + s * t for x, s in self.io)
        return GraphCost(batch, kernels, persistent, persistent + max((k.bytes for k in kernels), default=0.0), ins, outs)


def _close(x: float, y: float) -> bool:
    return abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1.0)


# Kernel classes whose speed differs from a plain roofline at the device's rates.
_CLASSES = {
    "mm": {"mm", "addmm", "bmm", "baddbmm", "addmv", "mv", "dot", "addbmm"},
    "scan": {"cumsum", "cumprod", "cummax", "cummin"},
    "sort": {"sort", "topk", "kthvalue", "median", "nanmedian", "msort", "argsort", "mode"},
    "adaptive_pool": {"adaptive_max_pool2d", "adaptive_max_pool3d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d",
                      "adaptive_max_pool1d", "adaptive_avg_pool1d"},
    "pool": {"avg_pool1d", "avg_pool2d", "avg_pool3d", "max_pool2d_with_indices", "max_pool3d_with_indices",
             "max_pool1d", "max_pool2d", "max_pool3d", "fractional_max_pool2d", "upsample_bilinear2d",
             "upsample_nearest2d", "upsample_nearest1d", "upsample_linear1d", "upsample_trilinear3d",
             "upsample_nearest3d", "upsample_bicubic2d", "_upsample_bilinear2d_aa", "im2col", "col2im"},
    "norm": {"native_batch_norm", "native_group_norm", "native_layer_norm", "_native_batch_norm_legit",
             "_native_batch_norm_legit_no_training", "_fused_rms_norm"},
    "reduce": {"sum", "mean", "amax", "amin", "max", "min", "nansum", "prod", "logsumexp", "all", "any", "argmax",
               "argmin", "aminmax"},
    "moments": {"var", "std", "var_mean", "std_mean"},
    # Vector norms are one pass like a sum, not two like var/std: fitted inside "moments" they were
    # predicted 15x too slow on the CPU (neg + norm over 26 features: 0.61 ms predicted, 0.04 ms
    # measured), which sized such tasks next to the band's low edge.
    "vector_norm": {"linalg_vector_norm", "norm", "frobenius_norm"},
    "softmax": {"_softmax", "_log_softmax"},
    "special": {"pow", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "tanh", "sinh", "cosh", "sin",
                "cos", "tan", "asin", "acos", "atan", "atan2", "asinh", "acosh", "atanh", "erf", "erfc", "mish",
                "celu", "elu", "selu", "gelu", "silu", "softplus", "log_sigmoid_forward", "sigmoid", "logit",
                "rsqrt", "sqrt", "reciprocal", "div", "remainder", "fmod", "logaddexp", "logaddexp2", "hypot",
                "xlogy", "sinc", "smooth_l1_loss", "binary_cross_entropy_with_logits", "soft_margin_loss",
                "huber_loss", "mse_loss", "l1_loss", "kl_div", "nll_loss_forward", "nll_loss2d_forward",
                "binary_cross_entropy", "poisson_nll_loss", "multilabel_margin_loss_forward"},
    "special_slow": {"i0", "special_i0e", "special_i1", "special_i1e", "lgamma", "digamma", "polygamma", "erfinv",
                     "special_erfcx", "special_ndtri", "special_log_ndtr", "igamma", "igammac", "mvlgamma",
                     "logcumsumexp", "_logcumsumexp"},
}
_CLASS_OF = {name: cls for cls, names in _CLASSES.items() for name in names}


def kernel_class(name: str) -> str:
    """The class a kernel's speed is modelled by: its convolution kind, or one of _CLASSES, or
    "other" (pointwise, copies, padding, indexing: bound by bytes or elements)."""
    if name.startswith("conv"):
        return name
    return _CLASS_OF.get(name, "other")


# How much slower than the roofline at peak rates each kernel class runs, per device kind (1: at
# the roofline). Fitted by least squares on log runtimes with the rates fixed at measured peaks:
# "cpu" on 896 (task, batch) timings of 450 sampled tasks at scale 0.1, one thread, against
# 0.18 TFLOP/s, 14 GB/s, 1.6 G exp/s, 1.8 us per call (residual sd 0.69 in ln units, 98 % of
# tasks within 0.23x to 5.6x); "cuda" on the 244 accepted tasks of
# benchmarks/results/verify_gpu.json (NVIDIA H200, torch 2.11), batch sizes recovered from their
# measured peak memory, against 50 TFLOP/s, 3.9 TB/s, 500 G exp/s, 6 us (residual sd 0.78).
# "vector_norm" was split from "moments" after those fits: on the CPU it takes the "reduce" value
# (one thread, six shapes: 0.46x to 0.91x the roofline over contiguous dims, 3.6x to 21x over a
# strided one); on CUDA it keeps the "moments" value it was fitted with, unmeasured since.
SLOWDOWN: dict[str, dict[str, float]] = {
    "cpu": {"adaptive_pool": 6.6, "conv1d": 4.2, "conv2d": 5.5, "conv3d": 4.0, "conv_transpose1d": 13.0,
            "conv_transpose2d": 18.0, "conv_transpose3d": 34.0, "mm": 0.91, "moments": 17.0, "norm": 2.8,
            "vector_norm": 2.0,
            "other": 0.53, "pool": 4.5, "reduce": 2.0, "scan": 1.1, "softmax": 3.0, "sort": 3.2, "special": 1.4,
            "special_slow": 27.0},
    "cuda": {"adaptive_pool": 11.0, "conv1d": 2.4, "conv2d": 1.3, "conv3d": 1.1, "conv_transpose1d": 3.7,
             "conv_transpose2d": 1.3, "conv_transpose3d": 12.0, "mm": 1.2, "moments": 3.5, "norm": 8.5,
             "vector_norm": 3.5,
             "other": 1.3, "pool": 3.6, "reduce": 1.4, "scan": 2.5, "softmax": 1.3, "sort": 3.0, "special": 1.1,
             "special_slow": 8.3},
}


_CONVS = ("conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d", "conv_transpose3d")
# Per device kind and reduced precision, how much slower (or faster, < 1) than in float32 a kernel
# class runs, multiplying SLOWDOWN (bytes are already counted in the task's dtype). "cpu": measured on
# the development machine, one thread, torch 2.13 (a 256x256 matmul and a 16-channel 3x3 conv2d over
# 32x32x32: float16 has no fast CPU kernels there, 40x and 23x slower; bfloat16 is faster, 0.27x and
# 0.63x). "cuda": a projection, not a measurement (tensor cores: bf16/fp16 matmuls several times the
# fp32 rate, convolutions about twice TF32's); benchmarks/generate_dtypes.py reports measured over
# predicted eager time per precision on the GPU, which is what should replace it.
DTYPE_SLOWDOWN: dict[str, dict[str, dict[str, float]]] = {
    "cpu": {"float16": {"mm": 40.0, **dict.fromkeys(_CONVS, 23.0)},
            "bfloat16": {"mm": 0.27, **dict.fromkeys(_CONVS, 0.63)}},
    "cuda": {"float16": {"mm": 0.15, **dict.fromkeys(_CONVS, 0.5)},
             "bfloat16": {"mm": 0.15, **dict.fromkeys(_CONVS, 0.5)}},
}


@dataclass(frozen=True)
class Rates:
    """What a device does per second, for the roofline below: FLOP/s, bytes/s, elements/s (the
    per-element cost of pointwise math, which binds on CPUs), and the fixed cost of one kernel
    call in eager mode (Python, dispatcher and launch); ``slowdown`` per kernel class (missing: 1)."""

    flops_per_s: float
    bytes_per_s: float
    elements_per_s: float
    kernel_s: float
    slowdown: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict:
        return {"tflops": self.flops_per_s / 1e12, "gbps": self.bytes_per_s / 1e9,
                "gelems": self.elements_per_s / 1e9, "kernel_us": self.kernel_s * 1e6}


def predict_ms(cost: GraphCost, rates: Rates) -> float:
    """Roofline estimate of the eager forward: per kernel the slowest of its FLOPs, bytes and
    elements at the device's rates, times its class's slowdown, plus the per-kernel overhead."""
    slow = dict(rates.slowdown)
    total = 0.0
    for k in cost.kernels:
        work = max(k.flops / rates.flops_per_s, k.bytes / rates.bytes_per_s, k.elements / rates.elements_per_s)
        total += work * slow.get(kernel_class(k.name), 1.0) + rates.kernel_s
    return total * 1e3




def forward_cost(fn, args) -> GraphCost:
    """What one call of ``fn(*args)`` does, counted as :func:`replay_cost` counts a graph (it runs:
    real tensors, any device). For a task without an OpGraph, e.g. the reward's reference Model."""
    rec = _Recorder()
    with torch.no_grad(), rec, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fn(*args)
    persistent = float(sum(_nbytes(a) for a in args if isinstance(a, torch.Tensor)))
    return GraphCost(0, tuple(rec.kernels), persistent, persistent + rec.largest)
