"""Decontamination against KernelBench: problems, edited copies and different chains."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from kb_edits import (  # noqa: E402
    add_comments_and_docstrings,
    all_edits,
    change_sizes,
    rename_identifiers,
    swap_independent_statements,
)

from opsynth.dedup import (  # noqa: E402
    DedupConfig,
    KernelBenchIndex,
    KernelBenchUnavailable,
    ast_similarity,
    load_kernelbench,
)

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing here may reach the network
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")


@pytest.fixture(scope="module")
def index(kernelbench_parquet) -> KernelBenchIndex:
    return KernelBenchIndex.from_config({"kb_path": str(kernelbench_parquet)})


@pytest.fixture(scope="module")
def level2(index):
    return [p for p in index.problems if p.level == 2]


def test_every_problem_is_rejected_as_itself(index):
    assert len(index) == 270
    for p in index.problems:
        m = index.check(p.code)
        assert m.max_similarity == 1.0, p.key
        assert m.rejected and m.reason == "kb_similarity", p.key
        assert m.nearest == p.key
        assert m.as_row() == {"kb_max_similarity": 1.0, "kb_nearest": p.key}


@pytest.mark.parametrize(
    "edit",
    [
        rename_identifiers,
        change_sizes,
        lambda s: swap_independent_statements(s)[0],
        add_comments_and_docstrings,
        all_edits,
    ],
    ids=["rename", "resize", "swap", "comments", "all"],
)
def test_edited_level2_problems_are_still_rejected(index, level2, edit):
    for p in level2:
        edited = edit(p.code)
        assert edited != p.code
        m = index.check(edited)
        assert m.rejected, (p.key, m)
        assert m.max_similarity >= 0.99, (p.key, m)
        # the nearest is the original, or a problem that is the same program up to sizes
        assert ast_similarity(index.problems[[q.key for q in index.problems].index(m.nearest)].code, p.code) == 1.0


def test_the_swap_edit_really_reorders(level2):
    swaps = sum(swap_independent_statements(p.code)[1] for p in level2)
    assert swaps >= 50


def test_reordered_independent_forward_statements_and_operands():
    a = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.left = nn.Conv2d(c, c, 3)
        self.right = nn.Conv2d(c, c, 1)

    def forward(self, x):
        a = self.left(x)
        b = torch.sigmoid(self.right(x))
        y = a * b
        return torch.relu(y)
"""
    b = """
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.right = nn.Conv2d(c, c, 1)
        self.left = nn.Conv2d(c, c, 3)

    def forward(self, inp):
        gate = torch.sigmoid(self.right(inp))
        feat = self.left(inp)
        out = gate * feat
        return torch.relu(out)
"""
    assert ast_similarity(a, b) == 1.0
    # a different chain (relu -> tanh at the end) is not the same program
    assert ast_similarity(a, b.replace("torch.relu(out)", "torch.tanh(out)")) < 0.9


def test_a_different_operator_chain_is_not_rejected(index):
    p = next(q for q in index.problems if q.key == "level_2/1_Conv2D_ReLU_BiasAdd")
    assert p.code.count("torch.relu") == 1
    for changed in (
        p.code.replace("torch.relu", "torch.tanh"),
        p.code.replace("x + self.bias", "x * self.bias"),
        p.code.replace("x = torch.relu(x)", "x = torch.relu(x)\n        x = torch.sigmoid(x)"),
    ):
        s = ast_similarity(changed, p.code)
        assert 0.3 < s < 0.9
        m = index.check(changed)
        assert not m.rejected, m
        assert m.max_similarity < 0.9


def test_nested_and_step_by_step_forms_are_the_same_program(index):
    p = next(q for q in index.problems if q.key == "level_2/1_Conv2D_ReLU_BiasAdd")
    nested = p.code.replace(
        "        x = self.conv(x)\n        x = torch.relu(x)\n        x = x + self.bias\n        return x",
        "        return torch.relu(self.conv(x)) + self.bias",
    )
    assert nested != p.code
    m = index.check(nested)
    assert m.max_similarity == 1.0 and m.nearest == p.key and m.reason == "kb_similarity"


FUNCTIONAL_CONV_RELU_BIAS = """
import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size, bias_shape):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(out_channels, in_channels, kernel_size, kernel_size))
        self.shift = nn.Parameter(torch.randn(bias_shape))

    def forward(self, x):
        y = F.conv2d(x, self.weight, stride=1)
        y = F.relu(y)
        return y + self.shift
"""


def test_op_sequence_match_rejects_or_flags(index):
    """Same chain as level_2/1 (conv2d, relu, add) written functionally: different code, same operators."""
    key = "level_2/1_Conv2D_ReLU_BiasAdd"
    m = index.check(FUNCTIONAL_CONV_RELU_BIAS)
    assert m.max_similarity < 0.9
    assert m.op_sequence_match == key
    assert m.rejected and m.reason == "kb_op_sequence"
    flag_only = KernelBenchIndex(index.problems, op_sequence_action="flag")
    m2 = flag_only.check(FUNCTIONAL_CONV_RELU_BIAS)
    assert m2.op_sequence_match == key and not m2.rejected and m2.reason is None
    assert m2.max_similarity == m.max_similarity
    # one operator more and it no longer matches
    longer = FUNCTIONAL_CONV_RELU_BIAS.replace("return y + self.shift", "return torch.tanh(y + self.shift)")
    assert index.check(longer).op_sequence_match is None


