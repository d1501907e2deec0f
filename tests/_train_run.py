"""`train.py` in a subprocess for the end-to-end tests (tiny recipes on CPU), and its logged losses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST_COMPILE = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"


def run_train(config: str, overrides: Sequence[str], cache_dir: str, timeout: float = 400
              ) -> subprocess.CompletedProcess:
    """`python train.py --config CONFIG --set O ...` on CPU; the runs of one test share `cache_dir`,
    a persistent compilation cache, so they compile the same programs once."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "XLA_FLAGS": FAST_COMPILE,
           "JAX_COMPILATION_CACHE_DIR": cache_dir, "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
           "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "0"}
    args = ["--config", config]
    for o in overrides:
        args += ["--set", o]
    return subprocess.run([sys.executable, os.path.join(ROOT, "train.py"), *args], env=env, cwd=ROOT,
                          capture_output=True, text=True, check=False, timeout=timeout)


def logged_losses(run_dir: str) -> list[tuple[int, float]]:
    """(step, loss) of every line of `run_dir/logs/metrics.jsonl`."""
    with open(os.path.join(run_dir, "logs", "metrics.jsonl")) as f:
        return [(r["step"], r["loss"]) for r in map(json.loads, f)]
