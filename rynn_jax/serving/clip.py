"""A whole clip through a `StreamingSession`: the reference view fitted to the served resolution,
an episode's noise key (from the seed and its name alone), and the block-by-block rollout of a
batch of skeleton videos into 8-bit frames.
"""

from __future__ import annotations

import hashlib

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.data import video as video_lib
from rynn_jax.serving.session import StreamingSession


def fit_image(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """Resize and centre-crop a reference view to the generation resolution, as the data pipeline
    treats training frames (`data.video.crop_geometry`)."""
    h, w = image.shape[:2]
    if (h, w) == (height, width):
        return image
    g = video_lib.crop_geometry(w, h, width, height)
    resized = jax.image.resize(jnp.asarray(image, jnp.float32), (g.resized_h, g.resized_w, 3), "linear",
                               antialias=True)
    crop = resized[g.y0:g.y0 + height, g.x0:g.x0 + width]
    return np.asarray(jnp.clip(jnp.round(crop), 0, 255)).astype(np.uint8)


def episode_key(seed: int, name: str) -> jax.Array:
    """Episode `name`'s noise key: `--seed` with 31 bits of sha256(name) folded in."""
    return jax.random.fold_in(jax.random.key(seed), noise_id(name))


def noise_id(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:4], "little") & 0x7FFFFFFF


@jax.jit
def _to_unit(frames_uint8: jax.Array) -> jax.Array:
    """8-bit RGB → [-1, 1] float32, on the device (a quarter of the bytes cross the bus)."""
    return frames_uint8.astype(jnp.float32) / 127.5 - 1.0


@jax.jit
def _to_uint8(frames: jax.Array) -> jax.Array:
    return jnp.clip(jnp.round((frames + 1.0) * 127.5), 0, 255).astype(jnp.uint8)


def rollout(session: StreamingSession, images_bhw3: np.ndarray, skeleton_bthw3: np.ndarray, ctx_bsk: jax.Array,
            key: jax.Array) -> np.ndarray:
    """Stream one batch through the session → (B, T, H, W, 3) uint8 for the T skeleton frames: the
    last block's missing skeleton frames repeat frame T − 1 and its extra output frames are dropped.
    `key`: one key, or (B,) keys, one per sample. The 8-bit frames are converted on the device,
    where the session takes them without a host-side check (they are our own renders), and the
    blocks are read back once at the end."""
    session.start(np.asarray(images_bhw3, np.float32) / 127.5 - 1.0, ctx_bsk, key)
    out, used, total = [], 0, skeleton_bthw3.shape[1]
    while used < total:
        n = session.frames_needed
        block = skeleton_bthw3[:, used:used + n]
        if block.shape[1] < n:  # the last block: hold the last pose
            block = np.concatenate([block, np.repeat(block[:, -1:], n - block.shape[1], axis=1)], axis=1)
        out.append(_to_uint8(session.step(_to_unit(block))))
        used += n
        if len(out) > 1:  # at most two blocks queued: other threads' device work (renders) gets in between
            out[-2].block_until_ready()
    return np.concatenate([np.asarray(o) for o in out], axis=1)[:, :total]
