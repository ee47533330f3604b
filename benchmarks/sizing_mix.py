"""What sizing does to the operator mix: the share of sampled candidates holding an operator of each
catalog category, against the share among those that sizing lets through to the verifier.

The sampler's category weights aim at Ops-6K's mixture; sizing then rejects the candidates that cannot
reach the runtime window within one verifier request's memory (`predicted_oom`: mostly memory-bound
pointwise pairs on a GPU shared by many workers), so what is verified is not what was sampled. GPU
sizes and reference rates on meta tensors, a GPU of `--gpu-mem-gb` shared by `--workers`; no GPU needed.

    python benchmarks/sizing_mix.py --candidates 600 --json benchmarks/results/sizing_mix_cpu.json
    python benchmarks/sizing_mix.py --slot torch#1 --candidates 200 --gpu-mem-gb 80 [--source-split 4]
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--candidates", type=int, default=600)
    ap.add_argument("--seed0", type=int, default=8_000_000)
    ap.add_argument("--gpu-mem-gb", type=float, default=140.0, help="H200: 140; H100: 80")
    ap.add_argument("--workers", type=int, default=16, help="verifier workers sharing the GPU")
    ap.add_argument("--slot", default=None, help="only candidates of this mixture slot (data_source), e.g. torch#1")
    ap.add_argument("--source-split", type=int, default=None, help="verify.split_by_source for --slot: its candidates "
                    "sized against 1/N of the device (the control: without it)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from opsynth.catalog import load_catalog, quiet_standalone_modules
    from opsynth.graph import Sampler, SamplerConfig
    from opsynth.verify.config import VerifyConfig
    from opsynth.verify.sizing import choose_batch

    quiet_standalone_modules()
    catalog = load_catalog()
    splits = {args.slot: args.source_split} if args.slot and args.source_split else {}
    vcfg = VerifyConfig(device="cuda", split_by_source=splits)
    budget = vcfg.task_memory_budget_mb("cuda", args.gpu_mem_gb * 1024, args.workers, args.slot)
    sampler = Sampler(SamplerConfig(), catalog, device="cuda")
    sampled, passed = collections.Counter(), collections.Counter()
    reasons = collections.Counter()
    n_passed = 0
    n = 0
    distinct_past = set()
    for seed in range(args.seed0, args.seed0 + (args.candidates if not args.slot else 40 * args.candidates)):
        if n >= args.candidates:
            break
        st = sampler.sample(seed)
        if args.slot and st.data_source != args.slot:
            continue
        n += 1
        cats = {getattr(catalog.ops.get(op), "category", None) or "?" for op in st.graph.ops()}
        sampled.update(cats)
        choice = choose_batch(st.graph, catalog, seed, vcfg, "cuda", budget_mb=budget)
        reasons[choice.reason or "sized"] += 1
        if not choice.reason:
            n_passed += 1
            passed.update(cats)
            distinct_past.add(tuple(st.graph.ops()))
    rows = [{"category": k, "sampled": round(v / n, 4), "past_sizing": round(passed[k] / max(1, n_passed), 4)}
            for k, v in sampled.most_common()]
    print(f"{n} sampled{' of ' + args.slot if args.slot else ''}, {n_passed} past sizing ({len(distinct_past)} distinct op lists); "
          f"budget {budget:.0f} MB a request ({args.gpu_mem_gb:g} GB / {splits.get(args.slot) or args.workers}); outcomes {dict(reasons)}")
    print(f"{'category (a candidate holding one)':<36}{'sampled':>9}{'past sizing':>13}")
    for r in rows:
        print(f"{r['category']:<36}{r['sampled']:>9.3f}{r['past_sizing']:>13.3f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"candidates": n, "past_sizing": n_passed, "budget_mb": budget,
                                               "slot": args.slot, "split_by_source": splits,
                                               "distinct_op_lists_past_sizing": len(distinct_past),
                                               "gpu_mem_gb": args.gpu_mem_gb, "workers": args.workers,
                                               "outcomes": dict(reasons), "categories": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
