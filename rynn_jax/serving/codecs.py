"""The pixel codecs a stream runs through, behind one typed protocol (`StreamingCodec`): the exact
Wan2.2 VAE (`models.vae`) and the tiny autoencoder of the same latent space (`models.tae`, the
real-time decoder), and the block-level streaming calls the served step makes on either.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from types import ModuleType
from typing import Any, Protocol

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import tae as tae_lib
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.tae import TinyAutoencoder
from rynn_jax.models.vae import WanVAE


class StreamingCodec(Protocol):
    """A pixel codec as the stream step uses it. Params travel separately, as jit arguments."""

    cfg: Any  # the model's config (`z_dim`: latent channels)
    # True: streams a whole block (F latents <-> 4F frames) in one call, the same result as F calls
    # (the tiny autoencoder: one frame of memory per layer, so its chunks run in parallel over
    # time); False: one chunk per call, in a scan (the Wan VAE).
    whole_blocks: bool

    def init_encode_cache(self, batch: int, height: int, width: int) -> Any: ...

    def init_decode_cache(self, batch: int, height: int, width: int) -> Any: ...

    def encode_chunk(self, params: nnx.State, cache: Any, frames_bthw3: jax.Array,
                     first: bool | None = None) -> tuple[jax.Array, Any]: ...

    def decode_chunk(self, params: nnx.State, cache: Any, latents_bfhwc: jax.Array,
                     first: bool | None = None) -> tuple[jax.Array, Any]: ...


@dataclasses.dataclass(frozen=True)
class ModelCodec:
    """`StreamingCodec` of a codec module with the streaming functions of `models.vae` (the same
    signatures in `models.tae`) and its graphdef."""
    lib: ModuleType
    graphdef: nnx.GraphDef
    cfg: Any
    whole_blocks: bool = False

    def init_encode_cache(self, batch: int, height: int, width: int) -> Any:
        return self.lib.init_encode_cache(self.cfg, batch, height, width)

    def init_decode_cache(self, batch: int, height: int, width: int) -> Any:
        return self.lib.init_decode_cache(self.cfg, batch, height, width)

    def encode_chunk(self, params: nnx.State, cache: Any, frames_bthw3: jax.Array,
                     first: bool | None = None) -> tuple[jax.Array, Any]:
        return self.lib.encode_chunk(self.graphdef, params, cache, frames_bthw3, first=first)

    def decode_chunk(self, params: nnx.State, cache: Any, latents_bfhwc: jax.Array,
                     first: bool | None = None) -> tuple[jax.Array, Any]:
        return self.lib.decode_chunk(self.graphdef, params, cache, latents_bfhwc, first=first)


def split(model: WanVAE | TinyAutoencoder) -> tuple[StreamingCodec, nnx.State]:
    """(the model's codec, its params)."""
    graphdef, params = nnx.split(model)
    if isinstance(model, TinyAutoencoder):
        return ModelCodec(tae_lib, graphdef, model.cfg, whole_blocks=True), params
    return ModelCodec(vae_lib, graphdef, model.cfg), params


def encode_image(codec: StreamingCodec, params: nnx.State, fresh_cache: Any, image_bhw3: jax.Array) -> jax.Array:
    """One image → its latent (B, 1, h, w, z), as a stream's first call (on a zero cache)."""
    return codec.encode_chunk(params, fresh_cache, jnp.repeat(image_bhw3[:, None], 4, 1), first=True)[0]


def _chunk_scan(call: Callable, cache: Any, chunks_f: jax.Array, first: bool | None) -> tuple[Any, jax.Array]:
    """`call(cache, chunk, first) -> (cache, out)` over the leading axis of `chunks_f`.

    first=None: every call picks its branch on the device (the codec's lax.cond on its step
    counter). True/False: the caller knows whether the cache is fresh, so the first chunk runs the
    first-chunk program (when True) and the scan compiles only the later-chunk one. That matters on
    a GPU beyond compile time: XLA reads a cond's predicate back to the host, which stalls the
    host's queueing of later work once per chunk."""
    if first is None:
        return jax.lax.scan(lambda c, x: call(c, x, None), cache, chunks_f)
    outs = []
    if first:
        cache, out0 = call(cache, chunks_f[0], True)
        outs, chunks_f = [out0[None]], chunks_f[1:]
    if chunks_f.shape[0]:
        cache, rest = jax.lax.scan(lambda c, x: call(c, x, False), cache, chunks_f)
        outs.append(rest)
    return cache, jnp.concatenate(outs) if len(outs) > 1 else outs[0]


def encode_block(enc: StreamingCodec, enc_params: nnx.State, enc_cache: Any, frames_bthwc: jax.Array,
                 first: bool | None = None) -> tuple[jax.Array, Any]:
    """4·F frames → F latent frames, streaming (a chunk's first call reads only frame 3). `first`:
    whether `enc_cache` is fresh (True), not (False), or unknown until run (None); see `_chunk_scan`."""
    if enc.whole_blocks:
        return enc.encode_chunk(enc_params, enc_cache, frames_bthwc, first=first)
    b, t = frames_bthwc.shape[:2]
    chunks = frames_bthwc.reshape(b, t // 4, 4, *frames_bthwc.shape[2:]).swapaxes(0, 1)

    def call(cache, chunk, is_first):
        z, cache = enc.encode_chunk(enc_params, cache, chunk, first=is_first)
        return cache, z[:, 0]

    enc_cache, z_fbhwc = _chunk_scan(call, enc_cache, chunks, first)
    return z_fbhwc.swapaxes(0, 1), enc_cache


def decode_block(dec: StreamingCodec, dec_params: nnx.State, dec_cache: Any, latents_bfhwc: jax.Array,
                 first: bool | None = None) -> tuple[jax.Array, Any]:
    """F latent frames → 4·F frames (a chunk's first call gives its frame at index 3, zeros before).
    `first`: as in `encode_block`."""
    if dec.whole_blocks:
        return dec.decode_chunk(dec_params, dec_cache, latents_bfhwc, first=first)

    def call(cache, z_bhwc, is_first):
        y, cache = dec.decode_chunk(dec_params, cache, z_bhwc[:, None], first=is_first)
        return cache, y

    dec_cache, y_fbthwc = _chunk_scan(call, dec_cache, latents_bfhwc.swapaxes(0, 1), first)
    y = y_fbthwc.swapaxes(0, 1)
    return y.reshape(y.shape[0], -1, *y.shape[3:]), dec_cache


def fresh(cache: Any) -> Any:
    """A codec cache as a new stream's (zeros, same structure)."""
    return jax.tree.map(jnp.zeros_like, cache)
