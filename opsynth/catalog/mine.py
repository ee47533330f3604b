"""Mine seed operators from torch: discover candidates by introspection, then keep those that
actually run, as the sampler will call them, on meta tensors of some input rank.

Nothing here lists operators one by one. Candidates come from `torch.nn`'s module classes and from
the functions torch itself declares overridable (`torch.overrides.get_testing_overrides`, which
also gives their parameter names). Exclusions are by family or by name pattern, each with a reason.
"""

from __future__ import annotations

import inspect
from dataclasses import replace
import random
import re
import warnings

import torch
import torch.nn as nn
import torch.nn.functional as F

from .call import apply, instantiate, is_float_tensor
from .params import NoRule, ParamContext, fill_params
from .spec import OpSpec

# Input shapes used to probe each rank (small, with room for kernels, pooling and pixel shuffles).
# Trailing dimensions differ so that a square matrix product is never mistaken for an elementwise op.
PROBE_SHAPES = {2: (4, 32), 3: (4, 8, 32), 4: (2, 8, 12, 16), 5: (2, 4, 6, 8, 10)}

# torch.nn module families (the file a class is defined in) -> category, or None with a reason.
MODULE_FAMILIES = {
    "activation": "activation",
    "conv": "convolution",
    "pooling": "pooling",
    "batchnorm": "normalization",
    "instancenorm": "normalization",
    "normalization": "normalization",
    "linear": "linear",
    "loss": "loss",
    "flatten": "shape",
    "fold": "shape",
    "padding": "shape",
    "pixelshuffle": "shape",
    "channelshuffle": "shape",
    "upsampling": "shape",
    "distance": "other",
    "sparse": "embedding",
    "dropout": "stochastic",
}
EXCLUDED_FAMILIES = {
    "container": "container, not an operator",
    "module": "base class",
    "rnn": "recurrent: tuple outputs and hidden state",
    "transformer": "composite model, not a seed operator",
    "data_parallel": "parallelism wrapper",
    "adaptive": "needs class targets and returns a tuple",
}
SOFTMAX_NAMES = re.compile(r"softm(ax|in)", re.I)

# Optional parameters worth varying (when an operator has them).
TUNABLE = ("stride", "padding", "negative_slope", "dim", "keepdim", "alpha", "lambd", "scale_factor",
           "min_val", "max_val", "min", "max", "start_dim")
# Optional parameters that must be set for a call to mean something (Upsample needs a size or
# factor; a reduction without `dim` collapses to a scalar; clamp needs a bound).
ALWAYS_SET = ("scale_factor", "dim", "min", "max")

# Function names excluded by pattern, with the reason.
FUNCTION_EXCLUDES = [
    (r"^_|_$", "private or in-place"),
    # Anchored where a random sampler's name is a prefix of deterministic operators' names
    # (torch.normal / F.normalize, torch.poisson / F.poisson_nll_loss).
    (r"rand|seed|bernoulli|multinomial|^normal$|^poisson$|dropout|rrelu|gumbel", "random"),
    (r"empty|zeros|ones|full|arange|range|linspace|logspace|eye|_like$|^tensor$|^as_|^from|scalar_tensor",
     "tensor creation: output does not depend on the input values"),
    (r"quantiz|sparse|mkldnn|cudnn|miopen|fbgemm|^native_|^sym_|vulkan|^q_|int_repr|nested|^fake_",
     "backend-specific"),
    (r"^is_|^set_|^get_|can_cast|promote_types|result_type|numel|^save|^load|^compile|^vmap|^cond$",
     "not a tensor operator"),
    (r"fft|stft|^view_as_|^real$|^imag$|conj|angle|polar|complex", "complex numbers"),
    (r"split|chunk|unbind|broadcast|meshgrid|where|masked|nonzero|unique|_with_indices|^sort|topk|kthvalue|"
     r"^mode$|^max$|^min$|median|^aminmax|histogram|bincount|searchsorted|bucketize", "tuple or data-dependent output"),
    (r"lstsq|^lu|svd|^qr$|eig|^det$|slogdet|logdet|cholesky|inverse|pinverse|matrix_exp|matrix_power|"
     r"solve|triangular|ormqr|geqrf|orgqr|householder", "matrix decomposition: ill-conditioned on random data"),
    (r"embedding|^one_hot|^grid_sample|affine_grid|^ctc|^pdist|^cdist|^bilinear|^linear$|^conv|"
     r"^batch_norm|^instance_norm|^group_norm|^layer_norm|^rms_norm|^prelu|^scaled_dot|multi_head|"
     r"^fold$|^unfold$|^interpolate|^upsample|^pixel_|^channel_shuffle|^pad$|^dropout",
     "covered by its nn module (needs weights or state the module owns)"),
    (r"^clone$|^detach|^alias|^contiguous|^resolve_|^positive$|^fix$|^clamp_(min|max)$|^clip$|^absolute$|"
     r"^arccos|^arcsin|^arctan|^arccosh|^arcsinh|^arctanh|^negative$|^multiply$|^divide$|^subtract$|^true_divide$|"
     r"^squeeze|^greater|^less|^not_equal|^moveaxis|^swapaxes|^swapdims|^concat|^row_stack|^hstack|^vstack|^dstack|"
     r"^narrow_copy$",
     "identity or an alias of another operator"),
]
_FUNCTION_EXCLUDE_RES = [(re.compile(p), why) for p, why in FUNCTION_EXCLUDES]


