"""Settings of an audit (mirrored by conf/audit.yaml)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class AuditConfig:
    # An opsynth output folder, a folder or file of Parquet shards, or a Hub dataset id
    # (e.g. BytedTsinghua-SIA/CUDA-Agent-Ops-6K; needs the Hub, or its copy in the local cache).
    source: str = ""
    # Where audit.json and verdicts.parquet go; empty: <source>/audit for a folder, audit/<id> for a Hub id.
    out: str = ""
    split: str = "train"  # the Hub dataset's split
    revision: str | None = None  # the Hub dataset's revision (a pinned commit makes an audit repeatable)
    limit: int = 0  # audit only the first N rows (0: all)
    device: str = "cpu"  # where the verifier's workers run the rows: cpu, cuda or auto
    n_workers: int = 0  # verifier workers; 0: one per core on CPU, 8 on CUDA
    # The runtime band is a property of the device a row was timed on: off unless asked for.
    band: bool = False
    compile: bool = True  # the generator's torch.compile check (seconds per row on CPU with inductor)
    compile_backend: str = "inductor"
    kb_check: bool = True  # KernelBench decontamination (local copy, else the Hub)
    kb_path: str | None = None
    # Rows whose batch_size is above this are audited at this batch_size (rewritten by the task
    # contract, opsynth.render.task_file): GPU-sized rows on a CPU. 0: as they are.
    max_batch: int = 0
    timeout_s: float = 300.0  # per verifier request (one row's eager checks, or its compile check)
    sandbox: str = "auto"  # verify.sandbox: "auto" confines the workers (rows are untrusted code)
    progress: bool = True

    def __post_init__(self) -> None:
        if self.device not in ("cpu", "cuda", "auto"):
            raise ValueError(f"device must be cpu, cuda or auto, got {self.device!r}")
        if self.limit < 0 or self.max_batch < 0 or self.n_workers < 0:
            raise ValueError("limit, max_batch and n_workers must be >= 0")
        if self.timeout_s <= 0:
            raise ValueError(f"timeout_s must be > 0, got {self.timeout_s}")

    def verify_config(self):
        """The verifier's settings for an audit: the generator's checks, few timed runs (with the
        band off a timing decides nothing), no calibration (a row's sizes are its own)."""
        from opsynth.verify import VerifyConfig

        return VerifyConfig(device=self.device, n_workers=self.n_workers, check_band=self.band,
                            check_compile=self.compile, compile_backend=self.compile_backend, calibrate=False,
                            timeout_s=self.timeout_s, sandbox=self.sandbox,
                            **({} if self.band else {"warmup": 1, "repeats": 3, "min_repeats": 1,
                                                     "timing_budget_ms": 50.0}))
