"""Codec blocks of the streaming path (rynn_jax.serving.codecs): the pixel-level stream step with
the tiny autoencoder as decoder, and statically-known first blocks against the lax.cond version."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.serving import codecs
from rynn_jax.serving.block_step import StepConfig, make_step
from rynn_jax.serving.codecs import decode_block, encode_block
from rynn_jax.serving.session import StreamingSession
from rynn_jax.serving.stream_step import make_stream_start, make_stream_step

# compiling-bound like tests/test_causal.py: XLA's cheapest compile (tests/conftest.py)
pytestmark = pytest.mark.usefixtures("fast_compile")

CFG = WanDiTConfig.tiny(control="add-plus", num_layers=2)


def test_stream_step_decodes_with_the_tiny_autoencoder():
    """A pixel step with the Wan VAE encoding and the tiny autoencoder decoding (StreamingSession's
    `decoder=`): its frames are tae.decode of the latents the latent-level step makes from the same
    encoded skeleton; a codec whose latents the DiT cannot take is refused."""
    from rynn_jax.models import tae, tae_weights
    from rynn_jax.models.vae import WanVAEConfig, init_vae

    dit = init_dit(dataclasses.replace(CFG, in_channels=4, out_channels=4, control_channels=4), seed=2)
    vae = init_vae(WanVAEConfig.tiny(), seed=0)
    tcfg = tae.TAEConfig.tiny(dtype="float32")
    rng = np.random.default_rng(7)
    fan_in = lambda a: np.prod(a.shape[:-1]) if len(a.shape) > 1 else 100.0  # noqa: E731  (HWIO kernels)
    tiny = tae.tae_from_params(tcfg, jax.tree.map(  # LeCun-scaled: rounding differences stay small
        lambda a: (rng.standard_normal(a.shape) * np.sqrt(1 / fan_in(a))).astype(np.float32),
        tae_weights.abstract_params(tcfg)))
    ccfg, scfg = causal.CausalConfig(frames_per_block=2, window_frames=3), StepConfig(num_steps=1)
    enc, enc_params = codecs.split(vae)
    dec, dec_params = codecs.split(tiny)
    assert dec.lib is tae and enc.lib is not tae
    graphdef, params = nnx.split(dit)
    image = jnp.asarray(rng.uniform(-1, 1, (1, 32, 64, 3)), jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((1, CFG.text_len, CFG.text_dim)), jnp.float32)
    skeleton = jnp.asarray(rng.uniform(-1, 1, (1, 8, 32, 64, 3)), jnp.float32)
    key = jax.random.key_data(jax.random.key(3))
    state = make_stream_start(graphdef, enc, dec, ccfg)(params, (enc_params, dec_params), image, ctx)
    rgb, _ = jax.jit(make_stream_step(graphdef, enc, dec, ccfg, scfg))(
        params, (enc_params, dec_params), state, skeleton, key)

    @jax.jit
    def reference(state):
        control, _ = encode_block(enc, enc_params, state["enc"], skeleton)
        latents, _ = make_step(graphdef, ccfg, scfg)(params, state["dit"], control, key)
        return tae.decode(dec.graphdef, dec_params, latents)  # 1 + 4·(2 − 1) frames

    want = reference(state)
    assert rgb.shape == (1, 8, 32, 64, 3) and want.shape == (1, 5, 32, 64, 3)
    assert float((jnp.abs(want) < 0.999).mean()) > 0.3  # many unclamped values: the check has teeth
    np.testing.assert_allclose(rgb[:, 3:], want, atol=1e-4)
    assert float(jnp.abs(rgb[:, :3]).max()) == 0.0  # the first call's start-up frames
    # The tiny autoencoder encodes a block in one call (Codec.whole_blocks): the same latents as one
    # chunk per call, and as the whole-clip encode of frame 0 (index 3 of the first chunk) onwards.
    fresh = tae.init_encode_cache(tcfg, 1, 32, 64)
    z_block = jax.jit(lambda c, x: encode_block(dec, dec_params, c, x)[0])(fresh, skeleton)
    per_chunk = dataclasses.replace(dec, whole_blocks=False)
    z_chunks = jax.jit(lambda c, x: encode_block(per_chunk, dec_params, c, x)[0])(fresh, skeleton)
    assert z_block.shape == (1, 2, 2, 4, 4)
    np.testing.assert_allclose(z_block, z_chunks, atol=1e-5)
    np.testing.assert_allclose(z_block, tae.encode(dec.graphdef, dec_params, skeleton[:, 3:]), atol=1e-5)
    with pytest.raises(ValueError, match="decoder makes 48-channel latents, the DiT takes 4"):
        StreamingSession(dit, vae, ccfg, scfg, chunk_frames=4, decoder=tae.abstract_tae(tae.TAEConfig.wan22()))


def test_codec_blocks_with_a_static_first_flag_equal_the_cond():
    """encode_block / decode_block told statically whether the codec cache is fresh (what the
    session's first-block and later-block programs know) give the lax.cond version's outputs and
    caches, over a first block and a later one, and their programs contain no cond (on a GPU a
    cond's predicate is read back by the host once per chunk)."""
    from rynn_jax.models.vae import WanVAEConfig, init_decode_cache, init_encode_cache, init_vae

    vae = init_vae(WanVAEConfig.tiny(), seed=0)
    codec, params = codecs.split(vae)
    rng = np.random.default_rng(5)
    frames = [jnp.asarray(rng.uniform(-1, 1, (1, 8, 32, 64, 3)), jnp.float32) for _ in range(2)]
    latents = [jnp.asarray(rng.standard_normal((1, 2, 2, 4, vae.cfg.z_dim)), jnp.float32) for _ in range(2)]
    for block, cache, inputs in ((encode_block, init_encode_cache(vae.cfg, 1, 32, 64), frames),
                                 (decode_block, init_decode_cache(vae.cfg, 1, 32, 64), latents)):
        run = {first: jax.jit(lambda c, x, first=first: block(codec, params, c, x, first=first))
               for first in (None, True, False)}
        c_cond, c_static = cache, cache
        for i, x in enumerate(inputs):  # a fresh cache, then a carried one
            y_cond, c_cond = run[None](c_cond, x)
            y_static, c_static = run[i == 0](c_static, x)
            np.testing.assert_allclose(y_static, y_cond, rtol=1e-5, atol=1e-5)
            jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5), c_static, c_cond)
        assert float(jnp.abs(y_cond).max()) > 0.05  # the check has teeth
        assert "cond[" in str(jax.make_jaxpr(run[None])(cache, inputs[0]))
        for first in (True, False):
            assert "cond[" not in str(jax.make_jaxpr(run[first])(cache, inputs[0]))