def activation_names() -> set[str]:
    """Function names that are activations, mined from the activation module classes and compared
    without underscores (`leaky_relu` ~ `LeakyReLU`)."""
    return {cname.lower() for cname, cls in vars(nn.modules.activation).items()
            if inspect.isclass(cls) and issubclass(cls, nn.Module) and not SOFTMAX_NAMES.search(cname)}


def _signature_params(fn) -> list[inspect.Parameter]:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return []
    return [p for p in sig.parameters.values()
            if p.name not in ("self", "device", "dtype", "out", "inplace", "generator", "layout", "memory_format")
            and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def _probe_ranks(spec: OpSpec, operand_for) -> list[int]:
    """Ranks on which the operator runs: first on meta tensors (cheap), then confirmed on small real
    CPU tensors, since some meta kernels accept inputs the real kernel rejects."""
    ranks = []
    for rank, shape in PROBE_SHAPES.items():
        ctx = ParamContext(shape=shape, rng=random.Random(0))
        try:
            params, _ = fill_params((*spec.required, *[t for t in spec.tunable if t in ALWAYS_SET]), ctx)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                with torch.device("meta"):
                    x = _probe_input(spec, shape)
                    out = apply(spec, x, params, operand=operand_for(spec, x))
                if not (is_float_tensor(out) and (out.dim() > 0 or spec.terminal)):
                    continue
                x = _probe_input(spec, shape)
                real = apply(spec, x, params, operand=operand_for(spec, x))
        except NoRule:
            raise
        except Exception:
            continue
        # A float32 chain must stay float32 (`float_power` returns float64, which the next
        # operator's float32 weights reject); integer inputs (embeddings) may turn into floats.
        same_dtype = spec.input_dtype != "float32" or real.dtype == x.dtype
        if is_float_tensor(real) and tuple(real.shape) == tuple(out.shape) and same_dtype:
            ranks.append(rank)
    return ranks


def _probe_input(spec: OpSpec, shape):
    if spec.input_dtype == "int64":
        return torch.randint(0, 16, shape)
    return torch.randn(shape)


def _probe_operand(spec: OpSpec, x):
    if spec.pattern in ("binary", "loss"):
        return torch.rand_like(x)
    if spec.pattern == "matmul":
        return torch.randn(x.shape[-1], 24)
    return None


def is_stochastic(spec: OpSpec, rank: int) -> bool:
    """Run twice on the same real input under different RNG seeds: any difference means randomness.
    NaN counts as equal to NaN (`log`, `sqrt`, `acos` of a negative entry is NaN on every run, which
    is a domain issue the verifier's finiteness check handles per task, not randomness)."""
    shape = PROBE_SHAPES[rank]
    ctx = ParamContext(shape=shape, rng=random.Random(0))
    params, _ = fill_params((*spec.required, *[t for t in spec.tunable if t in ALWAYS_SET]), ctx)
    torch.manual_seed(0)
    x = _probe_input(spec, shape)
    other = _probe_operand(spec, x)
    module = instantiate(spec, params) if spec.kind == "module" else None
    outs = []
    for seed in (1, 2):
        torch.manual_seed(seed)
        outs.append(apply(spec, x, params, operand=other, module=module))
    a, b = outs
    if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape:
        return not torch.equal(a, b)
    return not torch.allclose(a, b, rtol=0.0, atol=0.0, equal_nan=True)


def is_non_finite_on_randn(spec: OpSpec, rank: int) -> bool:
    """NaN or Inf from finite standard-normal inputs, as a task feeds it (`torch.randn` inputs, a
    `torch.randn` parameter as the binary operand, `torch.rand` targets): `log`, `sqrt`, `acos`
    and the like are defined on part of the line only, so nearly every task built on them would be
    rejected as non-finite after costing a verification."""
    shape = PROBE_SHAPES[rank]
    ctx = ParamContext(shape=shape, rng=random.Random(0))
    params, _ = fill_params((*spec.required, *[t for t in spec.tunable if t in ALWAYS_SET]), ctx)
    torch.manual_seed(0)
    x = _probe_input(spec, shape)
    if spec.pattern == "binary":
        other = torch.randn_like(x)
    else:
        other = _probe_operand(spec, x)
    module = instantiate(spec, params) if spec.kind == "module" else None
    out = apply(spec, x, params, operand=other, module=module)
    return not bool(torch.isfinite(out).all())


def _classify_function(name: str, spec: OpSpec, rank: int, activations: set[str]) -> str:
    short = name.split(".", 1)[1]
    if spec.pattern == "loss":
        return "loss"
    if spec.pattern == "matmul":
        return "linear"
    if SOFTMAX_NAMES.search(short):
        return "softmax"
    if short.replace("_", "") in activations:
        return "activation"
    if "pool" in short:
        return "pooling"
    shape = PROBE_SHAPES[rank]
    ctx = ParamContext(shape=shape, rng=random.Random(0))
    params, _ = fill_params((*spec.required, *[t for t in spec.tunable if t in ALWAYS_SET]), ctx)
    with torch.device("meta"):
        x = torch.randn(shape)
        out = apply(spec, x, params, operand=_probe_operand(spec, x))
    if "norm" in short and out.shape == x.shape:
        return "normalization"
    if out.numel() < x.numel():
        return "reduction"
    if out.shape != x.shape or re.search(r"flip|roll|rot90|tril|triu|slice|squeeze|msort", short):
        return "shape"
    if short.startswith("cum") or short.startswith("logcum"):
        return "other"
    if spec.pattern == "binary" or short in _arith_names():
        return "elementwise"
    return "elementwise" if name.startswith("torch.") else "other"


def _arith_names() -> set[str]:
    return {"add", "sub", "mul", "div", "pow", "neg", "reciprocal", "square", "sqrt", "rsqrt", "abs"}


def mine_modules(excluded: dict) -> list[OpSpec]:
    specs = []
    for cname in sorted(dir(nn)):
        cls = getattr(nn, cname)
        if not (inspect.isclass(cls) and issubclass(cls, nn.Module)):
            continue
        family = cls.__module__.rsplit(".", 1)[-1]
        name = f"nn.{cname}"
        if family in EXCLUDED_FAMILIES:
            excluded[name] = EXCLUDED_FAMILIES[family]
            continue
        if cname.startswith("Lazy"):
            excluded[name] = "lazy variant of an eager module"
            continue
        if cname in ("Identity", "SyncBatchNorm"):
            excluded[name] = "identity" if cname == "Identity" else "distributed-only"
            continue
        category = MODULE_FAMILIES.get(family)
        if category is None:
            excluded[name] = f"unknown family {family}"
            continue
        if category == "convolution" and cname.startswith("ConvTranspose"):
            category = "transposed_convolution"
        if category == "activation" and SOFTMAX_NAMES.search(cname):
            category = "softmax"
        params = _signature_params(cls.__init__)
        required = tuple(p.name for p in params if p.default is inspect.Parameter.empty)
        tunable = tuple(p.name for p in params if p.default is not inspect.Parameter.empty and p.name in TUNABLE
                        and not (p.name == "padding" and "kernel_size" not in required))
        pattern = "loss" if category == "loss" else ("index" if category == "embedding" else "unary")
        spec = OpSpec(name=name, kind="module", import_path=f"torch.nn.{cname}", category=category,
                      pattern=pattern, ranks=(), required=required, tunable=tunable,
                      input_dtype="int64" if pattern == "index" else "float32",
                      terminal=pattern == "loss")
        specs.append(spec)
    return specs


def mine_functions(excluded: dict) -> list[OpSpec]:
    overrides = torch.overrides.get_testing_overrides()
    specs = []
    seen = set()
    for fn, lam in overrides.items():
        short = getattr(fn, "__name__", None)
        if not short:
            continue
        if getattr(F, short, None) is fn:
            name, path = f"F.{short}", f"torch.nn.functional.{short}"
        elif getattr(torch, short, None) is fn:
            name, path = f"torch.{short}", f"torch.{short}"
        else:
            continue
        if name in seen:
            continue
        seen.add(name)
        why = next((w for rx, w in _FUNCTION_EXCLUDE_RES if rx.search(short)), None)
        if why:
            excluded[name] = why
            continue
        params = _signature_params(lam)
        if not params:
            excluded[name] = "no signature"
            continue
        specs.append(_function_spec(name, path, params))
    return specs


# Names a function gives its second tensor argument when that argument is the binary operand.
BINARY_OPERANDS = ("other", "exponent", "x2", "values")


def _function_spec(name: str, path: str, params: list[inspect.Parameter]) -> OpSpec:
    """The OpSpec a function's parameter list describes: its calling pattern from the name of the
    second parameter, then its required and tunable parameters."""
    rest = params[1:]
    second = rest[0].name if rest else None
    if second == "target":
        pattern, rest = "loss", rest[1:]
    elif second in BINARY_OPERANDS and rest[0].default is inspect.Parameter.empty:
        pattern, rest = "binary", rest[1:]
    elif second in ("mat2",):
        pattern, rest = "matmul", rest[1:]
    else:
        pattern = "unary"
    required = tuple(p.name for p in rest if p.default is inspect.Parameter.empty)
    tunable = tuple(p.name for p in rest if p.default is not inspect.Parameter.empty and p.name in TUNABLE)
    return OpSpec(name=name, kind="function", import_path=path, category="?", pattern=pattern,
                  ranks=(), required=required, tunable=tunable, terminal=pattern == "loss")


_DOC_SIGNATURE = re.compile(r"^\s*(\w+)\((.*)\)\s*(->.*)?$")


def docstring_params(fn) -> list[inspect.Parameter]:
    """The parameters the first line of a builtin's docstring lists (`logsumexp(input, dim,
    keepdim=False, *, out=None)`), or [] when it does not parse. The testing overrides sometimes
    describe another overload (a Dimname one for `logsumexp`, a dtype-only one for `prod`); the
    docstring names the overload people call."""
    import ast

    lines = [ln for ln in (getattr(fn, "__doc__", None) or "").splitlines() if ln.strip()]
    m = _DOC_SIGNATURE.match(lines[0]) if lines else None
    if not m or m.group(1) != getattr(fn, "__name__", None):
        return []
    try:
        args = ast.parse(f"def _f({m.group(2)}): pass").body[0].args  # type: ignore[attr-defined]
    except SyntaxError:
        return []
    positional = [*args.posonlyargs, *args.args]
    n_required = len(positional) - len(args.defaults)
    out = [inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                             default=inspect.Parameter.empty if i < n_required else None)
           for i, a in enumerate(positional)]
    out += [inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY,
                              default=inspect.Parameter.empty if d is None else None)
            for a, d in zip(args.kwonlyargs, args.kw_defaults)]
    skip = ("self", "device", "dtype", "out", "inplace", "generator", "layout", "memory_format")
    return [p for p in out if p.name not in skip]


