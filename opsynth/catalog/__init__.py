"""The seed-operator catalog: operators mined from torch (and transformers, when installed)."""

from __future__ import annotations

import contextlib
import functools
import warnings

from .spec import CATEGORIES, PATTERNS, Catalog, OpSpec

__all__ = ["CATEGORIES", "PATTERNS", "Catalog", "OpSpec", "load_catalog", "mine_catalog", "quiet_standalone_modules"]


def _transformers_version() -> str | None:
    try:
        import transformers

        return transformers.__version__
    except Exception:
        return None


@functools.lru_cache(maxsize=4)
def load_catalog(include_transformers: bool | None = None, use_cache: bool = True) -> Catalog:
    """The catalog, from the on-disk cache when it matches this torch/transformers/code, else mined.

    include_transformers: None uses transformers seeds when the package imports.
    """
    import torch

    from . import cache

    tf_version = _transformers_version() if include_transformers in (None, True) else None
    if include_transformers and tf_version is None:
        raise ImportError("include_transformers=True but the transformers package is not installed "
                          "(pip install 'opsynth[transformers]')")
    key = cache.cache_key(torch.__version__, tf_version)
    if use_cache:
        cat = cache.load(key)
        if cat is not None:
            return cat
    cat = mine_catalog(tf_version is not None)
    if use_cache:
        cache.save(key, cat)
    return cat


def quiet_standalone_modules() -> None:
    """For the rest of this process, keep transformers' warnings about modules built standalone
    off stderr (see ``_transformers_quiet``). For processes that build sampled tasks' modules (the
    generate workers replay them on meta tensors to size them): nothing a user can act on."""
    tf_logging = _tf_logging()
    if tf_logging is not None:
        tf_logging.set_verbosity_error()


def _tf_logging():
    """transformers' logging module, or None without transformers."""
    try:
        from transformers.utils import logging as tf_logging
    except Exception:
        return None
    return tf_logging


@contextlib.contextmanager
def _transformers_quiet():
    """Probing builds modules standalone, which transformers warns about through its own logger
    (xIELU's missing CUDA kernel, AttentionInterface without `_attn_implementation`, OPTAttention
    without `layer_idx`): expected here, and nothing a user of the catalog can act on."""
    tf_logging = _tf_logging()
    if tf_logging is None:
        yield
        return
    level = tf_logging.get_verbosity()
    tf_logging.set_verbosity_error()
    try:
        yield
    finally:
        tf_logging.set_verbosity(level)


def mine_catalog(include_transformers: bool) -> Catalog:
    """Discover and probe every candidate operator (tens of seconds)."""
    import torch

    from .mine import activation_names, finalize, mine_functions, mine_modules
    from .transformers_seeds import mine_transformers

    excluded: dict[str, str] = {}
    ops = {}
    activations = activation_names()
    with warnings.catch_warnings(), _transformers_quiet():
        warnings.simplefilter("ignore")
        for spec in mine_modules(excluded) + mine_functions(excluded):
            kept = finalize(spec, excluded, activations)
            if kept is not None:
                ops[kept.name] = kept
        tf_version = None
        if include_transformers:
            import transformers

            tf_version = transformers.__version__
            for spec in mine_transformers(excluded):
                ops[spec.name] = spec
    return Catalog(ops=dict(sorted(ops.items())), excluded=dict(sorted(excluded.items())),
                   torch_version=torch.__version__, transformers_version=tf_version)
