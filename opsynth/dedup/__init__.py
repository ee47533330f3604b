"""Decontamination against KernelBench and within-run near- and semantic-duplicate removal."""

from opsynth.dedup.config import DedupConfig
from opsynth.dedup.decontaminate import KBMatch, KernelBenchIndex
from opsynth.dedup.kernelbench import KBProblem, KernelBenchUnavailable, load_kernelbench
from opsynth.dedup.neardup import NearDupIndex
from opsynth.dedup.semantic import SemanticDupIndex
from opsynth.dedup.similarity import ast_similarity, fingerprint

__all__ = [
    "DedupConfig",
    "KBMatch",
    "KBProblem",
    "KernelBenchIndex",
    "KernelBenchUnavailable",
    "NearDupIndex",
    "SemanticDupIndex",
    "ast_similarity",
    "fingerprint",
    "load_kernelbench",
]
