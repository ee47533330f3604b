"""`pipelines.audit` / `opsynth.audit`: hand-made bad rows in Ops-6K's exact column layout, one per
reason, each get their reason (and the good rows are kept, a BatchNorm row in train mode); a clean
folder the generator wrote on CPU passes 100 %; a Hub id offline is one line; the command line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opsynth.audit import AuditConfig, audit, format_table
from opsynth.audit.run import SUMMARY, VERDICTS

REPO = Path(__file__).resolve().parents[2]
HEAD = "import torch\nimport torch.nn as nn\nimport torch.nn.functional as F\n\n\n"


def task(init: str, forward: str, sizes: str = "batch_size = 16\nfeatures = 64\n",
         inputs: str = "[torch.randn(batch_size, features)]") -> str:
    return (HEAD + "class Model(nn.Module):\n    def __init__(self, features):\n        super().__init__()\n"
            + init + "\n    def forward(self, x):\n" + forward + "\n\n" + sizes + "\n\n"
            "def get_inputs():\n    return " + inputs + "\n\n\ndef get_init_inputs():\n    return [features]\n")


LIN = "        self.lin = nn.Linear(features, features)\n"
GOOD = task(LIN, "        return torch.relu(self.lin(x))\n")
ROWS = [  # (code, ops, data_source, reason the audit must give; None: kept)
    (GOOD, ["nn.Linear", "torch.relu"], "torch#2", None),
    (task(LIN + "        self.bn = nn.BatchNorm1d(features)\n", "        return torch.tanh(self.bn(self.lin(x)))\n"),
     ["nn.Linear", "nn.BatchNorm1d", "torch.tanh"], "torch#3", None),
    # GOOD respelled and resized: the same call graph
    (task(LIN, "        y = self.lin(x)\n        return F.relu(y)\n", sizes="batch_size = 8\nfeatures = 32\n"),
     ["nn.Linear", "F.relu"], "torch#2", "semantic_duplicate"),
    (task(LIN + "        self.proj = nn.Linear(features, 2 * features)\n", "        return torch.sigmoid(self.lin(x))\n"),
     ["nn.Linear", "torch.sigmoid"], "torch#2", "unused_state"),
    (task(LIN, "        return torch.tanh(self.lin(x)) * 3.0\n", inputs="[torch.ones(batch_size, features)]"),
     ["nn.Linear", "torch.tanh"], "torch#2", "fixed_inputs"),
    (task(LIN, "        return self.lin(x).view(-1, 7, 3)\n"), ["nn.Linear"], "torch#1", "eager_error"),
    (task(LIN, "        return torch.zeros_like(self.lin(x))\n"), ["nn.Linear"], "torch#1", "constant_output"),
    (GOOD.replace("class Model", "class Modle"), ["nn.Linear"], "torch#2", "missing_definitions"),
]
AUDIT = dict(compile_backend="eager", n_workers=1, progress=False, timeout_s=60.0)


@pytest.fixture(scope="module")
def ops6k_file(tmp_path_factory, kernelbench_parquet) -> Path:
    """The rows above plus a copy of a KernelBench level-2 problem, in exactly Ops-6K's columns."""
    kb = pq.read_table(kernelbench_parquet).to_pylist()
    copied = next(r for r in kb if r["level"] == 2)
    rows = [{"code": c, "ops": o, "data_source": d} for c, o, d, _ in ROWS]
    rows.append({"code": copied["code"], "ops": ["nn.Conv2d"], "data_source": "torch#2"})
    path = tmp_path_factory.mktemp("ops6k") / "train-00000-of-00001.parquet"
    pq.write_table(pa.Table.from_pylist(rows, schema=pa.schema(
        [("code", pa.string()), ("ops", pa.list_(pa.string())), ("data_source", pa.string())])), path)
    return path


@pytest.fixture(scope="module")
def audited(ops6k_file, kernelbench_parquet, tmp_path_factory):
    out = tmp_path_factory.mktemp("audit")
    summary = audit(AuditConfig(source=str(ops6k_file), out=str(out), kb_path=str(kernelbench_parquet), **AUDIT))
    return summary, out


def test_each_bad_row_gets_its_reason_and_the_good_rows_are_kept(audited):
    summary, out = audited
    verdicts = pq.read_table(out / VERDICTS).to_pylist()
    want = [r for *_, r in ROWS] + ["kb_similarity"]
    assert [v["reason"] for v in verdicts] == want, [(v["reason"], v["detail"]) for v in verdicts]
    assert [v["kept"] for v in verdicts] == [r is None for r in want]
    assert [v["mode"] for v in verdicts[:2]] == ["eval", "train"]  # BatchNorm's output differs in train mode
    assert verdicts[2]["duplicate_of"].startswith("0:")  # the respelled copy names the first row
    assert "proj" in verdicts[3]["detail"]
    on_disk = json.loads((out / SUMMARY).read_text())
    assert on_disk["rows"] == summary["rows"] == len(want) and on_disk["kept"] == 2
    assert on_disk["rejected"] == {r: want.count(r) for r in want if r}
    assert on_disk["modes"] == {"train": 1, "eval": 1} and on_disk["distinct_signatures"] == 2
    assert on_disk["distinct_op_names"] == 4  # the kept rows' `ops`
    table = format_table(summary)
    assert "rejected: unused_state" in table and "distinct signatures (kept)" in table


