"""The dataset card (README.md): Hub YAML that `datasets` and the Hub viewer read, plus a description.

Row-derived facts (counts, the achieved mixture, devices, torch versions) are read from the shards
themselves so the card describes the folder as it is, including rows from earlier, resumed runs;
process facts (target, rejections, thresholds, speed) come from RunStats.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from huggingface_hub import DatasetCard, DatasetCardData

from opsynth.shards.schema import DESCRIPTIONS, SCHEMA
from opsynth.shards.stats import RunStats
from opsynth.shards.writer import DATA_DIR, SPLIT, list_shards, read_rows

LICENSE = "cc-by-4.0"  # as CUDA-Agent-Ops-6K, whose format and recipe this follows
TAGS = ["code", "pytorch", "cuda", "kernels", "kernelbench", "synthetic", "reinforcement-learning"]
PLOTS_DIR = "plots"


def size_category(n: int) -> str:
    """The Hub's size_categories bucket for n examples."""
    bounds = [(1_000, "n<1K"), (10_000, "1K<n<10K"), (100_000, "10K<n<100K"), (1_000_000, "100K<n<1M"),
              (10_000_000, "1M<n<10M"), (100_000_000, "10M<n<100M"), (1_000_000_000, "100M<n<1B")]
    for bound, name in bounds:
        if n < bound:
            return name
    return "n>1T" if n >= 10**12 else "1B<n<10B" if n < 10**10 else "10B<n<100B" if n < 10**11 else "100B<n<1T"


def _feature(field: pa.Field) -> dict[str, Any]:
    """One entry of dataset_info.features, in the YAML form `datasets.Features._from_yaml_list` reads."""
    t = field.type
    if pa.types.is_list(t):
        # `sequence:` is read by every datasets version (new ones turn it into List).
        return {"name": field.name, "sequence": _dtype(t.value_type)}
    return {"name": field.name, "dtype": _dtype(t)}


def _dtype(t: pa.DataType) -> str:
    if pa.types.is_string(t):
        return "string"
    if pa.types.is_int64(t):
        return "int64"
    if pa.types.is_float64(t):
        return "float64"
    raise ValueError(f"no dataset feature mapping for arrow type {t}")


def features_yaml() -> list[dict[str, Any]]:
    return [_feature(f) for f in SCHEMA]


def _shard_facts(output_dir: Path) -> dict[str, Any]:
    shards = list_shards(output_dir)
    if not shards:
        raise FileNotFoundError(f"{output_dir / DATA_DIR} holds no shards; write and finalize rows first")
    not_final = [s.path.name for s in shards if not s.final]
    if not_final:
        raise ValueError(f"{output_dir}: shards {not_final} are not finalized; call ShardWriter.finalize() first")
    num_bytes = download = 0
    for s in shards:
        md = pq.ParquetFile(s.path).metadata
        num_bytes += sum(md.row_group(i).total_byte_size for i in range(md.num_row_groups))
        download += s.path.stat().st_size
    rows = read_rows(output_dir, columns=["data_source", "num_ops", "device", "torch_version", "dtype", "task_pass"])
    return {
        "num_shards": len(shards),
        "num_examples": len(rows),
        "num_bytes": int(num_bytes),
        "download_size": int(download),
        "mixture": Counter(r["data_source"] for r in rows),
        "devices": Counter(r["device"] for r in rows),
        "torch_versions": Counter(r["torch_version"] for r in rows),
        "kinds": Counter((r["dtype"], r["task_pass"]) for r in rows),
    }


def card_data(facts: dict[str, Any], pretty_name: str) -> DatasetCardData:
    return DatasetCardData(
        license=LICENSE,
        task_categories=["text-generation"],
        language=["en"],
        tags=TAGS,
        size_categories=[size_category(facts["num_examples"])],
        pretty_name=pretty_name,
        configs=[{"config_name": "default", "data_files": [{"split": SPLIT, "path": f"{DATA_DIR}/{SPLIT}-*"}]}],
        dataset_info={
            "features": features_yaml(),
            "splits": [{"name": SPLIT, "num_bytes": facts["num_bytes"], "num_examples": facts["num_examples"]}],
            "download_size": facts["download_size"],
            "dataset_size": facts["num_bytes"],
        },
    )