# Exclusions that another reading of a function's signature may lift.
_SIGNATURE_REASONS = ("no value rule", "fails on every probed input rank")


def finalize(spec: OpSpec, excluded: dict, activations: set[str]) -> OpSpec | None:
    """Probe ranks, randomness and category. A function the testing overrides describe with an
    unusable overload gets a second try with the signature its docstring gives."""
    kept = _finalize(spec, excluded, activations)
    if kept is not None or spec.kind != "function" or not excluded.get(spec.name, "").startswith(_SIGNATURE_REASONS):
        return kept
    from .call import resolve

    params = docstring_params(resolve(spec.import_path))
    alt = _function_spec(spec.name, spec.import_path, params) if params else None
    if alt is None or (alt.pattern, alt.required, alt.tunable) == (spec.pattern, spec.required, spec.tunable):
        return None
    why = excluded.pop(spec.name)
    kept = _finalize(alt, excluded, activations)
    if kept is None:
        excluded[spec.name] = f"{why}; with its docstring signature: {excluded[spec.name]}"
    return kept


def _finalize(spec: OpSpec, excluded: dict, activations: set[str]) -> OpSpec | None:
    """Probe ranks (trying the matmul reading of a binary `other` too), randomness and category."""
    try:
        ranks = _probe_ranks(spec, _probe_operand)
        if not ranks and spec.pattern == "binary":
            spec = replace(spec, pattern="matmul")
            ranks = _probe_ranks(spec, _probe_operand)
    except NoRule as e:
        excluded[spec.name] = f"no value rule for required parameter {e.args[0]!r}"
        return None
    if not ranks:
        try:  # say which parameter stopped it, when that is the reason
            fill_params(spec.required, ParamContext(shape=PROBE_SHAPES[4], rng=random.Random(0)))
        except NoRule as e:
            excluded[spec.name] = f"no value rule for required parameter {e.args[0]!r}"
            return None
        excluded[spec.name] = "fails on every probed input rank (meta tensors)"
        return None
    spec = replace(spec, ranks=tuple(ranks))
    try:
        if spec.category == "stochastic" or is_stochastic(spec, ranks[0]):
            excluded[spec.name] = "stochastic: output changes with the RNG state"
            return None
        if is_non_finite_on_randn(spec, ranks[0]):
            excluded[spec.name] = "not finite on standard-normal inputs (defined on part of the line only)"
            return None
    except Exception as e:  # runs on meta but not on CPU: unusable in a CPU-verified dataset
        excluded[spec.name] = f"fails on real CPU tensors: {type(e).__name__}"
        return None
    if spec.kind == "function":
        try:
            spec = replace(spec, category=_classify_function(spec.name, spec, ranks[0], activations))
        except Exception as e:
            excluded[spec.name] = f"could not classify: {type(e).__name__}"
            return None
    return spec


