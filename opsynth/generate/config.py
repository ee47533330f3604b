"""Settings of the generate stage (`conf/generate.yaml`): `GenerateConfig`, how candidates are
numbered and seeded, and what a run records of its settings.

`GenerateConfig` checks its own values in `__post_init__`; its groups (sampler, verify, dedup,
cluster) are dataclasses of their rooms, each built by the shared builder (`opsynth.config.build`)
and checked by `validate()` together with the output folder, just before a run starts.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from opsynth.cluster import ClusterConfig
from opsynth.config import build, to_plain
from opsynth.dedup import DedupConfig
from opsynth.graph import SamplerConfig, source_name
from opsynth.verify import VerifyConfig

SEED_STRIDE = 1_000_000_007
CPU_SCALE = 0.1  # sampler size scale when verifying on CPU and sampler.scale is null


@dataclass
class GenerateConfig:
    n_tasks: int = 20
    output_dir: str = "data/opsynth-ops"
    seed: int = 0
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    verify: VerifyConfig = field(default_factory=VerifyConfig)
    dedup: DedupConfig = field(default_factory=DedupConfig)
    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    kb_check: bool = True  # decontaminate against KernelBench
    rows_per_shard: int = 10_000
    row_group_size: int = 1_000
    flush_every: int = 50  # commit shards and state at least every this many accepted rows
    max_in_flight: int = 0  # 0: 4 x the cluster's slots
    # Stop after this many candidates in all (resumed runs included, so a resumed run stops where an
    # uninterrupted one would) even if n_tasks is not reached (0: 200 x n_tasks).
    max_candidates: int = 0
    repo_id: str | None = None  # named in the dataset card's loading example
    progress: bool = True
    write_card: bool = True
    # A folder whose shards lost rows the state file lists (a shard deleted, truncated, unreadable)
    # is refused; repair=true regenerates exactly the missing seeds and sets damaged files aside.
    repair: bool = False
    # Fill the operator-count, precision and pass mixtures by quota (`opsynth.generate.quota`): each
    # slot, dtype and pass holds at most its share of n_tasks; one whose last `mixture_give_up` committed
    # candidates were all rejected is given up and its rows go to the others of its axis (0: never give
    # up; the run then stops at max_candidates). One rejected before the verifier counts a tenth
    # (`quota.PRE_VERIFIER_MISS`).
    mixture_quota: bool = True
    mixture_give_up: int = 200
    # Send each candidate the committed rows' trace signatures, and the run's in-flight claims
    # (`opsynth.generate.inflight`), so a semantic duplicate of a committed row or of an earlier
    # candidate in flight stops before its timing and torch.compile (rows and reasons are the same
    # either way; false: every candidate that passes its eager checks is timed and compiles).
    skip_duplicate_compiles: bool = True
    # Processes per Dask worker that sample, size, render and decontaminate candidates before they are
    # verified (`opsynth.generate.prepare`: off the worker's one GIL; rows are the same with any count).
    # null: 2 when verifying on CUDA, 0 on CPU; 0: the worker's threads do it.
    prepare_processes: int | None = None

    def __post_init__(self) -> None:
        self.check_values()

    def check_values(self) -> None:
        """This config's own values (the groups check theirs in `validate`)."""
        if self.n_tasks < 1:
            raise ValueError(f"n_tasks must be >= 1, got {self.n_tasks}")
        if not self.output_dir:
            raise ValueError("output_dir must be a folder path")
        if self.flush_every < 1:
            raise ValueError("flush_every must be >= 1")
        if not isinstance(self.mixture_quota, bool):
            raise ValueError(f"mixture_quota must be true or false, got {self.mixture_quota!r}")
        if not isinstance(self.skip_duplicate_compiles, bool):
            raise ValueError(f"skip_duplicate_compiles must be true or false, got {self.skip_duplicate_compiles!r}")
        if self.prepare_processes is not None and (isinstance(self.prepare_processes, bool)
                                                   or not isinstance(self.prepare_processes, int)
                                                   or self.prepare_processes < 0):
            raise ValueError(f"prepare_processes must be an integer >= 0 or null (2 on CUDA, 0 on CPU), "
                             f"got {self.prepare_processes!r}")
        if isinstance(self.mixture_give_up, bool) or not isinstance(self.mixture_give_up, int) or self.mixture_give_up < 0:
            raise ValueError(f"mixture_give_up must be an integer >= 0 (0: never give a slot up), got {self.mixture_give_up!r}")

    def validate(self) -> None:
        """Everything a run checks before it starts: these values (again: a caller may have changed
        them since), the groups' settings, and an output folder the run can write."""
        self.check_values()
        blocked = next((p for p in [Path(self.output_dir), *Path(self.output_dir).parents]
                        if p.exists() and not p.is_dir()), None)
        if blocked is not None:
            raise ValueError(f"output_dir={self.output_dir}: {blocked} is a file, not a folder; give a new folder "
                             "or the folder of an earlier run (to resume it)")
        self.sampler.validate()
        self.cluster.validate()
        self.verify.check_compile_backend()
        _check_output_dir(Path(self.output_dir), self.write_card)

    def check_machine(self) -> None:
        """What this machine must have for these settings (validate() checks the settings alone):
        verify=cuda on a local cluster needs a GPU, or the local workers start and fail candidate
        after candidate. (On Slurm or a scheduler the workers have their own devices.)"""
        if self.verify.device == "cuda" and self.cluster.kind in ("local", "local_cuda"):
            from opsynth.cluster import visible_gpus

            if visible_gpus() == 0:
                raise ValueError("verify=cuda, but this machine has no GPU that torch can see "
                                 "(torch.cuda.device_count() is 0); use verify=auto or verify=cpu here, or a "
                                 "cluster whose workers have GPUs (cluster=slurm_gpu, cluster=scheduler)")