def _table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(str(c) for c in r) + " |" for r in rows]
    return "\n".join(lines)


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.2f} %"


def _source_key(s: str) -> tuple[int, str, int]:
    name, _, k = s.partition("#")
    return (0 if name == "torch" else 1, name, int(k) if k.isdigit() else 0)


def _fmt_rates(r: dict[str, Any]) -> str:
    keys = (("tflops", "TFLOP/s"), ("gbps", "GB/s"), ("gelems", "G exp/s"), ("kernel_us", "us per kernel call"))
    def num(x: float) -> str:
        return f"{x:,.0f}" if abs(x) >= 100 else f"{x:.3g}"

    return ", ".join(f"{num(r[k])} {unit}" for k, unit in keys if isinstance(r.get(k), (int, float)))


def _checks_section(stats: RunStats) -> list[str]:
    """How sizes were chosen and which checks are exact (bitwise) and which use a tolerance."""
    v = stats.config.get("verify", {}) if stats.config else {}
    if not v:
        return []
    kind = stats.reference_rates.get("device_kind") or ("cpu" if stats.device == "cpu" else "cuda")
    p = "cpu_" if kind == "cpu" else ""
    lo, hi = v.get(p + "min_ms"), v.get(p + "max_ms")
    m, m_low = v.get("edge_margin", 0.0), v.get("edge_margin_low", v.get("edge_margin", 0.0))
    clock = "CUDA events" if kind == "cuda" else "the thread CPU time of a single-threaded worker"
    out = ["", "## Sizes and checks", ""]
    sizes = ("Sizes are a function of the seed and the settings alone: each candidate's target eager time is drawn "
             f"from its seed (log-normal, median {v.get(p + 'target_median_ms')} ms, 90 % under "
             f"{v.get(p + 'target_p90_ms')} ms, "
             f"kept within the band shrunk {v.get('band_margin')}x on each side), and `batch_size` is the one whose "
             "predicted eager time is nearest to it. The prediction is a roofline over the kernels of one forward, "
             "counted on meta tensors, at the cost model's reference rates")
    ref = stats.reference_rates or {k: v.get(p + "cost_" + k) for k in ("tflops", "gbps", "gelems", "kernel_us")}
    sizes += f" ({_fmt_rates(ref)}; settings `verify.{p}cost_*`)."
    if stats.measured_peaks:
        sizes += (f" This run measured `{stats.measured_peaks.get('device', stats.device)}` at "
                  f"{_fmt_rates(stats.measured_peaks)}; the measurement is recorded, not used.")
    cm = stats.cost_model
    if cm.get("rows"):
        sizes += (f" Measured over predicted eager time, over {cm['rows']:,} rows: median "
                  f"{cm['eager_over_predicted_median']:.2f} (10th to 90th percentile {cm['p10']:.2f} to {cm['p90']:.2f}).")
        if "near_edge_rows" in cm:
            sizes += (f" {cm['near_edge_rows']:,} rows measured within 25 % of an edge of the acceptance window: "
                      "a rerun whose timings are that far off could reject them (every other decision is made "
                      "without a clock).")
    safety = v.get("mem_safety_cuda", v.get("mem_safety")) if kind == "cuda" else v.get("mem_safety")
    if safety:
        budget = (stats.thresholds or {}).get("task_mem_budget_mb") or v.get("task_mem_budget_mb")
        sizes += (" Memory is admitted before anything runs: the memory a verifier request holds (weights, two input "
                  "sets and a clone, the outputs the checks compare, the running forward), predicted on the same meta "
                  f"tensors, times {safety:g} must fit the "
                  + (f"{budget:,.0f} MB" if budget else "memory")
                  + " one request may use on the device (its share among the workers on it); `batch_size` stays "
                  "within it, and a candidate whose target needs more is rejected as `predicted_oom` without running.")
        wide = (stats.thresholds or {}).get("task_mem_budget_mb_by_source") or {}
        if wide:
            sizes += (" Candidates of " + ", ".join(f"{src} ({mb:,.0f} MB)" for src, mb in sorted(wide.items()))
                      + " were sized against a larger share of the device (`verify.split_by_source`), and waited "
                      "until their request fitted beside the others'.")
    out.append(sizes)
    out += ["", _table(["check", "how", "exact?"], [
        ["runtime band", (f"eager median, timed with {clock}, inside [{lo} x (1 + {m_low}), {hi} x (1 - {m})] ms for the "
                          f"promised [{lo}, {hi}] ms; a first timing within {v.get('recheck_zone')}x of an edge is "
                          f"repeated ({v.get('recheck_timings')} timings, median decides)"), "a measurement"],
        ["finite, not constant", "no NaN or Inf; not every element equal to the first", "bitwise"],
        ["inputs from the random generator", "`get_inputs()` under two seeds: at least one tensor differs "
         "(`fixed_inputs` otherwise)", "bitwise"],
        ["train/eval mode (column `mode`)", (f"outputs in train and eval mode compared within atol {v.get('atol')}, "
                                             f"rtol {v.get('rtol')}: `train` when they differ (BatchNorm's batch "
                                             "statistics), else `eval`; every later check, and the reward, run the "
                                             "task in that mode"), "tolerance"],
        ["no unused state", ("one watched forward in the task's mode: every parameter, buffer and submodule "
                             "`Model.__init__` makes is read (`unused_state` otherwise)"), "exact"],
        ["deterministic", (f"two forwards on the same inputs agree within atol {v.get('det_atol')}, "
                           f"rtol {v.get('det_rtol')}"), "tolerance (cuDNN algorithms and atomics may reorder sums)"],
        ["input-sensitive", f"outputs for two random inputs differ beyond atol {v.get('atol')}, rtol {v.get('rtol')}",
         "tolerance"],
        ["`torch.compile` matches eager", (f"within atol {v.get('atol')}, rtol {v.get('rtol')} on two inputs "
                                           f"(backend `{v.get('compile_backend')}`)"), "tolerance"],
        ["no semantic duplicate", ("no two rows share a `trace_signature`: the forward's torch calls and their "
                                   "wiring, up to sizes and constants (`semantic_duplicate` otherwise)"), "exact"],
    ] + _quota_check(stats)), "", ("`python -m pipelines.audit <folder or Hub id>` runs these checks, through the same code, on any "
             "dataset in the Ops-6K format and writes `audit.json` and a per-row verdict Parquet.")]
    return out


