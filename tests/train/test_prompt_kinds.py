"""The policy's prompt names a task's precision and pass (and says nothing more for float32 forward)."""

from pathlib import Path

from opsynth.train.prompts import KERNEL_BRIEF, build_prompt

KINDS = Path(__file__).resolve().parents[1] / "reward" / "candidates" / "kinds"


def test_a_bf16_backward_prompt_says_its_precision_tolerance_and_pass():
    code = (KINDS / "chain_bf16.py").read_text() + 'task_pass = "backward"\n'
    p = build_prompt(code)
    assert "This task is in bfloat16" in p and "atol = 0.01, rtol = 0.01" in p
    assert "It is a backward task" in p and "sum(output * grad_output)" in p
    assert p.index("This task is in") < p.index("The program to optimise")


def test_a_float32_forward_prompt_is_the_brief_and_the_code():
    code = (KINDS / "chain_bf16.py").read_text().replace("dtype = torch.bfloat16\n", "").replace(", dtype=dtype", "")
    assert build_prompt(code) == f"{KERNEL_BRIEF}\n\nThe program to optimise:\n\n```python\n{code.strip()}\n```\n"
    assert "backward" not in build_prompt((KINDS / "chain_bf16.py").read_text()).split("The program to optimise")[1]
