"""The warm start's programs: what it lowers, and that the reward environment judges them correct.

Four tasks in the generator's style cover its operator families (pointwise modules and functions
with arguments, scalar and broadcast arithmetic, Linear, matmul by a weight, Conv1d / Conv2d with
stride, padding, dilation and groups, softmax, reductions, scans, tril). The CPU test judges their
C++ programs with the real environment (one build: they share one extension); the GPU test judges
the CUDA programs on the H200.
"""

from __future__ import annotations

import pytest

from opsynth.reward.candidate import CandidateSpec
from opsynth.reward.static_check import static_check
from opsynth.train.warm_start import answer, lower_task, smoke_examples

HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\nclass Model(nn.Module):\n"

CONV = HEAD + '''    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=1, groups=2)
        self.leaky_re_lu = nn.LeakyReLU(negative_slope=0.2)

    def forward(self, x):
        x = self.conv2d(x)
        x = self.leaky_re_lu(x)
        x = torch.sigmoid(x)
        x = torch.sum(x, dim=1, keepdim=True)
        return x


batch_size = 4
in_channels = 4
out_channels = 6
kernel_size = 3


def get_inputs():
    return [torch.randn(batch_size, in_channels, 16, 16)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size]
'''

LINEAR = HEAD + '''    def __init__(self, in_features, out_features, bias_shape):
        super().__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.bias = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        x = self.linear(x)
        x = F.gelu(x, approximate="tanh")
        x = torch.add(x, self.bias)
        x = torch.softmax(x, dim=1)
        return x


batch_size = 8
in_features = 32
out_features = 24
bias_shape = (24,)


def get_inputs():
    return [torch.randn(batch_size, in_features)]


def get_init_inputs():
    return [in_features, out_features, bias_shape]
'''

SCAN = HEAD + '''    def __init__(self, in_channels, out_channels, kernel_size, divisor):
        super().__init__()
        self.conv1d = nn.Conv1d(in_channels, out_channels, kernel_size, dilation=2, padding=2)
        self.divisor = divisor

    def forward(self, x):
        x = self.conv1d(x)
        x = torch.cumsum(x, dim=2)
        x = torch.div(x, self.divisor)
        x = torch.tril(x)
        return x


batch_size = 4
in_channels = 3
out_channels = 5
kernel_size = 3
divisor = 7.0


def get_inputs():
    return [torch.randn(batch_size, in_channels, 20)]


def get_init_inputs():
    return [in_channels, out_channels, kernel_size, divisor]
'''

MATMUL = HEAD + '''    def __init__(self, weight_shape):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(weight_shape) * 0.1)
        self.softplus = nn.Softplus(beta=2.0)

    def forward(self, x):
        x = torch.matmul(x, self.weight)
        x = self.softplus(x)
        x = torch.amax(x, dim=-1)
        x = F.elu(x, alpha=0.5)
        x = torch.log_softmax(x, dim=1)
        return x


batch_size = 4
weight_shape = (16, 12)


def get_inputs():
    return [torch.randn(batch_size, 10, 16)]


def get_init_inputs():
    return [weight_shape]
'''

TASKS = {"conv": CONV, "linear": LINEAR, "scan": SCAN, "matmul": MATMUL}


def test_lowering_fuses_pointwise_runs_and_copies_the_init():
    code = lower_task(CONV)
    forward = code[code.index("    def forward"):]
    assert "_ext.conv2d(x, self.conv2d.weight" in forward and "self.conv2d.groups" in forward
    assert "_ext.pointwise(x, [13, 1], [0.2, 0.0], [0.0, 0.0])" in forward  # leaky_relu then sigmoid, one pass
    assert "_ext.reduce(x, 1, True, 0)" in forward
    assert "self.conv2d = nn.Conv2d(in_channels, out_channels, kernel_size, stride=2, padding=1, groups=2)" in code
    cuda = lower_task(CONV, "cuda")
    assert "no_implicit_headers=True" in cuda and "s = torch.cuda.current_stream().cuda_stream" in cuda
    assert "_ext.reduce(x, 1, True, 0, s)" in cuda


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_every_program_passes_the_static_check(device):
    for name, task in TASKS.items():
        spec = CandidateSpec(source=lower_task(task, device), kernel_files={})
        assert static_check(spec) == ("ok", ""), name


def test_what_is_not_lowered_gives_no_program():
    norm = CONV.replace("nn.LeakyReLU(negative_slope=0.2)", "nn.GroupNorm(2, 6)")
    two_inputs = LINEAR.replace("def forward(self, x):", "def forward(self, x, y):")
    full_sum = CONV.replace("torch.sum(x, dim=1, keepdim=True)", "torch.sum(x)")
    for code in (norm, two_inputs, full_sum, "not python ("):
        assert lower_task(code) is None
    rows = [{"code": c, "task_id": str(i)} for i, c in enumerate((norm, CONV, LINEAR))]
    examples = smoke_examples(rows, 4)
    assert len(examples) == 2 and examples[0][1] == answer(lower_task(CONV))
    assert examples[0][1].startswith("```python\n") and CONV.strip() in examples[0][0]


def _judge(device: str):
    from opsynth.reward import RewardConfig, evaluate_many

    cfg = RewardConfig(device=device, prebuild=False, measure_workers=2)
    results = evaluate_many([(t, lower_task(t, device)) for t in TASKS.values()], cfg)
    return {name: (r.reward, r.reason, r.log[-600:]) for name, r in zip(TASKS, results)}


@pytest.mark.slow
def test_the_cpu_programs_are_judged_correct():
    verdicts = _judge("cpu")
    assert all(reward >= 1 for reward, _, _ in verdicts.values()), verdicts


@pytest.mark.gpu
@pytest.mark.slow
def test_the_cuda_programs_are_judged_correct():
    verdicts = _judge("cuda")
    assert all(reward >= 1 for reward, _, _ in verdicts.values()), verdicts
