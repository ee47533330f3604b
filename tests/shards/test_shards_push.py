from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from unittest import mock

import pytest
from hydra import compose, initialize_config_dir
from huggingface_hub import HfApi, constants

from opsynth.shards.card import write_card
from opsynth.shards.push import PushError, plan_upload
from opsynth.shards.report import write_report
from opsynth.shards.stats import RunStats
from opsynth.shards.writer import ShardWriter
from pipelines.push import run

REPO = Path(__file__).resolve().parents[2]
FAKE_TOKEN = "hf_FakeTokenForTests0123456789abcdefXYZ"
EXPECTED_FILES = [
    "README.md",
    "data/train-00000-of-00003.parquet",
    "data/train-00001-of-00003.parquet",
    "data/train-00002-of-00003.parquet",
    "plots/categories.png",
    "plots/kb_similarity.png",
    "plots/mixture.png",
    "plots/rejections.png",
    "plots/runtimes.png",
    "plots/speedup.png",
    "report.json",
]


@pytest.fixture(autouse=True)
def offline(monkeypatch):
    """No test here may reach the Hub: any unpatched network call raises OfflineModeIsEnabled."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)


@pytest.fixture
def dataset_dir(tmp_path, make_row) -> Path:
    out = tmp_path / "ds"
    w = ShardWriter(out, rows_per_shard=10)
    w.write([make_row(i) for i in range(25)])
    w.finalize()
    stats = RunStats(target_mixture={"torch#1": 0.5, "torch#2": 0.5})
    write_report(out, stats)
    write_card(out, stats)
    # things that live in an output folder but must never be uploaded
    (out / "data" / ".tmp-part-00009.parquet.123").write_bytes(b"half")
    (out / "run.log").write_text("log")
    return out


def _cfg(**overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base=None):
        return compose("push", overrides=[f"{k}={v}" for k, v in overrides.items()])


def test_dry_run_is_the_default_and_prints_exactly_the_plan(dataset_dir, capsys):
    cfg = _cfg(output_dir=dataset_dir, repo_id="someone/opsynth-ops")
    assert cfg.upload is False
    with mock.patch.object(HfApi, "create_repo") as create, mock.patch.object(HfApi, "upload_folder") as upload:
        plan = run(cfg)
    create.assert_not_called()
    upload.assert_not_called()
    assert [p for p, _ in plan.files] == EXPECTED_FILES
    out = capsys.readouterr().out
    assert "repo: someone/opsynth-ops (repo type: dataset" in out
    for rel in EXPECTED_FILES:
        size = (dataset_dir / rel).stat().st_size
        assert f"{rel}" in out and f"{size:,} B" in out
    assert f"files: 11, {plan.total_bytes:,} bytes" in out
    assert "commits: 1" in out and "dry run" in out
    assert ".tmp-" not in out and "run.log" not in out and ".opsynth-writer.lock" not in out


def test_upload_creates_the_dataset_repo_and_uploads_in_one_call(dataset_dir, monkeypatch, capsys):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    with mock.patch.object(HfApi, "create_repo", autospec=True) as create, \
            mock.patch.object(HfApi, "upload_folder", autospec=True) as upload:
        upload.return_value = mock.Mock(commit_url="https://huggingface.co/datasets/someone/opsynth-ops/commit/abc")
        run(_cfg(output_dir=dataset_dir, repo_id="someone/opsynth-ops", upload="true"))
    create.assert_called_once()
    assert create.call_args.kwargs == {"repo_id": "someone/opsynth-ops", "repo_type": "dataset",
                                       "private": False, "exist_ok": True}
    assert create.call_args.args[0].token == FAKE_TOKEN  # the token came from HF_TOKEN
    upload.assert_called_once()
    kw = upload.call_args.kwargs
    assert kw["repo_type"] == "dataset" and kw["repo_id"] == "someone/opsynth-ops"
    assert Path(kw["folder_path"]) == dataset_dir
    assert kw["allow_patterns"] == EXPECTED_FILES
    assert kw["delete_patterns"] == ["data/*", "plots/*"]
    assert "commit/abc" in capsys.readouterr().out


def test_real_upload_folder_sends_one_commit_with_exactly_the_planned_paths(dataset_dir, monkeypatch):
    """Runs huggingface_hub's own upload_folder with only its network calls patched, so the
    allow/delete patterns are checked for what they really select. `_validate_yaml` (a README check
    that POSTs to the Hub) and `is_xet_available` (pick the single-commit path) are private: if a
    huggingface_hub upgrade renames them this test fails instead of silently reaching the network."""
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    remote = [".gitattributes", "README.md", "data/train-00000-of-00004.parquet",
              "data/train-00003-of-00004.parquet", "plots/old.png", "notes.txt"]
    monkeypatch.setattr("huggingface_hub.hf_api.is_xet_available", lambda: False)
    with mock.patch.object(HfApi, "create_repo", autospec=True) as create, \
            mock.patch.object(HfApi, "list_repo_files", autospec=True, return_value=remote), \
            mock.patch.object(HfApi, "_validate_yaml", autospec=True) as validate, \
            mock.patch.object(HfApi, "create_commit", autospec=True) as commit:
        run(_cfg(output_dir=dataset_dir, repo_id="someone/opsynth-ops", upload="true"))
    create.assert_called_once()
    validate.assert_called_once()
    assert commit.call_count == 1
    kw = commit.call_args.kwargs
    assert kw["repo_type"] == "dataset" and kw["repo_id"] == "someone/opsynth-ops"
    ops = kw["operations"]
    added = [op.path_in_repo for op in ops if type(op).__name__ == "CommitOperationAdd"]
    deleted = sorted(op.path_in_repo for op in ops if type(op).__name__ == "CommitOperationDelete")
    assert sorted(added) == EXPECTED_FILES
    # stale remote shards and plots go in the same commit; files outside data/ and plots/ stay
    assert deleted == ["data/train-00000-of-00004.parquet", "data/train-00003-of-00004.parquet", "plots/old.png"]


def test_the_token_is_never_printed_or_logged_even_when_the_hub_echoes_it(dataset_dir, monkeypatch, capsys, caplog):
    monkeypatch.setenv("HF_TOKEN", FAKE_TOKEN)
    caplog.set_level(logging.DEBUG)

    def refuse(self, **kwargs):
        raise RuntimeError(f"401 Unauthorized: invalid credentials in header Authorization: Bearer {FAKE_TOKEN}")

    with mock.patch.object(HfApi, "create_repo", autospec=True), mock.patch.object(HfApi, "upload_folder", refuse):
        with pytest.raises(PushError) as e:
            run(_cfg(output_dir=dataset_dir, repo_id="someone/opsynth-ops", upload="true"))
    assert "401 Unauthorized" in str(e.value) and "<redacted>" in str(e.value)
    assert e.value.__cause__ is None and e.value.__suppress_context__
    captured = capsys.readouterr()
    for text in (str(e.value), captured.out, captured.err, caplog.text):
        assert FAKE_TOKEN not in text


def test_entry_point_with_a_fake_token_keeps_it_out_of_output_and_hydra_logs(dataset_dir, tmp_path):
    env = {**os.environ, "HF_TOKEN": FAKE_TOKEN, "HF_HUB_OFFLINE": "1", "PYTHONPATH": str(REPO)}
    run_dir = tmp_path / "hydra"
    common = [sys.executable, "-m", "pipelines.push", f"output_dir={dataset_dir}", "repo_id=someone/opsynth-ops",
              f"hydra.run.dir={run_dir}"]
    dry = subprocess.run(common, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr
    assert "commits: 1" in dry.stdout
    # upload=true gets as far as the Hub call, which offline mode refuses
    up = subprocess.run(common + ["upload=true"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert up.returncode != 0 and "OfflineModeIsEnabled" in up.stdout + up.stderr
    logs = [p for p in run_dir.rglob("*") if p.is_file()]
    assert any(p.suffix == ".log" for p in logs) and any(p.name == "config.yaml" for p in logs)
    for text in [dry.stdout, dry.stderr, up.stdout, up.stderr] + [p.read_text(errors="replace") for p in logs]:
        assert FAKE_TOKEN not in text


def test_upload_without_a_token_says_how_to_get_one(dataset_dir, monkeypatch, tmp_path):
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.delenv("HF_OIDC_RESOURCE", raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token"))
    with mock.patch.object(HfApi, "create_repo") as create:
        with pytest.raises(PushError, match="set HF_TOKEN or log in"):
            run(_cfg(output_dir=dataset_dir, repo_id="someone/opsynth-ops", upload="true"))
    create.assert_not_called()


def test_folders_that_are_not_ready_are_refused_clearly(tmp_path, dataset_dir, make_row):
    with pytest.raises(PushError, match="does not exist"):
        plan_upload(tmp_path / "absent", "someone/x")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PushError, match="no shards"):
        plan_upload(tmp_path / "empty", "someone/x")
    with pytest.raises(PushError, match="user or org"):
        plan_upload(dataset_dir, "no-namespace")

    unfinished = tmp_path / "unfinished"
    w = ShardWriter(unfinished)
    w.write(make_row(0))
    w.close()
    with pytest.raises(PushError, match="not finalized"):
        plan_upload(unfinished, "someone/x")

    card = dataset_dir / "README.md"
    text = card.read_text()
    card.unlink()
    with pytest.raises(PushError, match="no dataset card"):
        plan_upload(dataset_dir, "someone/x")
    card.write_text(text.replace("num_examples: 25", "num_examples: 20"))
    with pytest.raises(PushError, match="says 20 examples but the shards hold 25"):
        plan_upload(dataset_dir, "someone/x")


def _push_cli(tmp_path, *args, token: str | None = None):
    env = {k: v for k, v in os.environ.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env.update(HF_HUB_OFFLINE="1", PYTHONPATH=str(REPO), HF_HOME=str(tmp_path / "hf-home"))  # no stored login
    if token:
        env["HF_TOKEN"] = token
    return subprocess.run([sys.executable, "-m", "pipelines.push", f"hydra.run.dir={tmp_path / 'hydra'}", *args],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _error_line(proc) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


def test_cli_push_without_repo_id_names_it_and_exits_2(dataset_dir, tmp_path):
    proc = _push_cli(tmp_path, f"output_dir={dataset_dir}")
    assert proc.returncode == 2
    line = _error_line(proc)
    assert line.startswith("error: repo_id is required") and "<user or org>/<name>" in line
    assert proc.stdout == ""  # stopped before planning anything


def test_cli_upload_without_a_token_says_how_to_get_one_and_exits_2(dataset_dir, tmp_path):
    proc = _push_cli(tmp_path, f"output_dir={dataset_dir}", "repo_id=someone/opsynth-ops", "upload=true")
    assert proc.returncode == 2
    assert "set HF_TOKEN or log in" in _error_line(proc)
    assert "commits: 1" in proc.stdout  # the plan was shown first


def test_cli_push_of_a_file_or_a_misspelled_key_is_one_line(dataset_dir, tmp_path):
    proc = _push_cli(tmp_path, f"output_dir={dataset_dir / 'report.json'}", "repo_id=someone/opsynth-ops")
    assert proc.returncode == 2 and "is a file, not a dataset folder" in _error_line(proc)
    proc = _push_cli(tmp_path, f"output_dir={dataset_dir}", "repo_id=someone/opsynth-ops", "uplod=true")
    assert proc.returncode == 2 and "did you mean 'upload'?" in _error_line(proc)


def test_cli_a_hub_refusal_is_one_line_exit_1_not_a_usage_error(dataset_dir, tmp_path):
    proc = _push_cli(tmp_path, f"output_dir={dataset_dir}", "repo_id=someone/opsynth-ops", "upload=true",
                     token=FAKE_TOKEN)  # offline mode refuses the Hub call
    assert proc.returncode == 1
    assert "OfflineModeIsEnabled" in _error_line(proc) and FAKE_TOKEN not in proc.stderr