def test_similarity_is_symmetric_and_bounded(level2):
    codes = [p.code for p in level2[:12]]
    for a in codes:
        for b in codes:
            s = ast_similarity(a, b)
            assert 0.0 <= s <= 1.0
            assert s == pytest.approx(ast_similarity(b, a))


# --- loading the reference


def test_load_from_parquet_file_and_folder(kernelbench_parquet, tmp_path):
    problems = load_kernelbench(kb_path=kernelbench_parquet)
    assert len(problems) == 270 and {p.level for p in problems} == {1, 2, 3, 4}
    table = pq.read_table(kernelbench_parquet)
    pq.write_table(table.slice(0, 100), tmp_path / "a.parquet")
    pq.write_table(table.slice(100), tmp_path / "b.parquet")
    assert [p.key for p in load_kernelbench(kb_path=tmp_path)] == [p.key for p in problems]
    assert {p.level for p in load_kernelbench(kb_path=tmp_path, levels=[2])} == {2}


def test_missing_or_unreadable_reference_names_the_setting(tmp_path, monkeypatch):
    with pytest.raises(KernelBenchUnavailable, match="dedup.kb_path"):
        KernelBenchIndex.from_config({"kb_path": str(tmp_path / "nope.parquet")})
    garbage = tmp_path / "garbage.parquet"
    garbage.write_bytes(b"not parquet at all")
    with pytest.raises(KernelBenchUnavailable, match="dedup.kb_path"):
        load_kernelbench(kb_path=garbage)
    pq.write_table(pa.table({"text": ["x"]}), tmp_path / "wrong.parquet")
    with pytest.raises(KernelBenchUnavailable, match="lacks columns"):
        load_kernelbench(kb_path=tmp_path / "wrong.parquet")
    # the Hub source failing (offline here) is an error that points at the local setting
    import datasets

    def offline(*a, **k):
        raise ConnectionError("offline")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("OPSYNTH_KERNELBENCH", raising=False)
    monkeypatch.chdir(tmp_path)  # no local copy beside it either
    with pytest.raises(KernelBenchUnavailable, match="dedup.kb_path"):
        KernelBenchIndex.from_config({"kb_path": None, "kb_dataset": "ScalingIntelligence/KernelBench"})


def test_hub_rows_are_read_per_level_split(monkeypatch, kernelbench_parquet):
    """The Hub layout (splits level_1..level_4) gives the same problems as the Parquet file."""
    import datasets

    table = pq.read_table(kernelbench_parquet).drop(["source_path"])
    splits = {}
    for lvl in (1, 2, 3, 4):
        rows = [r for r in table.to_pylist() if r["level"] == lvl]
        splits[f"level_{lvl}"] = datasets.Dataset.from_list(rows)
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *a, **k: datasets.DatasetDict(splits))
    hub = load_kernelbench(kb_path=None, kb_dataset="ScalingIntelligence/KernelBench")
    assert [p.key for p in hub] == [p.key for p in load_kernelbench(kb_path=kernelbench_parquet)]


def _hub_splits(kernelbench_parquet):
    import datasets

    table = pq.read_table(kernelbench_parquet).drop(["source_path"])
    return datasets.DatasetDict({f"level_{lvl}": datasets.Dataset.from_list(
        [r for r in table.to_pylist() if r["level"] == lvl]) for lvl in (1, 2, 3, 4)})


def test_without_a_local_copy_the_default_is_the_hub_dataset(monkeypatch, tmp_path, kernelbench_parquet):
    """A clone without ../shared beside it (anyone's clone) and no $OPSYNTH_KERNELBENCH: the default
    settings load the Hub dataset through `datasets` (which caches it). Faked here: no download."""
    import datasets

    calls = []
    splits = _hub_splits(kernelbench_parquet)
    monkeypatch.setattr(datasets, "load_dataset", lambda name, *a, **k: calls.append(name) or splits)
    monkeypatch.delenv("OPSYNTH_KERNELBENCH", raising=False)
    monkeypatch.chdir(tmp_path)
    index = KernelBenchIndex.from_config(DedupConfig())
    assert calls == ["ScalingIntelligence/KernelBench"]
    assert len(index.problems) == 270


