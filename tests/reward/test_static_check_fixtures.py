"""The static pre-check on every CUDA and Triton fixture (pure AST: runs on the CPU suite).

Legitimate candidates must pass it (so the GPU suite can run with the defaults and still reach the
runtime guards), and the ones it can see through must be named here, before anything runs.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from opsynth.reward.candidate import CandidateSpec
from opsynth.reward.static_check import static_check

CUDA = Path(__file__).parent / "candidates" / "cuda"
PRELUDE = (CUDA / "ext_prelude.py").read_text()

EXPECTED = {  # fixture -> static verdict (reason prefix); "ok" means only the runtime guards can judge it
    "fast": "ok",
    "wrong": "ok",
    "not_launched": "ok",
    "slow_linear": "ok",
    "cublas": "ok",  # at::addmm inside C++ is invisible to an AST check: the runtime audit catches it
    "triton_fast": "ok",
    "triton_wrong": "ok",
    "functional": "forbidden_op:F.relu",
    "side_stream": "side_stream",
    # issue 23: only the runtime guards see these
    "graph_replay": "ok",  # its capture stream's name is pasted together by a macro: the text check misses it
    "l2_persist": "ok",
    "launch_fail": "ok",
    "event_patch": "ok",  # py::exec inside a C++ static initialiser
    "precompute": "ok",  # gc reached from C++ (pybind11::module_::import), not from a Python import
    # issue 28: its std::thread is in the text; the GPU suite runs it with the check off (the quiet device decides)
    "baseline_hog": "side_stream",
}


def test_every_fixture_is_listed():
    assert {p.stem for p in CUDA.glob("*.py")} - {"ext_prelude"} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_static_verdict(name):
    text = (CUDA / f"{name}.py").read_text()
    src = text if name.startswith("triton_") else PRELUDE + "\n" + text
    reason, detail = static_check(CandidateSpec(source=src))
    assert reason.startswith(EXPECTED[name]), (reason, detail)
