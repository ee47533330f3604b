"""How diverse the sampler's tasks are at Ops-6K's scale and ten times it (CPU only, no GPU).

Draws candidate graphs exactly as the generate pipeline numbers them (candidate i from
`seed * 1000000007 + i`) and counts distinct operator sequences (the `ops` column) and distinct
graph signatures (the exact-dedup key) after 6,000 and 60,000 draws, with the operator-count
mixture of the draws against Ops-6K's target. Verification is not run: this measures what the
sampler offers, which bounds what a run can accept.

    python benchmarks/sampler_diversity.py                          # writes benchmarks/results/sampler_diversity.json
    python benchmarks/sampler_diversity.py --draws 2000,6000 --out /tmp/div.json
    python benchmarks/sampler_diversity.py --variant extra_edges    # also with branching compositions
    python benchmarks/sampler_diversity.py --set partner_flatness=0  # any SamplerConfig field

About 2 ms a draw on one core at scale 1.0 (60,000 draws: about 2 minutes).
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from opsynth.graph import Sampler, SamplerConfig, SamplingError  # noqa: E402
from opsynth.graph.sampler import OPS6K_MIXTURE  # noqa: E402

SEED_STRIDE = 1_000_000_007  # opsynth.generate.config.SEED_STRIDE (not imported: it pulls in the verify room)
VARIANTS = {"default": {}, "extra_edges": {"extra_edges": True}}


def _source_key(k: str) -> str:
    return "transformers#1" if k == "transformers" else f"torch#{k}"


def measure(overrides: dict, checkpoints: list[int], seed: int = 0, progress_every: int = 10_000) -> dict:
    """Draw max(checkpoints) candidates; counts at each checkpoint, mixture and categories at the last."""
    cfg = SamplerConfig(**{"scale": 1.0, **overrides})
    sampler = Sampler(cfg)
    seqs: Counter = Counter()
    sigs: set[str] = set()
    sources: Counter = Counter()
    first_cats: Counter = Counter()
    all_cats: Counter = Counter()
    failed = 0
    at: dict[int, dict] = {}
    n_max = max(checkpoints)
    t0 = time.monotonic()
    for i in range(n_max):
        try:
            st = sampler.sample(seed * SEED_STRIDE + i)
        except SamplingError:
            failed += 1
        else:
            ops = tuple(st.graph.ops())
            seqs[ops] += 1
            sigs.add(st.graph.signature())
            sources[st.data_source] += 1
            first_cats[sampler.catalog.ops[ops[0]].category] += 1
            all_cats.update(sampler.catalog.ops[o].category for o in ops)
        n = i + 1
        if n in checkpoints:
            at[n] = {"distinct_op_sequences": len(seqs), "distinct_graph_signatures": len(sigs),
                     "seconds": round(time.monotonic() - t0, 1)}
        if progress_every and n % progress_every == 0:
            print(f"  {n:>6} draws: {len(seqs)} sequences, {len(sigs)} signatures, "
                  f"{time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    drawn = sum(sources.values())
    tsum = sum(OPS6K_MIXTURE.values())
    mix = {}
    for k, v in OPS6K_MIXTURE.items():
        src = _source_key(k)
        share = sources.get(src, 0) / drawn if drawn else 0.0
        mix[src] = {"share": round(share, 5), "target": round(v / tsum, 5), "delta_points": round(100 * (share - v / tsum), 3)}
    return {
        "settings": {k: v for k, v in vars(cfg).items() if k not in ("category_weights", "mixture")},
        "checkpoints": {str(k): v for k, v in sorted(at.items())},
        "sampling_failed": failed,
        "mixture": mix,
        "max_mixture_delta_points": max(abs(m["delta_points"]) for m in mix.values()),
        "first_op_category_share": {c: round(n / drawn, 4) for c, n in first_cats.most_common()},
        "op_category_share": {c: round(n / sum(all_cats.values()), 4) for c, n in all_cats.most_common()},
        "most_common_sequences": [[list(s), n] for s, n in seqs.most_common(10)],
        "catalog_torch_ops": len(sampler._torch_ops),
        "catalog_transformers_ops": len(sampler._tf_ops),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--draws", default="6000,60000", help="checkpoints, comma-separated (the largest is drawn)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variant", action="append", default=[], choices=sorted(VARIANTS),
                    help="extra settings to measure besides the defaults (repeatable)")
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a SamplerConfig field for every variant (value parsed as JSON when it parses)")
    ap.add_argument("--out", default=str(REPO / "benchmarks/results/sampler_diversity.json"))
    a = ap.parse_args(argv)
    checkpoints = sorted({int(x) for x in a.draws.split(",") if x.strip()})
    common = {}
    for item in a.set:
        k, _, v = item.partition("=")
        try:
            common[k] = json.loads(v)
        except json.JSONDecodeError:
            common[k] = v
    names = ["default", *[v for v in a.variant if v != "default"]]
    out: dict = {"python": platform.python_version(), "draws": checkpoints, "seed": a.seed,
                 "target_mixture": {_source_key(k): v for k, v in OPS6K_MIXTURE.items()}, "variants": {}}
    for name in names:
        print(f"variant {name}: {max(checkpoints)} draws", file=sys.stderr, flush=True)
        res = measure({**VARIANTS[name], **common}, checkpoints, a.seed)
        out["variants"][name] = res
        if name == "default":  # the headline keys the issue names
            for n, c in res["checkpoints"].items():
                out[f"distinct_op_sequences_{n}"] = c["distinct_op_sequences"]
                out[f"distinct_graph_signatures_{n}"] = c["distinct_graph_signatures"]
            out["mixture"] = res["mixture"]
            out["max_mixture_delta_points"] = res["max_mixture_delta_points"]
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(out, indent=1) + "\n")  # after every variant
    print(f"\n{'variant':<12} {'draws':>7} {'op sequences':>13} {'signatures':>11} {'per 1k draws':>13}")
    for name, res in out["variants"].items():
        for n, c in res["checkpoints"].items():
            print(f"{name:<12} {n:>7} {c['distinct_op_sequences']:>13} {c['distinct_graph_signatures']:>11} "
                  f"{1000 * c['distinct_op_sequences'] / int(n):>13.0f}")
    print(f"\nmixture of the draws (default), share vs target:")
    for src, m in out["variants"]["default"]["mixture"].items():
        print(f"  {src:<15} {100 * m['share']:6.2f} %  target {100 * m['target']:6.2f} %  ({m['delta_points']:+.2f} points)")
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
