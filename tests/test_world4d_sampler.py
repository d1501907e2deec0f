"""RynnWorld-4D sampling (serving/world4d.py): with the joint attention silenced each branch is
exactly the teacher's flow-matching sampler on that branch alone, from the same key (shared noise);
decoded outputs have the documented shapes and ranges; bad inputs fail in one line."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.diffusion import samplers
from rynn_jax.models import build
from rynn_jax.models.dit import WanDiT, WanDiTConfig
from rynn_jax.models.dit4d import WanDiT4DConfig, abstract_dit4d, dit4d_from_params, init_dit4d
from rynn_jax.models.dit4d_weights import branch_as_dit
from rynn_jax.models.vae import WanVAEConfig, init_vae
from rynn_jax.serving.bidirectional import SamplingConfig
from rynn_jax.serving.world4d import World4DModel
from rynn_jax.weights import flatten_params, unflatten_params

pytestmark = pytest.mark.usefixtures("fast_compile")

Z = WanVAEConfig.tiny().z_dim
CFG = WanDiT4DConfig.tiny(base=WanDiTConfig.tiny(num_layers=3, eps=1e-5, in_channels=Z, out_channels=Z))
SAMPLING = SamplingConfig(num_steps=3)
T_LAT, HL, WL = 3, 4, 4  # latent clip (B = 1)


def _params(seed: int, joint_out: bool) -> dict:
    """Every parameter off its init; the JA output projections and modality embeddings zero unless
    `joint_out` (then the branches are coupled)."""
    flat = flatten_params(nnx.to_pure_dict(nnx.state(abstract_dit4d(CFG), nnx.Param)), str_keys=False)
    rng = np.random.default_rng(seed)
    out = {}
    for path, leaf in flat.items():
        base = 1.0 if any(k in str(p) for p in path for k in ("norm", "scale", "gate")) else 0.0
        value = base + 0.2 * rng.standard_normal(leaf.shape)
        if path[0] == "joint" and not joint_out and len(path) > 2 and path[2] in ("out", "embed"):
            value = np.zeros(leaf.shape)
        out[path] = jnp.asarray(value, jnp.float32)
    return unflatten_params(out)


@pytest.fixture(scope="module")
def vae():
    return init_vae(WanVAEConfig.tiny(), 0)


def _first_and_context(seed: int = 0):
    rng = np.random.default_rng(seed)
    first = tuple(jnp.asarray(rng.standard_normal((1, 1, HL, WL, Z)), jnp.float32) for _ in range(3))
    ctx = jnp.asarray(rng.standard_normal((1, CFG.text_len, CFG.text_dim)), jnp.float32)
    return first, ctx


def test_silenced_joint_attention_gives_the_teachers_sampler_per_branch(vae):
    params = _params(1, joint_out=False)
    first, ctx = _first_and_context()
    key = jax.random.PRNGKey(7)
    model = World4DModel(dit4d_from_params(CFG, params), vae)
    got = model.sample_latents(key, first, ctx, T_LAT, SAMPLING)
    shape = (1, T_LAT, HL, WL, Z)
    for i, m in enumerate(("rgb", "depth", "flow")):
        dit = build.model_from_params(WanDiT, CFG.base, branch_as_dit(params, m))
        # the oracle: the sampler the teacher runs, on this branch alone, from the same key
        want = jax.jit(lambda f: samplers.sample(key, lambda x, t: dit(x, t, ctx), shape, num_steps=SAMPLING.num_steps,
                                                 shift=SAMPLING.shift, first_frame_latent=f))(first[i])
        assert got[i].shape == shape
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-4, err_msg=m)
        np.testing.assert_array_equal(got[i][:, :1], first[i])  # frame 0 stays the clean condition
    # with the joint output live the branches read each other and the RGB sample moves
    coupled = World4DModel(dit4d_from_params(CFG, _params(1, joint_out=True)), vae)
    assert float(jnp.abs(coupled.sample_latents(key, first, ctx, T_LAT, SAMPLING)[0] - got[0]).max()) > 1e-2
    # another key, another sample; the Euler solver runs through the same path
    assert float(jnp.abs(model.sample_latents(jax.random.PRNGKey(8), first, ctx, T_LAT, SAMPLING)[0] - got[0]).max()) > 1e-2
    euler = model.sample_latents(key, first, ctx, T_LAT, dataclasses.replace(SAMPLING, solver="euler"))
    assert euler[0].shape == shape and np.isfinite(np.asarray(euler[0])).all()


def test_control_variant_samples_each_branch_as_the_controlled_teacher(vae):
    """A 4D model with a control branch (silenced JA): each branch is the teacher's sampler with the
    skeleton latent on that branch alone; the skeleton is required and followed."""
    cfg = dataclasses.replace(CFG, base=dataclasses.replace(CFG.base, control="add", control_channels=Z))
    flat = flatten_params(nnx.to_pure_dict(nnx.state(abstract_dit4d(cfg), nnx.Param)), str_keys=False)
    params = flatten_params(_params(4, joint_out=False), str_keys=False)
    rng = np.random.default_rng(4)
    params.update({k: jnp.asarray((k[-1] == "gate") + 0.2 * rng.standard_normal(v.shape), jnp.float32)
                   for k, v in flat.items() if k[:2] == ("base", "control")})
    params = unflatten_params(params)
    first, ctx = _first_and_context(1)
    control = jnp.asarray(rng.standard_normal((1, T_LAT, HL, WL, Z)), jnp.float32)
    key = jax.random.PRNGKey(3)
    model = World4DModel(dit4d_from_params(cfg, params), vae)
    got = model.sample_latents(key, first, ctx, T_LAT, SAMPLING, control)
    for i, m in enumerate(("rgb", "depth", "flow")):
        dit = build.model_from_params(WanDiT, cfg.base, branch_as_dit(params, m))
        want = jax.jit(lambda f: samplers.sample(key, lambda x, t: dit(x, t, ctx, control), control.shape,
                                                 num_steps=SAMPLING.num_steps, shift=SAMPLING.shift,
                                                 first_frame_latent=f))(first[i])
        np.testing.assert_allclose(got[i], want, rtol=1e-4, atol=1e-4, err_msg=m)
    other = model.sample_latents(key, first, ctx, T_LAT, SAMPLING, -control)
    assert all(float(jnp.abs(a - b).max()) > 1e-2 for a, b in zip(got, other))  # every modality follows it
    with pytest.raises(ValueError, match="reads a skeleton video"):
        model.sample_latents(key, first, ctx, T_LAT, SAMPLING)
    with pytest.raises(ValueError, match="takes no skeleton video"):
        World4DModel(dit4d_from_params(CFG, _params(4, joint_out=False)), vae).sample_latents(
            key, first, ctx, T_LAT, SAMPLING, control)


def test_generate_shapes_ranges_and_first_frame_conditions(vae):
    model = World4DModel(dit4d_from_params(CFG, _params(2, joint_out=True)), vae)
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    depth = rng.uniform(0.3, 4.0, (64, 64))
    first = model.first_latents(ref, depth)
    white = model.encode(jnp.ones((1, 1, 64, 64, 3)))  # the flow condition: the white frame
    grey = np.floor(depth / 5 * 255) / 127.5 - 1  # the depth condition: the release's grey encoding
    np.testing.assert_allclose(first[2], white, atol=1e-6)
    np.testing.assert_allclose(first[1], model.encode(jnp.asarray(np.repeat(grey[None, None, ..., None], 3, -1),
                                                                  jnp.float32)), atol=1e-5)
    out = model.generate(jax.random.PRNGKey(0), ref, depth, np.zeros((CFG.text_len, CFG.text_dim)), 5, SAMPLING)
    assert out.rgb.shape == out.depth_video.shape == out.flow_video.shape == (5, 64, 64, 3)
    assert out.rgb.dtype == out.depth_video.dtype == np.uint8
    assert out.depth.shape == (5, 64, 64) and out.depth.dtype == np.float32
    assert 0 <= out.depth.min() and out.depth.max() <= 5.0
    # the depth in metres is the grey read back (channels averaged)
    np.testing.assert_allclose(out.depth, out.depth_video.astype(np.float32).mean(-1) / 255 * 5, atol=5 / 255)
    assert out.flow.shape == (4, 64, 64, 2) and np.hypot(*out.flow.transpose(3, 0, 1, 2)).max() <= 32 * (1 + 1e-5)


def test_bad_inputs(vae):
    model = World4DModel(dit4d_from_params(CFG, _params(3, joint_out=False)), vae)
    ref, depth, ctx = np.zeros((64, 64, 3), np.uint8), np.ones((64, 64)), np.zeros((CFG.text_len, CFG.text_dim))
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="num_frames must be 1 \\+ 4k"):
        model.generate(key, ref, depth, ctx, 6)
    with pytest.raises(ValueError, match="num_frames must be 1 \\+ 4k"):
        model.generate(key, ref, depth, ctx, 1)
    with pytest.raises(ValueError, match="reference depth \\(32, 64\\) does not match"):
        model.first_latents(ref, depth[:32])
    with pytest.raises(ValueError, match="finite metres"):
        model.first_latents(ref, -depth)
    with pytest.raises(ValueError, match="expected uint8"):
        model.first_latents(ref.astype(np.float32), depth)
    first, c = _first_and_context()
    with pytest.raises(ValueError, match="three arrays of one shape"):
        model.sample_latents(key, (first[0], first[1], first[2][:, :, :2]), c, T_LAT, SAMPLING)
    with pytest.raises(ValueError, match="the VAE makes 4"):
        World4DModel(init_dit4d(WanDiT4DConfig.tiny()), vae)  # 8-channel latents
