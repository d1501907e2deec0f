"""Flow matching on action chunks: x_t = (1 − t)·ε + t·a, velocity target a − ε, Euler sampling
from t = 0 (noise) to t = 1 (actions). Time runs the opposite way from the world model's σ."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp

Velocity = Callable[[jax.Array, jax.Array], jax.Array]  # (x_t (B, …), t (B,)) → v (B, …)
T_MIN = 1e-4  # t ~ U(0, 1) clamped below (the released trainer's)


def loss(velocity: Velocity, actions: jax.Array, rng: jax.Array) -> jax.Array:
    """Mean squared velocity error at one random (t, ε) per example."""
    k_t, k_eps = jax.random.split(rng)
    b = actions.shape[0]
    t = jnp.maximum(jax.random.uniform(k_t, (b,)), T_MIN)
    eps = jax.random.normal(k_eps, actions.shape, jnp.float32)
    tt = t.reshape((b,) + (1,) * (actions.ndim - 1))
    x_t = (1.0 - tt) * eps + tt * actions
    return jnp.mean(jnp.square(velocity(x_t, t) - (actions - eps)))


def sample(velocity: Velocity, shape: tuple[int, ...], rng: jax.Array, steps: int = 4) -> jax.Array:
    """`steps` Euler steps at t = 0, 1/steps, … from ε ~ N(0, I) drawn from `rng` (deterministic
    given the key)."""
    x = jax.random.normal(rng, shape, jnp.float32)
    dt = 1.0 / steps

    def body(i, x):
        t = jnp.full((shape[0],), i * dt, jnp.float32)
        return x + dt * velocity(x, t)

    return jax.lax.fori_loop(0, steps, body, x)
