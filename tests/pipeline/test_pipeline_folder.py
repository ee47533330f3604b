"""A dataset folder that lost rows between runs (a shard deleted, truncated or overwritten) is
found out before anything runs: refused by default with one line that names the file, or with
`repair=true` mended by regenerating exactly the missing seeds, so that the folder ends with the
rows of an uninterrupted run and every count (state, summary, report, card) equals the rows in the
files. Also: the card's "present at start" and wall-time lines for a resumed run.

Uses the stand-in candidate processing of test_pipeline_driver.py (in-process Dask, no sandboxes);
the CLI test runs `python -m pipelines.generate` on a damaged folder, which must stop before it
starts any cluster."""

from __future__ import annotations

import copy
import json
import shutil
import threading

import pytest
import test_pipeline_driver as driver
from pipeline_cli import generate_cmd, run_env, run_generate

from opsynth.generate.config import SEED_STRIDE
from opsynth.generate.driver import run
from opsynth.generate.state import STATE_FILE, DatasetFolderError
from opsynth.shards import count_rows, read_rows

fake, tasks = driver.fake, driver.tasks  # the stand-in's fixtures
N = 10
ROWS_PER_SHARD = 3  # 10 rows: 4 shards, so one can go missing in the middle


def _run(cfg, seconds=120):
    box = {}

    def target():
        try:
            box["summary"] = run(cfg)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"run() did not return within {seconds} s"
    if "error" in box:
        raise box["error"]
    return box["summary"]


def _config(out, n=N, **kw):
    cfg = driver._cfg(out, n, rows_per_shard=ROWS_PER_SHARD, **kw)
    cfg.write_card = True
    return cfg


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tasks):
    """Two uninterrupted runs of N rows with the stand-in, made once for the module (each run is
    seconds of Dask and the stand-in's sleeps): `reference` and `ds`, and the reference's summary.
    Tests get copies of the folders (`reference`, `made`): they damage them."""
    base = tmp_path_factory.mktemp("finished")
    with pytest.MonkeyPatch.context() as mp:
        driver.install_fake(mp, tasks, base)
        summary = _run(_config(base / "reference"))
        _run(_config(base / "ds"))
    return base, summary


def _copy_run(src, out):
    """A finished folder copied to `out`, as a run there would have left it (its card names its own path)."""
    shutil.copytree(src, out, symlinks=True)
    card = out / "README.md"
    card.write_text(card.read_text().replace(f'"{src}"', f'"{out}"'))
    return out


@pytest.fixture
def reference(tmp_path, fake, finished):
    """An uninterrupted run of N rows (a copy in tmp_path/reference): its rows (all columns) and its summary."""
    out = _copy_run(finished[0] / "reference", tmp_path / "reference")
    return read_rows(out), copy.deepcopy(finished[1])


@pytest.fixture
def made(tmp_path, fake, reference, finished):
    """A finished folder of the same run (a copy in tmp_path/ds), to be damaged by the test."""
    out = _copy_run(finished[0] / "ds", tmp_path / "ds")
    assert read_rows(out) == reference[0]
    return out


def _shards(out):
    return sorted((out / "data").glob("*.parquet"))


def _assert_counts_match_files(out, summary, n):
    """Every count the run reports is the number of rows in the files."""
    state = json.loads((out / STATE_FILE).read_text())
    report = json.loads((out / "report.json").read_text())
    card = (out / "README.md").read_text()
    assert count_rows(out) == n
    assert summary["rows"] == summary["accepted"] == n
    assert state["stats"]["accepted"] + state["stats"]["adopted_rows"] == n
    assert len(state["ledger"]) == n and sum(s["rows"] for s in state["shards"]) == n
    assert report["rows"]["num_rows"] == n and report["run"]["accepted"] == n
    assert f"num_examples: {n}\n" in card and f"| rows in this dataset | {n} |" in card


