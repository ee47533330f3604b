"""Within-run dedup: exact and near duplicates, first kept, deterministic, rebuildable."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kb_edits import add_comments_and_docstrings, change_sizes, rename_identifiers  # noqa: E402

from opsynth.dedup import NearDupIndex  # noqa: E402
from opsynth.dedup.neardup import task_signature  # noqa: E402
from opsynth.render.parse import TaskParseError, parse_task  # noqa: E402

HEADER = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n"


def chain(*lines: str, init: str = "", params: str = "") -> str:
    """A rendered-style task with the given forward lines (each `x = ...`)."""
    init_lines = "".join(f"        {line}\n" for line in init.splitlines() if line.strip())
    fwd = "".join(f"        x = {line}\n" for line in lines)
    sep = ", " if params else ""
    return (
        f"{HEADER}class Model(nn.Module):\n    def __init__(self{sep}{params}):\n        super().__init__()\n{init_lines}"
        f"\n    def forward(self, x):\n{fwd}        return x\n\n\nbatch_size = 16\nfeatures = 64\n\n\n"
        "def get_inputs():\n    return [torch.randn(batch_size, features)]\n\n\n"
        "def get_init_inputs():\n    return []\n"
    )


ACTS = ["torch.relu(x)", "torch.tanh(x)", "torch.sigmoid(x)", "F.gelu(x)", "F.silu(x)", "torch.exp(x)",
        "torch.abs(x)", "F.softplus(x)", "torch.sin(x)", "torch.cos(x)"]
REDS = ["torch.sum(x, dim=1)", "torch.mean(x, dim=1)", "torch.amax(x, dim=1)", "torch.softmax(x, dim=1)",
        "torch.cumsum(x, dim=1)", "torch.log_softmax(x, dim=1)"]


def distinct_tasks() -> list[str]:
    """60 tasks with pairwise different operator chains."""
    return [chain(a, r) for a in ACTS for r in REDS]


def test_distinct_chains_are_all_kept():
    idx = NearDupIndex(threshold=0.9)
    tasks = distinct_tasks()
    assert len(set(tasks)) == 60
    assert [idx.add(f"t{i}", s) for i, s in enumerate(tasks)] == [None] * 60
    assert len(idx) == 60 and idx.counts == {"kept": 60, "exact_duplicate": 0, "near_duplicate": 0}


def test_renamed_resized_recommented_copy_is_an_exact_duplicate_of_the_first():
    base = chain("torch.relu(x)", "torch.sum(x, dim=1)")
    idx = NearDupIndex()
    assert idx.add("first", base) is None
    for i, edited in enumerate(
        [rename_identifiers(base), change_sizes(base), add_comments_and_docstrings(base),
         base.replace("x = torch.relu(x)\n        x = torch.sum(x, dim=1)", "x = torch.sum(torch.relu(x), dim=1)")]
    ):
        assert edited != base
        assert idx.add(f"copy{i}", edited) == "first"
    assert idx.counts["exact_duplicate"] == 4 and len(idx) == 1
    assert task_signature(base) == task_signature(rename_identifiers(base))


def test_literal_attributes_distinguish_tasks_unless_abstracted():
    a = chain("torch.sum(x, dim=1)", "torch.relu(x)")
    b = chain("torch.sum(x, dim=0)", "torch.relu(x)")
    keep = NearDupIndex(keep_literals=True)
    assert keep.add("a", a) is None and keep.add("b", b) is None
    abstract = NearDupIndex(keep_literals=False)
    assert abstract.add("a", a) is None and abstract.add("b", b) == "a"


def test_near_duplicate_above_threshold_is_caught_and_below_is_kept():
    # a long chain and the same chain with one operator appended share most shingles
    ops = ["torch.relu(x)", "torch.tanh(x)", "torch.sigmoid(x)", "F.gelu(x)", "F.silu(x)", "torch.exp(x)",
           "torch.abs(x)", "F.softplus(x)", "torch.sin(x)", "torch.cos(x)", "torch.neg(x)", "torch.sqrt(x)"]
    long_chain = chain(*ops)
    one_more = chain(*ops, "torch.log1p(x)")
    strict = NearDupIndex(threshold=0.95)
    assert strict.add("long", long_chain) is None
    assert strict.add("more", one_more) is None  # Jaccard ~0.9 < 0.95
    loose = NearDupIndex(threshold=0.7)
    assert loose.add("long", long_chain) is None
    assert loose.add("more", one_more) == "long"
    assert loose.counts["near_duplicate"] == 1
    assert loose.add("other", chain("torch.sum(x, dim=1)")) is None


def test_caller_signature_decides_exact_duplicates():
    idx = NearDupIndex()
    a, b = distinct_tasks()[:2]
    assert idx.add("a", a, signature="sig-1") is None
    assert idx.add("b", b, signature="sig-1") == "a"
    assert idx.add("c", b, signature="sig-2") is None


def test_first_come_first_kept_and_deterministic():
    tasks = distinct_tasks()[:20]
    stream = []
    for i, s in enumerate(tasks):
        stream.append((f"t{i}", s))
        if i % 3 == 0:
            stream.append((f"t{i}-copy", rename_identifiers(s)))
    runs = []
    for _ in range(2):
        idx = NearDupIndex()
        runs.append([idx.add(k, s) for k, s in stream])
    assert runs[0] == runs[1]
    for (key, _), dup in zip(stream, runs[0]):
        assert dup == (key[: -len("-copy")] if key.endswith("-copy") else None)
    # reversed order: now the copies come first and are the ones kept
    idx = NearDupIndex()
    rev = [idx.add(k, s) for k, s in reversed(stream)]
    kept = {k for (k, _), d in zip(reversed(stream), rev) if d is None}
    assert {f"t{i}-copy" for i in range(0, 20, 3)} <= kept


def test_rebuild_for_a_resumed_run_gives_the_same_decisions():
    tasks = distinct_tasks()
    stream = [(f"t{i}", s) for i, s in enumerate(tasks[:30])] + [("dup", rename_identifiers(tasks[4]))]
    stream += [(f"t{i}", s) for i, s in enumerate(tasks[30:], start=30)]
    full = NearDupIndex()
    decisions = {k: full.add(k, s) for k, s in stream}
    # run stopped after 31 tasks; resume from the accepted ones
    accepted = [(k, s) for k, s in stream[:31] if decisions[k] is None]
    resumed = NearDupIndex.rebuild(accepted)
    assert len(resumed) == len(accepted)
    assert {k: resumed.add(k, s) for k, s in stream[31:]} == {k: decisions[k] for k, _ in stream[31:]}
    assert resumed.add("again", rename_identifiers(tasks[4])) == "t4"


def test_errors_are_clear():
    idx = NearDupIndex()
    idx.add("a", distinct_tasks()[0])
    with pytest.raises(ValueError, match="already added"):
        idx.add("a", distinct_tasks()[1])
    with pytest.raises(TaskParseError):
        idx.add("bad", "def broken(:\n")
    with pytest.raises(ValueError, match="threshold"):
        NearDupIndex(threshold=0.0)


def test_accepts_parsed_facts_and_config():
    src = distinct_tasks()[0]
    idx = NearDupIndex.from_config({"neardup_threshold": 0.8, "num_perm": 64})
    assert idx.threshold == 0.8 and idx.num_perm == 64
    assert idx.add("a", parse_task(src)) is None
    assert idx.add("b", src) == "a"
