"""Loading the KernelBench problems that tasks are decontaminated against.

Where the problems come from, first match wins:

1. ``dedup.kb_path``, a local Parquet file or folder (an error if it is not there);
2. a local copy found without being asked for: ``$OPSYNTH_KERNELBENCH`` (an error if set to a path
   that is not there), then ``../shared/kernelbench/kernelbench.parquet`` beside the working folder
   (the layout of the project's own machines and CI);
3. the Hub dataset ``ScalingIntelligence/KernelBench`` (splits ``level_1`` ... ``level_4``) through
   ``datasets``, which caches it: a user with internet needs nothing else, and offline a cached copy
   serves. Offline with no copy at all, the error says how to point at a file.

A reference that cannot be read is an error naming the setting to fix: decontaminating against
nothing would pass every task.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["KBProblem", "KernelBenchUnavailable", "load_kernelbench", "local_reference"]

ENV_VAR = "OPSYNTH_KERNELBENCH"
BESIDE = Path("..") / "shared" / "kernelbench" / "kernelbench.parquet"  # relative to the working folder

_REQUIRED = ("code", "level", "name")


class KernelBenchUnavailable(RuntimeError):
    """The KernelBench reference could not be loaded; the message names the setting to fix."""


@dataclass(frozen=True)
class KBProblem:
    level: int
    problem_id: int
    name: str
    code: str

    @property
    def key(self) -> str:
        """``level_2/1_Conv2D_ReLU_BiasAdd``: the Hub split and the file name."""
        return f"level_{self.level}/{self.name}"


def _rows_to_problems(rows: list[dict], where: str) -> list[KBProblem]:
    out = []
    for r in rows:
        name = str(r["name"])
        if name.endswith(".py"):
            name = name[:-3]
        pid = r.get("problem_id")
        if pid is None:
            head = name.split("_", 1)[0]
            pid = int(head) if head.isdigit() else 0
        out.append(KBProblem(level=int(r["level"]), problem_id=int(pid), name=name, code=str(r["code"])))
    if not out:
        raise KernelBenchUnavailable(f"KernelBench reference at {where} has no rows")
    return out


def _load_parquet(path: Path) -> list[dict]:
    import pyarrow.parquet as pq

    if not path.exists():
        raise KernelBenchUnavailable(
            f"KernelBench reference not found: dedup.kb_path={str(path)!r} does not exist; "
            "set dedup.kb_path to a kernelbench Parquet file or folder (or null to use the Hub dataset)"
        )
    files = sorted(path.rglob("*.parquet")) if path.is_dir() else [path]
    if not files:
        raise KernelBenchUnavailable(f"dedup.kb_path={str(path)!r} is a folder without .parquet files")
    rows: list[dict] = []
    for f in files:
        try:
            table = pq.read_table(f)
        except Exception as e:  # corrupt / not Parquet
            raise KernelBenchUnavailable(
                f"cannot read KernelBench reference {str(f)!r} ({type(e).__name__}: {e}); fix dedup.kb_path"
            ) from e
        missing = [c for c in _REQUIRED if c not in table.column_names]
        if missing:
            raise KernelBenchUnavailable(
                f"KernelBench reference {str(f)!r} lacks columns {missing} (has {table.column_names}); fix dedup.kb_path"
            )
        rows.extend(table.to_pylist())
    return rows


def local_reference() -> Path | None:
    """A local KernelBench copy found without `dedup.kb_path`: `$OPSYNTH_KERNELBENCH`, else
    `../shared/kernelbench/kernelbench.parquet`; None when there is neither (then: the Hub)."""
    env = os.environ.get(ENV_VAR, "").strip()
    if env:
        path = Path(env).expanduser()
        if not path.exists():
            raise KernelBenchUnavailable(f"KernelBench reference not found: {ENV_VAR}={env!r} does not exist; "
                                         f"point it (or dedup.kb_path) at a kernelbench Parquet file, or unset it")
        return path
    return BESIDE if BESIDE.exists() else None


def _offline() -> bool:
    return any(os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
               for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"))


HOW_TO_POINT = ("point at a local copy with dedup.kb_path=/path/to/kernelbench.parquet (the Hub dataset's splits "
                "as Parquet, columns level, name, code), or kb_check=false to skip decontamination")


def _load_hub(dataset: str) -> list[dict]:
    try:
        import datasets

        dd = datasets.load_dataset(dataset)
    except Exception as e:
        if _offline():
            raise KernelBenchUnavailable(
                f"KernelBench reference: no local copy (dedup.kb_path is unset, no ${ENV_VAR}, no {BESIDE}) and the "
                f"Hub dataset {dataset} is not in the datasets cache, which offline mode (HF_HUB_OFFLINE=1) "
                f"cannot fill; {HOW_TO_POINT}") from e
        detail = " ".join(str(e).split())[:200]
        raise KernelBenchUnavailable(
            f"KernelBench reference: no local copy (dedup.kb_path is unset, no ${ENV_VAR}, no {BESIDE}) and the "
            f"Hub dataset dedup.kb_dataset={dataset} could not be loaded ({type(e).__name__}: {detail}); "
            f"{HOW_TO_POINT}") from e
    rows: list[dict] = []
    for split in sorted(dd.keys()):
        for r in dd[split]:
            r = dict(r)
            if "level" not in r and split.startswith("level_"):
                r["level"] = int(split.split("_", 1)[1])
            rows.append(r)
    missing = [c for c in _REQUIRED if rows and c not in rows[0]]
    if missing:
        raise KernelBenchUnavailable(f"Hub dataset {dataset!r} lacks columns {missing}; fix dedup.kb_dataset")
    return rows


def load_kernelbench(
    kb_path: str | Path | None = None,
    kb_dataset: str = "ScalingIntelligence/KernelBench",
    levels: list[int] | None = None,
) -> list[KBProblem]:
    """The KernelBench problems, sorted by (level, problem_id); `kb_path` None: a local copy if one
    is found (`local_reference`), else the Hub dataset `kb_dataset`."""
    kb_path = kb_path or local_reference()
    if kb_path:
        path = Path(kb_path).expanduser()
        problems = _rows_to_problems(_load_parquet(path), str(path))
    else:
        problems = _rows_to_problems(_load_hub(kb_dataset), kb_dataset)
    if levels is not None:
        wanted = set(levels)
        problems = [p for p in problems if p.level in wanted]
        if not problems:
            raise KernelBenchUnavailable(f"no KernelBench problems at levels {sorted(wanted)}; fix dedup.kb_levels")
    return sorted(problems, key=lambda p: (p.level, p.problem_id, p.name))
