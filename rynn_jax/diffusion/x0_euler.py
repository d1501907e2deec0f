"""The causal student's few-step sampler, x0-Euler (Self-Forcing style), in one place: the rollout
the student is trained through (`distill.rollout`) and the step it is served through
(`serving.block_step`) both run these functions, so the two cannot drift apart.

Per block of F latent frames, with the block's key k (the session's key folded with the block's
index, `fold_in`):
  x ← N(0, I) from fold_in(k, 0)                                   (`block_noise`)
  for i = 0..N−1:  x0 = x − σ_i·v(x, t_i);  x ← (1 − σ_{i+1})·x0 + σ_{i+1}·ε_i,  ε_i from fold_in(k, i + 1)
σ_N = 0, so the last x is the block's sample. The chunk's frame 0 is the reference latent: pinned
(clean, t = 0) before every model call (`reference_pin`), as TI2V sampling does.

Keys may be one key, or a (B,) batch of keys: then sample b's noise comes from key b alone, the
same in any batch and at any place in one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.diffusion.schedules import flow_sigmas, flow_timesteps

# velocity(x_bfhwc, t_bf, carry) -> (v_bfhwc, carry): one model call on a block; `carry` is
# threaded through the steps (the served step's working K/V; None in training).
Velocity = Callable[[jax.Array, jax.Array, Any], tuple[jax.Array, Any]]


def schedule(num_steps: int, shift: float) -> tuple[np.ndarray, np.ndarray]:
    """Model timesteps (N,) float32 and solver sigmas (N + 1,) ending at 0, both host constants.
    4 steps, shift 5 → timesteps [999, 937, 833, 624]."""
    sigmas = flow_sigmas(num_steps, shift).astype(np.float32).astype(np.float64)  # as the teacher's solver
    return flow_timesteps(num_steps, shift).astype(np.float32), sigmas


def as_key(rng: jax.Array) -> jax.Array:
    """A typed PRNG key (raw uint32 key data, as exported executables take it, is wrapped)."""
    return rng if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(rng)


def fold_in(rng: jax.Array, data: int | jax.Array) -> jax.Array:
    """`jax.random.fold_in` of one key, or of each key of a (B,) batch (one per sample)."""
    if rng.ndim == 0 or not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.fold_in(rng, data)  # one typed key, or one raw key (uint32 (2,))
    return jax.vmap(jax.random.fold_in, in_axes=(0, None))(rng, data)


def normal(rng: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """N(0, 1) noise of `shape` = (B, ...): one draw from one key, or sample b from key b of a (B,)
    batch, so a sample's noise does not depend on its batch or its place in it."""
    if rng.ndim == 0 or not jnp.issubdtype(rng.dtype, jax.dtypes.prng_key):
        return jax.random.normal(rng, shape, dtype)
    return jax.vmap(lambda k: jax.random.normal(k, shape[1:], dtype))(rng)


def block_noise(key: jax.Array, shape_bfhwc: tuple[int, ...]) -> jax.Array:
    """A block's initial noise (float32), from its key."""
    return normal(fold_in(key, 0), shape_bfhwc, jnp.float32)


def reference_pin(ref_b1hwc: jax.Array, first_frame: jax.Array | int, frames: int
                  ) -> tuple[jax.Array, Callable[[jax.Array], jax.Array]]:
    """(pin_f, pin) for a block of `frames` latent frames starting at chunk frame `first_frame`:
    pin_f (F,) says which of them is the chunk's frame 0, and pin(x) puts the reference latent
    there (the block's other frames unchanged)."""
    pin_f = (first_frame + jnp.arange(frames)) == 0
    ref = ref_b1hwc.astype(jnp.float32)
    return pin_f, lambda x: jnp.where(pin_f[None, :, None, None, None], ref, x)


def pinned_t(pin_f: jax.Array, t_bf: jax.Array) -> jax.Array:
    """Timesteps (B, F) with the pinned reference frame clean (t = 0)."""
    return jnp.where(pin_f[None], 0.0, t_bf)


def predict_x0(x: jax.Array, v: jax.Array, sigma: Any) -> jax.Array:
    """The clean sample a flow-matching velocity v at noise level σ points to: x0 = x − σ·v."""
    return x - sigma * v


def update(x: jax.Array, v: jax.Array, key: jax.Array, i: int | jax.Array, sigma: Any, sigma_next: Any
           ) -> tuple[jax.Array, jax.Array]:
    """Step i: x0 = x − σ_i·v, re-noised to σ_{i+1} with ε_i from fold_in(key, i + 1) → (x, x0)."""
    x0 = predict_x0(x, v, sigma)
    eps = normal(fold_in(key, i + 1), x.shape, x.dtype)
    return (1.0 - sigma_next) * x0 + sigma_next * eps, x0


def run(velocity: Velocity, x: jax.Array, key: jax.Array, timesteps_n: np.ndarray, sigmas_n1: np.ndarray, *,
        first: int = 0, stop: int | jax.Array | None = None, carry: Any = None
        ) -> tuple[jax.Array, jax.Array, Any]:
    """Steps first..stop−1 (default: to the last) from `x`, the state after step first − 1
    → (x, the last step's x0, carry). After the last step x is x0 (σ_N = 0). `stop` may be
    traced (training's random exit step): the loop then has a traced length, so only the steps
    taken are run."""
    b, f = x.shape[:2]
    n = len(timesteps_n)
    ts, sigmas = jnp.asarray(timesteps_n, jnp.float32), jnp.asarray(sigmas_n1, jnp.float32)

    def body(i, xc):
        x, _, c = xc
        v, c = velocity(x, jnp.full((b, f), ts[i], jnp.float32), c)
        return (*update(x, v, key, i, sigmas[i], sigmas[i + 1]), c)

    return jax.lax.fori_loop(first, n if stop is None else stop, body, (x, x, carry))
