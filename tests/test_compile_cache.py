"""The persistent compilation cache: a second process loads the executable the first one compiled."""

import json
import subprocess
import sys
from pathlib import Path

from rynn_jax import compile_cache

ROOT = Path(__file__).resolve().parents[1]

_PROGRAM = r"""
import json, sys
import jax, jax.numpy as jnp
from rynn_jax import compile_cache
events = []
jax.monitoring.register_event_listener(lambda name, **kw: events.append(name))
compile_cache.enable(sys.argv[1])
f = jax.jit(lambda x: jnp.tanh(x @ x.T).sum(0) * 3.0)
y = f(jnp.arange(48.0).reshape(6, 8) / 48)
print(json.dumps({"hits": events.count("/jax/compilation_cache/cache_hits"),
                  "misses": events.count("/jax/compilation_cache/cache_misses"),
                  "y": [float(v) for v in y]}))
"""


def _run(cache_dir: Path) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROGRAM, str(cache_dir)], capture_output=True, text=True,
                         cwd=ROOT, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_second_process_hits_the_cache(tmp_path):
    cache = tmp_path / "xla"
    assert compile_cache.entries(cache) == 0
    cold = _run(cache)
    stored = compile_cache.entries(cache)
    assert cold["hits"] == 0 and cold["misses"] >= 1 and stored >= 1
    warm = _run(cache)
    assert warm["hits"] >= 1 and warm["misses"] == 0
    assert compile_cache.entries(cache) == stored  # nothing recompiled, nothing new written
    assert warm["y"] == cold["y"]
