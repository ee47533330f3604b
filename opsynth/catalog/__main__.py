"""`python -m opsynth.catalog [--json] [--no-transformers] [--excluded]`: list the seed operators."""

from __future__ import annotations

import argparse
import json
import sys

from . import load_catalog


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m opsynth.catalog",
                                 description="List the seed operators mined from torch (and transformers) "
                                             "with counts per category.")
    ap.add_argument("--json", action="store_true", help="print the full catalog as JSON")
    ap.add_argument("--no-transformers", action="store_true", help="leave out transformers seed modules")
    ap.add_argument("--excluded", action="store_true", help="also list mined candidates that were excluded, with why")
    ap.add_argument("--refresh", action="store_true", help="re-mine instead of reading the cache")
    a = ap.parse_args(argv)
    cat = load_catalog(False if a.no_transformers else None, use_cache=not a.refresh)
    by_cat = cat.by_category()
    if a.json:
        out = {"torch_version": cat.torch_version, "transformers_version": cat.transformers_version,
               "total": len(cat), "counts": {k: len(v) for k, v in by_cat.items()},
               "ops": {n: s.to_dict() for n, s in cat.ops.items()}}
        if a.excluded:
            out["excluded"] = cat.excluded
        json.dump(out, sys.stdout, indent=1)
        print()
        return 0
    print(f"opsynth seed-operator catalog (torch {cat.torch_version}"
          + (f", transformers {cat.transformers_version}" if cat.transformers_version else "") + ")")
    for category, names in by_cat.items():
        print(f"\n{category} ({len(names)})")
        for n in names:
            s = cat.ops[n]
            print(f"  {n:<44} ranks={','.join(map(str, s.ranks))}  pattern={s.pattern}")
    print(f"\n{len(cat)} operators in {len(by_cat)} categories; {len(cat.excluded)} candidates excluded"
          + (" (listed below)" if a.excluded else " (--excluded lists them)"))
    if a.excluded:
        for n, why in cat.excluded.items():
            print(f"  {n:<44} {why}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