def _quota_check(stats: RunStats) -> list[list[str]]:
    """The checks table's row for the mixture quotas (none when the run had them off)."""
    q = stats.mixture_quota or {}
    if not q.get("quotas"):
        return []
    axes = ["`data_source` slot"] + [f"`{a}`" for a in q.get("axes") or {}]
    what = axes[0] if len(axes) == 1 else ", ".join(axes[:-1]) + " and " + axes[-1] + " each"
    return [["mixture quota", (f"the candidate's {what} holds fewer rows than its quota, counted over the "
                               f"rows committed before it in candidate order (`{q.get('reason')}` otherwise)"), "exact"]]


def _quota_words(q: dict[str, Any]) -> str:
    """How the mixture was filled by quota, and which slots were given up."""
    words = ("Each slot was filled up to its quota: its target share of `n_tasks` (largest remainder), decided in "
             "candidate order from the rows already committed; a candidate whose slot was full was rejected "
             f"(`{q.get('reason')}`). The target is the sampler's expected share of each slot over its precisions and "
             "passes.")
    if q.get("given_up"):
        cheap = (f"; one rejected before verification, at sampling, sizing or the KernelBench check, counted "
                 f"{q['pre_verifier_miss']:g} of one" if q.get("pre_verifier_miss") is not None else "")
        words += (f" Given up, after {q.get('give_up_after')} of their candidates in a row were rejected{cheap} (their "
                  f"rows went to the other slots): {', '.join(f'`{g}`' for g in q['given_up'])}.")
    if q.get("axes"):
        words += (" The precision and pass mixture was filled the same way, each value of "
                  f"{' and '.join(f'`{a}`' for a in q['axes'])} up to its own quota: a candidate with any value full was "
                  "rejected for it, with the same reason (see Precisions and passes).")
    return words


