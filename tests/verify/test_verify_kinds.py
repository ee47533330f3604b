"""The verifier on tasks of other precisions and passes: a bf16 task and a backward task are
accepted; a backward task's reference gradients are checked (each exists, is deterministic and
input-sensitive), and a task that leaves its stated precision is rejected, each with its reason."""

from __future__ import annotations

import pytest

from opsynth.verify import VerifyConfig, WorkerPool

CFG = VerifyConfig(device="cpu", n_workers=1, timeout_s=60.0, compile_backend="eager", warmup=1, repeats=3,
                   timing_budget_ms=100.0, cpu_min_ms=0.0, cpu_max_ms=1e6, preload_compiler=False)


def task(forward: str, kind: str = "", init: str = "        self.weight = nn.Parameter(torch.randn(features))\n",
         make: str = "torch.randn(batch_size, features{dt})") -> str:
    dt = ", dtype=dtype" if "dtype =" in kind else ""
    to = "        self.to(dtype)\n" if "dtype =" in kind else ""
    return ("import torch\nimport torch.nn as nn\n\n\nclass Model(nn.Module):\n"
            "    def __init__(self, features):\n        super().__init__()\n" + init + to + "\n"
            "    def forward(self, x):\n" + forward + "\n\n\nbatch_size = 16\nfeatures = 64\n" + kind + "\n\n"
            "def get_inputs():\n    return [" + make.format(dt=dt) + "]\n\n\n"
            "def get_init_inputs():\n    return [features]\n")


BACKWARD = 'task_pass = "backward"\n'
BF16 = "dtype = torch.bfloat16\n"
CASES = {
    "bf16": (task("        return torch.tanh(x * self.weight)\n", BF16), "accepted"),
    "backward": (task("        return torch.tanh(x * self.weight)\n", BACKWARD), "accepted"),
    "bf16_backward": (task("        return torch.tanh(x * self.weight)\n", BF16 + BACKWARD), "accepted"),
    # the weight is read, but not differentiably: it has no gradient
    "no_gradient": (task("        return torch.tanh(x * self.weight.detach())\n", BACKWARD), "no_gradient"),
    # floor's derivative is zero everywhere: x's gradient is zero for every input
    "zero_gradient": (task("        return torch.floor(x * self.weight) + self.weight\n", BACKWARD), "gradient_insensitive"),
    # a bf16 task whose forward leaves bf16
    "leaves_precision": (task("        return torch.tanh(x * self.weight).float()\n", BF16), "dtype_mismatch"),
    "unknown_pass": (task("        return torch.tanh(x * self.weight)\n", 'task_pass = "sideways"\n'), "load_error"),
    # forward only, the same code: the float32 default path is unchanged (float64 outputs stay allowed)
    "float32_forward": (task("        return torch.tanh(x * self.weight).double()\n"), "accepted"),
}


@pytest.fixture(scope="module")
def results():
    with WorkerPool(CFG) as pool:
        names = list(CASES)
        return dict(zip(names, pool.verify_many([CASES[n][0] for n in names])))


@pytest.mark.parametrize("name", list(CASES))
def test_each_kind_of_task_gets_its_verdict(results, name):
    r = results[name]
    assert r.reason == CASES[name][1], (r.reason, r.evidence)


def test_a_backward_task_is_timed_forward_and_backward_and_has_its_own_signature(results):
    fwd, bwd, bf16 = results["float32_forward"], results["backward"], results["bf16"]
    assert bwd.eager_ms > 0 and bwd.compile_ms > 0
    # the same chain in another kind is another task: its trace signature says the kind
    assert len({bwd.signature, bf16.signature, results["bf16_backward"].signature}) == 3
    assert bwd.evidence["outputs"] == [{"shape": [16, 64], "dtype": "float32"}]
    assert bf16.evidence["outputs"] == [{"shape": [16, 64], "dtype": "bfloat16"}]
    assert fwd.accepted
