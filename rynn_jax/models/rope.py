"""Wan's 3D rotary position embedding.

Each head's 128 dims are 64 rotation pairs, split over the three token axes: 22 pairs for time and
21 each for height and width (every axis with its own frequency table, exponent denominator = the
axis' dims: 44 for t, 42 for h and w). Pairs are *interleaved* (dims 2i, 2i+1 rotate together).
Tables are built once in float64 with numpy (positions are static) and stored as float32.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def axis_dims(head_dim: int) -> tuple[int, int, int]:
    """Dims given to (t, h, w): h and w get 2·(head_dim // 6) each, t the rest (44/42/42 for 128)."""
    hw = 2 * (head_dim // 6)
    return head_dim - 2 * hw, hw, hw


def _angles(dim: int, max_len: int, theta: float) -> np.ndarray:
    """Rotation angle of every pair at positions 0..max_len-1: (max_len, dim // 2), float64."""
    inv_freq = 1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    return np.outer(np.arange(max_len, dtype=np.float64), inv_freq)


def rope_cos_sin(
    grid_thw: tuple[int, int, int],
    head_dim: int,
    theta: float = 10000.0,
    t_offset: int | jax.Array = 0,
    max_len: int = 1024,
) -> tuple[jax.Array, jax.Array]:
    """cos/sin per token for a (T, H, W) token grid in (t, h, w) row-major order: each (L, head_dim // 2).

    `t_offset` shifts time positions (absolute positions for block-causal generation). A Python int
    gives float64-exact tables like the reference; a traced value lets one compiled step serve
    every block (angles then come from a float32 table).
    """
    t, h, w = grid_thw
    dt, dh, dw = axis_dims(head_dim)
    ang_h = _angles(dh, h, theta)[None, :, None, :]
    ang_w = _angles(dw, w, theta)[None, None, :, :]
    if isinstance(t_offset, (int, np.integer)):
        ang_t = _angles(dt, int(t_offset) + t, theta)[int(t_offset) :, None, None, :]
        ang = np.concatenate(
            [np.broadcast_to(a, (t, h, w, a.shape[-1])) for a in (ang_t, ang_h, ang_w)], axis=-1
        ).reshape(t * h * w, head_dim // 2)
        return jnp.asarray(np.cos(ang), jnp.float32), jnp.asarray(np.sin(ang), jnp.float32)
    table_t = jnp.asarray(_angles(dt, max_len, theta), jnp.float32)
    ang_t = jax.lax.dynamic_slice_in_dim(table_t, t_offset, t, axis=0)[:, None, None, :]
    parts = [ang_t, jnp.asarray(ang_h, jnp.float32), jnp.asarray(ang_w, jnp.float32)]
    ang = jnp.concatenate(
        [jnp.broadcast_to(a, (t, h, w, a.shape[-1])) for a in parts], axis=-1
    ).reshape(t * h * w, head_dim // 2)
    return jnp.cos(ang), jnp.sin(ang)


def apply_rope(x_blnh: jax.Array, cos_lp: jax.Array, sin_lp: jax.Array) -> jax.Array:
    """Rotate interleaved pairs (x[2i], x[2i+1]) of every head; computed in float32."""
    dtype = x_blnh.dtype
    x = x_blnh.astype(jnp.float32).reshape(*x_blnh.shape[:-1], -1, 2)
    x1, x2 = x[..., 0], x[..., 1]
    cos = cos_lp[None, :, None, :]
    sin = sin_lp[None, :, None, :]
    out = jnp.stack([x1 * cos - x2 * sin, x1 * sin + x2 * cos], axis=-1)
    return out.reshape(x_blnh.shape).astype(dtype)