def _axis_quota_table(q: dict[str, Any]) -> list[str]:
    """Each quota axis' values but the slot's: rows held and quota (none when the run had no such axis)."""
    axes = q.get("axes") or {}
    if not axes:
        return []
    rows = [[f"`{axis}`", f"`{v}`", a.get("rows", {}).get(v, 0), quota, "yes" if v in (a.get("given_up") or []) else ""]
            for axis, a in axes.items() for v, quota in (a.get("quotas") or {}).items()]
    return ["", (f"Quotas by precision and pass (a value given up after {q.get('give_up_after')} of its candidates in "
                 f"a row were rejected holds what it had; its rows went to its axis' other values):"), "",
            _table(["axis", "value", "rows", "quota", "given up"], rows)]


def _precision_section(facts: dict[str, Any], stats: RunStats) -> list[str]:
    """Rows by precision and pass, each precision's tolerances, and the loss a backward task states."""
    n = facts["num_examples"]
    p = stats.precisions or {}
    dtypes, passes = p.get("dtypes") or {}, p.get("passes") or {}
    out = ["", "## Precisions and passes", "",
           "A task's precision (`dtype`) and pass (`task_pass`) are part of its code: float inputs are made in "
           "`dtype` (`dtype = torch.<name>` at module level, absent for float32) and `Model.__init__` ends with "
           "`self.to(dtype)`; a backward task sets `task_pass = \"backward\"`. Operators that do not run in a "
           "precision or pass on the verifying device are excluded for it by the catalog before sampling. "
           "The runtime band applies to the task's pass (forward, or forward and backward) in its precision.", ""]
    kinds = sorted(facts.get("kinds", {}).items())
    out.append(_table(["dtype", "task_pass", "rows", "share"],
                      [[f"`{d}`", f"`{t}`", c, _pct(c / n if n else None)] for (d, t), c in kinds]))
    out += _axis_quota_table(stats.mixture_quota or {})
    if dtypes:
        out += ["", _table(["dtype", "target share", "atol", "rtol", "determinism atol", "determinism rtol"],
                           [[f"`{d}`", _pct(v.get("target")), v.get("atol"), v.get("rtol"), v.get("det_atol"),
                             v.get("det_rtol")] for d, v in sorted(dtypes.items())])]
        out += ["", "The compile check, input sensitivity and the reward compare within `atol + rtol |reference|` of the "
                "task's precision; determinism within its tighter pair."]
    if passes:
        out += ["", "Target passes: " + ", ".join(f"`{k}` {_pct(v)}" for k, v in sorted(passes.items())) + "."]
    if p.get("backward_loss"):
        out += ["", f"A backward task asks for the forward output and {p['backward_loss']}. The verifier checks that "
                "every gradient exists, is finite, deterministic and input-sensitive; `eager_ms` and `compile_ms` "
                "time forward and backward together."]
    return out


