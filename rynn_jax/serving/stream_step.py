"""The streamed step: skeleton frames → control latents → one block step → decoded RGB frames, as
pure functions of (dit_params, codec_params, state, inputs) with the codec caches carried in the
state. `codec_params` is the pair (encoder params, decoder params); one model may fill both.
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import causal
from rynn_jax.serving import block_step, codecs
from rynn_jax.serving.block_step import State, StepConfig
from rynn_jax.serving.codecs import StreamingCodec as Codec


def make_stream_start(dit_graphdef: nnx.GraphDef, enc: Codec, dec: Codec, ccfg: causal.CausalConfig
                      ) -> Callable:
    """start(dit_params, codec_params, image_bhw3, ctx_bsk) -> state (image in [-1, 1])."""
    start = block_step.make_start(dit_graphdef, ccfg)

    def stream_start(dit_params, codec_params, image_bhw3: jax.Array, ctx_bsk: jax.Array) -> State:
        b, h, w, _ = image_bhw3.shape
        enc_cache = enc.init_encode_cache(b, h, w)
        ref = codecs.encode_image(enc, codec_params[0], enc_cache, image_bhw3)
        return {"dit": start(dit_params, ref, ctx_bsk), "enc": enc_cache,
                "dec": dec.init_decode_cache(b, h, w), "last_rgb": image_bhw3.astype(jnp.float32)}

    return stream_start


def make_stream_anchor(enc: Codec) -> Callable:
    """anchor(codec_params, state, image_bhw3, use_image) -> state: a new chunk on `image`, or on the
    last generated frame when `use_image` is False."""

    def stream_anchor(codec_params, state: State, image_bhw3: jax.Array, use_image: jax.Array) -> State:
        image_bhw3 = jnp.where(use_image, image_bhw3, state["last_rgb"])
        enc_cache = codecs.fresh(state["enc"])
        ref = codecs.encode_image(enc, codec_params[0], enc_cache, image_bhw3)
        return {"dit": block_step.anchor_state(state["dit"], ref), "enc": enc_cache,
                "dec": codecs.fresh(state["dec"]), "last_rgb": image_bhw3.astype(jnp.float32)}

    return stream_anchor


def make_stream_step(dit_graphdef: nnx.GraphDef, enc: Codec, dec: Codec, ccfg: causal.CausalConfig,
                     scfg: StepConfig) -> Callable:
    """stream_step(dit_params, codec_params, state, skeleton_bthw3, rng) -> (rgb_bthw3, state):
    4·F skeleton frames → control latents → one causal step → 4·F decoded frames."""
    step = block_step.make_step(dit_graphdef, ccfg, scfg)

    def stream_step(dit_params, codec_params, state: State, skeleton_bthw3: jax.Array, rng: jax.Array):
        control, enc_cache = codecs.encode_block(enc, codec_params[0], state["enc"], skeleton_bthw3)
        latents, dit_state = step(dit_params, state["dit"], control, rng)
        rgb, dec_cache = codecs.decode_block(dec, codec_params[1], state["dec"], latents)
        return rgb, {"dit": dit_state, "enc": enc_cache, "dec": dec_cache, "last_rgb": rgb[:, -1]}

    return stream_step


def make_deferred_stream_step(dit_graphdef: nnx.GraphDef, enc: Codec, dec: Codec, ccfg: causal.CausalConfig,
                              scfg: StepConfig, *, after_clean: bool) -> Callable:
    """`make_stream_step` over `make_deferred_step`: stream_step(dit_params, codec_params, state,
    skeleton_bthw3, rng, clean_x0, clean_control) -> (rgb, state, (x0, control)), the last pair
    being the next call's clean_x0 / clean_control."""
    step = block_step.make_deferred_step(dit_graphdef, ccfg, scfg, after_clean=after_clean)

    def stream_step(dit_params, codec_params, state: State, skeleton_bthw3: jax.Array, rng: jax.Array,
                    clean_x0_bfhwc: jax.Array, clean_control_bfhwc: jax.Array):
        # a chunk's first block (after start or a re-anchor) finds both codec caches fresh
        control, enc_cache = codecs.encode_block(enc, codec_params[0], state["enc"], skeleton_bthw3,
                                                 first=not after_clean)
        latents, dit_state = step(dit_params, state["dit"], control, rng, clean_x0_bfhwc, clean_control_bfhwc)
        rgb, dec_cache = codecs.decode_block(dec, codec_params[1], state["dec"], latents, first=not after_clean)
        return (rgb, {"dit": dit_state, "enc": enc_cache, "dec": dec_cache, "last_rgb": rgb[:, -1]},
                (latents, control))

    return stream_step