def generate_config(cfg: Mapping) -> GenerateConfig:
    """A `GenerateConfig` from the composed `conf/generate.yaml`: each group through the shared
    builder, then the top level (unknown keys and mistyped values named by their setting)."""
    plain = dict(to_plain(cfg))
    groups = {"sampler": SamplerConfig, "verify": VerifyConfig, "cluster": ClusterConfig}
    kw: dict[str, Any] = {k: build(c, plain.pop(k, None), k) for k, c in groups.items()}
    kw["dedup"] = DedupConfig.from_any(plain.pop("dedup", None))  # the builder, after its list coercion
    plain.pop("hydra", None)
    return build(GenerateConfig, {**plain, **kw}, "generate")


def _check_output_dir(out: Path, write_card: bool) -> None:
    """A folder the run can write, and nothing of the user's that the run would overwrite."""
    existing = next(p for p in [out, *out.parents] if p.exists())
    try:  # a probe, not a guess from permission bits: root passes os.access on /proc
        probe = tempfile.mkdtemp(prefix=".opsynth-probe-", dir=existing)
        os.rmdir(probe)
    except OSError as e:
        raise ValueError(f"output_dir={out}: cannot write in {existing} ({e.strerror or type(e).__name__}); "
                         "give a folder you can write to") from None
    card = out / "README.md"
    if write_card and card.is_file():
        from opsynth.shards.card import is_dataset_card

        if not is_dataset_card(card):
            raise ValueError(f"output_dir={out} holds a README.md that is not an opsynth dataset card, and the run "
                             "would replace it with one; move it away or give another output_dir")


def candidate_seed(seed: int, index: int) -> int:
    return seed * SEED_STRIDE + index


def plain(cfg) -> dict:
    """A group's settings as the plain dict a Dask task carries to its worker."""
    return {k: v for k, v in asdict(cfg).items()}


def verify_device(cfg: GenerateConfig) -> str:
    """"cuda" or "cpu": where the verifier runs with these settings (`verify.device=auto` picks the
    GPU when the driver sees one). It decides `sampler.scale=null` and which runtime band applies."""
    if cfg.verify.device in ("cpu", "cuda"):
        return cfg.verify.device
    from opsynth.cluster import visible_gpus

    return "cuda" if visible_gpus() > 0 else "cpu"


def precision_facts(cfg: GenerateConfig) -> dict:
    """What the card says of precisions and passes: each precision's target share and tolerances
    (float32's as configured, the others from the task contract's table), the passes' shares and the
    loss a backward task states."""
    from dataclasses import asdict as _asdict

    from opsynth.catalog.precision import dtype_name
    from opsynth.render.task_file import BACKWARD_LOSS, TOLERANCES

    v = cfg.verify
    total = sum(float(x) for x in cfg.sampler.dtypes.values()) or 1.0
    dtypes = {}
    for name, share in cfg.sampler.dtypes.items():
        dt = dtype_name(str(name))
        tol = ({"atol": v.atol, "rtol": v.rtol, "det_atol": v.det_atol, "det_rtol": v.det_rtol}
               if dt == "float32" else _asdict(TOLERANCES[dt]))
        dtypes[dt] = {"target": float(share) / total, **tol}
    p_total = sum(float(x) for x in cfg.sampler.passes.values()) or 1.0
    return {"dtypes": dtypes, "passes": {str(k): float(x) / p_total for k, x in cfg.sampler.passes.items()},
            "backward_loss": BACKWARD_LOSS}


def describe_run(stats, cfg: GenerateConfig) -> None:
    """Record the settings of this run in its stats (the card and report print them). The runtime
    band and memory cap are those in force on the device that verifies (the CPU band on a CPU run)."""
    from opsynth.shards.stats import default_versions

    stats.n_tasks = cfg.n_tasks
    stats.seed = cfg.seed
    stats.cluster = cfg.cluster.kind
    # As configured; the driver replaces it with the sampler's effective shares (`SlotPlan.shares`).
    stats.target_mixture = {source_name(str(k)): float(v) for k, v in cfg.sampler.mixture.items()}
    device = verify_device(cfg)
    limits = cfg.verify.limits(device)
    stats.thresholds = {
        "verify_device": device, "eager_ms_min": limits.min_ms, "eager_ms_max": limits.max_ms,
        "kb_similarity_max": cfg.dedup.kb_threshold if cfg.kb_check else None,
        "kb_op_sequence": cfg.dedup.op_sequence_action if cfg.kb_check else None,
        "near_dup_threshold": cfg.dedup.neardup_threshold, "mem_cap_gb": limits.mem_cap_gb,
        "compile_backend": cfg.verify.compile_backend, "atol": cfg.verify.atol, "rtol": cfg.verify.rtol,
        "edge_margin": cfg.verify.edge_margin, "edge_margin_low": cfg.verify.edge_margin_low,
    }
    stats.precisions = precision_facts(cfg)
    stats.versions = {**default_versions(), **stats.versions}
    stats.config = {"n_tasks": cfg.n_tasks, "seed": cfg.seed, "mixture_quota": cfg.mixture_quota,
                    "mixture_give_up": cfg.mixture_give_up, "sampler": plain(cfg.sampler),
                    "verify": plain(cfg.verify), "dedup": plain(cfg.dedup), "cluster": cfg.cluster.kind}