def _body(output_dir: Path, facts: dict[str, Any], stats: RunStats, pretty_name: str, load_path: str) -> str:
    n = facts["num_examples"]
    th = stats.thresholds
    out = [f"# {pretty_name}", ""]
    out.append(
        f"{n:,} PyTorch operator-fusion tasks in the KernelBench format (`class Model(nn.Module)`, module-level "
        f"size constants, `get_inputs()`, `get_init_inputs()`), {CARD_MARK} in the style of CUDA-Agent-Ops-6K. "
        "A policy is asked to write `ModelNew`, "
        "a faster implementation of `Model` built from its own CUDA or Triton kernels. The first three columns "
        "(`code`, `ops`, `data_source`) are exactly Ops-6K's, so code that reads Ops-6K reads this dataset unchanged."
    )
    out += ["", "## How it was made", ""]
    out.append(
        "1. **Sample**: an operator graph of up to k seed operators (mined from `torch` and `transformers`) "
        "is sampled with a seeded sampler; the seed is kept in the `seed` column.\n"
        "2. **Render**: the graph becomes a self-contained task file (`code`).\n"
        "3. **Verify**: `batch_size` is chosen from the seed and a cost model (no clock is read; see "
        "below), then each task runs in a sandboxed child process with a timeout, eagerly and under "
        "`torch.compile`; tasks with randomness, non-deterministic, constant or input-independent outputs, "
        "fixed inputs or state that `forward` never reads are rejected, and so are tasks whose eager runtime "
        "is not inside the band below by its edge margin; each row's `mode` says whether `Model` runs in train "
        "or eval mode; "
        f"runtimes are medians measured on `{stats.device}`.\n"
        "4. **Dedup**: tasks whose `Model` is too similar (AST similarity) to any KernelBench problem are "
        "dropped, and semantic duplicates (same traced call graph up to sizes and constants) and near-duplicates "
        "within the run are removed.\n"
        "5. **Write**: accepted rows are written to zstd Parquet shards in the Hub layout."
    )
    out += ["", "## Operator-count mixture", ""]
    sources = sorted(set(facts["mixture"]) | set(stats.target_mixture), key=_source_key)
    tgt_total = sum(stats.target_mixture.values()) or None
    quotas = (stats.mixture_quota or {}).get("quotas")
    if quotas:
        out.append(_quota_words(stats.mixture_quota) + "\n")
    out.append(_table(
        ["data_source", "rows", "achieved", "target"] + (["quota"] if quotas else []),
        [[f"`{s}`", facts["mixture"].get(s, 0), _pct(facts["mixture"].get(s, 0) / n if n else None),
          _pct(stats.target_mixture[s] / tgt_total) if s in stats.target_mixture and tgt_total else "–"]
         + ([quotas.get(s, "–")] if quotas else [])
         for s in sources],
    ))
    out += _precision_section(facts, stats)
    out += ["", "## Filters and thresholds", ""]
    if th:
        shown = {k: v for k, v in th.items() if k != "verify_device"}
        if th.get("verify_device"):  # the band and memory cap are the ones of the device that verified
            out.append(f"The runtime band and memory cap below are those in force on `{th['verify_device']}`, "
                       "where this run verified its tasks.\n")
        out.append(_table(["filter", "threshold"], [[f"`{k}`", f"`{v}`"] for k, v in shown.items()]))
    else:
        out.append("No thresholds were recorded for this run.")
    out += _checks_section(stats)
    out += ["", "## Counts", ""]
    count_rows = [
        ["rows in this dataset", f"{n:,}"],
        ["shards", facts["num_shards"]],
        ["target rows (`n_tasks`)", f"{stats.n_tasks:,}" if stats.n_tasks else "–"],
        ["runs that built this folder", f"{stats.runs:,}"],
        ["rows present when the last run started", f"{stats.resumed_rows:,}"],
        ["rows added by the last run", f"{stats.run_added_rows:,}"],
    ]
    if stats.adopted_rows:
        count_rows.append(["rows found in the folder without a state file", f"{stats.adopted_rows:,}"])
    if stats.repaired_rows or stats.unreproduced_rows:
        count_rows.append(["rows of damaged shards regenerated (`repair=true`)", f"{stats.repaired_rows:,}"])
        count_rows.append(["rows of damaged shards whose seed did not give them again", f"{stats.unreproduced_rows:,}"])
    count_rows += [
        ["accepted, all runs", f"{stats.accepted:,}"],
        ["rejected, all runs", f"{stats.num_rejected:,}"],
        ["acceptance rate", _pct(stats.acceptance_rate)],
        ["candidates per minute", f"{stats.candidates_per_minute:.1f}" if stats.candidates_per_minute else "–"],
        ["wall time, last run", f"{stats.run_wall_time_s / 60:.1f} min"],
        ["wall time, all runs", f"{stats.wall_time_s / 60:.1f} min"],
    ]
    out.append(_table(["", ""], count_rows))
    if stats.rejected:
        out += ["", "### Rejections by reason", ""]
        total_rej = stats.num_rejected
        out.append(_table(
            ["reason", "count", "share"],
            [[f"`{r}`", c, _pct(c / total_rej)] for r, c in Counter(stats.rejected).most_common()],
        ))
    out += ["", "## Environment", ""]
    env = [["device (measured on)", ", ".join(f"`{d}` ({c:,} rows)" for d, c in facts["devices"].most_common())],
           ["torch (rows verified with)", ", ".join(f"`{v}` ({c:,} rows)" for v, c in facts["torch_versions"].most_common())]]
    env += [[name, f"`{v}`"] for name, v in sorted(stats.versions.items())]
    if stats.cluster:
        env.append(["cluster", f"`{stats.cluster}`"])
    if stats.seed is not None:
        env.append(["base seed", f"`{stats.seed}`"])
    out.append(_table(["", ""], env))
    out += ["", "## Columns", ""]
    out.append(_table(["column", "type", "meaning"],
                      [[f"`{f.name}`", f"`{f.type}`", DESCRIPTIONS.get(f.name, "")] for f in SCHEMA]))
    out += ["", "## Load it", "", "```python", "from datasets import load_dataset", "",
            f'ds = load_dataset("{load_path}", split="train")', 'print(ds[0]["code"])', "```"]
    plots = sorted((output_dir / PLOTS_DIR).glob("*.png")) if (output_dir / PLOTS_DIR).is_dir() else []
    if plots:
        out += ["", "## Plots", ""]
        out += [f"![{p.stem}]({PLOTS_DIR}/{p.name})" for p in plots]
    out += ["", "## License", "",
            f"`{LICENSE}`, as CUDA-Agent-Ops-6K. KernelBench (MIT) is used only to decontaminate, never copied.", ""]
    return "\n".join(out)


CARD_MARK = "generated by opsynth"  # in every card's first paragraph: how a rerun knows the README is its own


def is_dataset_card(path: str | os.PathLike) -> bool:
    """Whether `path` is a dataset card opsynth wrote (a rerun may replace it; a user's README it must not)."""
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return False
    return text.startswith("---\n") and CARD_MARK in text


def write_card(
    output_dir: str | os.PathLike,
    stats: RunStats,
    repo_id: str | None = None,
    pretty_name: str = "opsynth operator-fusion tasks",
) -> Path:
    """Write `<output_dir>/README.md` for the finalized shards there; return its path.

    `repo_id` (when known) is what the "how to load it" snippet names; otherwise the local folder.
    Raises FileNotFoundError when there are no shards and ValueError when they are not finalized.
    """
    output_dir = Path(output_dir)
    facts = _shard_facts(output_dir)
    data = card_data(facts, pretty_name)
    body = _body(output_dir, facts, stats, pretty_name, repo_id or str(output_dir))
    card = DatasetCard(f"---\n{data.to_yaml()}\n---\n\n{body}")
    path = output_dir / "README.md"
    tmp = output_dir / ".README.md.tmp"
    tmp.write_text(str(card), encoding="utf-8")
    os.replace(tmp, path)
    return path
