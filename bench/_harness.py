"""What the benchmarks share: timing, and output checks (a timed program must also compute the
right thing).

Each bench records its checks in its JSON (`checks`) and exits non-zero after writing it when one
fails, so a fast but wrong variant cannot pass unnoticed.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable

import numpy as np


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def portable(value):
    """`value` with every absolute path made machine-independent (results are committed): relative
    to the repository when inside it, else the file's name alone (e.g. an output folder's)."""
    if isinstance(value, dict):
        return {k: portable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [portable(v) for v in value]
    if isinstance(value, str) and os.path.isabs(value) and "\n" not in value:
        inside = os.path.commonpath([REPO, os.path.abspath(value)]) == REPO
        return os.path.relpath(value, REPO) if inside else os.path.basename(value.rstrip("/"))
    return value


def write_json(path: str, payload: dict) -> None:
    """The bench's results file (its folder created), with machine paths made portable."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(portable(payload), f, indent=1)


def time_ms(fn: Callable[[], object], warmup: int, iters: int) -> list[float]:
    """Wall times in ms of `iters` calls after `warmup` untimed ones; `fn` must block until done."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def decode_streamed(lib, graphdef, params, latents, height: int, width: int):
    """A clip decoded the streaming way with `lib` (models.vae or models.tae): one jitted
    `decode_chunk` per latent frame, the cache carried; the first call's frame 0 is the last of its
    frames (the ones before are empty), so dropping those gives `lib.decode`'s frames (up to float
    rounding)."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax import nnx

    step = jax.jit(functools.partial(lib.decode_chunk, graphdef))
    cache = lib.init_decode_cache(nnx.merge(graphdef, params).cfg, latents.shape[0], height, width)
    outs = []
    for i in range(latents.shape[1]):
        y, cache = step(params, cache, latents[:, i:i + 1])
        outs.append(y)
    return jnp.concatenate(outs, axis=1)[:, outs[0].shape[1] - 1:]


class Checks:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def finite(self, name: str, x) -> bool:
        ok = bool(np.isfinite(np.asarray(x, np.float32)).all())
        self.rows.append(dict(check=f"{name}: finite", ok=ok))
        if not ok:
            print(f"CHECK FAILED: {name} has non-finite values", flush=True)
        return ok

    def close(self, name: str, got, want, tol: float) -> float:
        """Relative L2 error of `got` against `want` must be ≤ tol."""
        g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
        err = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
        ok = bool(np.isfinite(err) and err <= tol)
        self.rows.append(dict(check=f"{name}: rel L2 ≤ {tol:g}", value=err, ok=ok))
        print(f"check {name}: rel L2 {err:.2e} (≤ {tol:g}) {'ok' if ok else 'FAILED'}", flush=True)
        return err

    @property
    def ok(self) -> bool:
        return all(r["ok"] for r in self.rows)

    def exit_if_failed(self) -> None:
        if not self.ok:
            bad = [r["check"] for r in self.rows if not r["ok"]]
            raise SystemExit(f"benchmark checks failed: {bad}")
