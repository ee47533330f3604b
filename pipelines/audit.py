"""`python -m pipelines.audit DIR_OR_HUB_ID [--out DIR] [key=value ...]`: audit a dataset in the
Ops-6K format (an opsynth folder, a Parquet file, or a Hub id such as
BytedTsinghua-SIA/CUDA-Agent-Ops-6K) with every check the generator applies (opsynth.audit).

Prints the table (rows kept, rejected per reason, distinct op names and signatures), writes
`audit.json` and `verdicts.parquet` to `--out` (default `<folder>/audit`, or `audit/<hub id>`), and
prints the summary as one JSON object on its last line. The Hydra spelling works too:
`source=DIR out=DIR device=cpu compile=false ...` (keys: conf/audit.yaml).
"""

from __future__ import annotations

import json
import sys
from typing import Any

from omegaconf import DictConfig, OmegaConf

from opsynth import cli

# `--flag VALUE` spellings of conf/audit.yaml keys (Hydra itself takes only key=value).
FLAGS = {"--out": "out", "--device": "device", "--limit": "limit", "--split": "split", "--revision": "revision",
         "--max-batch": "max_batch", "--workers": "n_workers"}
SWITCHES = {"--band": "band=true", "--no-compile": "compile=false", "--no-kb": "kb_check=false",
            "--no-progress": "progress=false"}


TEXT_KEYS = {"source", "out", "split", "revision"}  # quoted: a path or id may hold characters Hydra parses


def _quoted(key: str, value: str) -> str:
    if key not in TEXT_KEYS:
        return f"{key}={value}"
    return f"{key}='{value}'" if "'" not in value else f'{key}="{value}"'


def to_overrides(argv: list[str]) -> list[str]:
    """`DIR --out X --no-compile k=v` -> `source='DIR' out='X' compile=false k=v`; raises UsageError."""
    out, args = [], list(argv)
    while args:
        a = args.pop(0)
        if a in FLAGS:
            if not args:
                raise cli.UsageError(f"{a} needs a value")
            out.append(_quoted(FLAGS[a], args.pop(0)))
        elif a in SWITCHES:
            out.append(SWITCHES[a])
        elif a.startswith("--") and "=" in a and a.split("=", 1)[0] in FLAGS:
            flag, value = a.split("=", 1)
            out.append(_quoted(FLAGS[flag], value))
        elif a.startswith("-"):
            out.append(a)  # a Hydra flag (--cfg job, --help)
        elif "=" not in a:
            out.append(_quoted("source", a))
        else:
            out.append(a)
    return out


def run(cfg: Any) -> dict:
    """Plain entry (tests call it with a dict): audit, print the table and the JSON summary."""
    from opsynth.audit import AuditConfig, AuditError, audit, format_table
    from opsynth.config import build

    plain = OmegaConf.to_container(cfg, resolve=True) if isinstance(cfg, DictConfig) else dict(cfg)
    plain.pop("hydra", None)
    try:
        settings = build(AuditConfig, plain, "audit")
    except (TypeError, ValueError) as e:
        raise cli.UsageError(str(e)) from None
    try:
        summary = audit(settings)
    except AuditError as e:
        raise cli.UsageError(str(e)) from None
    print(format_table(summary), flush=True)
    print(f"wrote {summary['out']}/audit.json and {summary['out']}/verdicts.parquet", flush=True)
    print(json.dumps({k: v for k, v in summary.items() if k != "settings"}, default=str), flush=True)
    return summary


def _isolation_unavailable():
    from opsynth.runtime.sandbox import IsolationUnavailable  # the refusal is one line, exit 2

    return IsolationUnavailable


def _fields() -> dict:
    from opsynth.audit import AuditConfig

    return {"": AuditConfig}


@cli.entry("audit", fields=_fields, required={"source": "give the dataset: python -m pipelines.audit DIR_OR_HUB_ID"},
           usage_errors=(_isolation_unavailable(),),
           interrupted=lambda cfg: "interrupted: an unfinished audit writes nothing")
def _main(cfg: DictConfig) -> None:
    run(cfg)


def main() -> None:
    sys.argv[1:] = to_overrides(sys.argv[1:])
    _main()


if __name__ == "__main__":
    main()