@pytest.fixture(scope="module")
def clean_folder(tmp_path_factory, kernelbench_parquet):
    """A tiny dataset the generator writes on CPU (as the pipeline tests run it)."""
    from opsynth.generate import candidate, driver
    from opsynth.generate.config import GenerateConfig

    out = tmp_path_factory.mktemp("clean") / "ds"
    cfg = GenerateConfig(n_tasks=4, output_dir=str(out), progress=False, write_card=True)
    cfg.sampler.scale = 0.1
    cfg.verify.device, cfg.verify.compile_backend, cfg.verify.n_workers = "cpu", "eager", 1
    cfg.verify.cpu_min_ms, cfg.verify.cpu_max_ms = 0.0, 1e6  # acceptance does not hinge on a timing
    cfg.cluster.n_workers, cfg.cluster.threads_per_worker = 1, 2
    cfg.dedup.kb_path = str(kernelbench_parquet)
    driver.run(cfg)
    candidate._close_context()
    return out


@pytest.mark.slow
def test_a_folder_the_generator_wrote_passes_the_audit_entirely(clean_folder, kernelbench_parquet):
    from opsynth.shards import read_rows

    rows = read_rows(clean_folder)
    summary = audit(AuditConfig(source=str(clean_folder), kb_path=str(kernelbench_parquet), **AUDIT))
    assert summary["rows"] == len(rows) == 4
    assert summary["kept"] == 4 and summary["rejected"] == {}, summary["rejected"]
    assert summary["mode_disagreements"] == 0  # the audit decides each row's mode as the generator did
    verdicts = pq.read_table(Path(summary["out"]) / VERDICTS).to_pylist()
    assert [v["trace_signature"] for v in verdicts] == [r["trace_signature"] for r in rows]
    assert Path(summary["out"]) == clean_folder / "audit"
    card = (clean_folder / "README.md").read_text()
    assert "no unused state" in card and "no semantic duplicate" in card and "pipelines.audit" in card


def _command(*args: str, **env: str) -> subprocess.CompletedProcess:
    e = {**os.environ, "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "pipelines.audit", *args], cwd=REPO, env=e,
                          capture_output=True, text=True, timeout=300)


def test_a_hub_id_offline_is_one_clear_line(tmp_path):
    proc = _command("nobody-here/no-such-dataset", "--out", str(tmp_path / "a"), "--no-progress",
                    HF_HUB_OFFLINE="1", HF_DATASETS_OFFLINE="1", HF_HOME=str(tmp_path / "hf"))
    assert proc.returncode == 2, proc.stderr[-2000:]
    lines = [ln for ln in proc.stderr.strip().splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "nobody-here/no-such-dataset" in lines[0] and "did not load" in lines[0], proc.stderr
    assert "Traceback" not in proc.stderr


def test_the_command_line_prints_the_table_and_writes_its_files(ops6k_file, kernelbench_parquet, tmp_path):
    out = tmp_path / "cli"
    proc = _command(str(ops6k_file), "--out", str(out), "--limit", "2", "--no-progress", "compile_backend=eager",
                    f"kb_path={kernelbench_parquet}", "n_workers=1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "rows" in proc.stdout and "kept" in proc.stdout
    last = json.loads(proc.stdout.strip().splitlines()[-1])
    assert last["rows"] == 2 and last["kept"] == 2
    assert (out / SUMMARY).is_file() and (out / VERDICTS).is_file()


def test_flags_become_overrides():
    from pipelines.audit import to_overrides

    assert to_overrides(["data/x", "--out", "o", "--no-compile", "limit=3", "--max-batch=2"]) == [
        "source='data/x'", "out='o'", "compile=false", "limit=3", "max_batch=2"]


@pytest.mark.slow
def test_the_benchmark_script_audits_a_folder_and_writes_its_table_and_json(clean_folder, kernelbench_parquet, tmp_path,
                                                                             capsys):
    sys.path.insert(0, str(REPO / "benchmarks"))
    import audit_run

    out = tmp_path / "bench.json"
    result = audit_run.main(["--folder", str(clean_folder), "--n-tasks", "4", "--device", "cpu", "--out", str(out),
                             *[a for kv in ("compile_backend=eager", f"kb_path={kernelbench_parquet}", "n_workers=1",
                                            "progress=false") for a in ("--audit-override", kv)]])
    assert result["generate"] == {"rows": 4}  # the folder already held n_tasks rows: nothing generated
    assert result["audit"]["kept"] == 4 and result["kept_ok"]
    assert set(result["mixture"]) == {"torch#1", "torch#2", "torch#3", "torch#4", "torch#5", "transformers#1"}
    assert sum(m["rows"] for m in result["mixture"].values()) == 4
    assert json.loads(out.read_text())["audit"]["rows"] == 4
    assert "transformers#1" in capsys.readouterr().out
