"""Persistent XLA compilation cache: later processes load compiled executables instead of compiling.

The 5B streaming step with unrolled layers takes minutes to compile on an H200 (docs/PERFORMANCE.md);
with the cache a restarted server pays that once per (program, shapes, jax/XLA version, GPU).
"""

from __future__ import annotations

import os

import jax
from jax.experimental.compilation_cache import compilation_cache


def enable(cache_dir: str, min_compile_s: float = 0.0) -> str:
    """Turn on JAX's persistent cache in `cache_dir` (created). Call before the first compilation of
    the programs to be cached; programs that compiled faster than `min_compile_s` are not stored.
    Returns the absolute directory."""
    path = os.path.abspath(os.path.expanduser(cache_dir))
    os.makedirs(path, exist_ok=True)
    jax.config.update("jax_compilation_cache_dir", path)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", float(min_compile_s))
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)
    compilation_cache.reset_cache()  # re-read the settings even if something compiled already
    return path


def entries(cache_dir: str) -> int:
    """Number of stored executables (files) in `cache_dir`; 0 if it does not exist."""
    path = os.path.abspath(os.path.expanduser(cache_dir))
    if not os.path.isdir(path):
        return 0
    return sum(len(files) for _, _, files in os.walk(path))