@pytest.mark.parametrize("damage", ["delete_middle", "delete_last", "truncate", "overwrite"])
def test_a_damaged_folder_is_refused_with_one_line_naming_the_file(made, damage):
    victim = _shards(made)[1 if damage == "delete_middle" else -1 if damage == "delete_last" else 2]
    before = {p.name: p.read_bytes() for p in _shards(made)}
    if damage.startswith("delete"):
        victim.unlink()
    elif damage == "truncate":
        victim.write_bytes(before[victim.name][: len(before[victim.name]) // 2])
    else:
        victim.write_bytes(b"not parquet at all")
    with pytest.raises(DatasetFolderError) as err:
        _run(_config(made))
    msg = str(err.value)
    assert "\n" not in msg and f"data/{victim.name}" in msg, msg
    assert ("is missing" in msg) if damage.startswith("delete") else ("is unreadable" in msg), msg
    lost = 1 if damage == "delete_last" else ROWS_PER_SHARD
    assert f"{lost} of the {N} rows the state file lists are gone" in msg, msg
    assert "repair=true" in msg
    # Refusing touches nothing: the other shards are as they were.
    assert {p.name: p.read_bytes() for p in _shards(made) if p.name != victim.name} == \
        {k: v for k, v in before.items() if k != victim.name}


@pytest.mark.parametrize("damage", ["delete_middle", "delete_last", "truncate"])
def test_repair_regenerates_exactly_the_missing_seeds(made, reference, fake, damage):
    want_rows, want = reference
    victim = _shards(made)[1 if damage == "delete_middle" else -1 if damage == "delete_last" else 2]
    if damage == "truncate":
        victim.write_bytes(victim.read_bytes()[:100])
    else:
        victim.unlink()
    lost_ids = {r["task_id"] for r in want_rows} - {r["task_id"] for p in _shards(made) if p != victim
                                                     for r in read_rows_of_file(p)}
    calls_before = len(fake.calls())
    got = _run(_config(made, repair=True))
    seeds_rerun = fake.calls()[calls_before:]
    # Exactly the lost rows' candidates ran again (then nothing: the folder was complete).
    assert sorted(seeds_rerun) == sorted(pipeline_index(r["seed"]) for r in want_rows if r["task_id"] in lost_ids)
    assert read_rows(made) == want_rows  # every row, every column, in order: nothing else lost
    assert [p.name for p in _shards(made)] == [p.name for p in _shards(made.parent / "reference")]
    _assert_counts_match_files(made, got, N)
    state = json.loads((made / STATE_FILE).read_text())
    assert state["stats"]["repaired_rows"] == len(lost_ids)
    assert got["rejected"] == want["rejected"] and got["candidates"] == want["candidates"]
    if damage == "truncate":  # set aside, not deleted
        assert (made / ".opsynth-damaged" / victim.name).exists()
    # And the repaired folder is a normal one: raising n_tasks continues it.
    more = _run(_config(made, n=N + 3))
    _assert_counts_match_files(made, more, N + 3)


def test_after_repair_a_larger_n_tasks_gives_the_rows_of_an_uninterrupted_run(tmp_path, made, fake):
    """The issue's sequence: a shard goes, the user reruns with a larger n_tasks."""
    _shards(made)[0].unlink()
    with pytest.raises(DatasetFolderError):
        _run(_config(made, n=N + 5))
    got = _run(_config(made, n=N + 5, repair=True))
    ref = tmp_path / "ref15"
    want = _run(_config(ref, n=N + 5))
    assert read_rows(made) == read_rows(ref)
    _assert_counts_match_files(made, got, N + 5)
    assert got["accepted"] == want["accepted"] and got["rejected"] == want["rejected"]


def test_the_card_tells_the_truth_about_a_resumed_run(tmp_path, fake):
    out = tmp_path / "ds"
    first = _run(_config(out, n=4))
    second = _run(_config(out, n=9))
    card = (out / "README.md").read_text()
    assert "| rows present when the last run started | 4 |" in card
    assert "| rows added by the last run | 5 |" in card
    assert "| runs that built this folder | 2 |" in card
    last, total = second["run_wall_time_s"], second["wall_time_s"]
    assert total == pytest.approx(first["wall_time_s"] + last)
    assert f"| wall time, last run | {last / 60:.1f} min |" in card
    assert f"| wall time, all runs | {total / 60:.1f} min |" in card
    _assert_counts_match_files(out, second, 9)


def test_the_cli_refuses_a_damaged_folder_with_exit_2_and_no_traceback(made, kernelbench):
    victim = _shards(made)[2]
    victim.write_bytes(victim.read_bytes()[:50])
    cmd = generate_cmd(made, f"n_tasks={N}", f"rows_per_shard={ROWS_PER_SHARD}", "progress=false",
                       "cluster=scheduler", "cluster.address=tcp://127.0.0.1:9")  # no cluster may be needed
    proc = run_generate(cmd, run_env(kernelbench), timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "ArrowInvalid" not in proc.stderr.replace("(ArrowInvalid:", "")
    (line,) = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert f"data/{victim.name} is unreadable" in line and "repair=true" in line


def test_a_folder_whose_state_file_was_deleted_resumes_from_its_rows(tmp_path, made, reference, fake):
    """Not `"accepted": 0` beside the rows it holds: the state is rebuilt from the rows' seeds, the
    counts are the rows, and a larger n_tasks gives the rows of an uninterrupted run."""
    (made / STATE_FILE).unlink()
    calls_before = len(fake.calls())
    got = _run(_config(made))
    assert len(fake.calls()) == calls_before  # complete: nothing ran again
    _assert_counts_match_files(made, got, N)
    assert read_rows(made) == reference[0]
    more = _run(_config(made, n=N + 3))
    want = _run(_config(tmp_path / "ref13", n=N + 3))
    assert read_rows(made) == read_rows(tmp_path / "ref13")
    _assert_counts_match_files(made, more, N + 3)
    assert more["accepted"] == want["accepted"] == N + 3


def test_rows_of_another_seed_without_a_state_file_are_refused(made, fake):
    (made / STATE_FILE).unlink()
    with pytest.raises(DatasetFolderError, match="not candidates of seed=3"):
        _run(_config(made, seed=3))


def _cli_on_finished_folder(made, kernelbench):
    cmd = generate_cmd(made, f"n_tasks={N}", f"rows_per_shard={ROWS_PER_SHARD}", "progress=false",
                       "cluster=scheduler", "cluster.address=tcp://127.0.0.1:9")  # no cluster may be needed
    return run_generate(cmd, run_env(kernelbench), timeout=300)


def test_the_cli_says_what_a_folder_without_its_state_file_holds(made, kernelbench):
    (made / STATE_FILE).unlink()
    proc = _cli_on_finished_folder(made, kernelbench)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads(proc.stdout)
    assert summary["accepted"] == N, summary
    assert f"rebuilt it from its {N} rows" in proc.stderr


def test_log_lines_go_to_stderr_and_stdout_holds_only_the_summary(made, kernelbench):
    """`generate ... > summary.json` gives a JSON file: Hydra's console log (INFO, WARNING) is stderr."""
    proc = _cli_on_finished_folder(made, kernelbench)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["accepted"] == N  # the whole of stdout is one JSON object
    assert "nothing to generate" in proc.stderr


def read_rows_of_file(path):
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


def pipeline_index(seed: int) -> int:
    return seed - 0 * SEED_STRIDE  # the fixtures' runs use seed=0