def test_a_local_copy_is_found_before_the_hub(monkeypatch, tmp_path, kernelbench_parquet):
    """../shared/kernelbench/kernelbench.parquet beside the working folder, or $OPSYNTH_KERNELBENCH,
    is read without being asked for; the Hub is then never called."""
    import datasets

    def no_hub(*a, **k):
        raise AssertionError("the Hub must not be asked when a local copy is there")

    monkeypatch.setattr(datasets, "load_dataset", no_hub)
    monkeypatch.delenv("OPSYNTH_KERNELBENCH", raising=False)
    (tmp_path / "shared" / "kernelbench").mkdir(parents=True)
    (tmp_path / "shared" / "kernelbench" / "kernelbench.parquet").symlink_to(kernelbench_parquet)
    (tmp_path / "clone").mkdir()
    monkeypatch.chdir(tmp_path / "clone")
    assert len(load_kernelbench()) == 270
    monkeypatch.chdir(tmp_path)  # nothing beside: the variable
    monkeypatch.setenv("OPSYNTH_KERNELBENCH", str(kernelbench_parquet))
    assert len(load_kernelbench()) == 270
    monkeypatch.setenv("OPSYNTH_KERNELBENCH", str(tmp_path / "gone.parquet"))  # set, but wrong: said so
    with pytest.raises(KernelBenchUnavailable, match="OPSYNTH_KERNELBENCH="):
        load_kernelbench()


def test_offline_without_any_copy_says_how_to_point_at_one(monkeypatch, tmp_path):
    import datasets

    def offline(*a, **k):
        raise ConnectionError("Couldn't reach 'ScalingIntelligence/KernelBench' on the Hub (LocalEntryNotFoundError)")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    monkeypatch.delenv("OPSYNTH_KERNELBENCH", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(KernelBenchUnavailable) as err:
        load_kernelbench()
    msg = str(err.value)
    assert "\n" not in msg and "dedup.kb_path=/path/to/kernelbench.parquet" in msg and "HF_HUB_OFFLINE=1" in msg


def test_config_yaml_matches_the_dataclass():
    from omegaconf import OmegaConf

    yaml = OmegaConf.load(Path(__file__).resolve().parents[2] / "conf" / "dedup" / "default.yaml")
    cfg = DedupConfig.from_any(yaml)
    assert cfg == DedupConfig()
    assert set(OmegaConf.to_container(yaml)) == set(DedupConfig.__dataclass_fields__)
    with pytest.raises(ValueError, match=r"unknown dedup setting\(s\) \['kb_treshold'\]"):
        DedupConfig.from_any({"kb_treshold": 0.5})
    with pytest.raises(ValueError, match="op_sequence_action"):
        DedupConfig(op_sequence_action="maybe")


def test_equivalent_spellings_of_one_forward_compare_equal():
    head = (
        "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\nclass Model(nn.Module):\n"
        "    def __init__(self, c):\n        super().__init__()\n        self.conv = nn.Conv2d(c, c, 3)\n"
        "        self.bias = nn.Parameter(torch.zeros(c, 1, 1))\n\n    def forward(self, x):\n"
    )
    forms = [
        "        x = self.conv(x)\n        x = torch.relu(x)\n        x += self.bias\n        return x\n",
        "        return torch.relu(self.conv(x)) + self.bias\n",
        "        y = self.conv(x)\n        z = self.bias + y.relu()\n        return z\n",
        "        h = F.relu(self.conv(x))\n        return torch.add(h, self.bias)\n",
    ]
    sources = [head + f for f in forms]
    for s in sources[1:]:
        assert ast_similarity(sources[0], s) == 1.0, s
    # swapping the two operators is a different program
    swapped = head + "        return torch.relu(self.conv(x) + self.bias)\n"
    assert ast_similarity(sources[0], swapped) < 0.9


@pytest.mark.parametrize("choice", ["default", "offline"])
def test_hydra_group_composes_into_the_dataclass(choice, monkeypatch):
    from hydra import compose, initialize_config_dir

    monkeypatch.setenv("OPSYNTH_KERNELBENCH", "/somewhere/kb.parquet")
    conf = Path(__file__).resolve().parents[2] / "conf"
    with initialize_config_dir(config_dir=str(conf), version_base=None):
        cfg = compose(config_name=None, overrides=[f"+dedup={choice}"])
    c = DedupConfig.from_any(cfg.dedup)
    assert c.kb_threshold == 0.9 and c.op_sequence_action == "reject"
    assert c.kb_path == (None if choice == "default" else "/somewhere/kb.parquet")


def test_sampled_tasks_are_not_rejected_wholesale(index):
    """The full distribution over 2,000 tasks is in benchmarks/results/dedup_throughput.json."""
    from opsynth.catalog import load_catalog
    from opsynth.graph import Sampler, SamplerConfig
    from opsynth.render import render_task

    sampler = Sampler(SamplerConfig(), load_catalog())
    matches = [index.check(render_task(sampler.sample(seed).graph)) for seed in range(150)]
    rejected = [m for m in matches if m.rejected]
    assert len(rejected) <= 0.05 * len(matches), [(m.nearest, m.max_similarity) for m in rejected]
    sims = sorted(m.max_similarity for m in matches)
    assert 0.2 < sims[len(sims) // 2] < 0.8  # the median task shares some structure, not the program
