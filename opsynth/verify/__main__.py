"""Verify task files from the command line and print one JSON verdict per line.

    python -m opsynth.verify task1.py task2.py --device cpu --workers 2 --backend aot_eager
    python -m opsynth.verify tasks/*.py --set timeout_s=60 --set max_calib_steps=3

``--set key=value`` sets any VerifyConfig field (value parsed as JSON when it parses, else a string).
The files are the user's, not the sampler's: with ``sandbox=auto`` (the default) every worker runs
confined (``--set sandbox=false`` to run them unconfined).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .config import VerifyConfig
from .pool import WorkerPool


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m opsynth.verify", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("files", nargs="+", type=Path)
    ap.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--backend", default="inductor")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    ap.add_argument("--source", action="store_true", help="include the (calibrated) source in the output")
    args = ap.parse_args(argv)
    overrides = {}
    for item in args.set:
        key, _, value = item.partition("=")
        try:
            overrides[key] = json.loads(value)
        except json.JSONDecodeError:
            overrides[key] = value
    cfg = VerifyConfig.from_dict({"device": args.device, "n_workers": args.workers,
                                  "compile_backend": args.backend, **overrides})
    sources = [f.read_text() for f in args.files]
    with WorkerPool(cfg) as pool:
        for f, r in zip(args.files, pool.verify_many(sources)):
            d = r.to_dict()
            if not args.source:
                d.pop("source")
            print(json.dumps({"file": str(f), **d}, default=str), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
