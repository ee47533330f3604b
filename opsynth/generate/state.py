"""The run's state file and row ledger.

`.opsynth-state.json` in the output folder records the next candidate to commit, the counts, the
*row ledger* (one "seed:task_id" per row, in row order) and the shards as written, whenever the
shards are flushed; a rerun starts from it. A folder whose state file is gone gets one rebuilt
from its rows (each row carries its seed).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from opsynth.generate.config import SEED_STRIDE, GenerateConfig, describe_run

log = logging.getLogger("opsynth.generate")

# Hidden, and not "state.json": `datasets.load_dataset(folder)` refuses a folder holding a
# state.json (it takes it for a `save_to_disk` folder). The push uploads only data and card.
STATE_FILE = ".opsynth-state.json"


class DatasetFolderError(RuntimeError):
    """The output folder is not what its state file says (a shard deleted, truncated or unreadable,
    an unreadable state file); the one-line message names the file and what to do."""


def load_state(out: Path) -> dict:
    p = out / STATE_FILE
    if not p.exists():
        return {}
    try:
        return json.loads(p.read_text())
    except ValueError as e:
        raise DatasetFolderError(f"{p} is unreadable ({e}); delete it to restart the run from the shards") from e


def read_ledger(state: dict) -> list[tuple[int, str]] | None:
    """The state's row ledger as (seed, task_id) pairs; None for a state without one."""
    if "ledger" not in state:
        return None
    out = []
    for entry in state["ledger"]:
        seed, _, tid = str(entry).partition(":")
        out.append((int(seed), tid))
    return out


def state_record(committer, stats, writer, finished: bool = False) -> dict:
    """Everything the state file holds: where to resume, the counts, the row ledger (one
    "seed:task_id" per row, in row order) and the shards as written (to name a deleted one)."""
    import pyarrow.parquet as pq

    from opsynth.shards import list_shards

    committer.summarise_cost_model()
    committer.summarise_quota()
    shards = [{"name": sh.path.name, "rows": pq.ParquetFile(sh.path).metadata.num_rows}
              for sh in list_shards(writer.output_dir)]
    rec = {"next_index": committer.next_index, "stats": stats.to_dict(), "examples": committer.examples,
           "ledger": [f"{seed}:{tid}" for seed, tid in committer.ledger], "shards": shards,
           "eager_over_predicted": committer.ratios, "near_edge_rows": committer.near_edge}
    if committer.quota_state():  # given-up slots and misses in a row (the counts are the rows')
        rec["mixture_quota"] = committer.quota_state()
    if finished:
        rec["finished"] = True
    return rec


def save_state(out: Path, state: dict) -> None:
    tmp = out / (STATE_FILE + ".tmp")
    tmp.write_text(json.dumps(state, indent=1, default=str))
    os.replace(tmp, out / STATE_FILE)


def state_from_rows(cfg: GenerateConfig, out: Path) -> dict:
    """A state rebuilt from the rows of a folder whose state file is gone (deleted, or a copy made
    without hidden files): every row carries its seed, so its candidate, and the run resumes after
    the last one, as the lost state would have had it. Rejection counts of the earlier runs are gone.
    {} for a folder without rows (a new run). Rows of another `seed` are refused, not adopted."""
    from opsynth.shards import RunStats, iter_rows, list_shards

    rows = [(int(r["seed"]), r["task_id"]) for r in iter_rows(out, columns=["seed", "task_id"])]
    if not rows:
        return {}
    indices = [seed - cfg.seed * SEED_STRIDE for seed, _ in rows]
    if min(indices) < 0 or max(indices) >= SEED_STRIDE:
        raise DatasetFolderError(
            f"{out} holds {len(rows)} rows but no {STATE_FILE}, and their seeds are not candidates of seed={cfg.seed}; "
            "rerun with the seed they were made with, or use another output_dir")
    stats = RunStats(accepted=len(rows), candidates=len(rows))
    describe_run(stats, cfg)
    import pyarrow.parquet as pq

    state = {"next_index": max(indices) + 1, "stats": stats.to_dict(), "examples": [],
             "ledger": [f"{seed}:{tid}" for seed, tid in rows],
             "shards": [{"name": sh.path.name, "rows": pq.ParquetFile(sh.path).metadata.num_rows}
                        for sh in list_shards(out)], "rebuilt_from_rows": True}
    save_state(out, state)
    log.warning("%s had no %s: rebuilt it from its %d rows (candidates up to %d); the run goes on from candidate %d "
                "(the earlier runs' rejection counts are not known)", out, STATE_FILE, len(rows), max(indices),
                max(indices) + 1)
    return state


def rows_with_ids(output_dir, ids: set[str]) -> list[dict]:
    from opsynth.shards import iter_rows

    return [r for r in iter_rows(output_dir, columns=["seed", "task_id"]) if r["task_id"] in ids]

