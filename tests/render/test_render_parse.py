"""parse_task / task_id: the reverse of the renderer, on small sources and on all of KernelBench."""

from __future__ import annotations

import ast

import pyarrow.parquet as pq
import pytest

from opsynth.render.parse import TaskParseError, parse_task, task_id

INTERFACES_EXAMPLE = '''
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    """nn.Conv2d -> torch.relu"""

    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size)

    def forward(self, x):
        x = self.conv2d(x)
        x = torch.relu(x)
        return x


batch_size = 128
in_channels = 3
out_channels = 16
height = 32
width = 32
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, height, width)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
'''


def _task(init: str, forward: str, header: str = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n") -> str:
    init_body = "\n".join("        " + line for line in (["super().__init__()"] + init.strip().splitlines()))
    fwd_body = "\n".join("        " + line for line in forward.strip().splitlines())
    return (
        f"{header}\nclass Model(nn.Module):\n    def __init__(self, n=4):\n{init_body}\n\n"
        f"    def forward(self, x, y=None):\n{fwd_body}\n\nbatch_size = 2\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, 4)]\n\ndef get_init_inputs():\n    return [4]\n"
    )


def test_interfaces_example_facts():
    f = parse_task(INTERFACES_EXAMPLE)
    assert isinstance(f.tree, ast.Module)
    assert isinstance(f.model_class, ast.ClassDef) and f.model_class.name == "Model"
    assert f.ops == ["nn.Conv2d", "torch.relu"]
    assert f.sizes == {
        "batch_size": 128,
        "in_channels": 3,
        "out_channels": 16,
        "height": 32,
        "width": 32,
        "kernel_size": 3,
    }
    assert f.init_params == ["in_channels", "out_channels", "kernel_size"]


def test_sizes_follow_earlier_constants_and_skip_non_literals():
    src = _task("", "return x") + "height = width = 256\nc = 8\nshape = (c, 1, 1)\nhalf = c // 2\ncfg = object()\n"
    f = parse_task(src)
    assert f.sizes["height"] == 256 and f.sizes["width"] == 256
    assert f.sizes["shape"] == (8, 1, 1)
    assert f.sizes["half"] == 4
    assert "cfg" not in f.sizes


@pytest.mark.parametrize(
    "init, forward, expected",
    [
        # evaluation order: the inner call runs first
        ("self.conv = nn.Conv2d(3, 3, 3)", "return torch.relu(self.conv(x))", ["nn.Conv2d", "torch.relu"]),
        # torch.nn.X, F.<fn>, torch.nn.functional.<fn>
        ("self.lin = torch.nn.Linear(4, 4)", "x = self.lin(x)\nx = F.gelu(x)\nreturn torch.nn.functional.silu(x)",
         ["nn.Linear", "F.gelu", "F.silu"]),
        # tensor methods with a torch function of the same name; view has none; in-place maps to the op
        ("", "x = x.mean(dim=1)\nx = x.view(-1)\nx = x.relu()\nx.sigmoid_()\nreturn x.softmax(0)",
         ["torch.mean", "torch.relu", "torch.sigmoid", "torch.softmax"]),
        # arithmetic operators on tensors, in evaluation order
        ("self.bias = nn.Parameter(torch.zeros(4))",
         "x = x + self.bias\nx = x - 1\nx = x * 2\nx = x / 3\nx = x @ x\nreturn x ** 2",
         ["torch.add", "torch.sub", "torch.mul", "torch.div", "torch.matmul", "torch.pow"]),
        # arithmetic on shapes is not an operator
        ("", "n = x.size(0) * 2\nreturn x.reshape(n // 2, -1)", ["torch.reshape"]),
        # nn.Sequential contents in order
        ("self.seq = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 4))", "return self.seq(x)",
         ["nn.Linear", "nn.ReLU", "nn.Linear"]),
        # ModuleList iterated in forward
        ("self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(2)])\nself.act = nn.Tanh()",
         "for layer in self.layers:\n    x = self.act(layer(x))\nreturn x", ["nn.Linear", "nn.Tanh"]),
        # augmented assignment
        ("", "x += y\nreturn x", ["torch.add"]),
    ],
)
def test_ops_in_forward_order(init, forward, expected):
    assert parse_task(_task(init, forward)).ops == expected


def test_import_spellings_resolve_to_the_same_vocabulary():
    header = "import torch\nfrom torch import nn\nfrom torch.nn import functional as fn\nimport torch as th\n"
    src = _task("self.norm = nn.LayerNorm(4)", "x = self.norm(x)\nx = fn.relu(x)\nreturn th.tanh(x)", header=header)
    assert parse_task(src).ops == ["nn.LayerNorm", "F.relu", "torch.tanh"]


def test_helper_module_class_is_inlined():
    src = (
        "import torch\nimport torch.nn as nn\n\n"
        "class Block(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.c = nn.Conv2d(3, 3, 1)\n    def forward(self, x):\n        return torch.relu(self.c(x))\n\n"
        "class Model(nn.Module):\n    def __init__(self):\n        super().__init__()\n"
        "        self.blocks = nn.Sequential(Block(), Block())\n        self.pool = nn.AdaptiveAvgPool2d(1)\n"
        "    def forward(self, x):\n        return self.pool(self.blocks(x))\n"
    )
    assert parse_task(src).ops == ["nn.Conv2d", "torch.relu", "nn.Conv2d", "torch.relu", "nn.AdaptiveAvgPool2d"]


def test_parse_errors_are_named_value_errors():
    with pytest.raises(TaskParseError, match="does not parse"):
        parse_task("class Model(nn.Module:\n    pass\n")
    with pytest.raises(TaskParseError, match="no module-level `class Model`"):
        parse_task("import torch\nclass Net(torch.nn.Module):\n    pass\n")
    assert issubclass(TaskParseError, ValueError)


def test_task_id_ignores_comments_whitespace_and_docstrings():
    base = task_id(INTERFACES_EXAMPLE)
    assert len(base) == 16 and int(base, 16) >= 0
    noisy = INTERFACES_EXAMPLE.replace('    """nn.Conv2d -> torch.relu"""\n', "    # a comment\n\n")
    noisy = noisy.replace("x = torch.relu(x)", "x = torch.relu( x )  # activation")
    noisy = noisy.replace("def forward(self, x):", 'def forward(self, x):\n        """Docstring."""')
    assert task_id(noisy) == base
    assert task_id(INTERFACES_EXAMPLE.replace("torch.relu", "torch.tanh")) != base
    assert task_id(INTERFACES_EXAMPLE.replace("kernel_size = 3", "kernel_size = 5")) != base


@pytest.fixture(scope="module")
def kernelbench_rows(kernelbench_parquet):
    return pq.read_table(kernelbench_parquet).to_pylist()


def test_all_kernelbench_problems_parse(kernelbench_rows):
    assert len(kernelbench_rows) == 270
    by_key = {}
    for r in kernelbench_rows:
        f = parse_task(r["code"])
        assert f.model_class.name == "Model", r["name"]
        # every problem names at least one operator; level 4 wraps a whole HF model, which is one op
        assert f.ops, f"{r['level']}/{r['name']} yielded no operators"
        assert all(isinstance(o, str) and "." in o for o in f.ops)
        by_key[(r["level"], r["problem_id"])] = f
    assert by_key[(2, 1)].ops == ["nn.Conv2d", "torch.relu", "torch.add"]
    assert by_key[(1, 19)].ops == ["torch.relu"]
    assert by_key[(1, 50)].ops == ["nn.Conv2d"]
    assert by_key[(3, 1)].ops == ["nn.Linear", "nn.ReLU", "nn.Linear"]  # Sequential built in a loop
    assert len(by_key[(3, 11)].ops) > 30  # VGG16: the whole feature stack
    for pid in range(1, 21):
        assert by_key[(4, pid)].ops == ["transformers.AutoModelForCausalLM"]
    assert by_key[(2, 21)].sizes["height"] == 256 and by_key[(2, 21)].sizes["bias_shape"] == (32, 1, 1)
    # level 1 and 2 problems are single kernels and small fusions: at most a handful of ops each
    assert max(len(by_key[(2, p)].ops) for p in range(1, 101)) <= 12
