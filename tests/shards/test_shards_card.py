from __future__ import annotations

import pytest
import yaml

from opsynth.shards.card import size_category, write_card
from opsynth.shards.schema import SCHEMA
from opsynth.shards.stats import RunStats
from opsynth.shards.writer import ShardWriter


def _stats() -> RunStats:
    s = RunStats(
        n_tasks=30,
        target_mixture={"torch#1": 0.034, "torch#2": 0.8377, "torch#3": 0.0762, "torch#4": 0.028, "torch#5": 0.0123,
                        "transformers#1": 0.0118},
        thresholds={"eager_ms_min": 1.0, "eager_ms_max": 100.0, "kb_similarity_max": 0.9},
        device="NVIDIA H200",
        versions={"torch": "2.11.0", "python": "3.12.3"},
        wall_time_s=120.0,
        seed=7,
    )
    s.accept(30)
    s.reject("eager_too_slow", 4)
    s.reject("nondeterministic", 6)
    return s


def _front_matter(text: str) -> dict:
    assert text.startswith("---\n")
    return yaml.safe_load(text.split("---\n", 2)[1])


@pytest.fixture
def folder(tmp_path, make_row):
    w = ShardWriter(tmp_path / "ds", rows_per_shard=8, row_group_size=4)
    w.write([make_row(i) for i in range(30)])
    w.finalize()
    return tmp_path / "ds"


def test_datasets_loads_the_folder_with_the_schema_features_and_all_rows(folder, tmp_path, monkeypatch, make_row):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    write_card(folder, _stats())
    ds = datasets.load_dataset(str(folder), split="train", cache_dir=str(tmp_path / "cache"))
    assert ds.num_rows == 30
    assert ds.column_names[:3] == ["code", "ops", "data_source"]
    assert ds.features == datasets.Features.from_arrow_schema(SCHEMA)
    assert ds[29] == make_row(29)


def test_card_yaml_has_hub_metadata_matching_the_shards(folder):
    text = write_card(folder, _stats()).read_text()
    meta = _front_matter(text)
    assert meta["license"] == "cc-by-4.0"
    assert meta["task_categories"] == ["text-generation"]
    assert meta["size_categories"] == ["n<1K"]
    assert "pytorch" in meta["tags"]
    assert meta["configs"] == [{"config_name": "default", "data_files": [{"split": "train", "path": "data/train-*"}]}]
    info = meta["dataset_info"]
    assert [f["name"] for f in info["features"]] == list(SCHEMA.names)
    assert {"name": "ops", "sequence": "string"} in info["features"]
    assert info["splits"][0]["name"] == "train" and info["splits"][0]["num_examples"] == 30
    assert info["download_size"] == sum(p.stat().st_size for p in (folder / "data").iterdir())


def test_card_describes_mixture_filters_counts_environment_and_loading(folder):
    text = write_card(folder, _stats(), repo_id="someone/opsynth-ops").read_text()
    body = text.split("---\n", 2)[2]
    # achieved torch#2 = 10 of 30 rows (make_row cycles k = 1, 2, 3) against a target of 83.77 %
    assert "| `torch#2` | 10 | 33.33 % | 83.77 % |" in body
    assert "| `transformers#1` | 0 | 0.00 % | 1.18 % |" in body
    assert "`eager_ms_max` | `100.0`" in body and "`kb_similarity_max` | `0.9`" in body
    assert "| `nondeterministic` | 6 | 60.00 % |" in body
    assert "acceptance rate | 75.00 %" in body
    assert "`NVIDIA H200`" in body and "`2.13.0` (30 rows)" in body and "`3.12.3`" in body
    assert 'load_dataset("someone/opsynth-ops", split="train")' in body
    for step in ("Sample", "Render", "Verify", "Dedup"):
        assert f"**{step}**" in body


def test_card_refuses_a_folder_without_finalized_shards(tmp_path, make_row):
    with pytest.raises(FileNotFoundError, match="no shards"):
        write_card(tmp_path, _stats())
    w = ShardWriter(tmp_path, rows_per_shard=8)
    w.write(make_row(0))
    w.close()
    with pytest.raises(ValueError, match="not finalized"):
        write_card(tmp_path, _stats())


@pytest.mark.parametrize("n, cat", [(0, "n<1K"), (999, "n<1K"), (1_000, "1K<n<10K"), (6_000, "1K<n<10K"),
                                     (10_000, "10K<n<100K"), (2_000_000, "1M<n<10M")])
def test_size_category(n, cat):
    assert size_category(n) == cat


def test_card_lists_the_band_in_force_on_the_device_that_verified(folder):
    stats = _stats()
    stats.thresholds = {"verify_device": "cpu", "eager_ms_min": 0.05, "eager_ms_max": 100.0, "mem_cap_gb": 4.0}
    body = write_card(folder, stats).read_text().split("---\n", 2)[2]
    assert "in force on `cpu`" in body
    assert "| `eager_ms_min` | `0.05` |" in body and "| `mem_cap_gb` | `4.0` |" in body
    assert "`verify_device`" not in body  # said in the sentence, not as a filter
