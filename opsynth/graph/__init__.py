"""Operator graphs: `OpGraph`, the sampler, shape propagation on meta tensors, canonical signatures."""

from .opgraph import OpGraph
from .sampler import OPS6K_MIXTURE, Resample, SampledTask, Sampler, SamplerConfig, SamplingError

__all__ = ["OpGraph", "Sampler", "SamplerConfig", "SampledTask", "SamplingError", "Resample", "OPS6K_MIXTURE"]
