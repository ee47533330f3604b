"""Upload a finished dataset folder (shards, card, report, plots) to a Hugging Face dataset repo.

Why one `upload_folder` call: it makes a single commit with every file plus the deletion of stale
remote shards (`delete_patterns`), so the repo never shows a half-updated dataset (e.g. new
`train-00000-of-00005` next to an old `train-00003-of-00004`). `upload_large_folder` no longer
exists in huggingface_hub >= 1.0: `upload_folder` itself switches, when `hf_xet` is installed, to a
streamed upload that commits very large folders in batches (initially 250 files a commit) and
resumes when rerun. A dataset folder is a few files per million rows, so it is one commit in practice;
the plan reports when it would not be.

The token comes from HF_TOKEN or the stored login (`huggingface_hub.get_token`); it is never an
argument of the Hydra config (Hydra would write it to `.hydra/config.yaml`), never printed, never
logged, and scrubbed from any error message that reaches the caller.
"""

from __future__ import annotations

import fnmatch
import logging
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from opsynth.shards.card import PLOTS_DIR
from opsynth.shards.report import REPORT_NAME
from opsynth.shards.writer import DATA_DIR, SPLIT, count_rows, list_shards

log = logging.getLogger(__name__)

REPO_TYPE = "dataset"
CARD_NAME = "README.md"
# Exactly these files are uploaded; anything else in the folder (locks, temp files, logs) stays local.
UPLOAD_PATTERNS = [CARD_NAME, REPORT_NAME, f"{PLOTS_DIR}/*.png", f"{DATA_DIR}/{SPLIT}-*.parquet"]
# Remote files under these folders that this upload does not rewrite are deleted in the same commit:
# a stale shard would otherwise be loaded next to the new ones by the card's `data/train-*` glob.
DELETE_PATTERNS = [f"{DATA_DIR}/*", f"{PLOTS_DIR}/*"]
# huggingface_hub's streamed upload starts at 250 files per commit (COMMIT_SIZE_SCALE in
# huggingface_hub/_upload_pipeline.py); without hf_xet it is always a single commit.
FILES_PER_COMMIT = 250


class PushError(RuntimeError):
    """The folder cannot be pushed (nothing to push, stale card, no token) or the Hub refused it."""


class UploadError(PushError):
    """The Hub (or the network) refused an upload that was fine to try."""


@dataclass(frozen=True)
class UploadPlan:
    """Exactly what an upload sends: files (path in repo, bytes), where, and in how many commits."""

    output_dir: Path
    repo_id: str
    files: list[tuple[str, int]]
    num_rows: int
    repo_type: str = REPO_TYPE
    private: bool = False
    revision: str | None = None
    commit_message: str = "Upload opsynth dataset"
    delete_patterns: list[str] = field(default_factory=lambda: list(DELETE_PATTERNS))

    @property
    def total_bytes(self) -> int:
        return sum(size for _, size in self.files)

    @property
    def num_commits(self) -> int:
        return max(1, math.ceil(len(self.files) / FILES_PER_COMMIT))

    def describe(self) -> str:
        width = max(len(p) for p, _ in self.files)
        lines = [
            f"repo: {self.repo_id} (repo type: {self.repo_type}, "
            f"{'private' if self.private else 'public'} if created, revision: {self.revision or 'main'})",
            f"from: {self.output_dir}",
            f"rows: {self.num_rows:,}",
            f"files: {len(self.files)}, {self.total_bytes:,} bytes ({_human(self.total_bytes)}) in total",
        ]
        lines += [f"  {p:<{width}}  {s:>14,} B" for p, s in self.files]
        lines.append(f"remote files matching {self.delete_patterns} that are not in this list are deleted")
        lines.append(f"commits: {self.num_commits} (one upload_folder call)")
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return {"repo_id": self.repo_id, "repo_type": self.repo_type, "private": self.private,
                "revision": self.revision, "files": [{"path": p, "bytes": s} for p, s in self.files],
                "total_bytes": self.total_bytes, "num_rows": self.num_rows, "num_commits": self.num_commits,
                "delete_patterns": self.delete_patterns}


