"""The README's main job end to end, through the Hydra entry point, with its defaults (local Dask
cluster, verify=auto, torch.compile with inductor, calibration) at a tiny size: the folder it writes
loads with `datasets`, every row runs, and the report, plots and card are there. Rerunning it on
the finished folder does nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from pipeline_cli import REPO, generate_cmd, run_env, run_generate

from opsynth.generate.state import STATE_FILE
from opsynth.render import task_id
from opsynth.shards import COLUMNS, SCHEMA, read_rows, validate_row

N_TASKS = 3
RUN = [f"n_tasks={N_TASKS}", "sampler.scale=0.1", "cluster.n_workers=1", "cluster.threads_per_worker=2",
       "progress=false"]


@pytest.fixture(scope="module")
def generated(tmp_path_factory, kernelbench_parquet):
    out = tmp_path_factory.mktemp("e2e") / "ds"
    proc = run_generate(generate_cmd(out, *RUN), run_env(kernelbench_parquet), timeout=540)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out, proc


@pytest.mark.slow
def test_generate_writes_a_dataset_that_datasets_loads(generated, tmp_path, monkeypatch):
    out, proc = generated
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    assert summary["accepted"] == N_TASKS and summary["device"] == "cpu"
    assert sorted(p.name for p in (out / "data").iterdir()) == ["train-00000-of-00001.parquet"]

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    import datasets

    ds = datasets.load_dataset(str(out), cache_dir=str(tmp_path / "hf-cache"))
    assert list(ds) == ["train"] and ds["train"].num_rows == N_TASKS
    assert ds["train"].column_names == list(COLUMNS)
    assert ds["train"].column_names[:3] == ["code", "ops", "data_source"]  # Ops-6K's columns first
    assert ds["train"].features == datasets.Features.from_arrow_schema(SCHEMA)

    rows = read_rows(out)
    assert [r["task_id"] for r in rows] == ds["train"]["task_id"]
    assert len({r["task_id"] for r in rows}) == N_TASKS
    for i, row in enumerate(rows):
        validate_row(row, i)
        assert row["task_id"] == task_id(row["code"])
        assert row["device"] == "cpu" and row["eager_ms"] > 0 and row["compile_ms"] > 0
        assert row["kb_max_similarity"] is not None and row["kb_max_similarity"] <= 0.9


_RUN_ROWS = """
import json, sys
import pyarrow.parquet as pq
import torch

codes = pq.read_table(sys.argv[1], columns=["code"]).column("code").to_pylist()
done = []
for code in codes:
    ns = {}
    exec(compile(code, "<task>", "exec"), ns)
    model = ns["Model"](*ns["get_init_inputs"]())
    with torch.no_grad():
        out = model(*ns["get_inputs"]())
    outs = out if isinstance(out, (tuple, list)) else [out]
    assert any(isinstance(o, torch.Tensor) for o in outs), type(out)
    done.append(True)
print(json.dumps({"ran": len(done)}))
"""


@pytest.mark.slow
def test_every_row_executes(generated):
    out, _ = generated
    (shard,) = (out / "data").iterdir()
    # Task code runs in a child process with a timeout, never in the test process.
    proc = subprocess.run([sys.executable, "-c", _RUN_ROWS, str(shard)], capture_output=True, text=True,
                          timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.strip().splitlines()[-1]) == {"ran": N_TASKS}


@pytest.mark.slow
def test_report_plots_and_card_are_written(generated):
    out, _ = generated
    report = json.loads((out / "report.json").read_text())
    assert report["run"]["accepted"] == N_TASKS and report["run"]["n_tasks"] == N_TASKS
    assert report["run"]["thresholds"]["compile_backend"] == "inductor"
    assert report["rows"]["num_rows"] == N_TASKS
    div = report["rows"]["diversity"]  # rows are distinct tasks: at least one sequence and N signatures
    assert 1 <= div["distinct_op_sequences"] <= N_TASKS and div["distinct_graph_signatures"] == N_TASKS
    stages = report["run"]["stage_seconds"]
    assert {"sampling", "eager_checks", "compile", "timing", "writing"} <= set(stages)
    assert all(v >= 0 for v in stages.values())
    assert set(report["plots"]) >= {"mixture", "categories", "runtimes", "speedup", "kb_similarity", "rejections"}
    for rel in report["plots"].values():
        png = (out / rel).read_bytes()
        assert png[:8] == b"\x89PNG\r\n\x1a\n", rel
    card = (out / "README.md").read_text()
    assert card.startswith("---\n")
    header = card.split("---\n")[1]
    assert "license:" in header and "configs:" in header and "data/train-*" in header
    assert "dataset_info:" in header and "num_examples: 3" in header
    state = json.loads((out / STATE_FILE).read_text())
    assert state["finished"] is True and state["next_index"] >= N_TASKS


@pytest.mark.slow
def test_rerun_on_a_finished_folder_does_nothing(generated, kernelbench_parquet):
    out, _ = generated
    (shard,) = (out / "data").iterdir()
    before = (shard.name, shard.stat().st_mtime_ns, shard.read_bytes())
    rows_before = read_rows(out)
    state_before = json.loads((out / STATE_FILE).read_text())
    card_before = (out / "README.md").read_text()

    # An unreachable scheduler: a finished folder must not need any cluster at all.
    rerun = [f"n_tasks={N_TASKS}", "sampler.scale=0.1", "progress=false", "cluster=scheduler",
             "cluster.address=tcp://127.0.0.1:9"]
    proc = run_generate(generate_cmd(out, *rerun), run_env(kernelbench_parquet), timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "nothing to generate" in proc.stdout + proc.stderr
    (shard_after,) = (out / "data").iterdir()
    assert (shard_after.name, shard_after.stat().st_mtime_ns, shard_after.read_bytes()) == before
    assert read_rows(out) == rows_before
    state = json.loads((out / STATE_FILE).read_text())
    assert state["next_index"] == state_before["next_index"]
    assert state["stats"] == state_before["stats"]  # same counts and settings, no extra wall time
    assert (out / "README.md").read_text() == card_before
