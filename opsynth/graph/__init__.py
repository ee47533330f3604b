"""Operator graphs: `OpGraph`, the sampler, shape propagation on meta tensors, canonical signatures."""

from .opgraph import OpGraph
from .sampler import OPS6K_MIXTURE, Resample, SampledTask, Sampler, SamplerConfig, SamplingError
from .slots import SlotPlan, source_name

__all__ = ["OpGraph", "Sampler", "SamplerConfig", "SampledTask", "SamplingError", "Resample", "OPS6K_MIXTURE", "SlotPlan", "source_name"]
