"""What one seed operator is: how to call it, what it accepts, and where it came from."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

# The categories the issue names; every accepted operator lands in exactly one.
CATEGORIES = (
    "elementwise",
    "activation",
    "reduction",
    "normalization",
    "linear",
    "convolution",
    "transposed_convolution",
    "pooling",
    "softmax",
    "shape",
    "loss",
    "embedding",
    "transformers",
    "other",
)

# How an operator consumes the running tensor `x`:
#   unary   op(x, **params)                       (modules: self.m(x))
#   binary  op(x, other, **params)                other: a parameter, a scalar, an earlier tensor or a second input
#   matmul  op(x, weight)                         weight: a (K, N) parameter
#   loss    op(x, target)                         target: an extra input; the op ends the graph
#   index   op(ids)                               ids: an integer input; the op starts the graph
PATTERNS = ("unary", "binary", "matmul", "loss", "index")


@dataclass(frozen=True)
class OpSpec:
    """A seed operator. `name` is what lands in a row's `ops` column (e.g. `nn.Conv2d`, `torch.relu`)."""

    name: str
    kind: str  # "module" or "function"
    import_path: str  # dotted path that resolves to the class or function
    category: str
    pattern: str
    ranks: tuple[int, ...]
    required: tuple[str, ...] = ()  # parameters that must be given a value
    tunable: tuple[str, ...] = ()  # optional parameters the sampler varies
    input_dtype: str = "float32"
    terminal: bool = False  # output is a scalar or otherwise ends a chain (losses)
    tuple_output: bool = False  # forward returns a tuple; the task keeps element 0
    config_class: str | None = None  # transformers: the config class the module is built from
    source: str = "torch"

    def to_dict(self) -> dict:
        d = asdict(self)
        d["ranks"] = list(self.ranks)
        d["required"] = list(self.required)
        d["tunable"] = list(self.tunable)
        return d


@dataclass
class Catalog:
    """Accepted seed operators by name, and the ones mined but excluded, with the reason."""

    ops: dict[str, OpSpec]
    excluded: dict[str, str] = field(default_factory=dict)
    torch_version: str = ""
    transformers_version: str | None = None

    def by_category(self) -> dict[str, list[str]]:
        out: dict[str, list[str]] = {}
        for name, spec in sorted(self.ops.items()):
            out.setdefault(spec.category, []).append(name)
        return out

    def names(self, source: str | None = None) -> list[str]:
        return sorted(n for n, s in self.ops.items() if source is None or s.source == source)

    def __len__(self) -> int:
        return len(self.ops)

    def __getitem__(self, name: str) -> OpSpec:
        return self.ops[name]

    def __contains__(self, name: str) -> bool:
        return name in self.ops