def _human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError


def _card_num_examples(card_path: Path) -> int | None:
    from huggingface_hub import DatasetCard

    data = DatasetCard.load(card_path).data.to_dict()
    splits = (data.get("dataset_info") or {}).get("splits") or []
    for split in splits:
        if split.get("name") == SPLIT:
            return split.get("num_examples")
    return None


def plan_upload(
    output_dir: str | os.PathLike,
    repo_id: str,
    *,
    private: bool = False,
    revision: str | None = None,
    commit_message: str = "Upload opsynth dataset",
) -> UploadPlan:
    """Check that `output_dir` is a finished dataset folder and list what an upload would send.

    Raises PushError when the folder is missing, has no finalized shards, has no card, or has a card
    whose row count disagrees with the shards (the card was written before the last rows).
    """
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        validate_repo_id(repo_id)
    except HFValidationError as e:
        raise PushError(f"invalid repo_id {repo_id!r}: {e}") from None
    if "/" not in repo_id:
        raise PushError(f"repo_id must be '<user or org>/<name>', got {repo_id!r}")
    root = Path(output_dir)
    if not root.is_dir():
        what = "is a file, not a dataset folder" if root.exists() else "does not exist"
        raise PushError(f"output_dir {root} {what}; give the folder pipelines.generate wrote")
    try:
        shards = list_shards(root)
    except ValueError as e:
        raise PushError(str(e)) from None
    if not shards:
        raise PushError(f"{root} has no shards under {DATA_DIR}/: nothing to push (run pipelines.generate first)")
    not_final = [s.path.name for s in shards if not s.final]
    if not_final:
        raise PushError(f"{root}: shards {not_final} are not finalized (the run did not finish); rerun it to finalize")
    card = root / CARD_NAME
    if not card.is_file():
        raise PushError(f"{root} has no dataset card ({CARD_NAME}); write it with opsynth.shards.card.write_card")
    num_rows = count_rows(root)
    in_card = _card_num_examples(card)
    if in_card != num_rows:
        raise PushError(f"{card} says {in_card} examples but the shards hold {num_rows}; rewrite the card")
    files = []
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if any(fnmatch.fnmatchcase(rel, pat) for pat in UPLOAD_PATTERNS):
            files.append((rel, path.stat().st_size))
    return UploadPlan(output_dir=root, repo_id=repo_id, files=files, num_rows=num_rows, private=private,
                      revision=revision, commit_message=commit_message)


def _redact(text: str, token: str | None) -> str:
    return text.replace(token, "<redacted>") if token else text


def push(plan: UploadPlan, *, api: Any = None) -> Any:
    """Create the dataset repo if needed and upload `plan.files` in one upload_folder call.

    Returns the CommitInfo. Errors from the Hub come back as PushError with the token scrubbed.
    """
    from huggingface_hub import HfApi, get_token

    token = get_token()
    if not token:
        raise PushError("no Hugging Face token: set HF_TOKEN or log in with `hf auth login`")
    api = api or HfApi(token=token)
    try:
        api.create_repo(repo_id=plan.repo_id, repo_type=plan.repo_type, private=plan.private, exist_ok=True)
        info = api.upload_folder(
            repo_id=plan.repo_id,
            repo_type=plan.repo_type,
            folder_path=str(plan.output_dir),
            # The exact relative paths (none holds a glob character) so the upload is exactly the plan.
            allow_patterns=[p for p, _ in plan.files],
            delete_patterns=plan.delete_patterns,
            commit_message=plan.commit_message,
            revision=plan.revision,
        )
    except Exception as e:  # Hub/HTTP errors: re-raise without the chained original, token scrubbed
        raise UploadError(f"upload to {plan.repo_id} failed: {type(e).__name__}: {_redact(str(e), token)}") from None
    log.info("uploaded %d files to %s (%s)", len(plan.files), plan.repo_id, getattr(info, "commit_url", info))
    return info
