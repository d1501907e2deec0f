"""Control branch (paper Eq. 3): zero-init identity, gradients, running stats, loading."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.models.control import ControlStats
from rynn_jax.models.dit import WanDiTConfig, dit_from_params, init_dit
from rynn_jax.models.dit_weights import dit_params_from_state_dict

BASE = WanDiTConfig.tiny()  # control_channels = in_channels = 8


def _inputs(seed: int = 0):
    rng = np.random.default_rng(seed)
    z = jnp.asarray(rng.standard_normal((2, 3, 4, 6, BASE.in_channels)), jnp.float32)
    c = jnp.asarray(2.0 + 3.0 * rng.standard_normal((2, 3, 4, 6, 8)), jnp.float32)
    t = jnp.array([[0.0, 800.0, 800.0], [0.0, 300.0, 300.0]])
    ctx = jnp.asarray(rng.standard_normal((2, BASE.text_len, BASE.text_dim)), jnp.float32)
    return z, c, t, ctx


def _controlled(mode: str):
    """A controlled model sharing every base parameter with a plain one."""
    base = init_dit(BASE, seed=3)
    ctrl = init_dit(dataclasses.replace(BASE, control=mode), seed=3)
    base_params = nnx.to_pure_dict(nnx.state(base, nnx.Param))
    nnx.update(ctrl, nnx.state(base, nnx.Param))
    assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.all(a == b)), base_params,
                                     {k: v for k, v in nnx.to_pure_dict(nnx.state(ctrl, nnx.Param)).items()
                                      if k != "control"}))
    return base, ctrl


@pytest.mark.parametrize("mode", ["add", "concat"])
def test_zero_init_leaves_base_output_unchanged(mode):
    base, ctrl = _controlled(mode)
    z, c, t, ctx = _inputs()
    want = base(z, t, ctx)
    np.testing.assert_array_equal(ctrl(z, t, ctx, c), want)
    np.testing.assert_array_equal(ctrl(z, t, ctx, c, gt_latent_bthwc=z, train=True), want)
    if mode == "add":
        assert float(ctrl.control.gate[...]) == pytest.approx(0.1)


def test_gradients_reach_the_control_branch():
    _, ctrl = _controlled("add")
    z, c, t, ctx = _inputs()
    graphdef, params, rest = nnx.split(ctrl, nnx.Param, ...)

    def loss(params):
        model = nnx.merge(graphdef, params, rest)
        return jnp.mean(jnp.square(model(z, t, ctx, c, gt_latent_bthwc=z)))

    grads = nnx.to_pure_dict(jax.grad(loss)(params))
    g_embed = np.asarray(grads["control"]["embed"])
    assert np.abs(g_embed).max() > 1e-6  # zero weights, but α ≠ 0: the branch learns
    # Finite-difference check of one control weight's gradient.
    idx = np.unravel_index(np.argmax(np.abs(g_embed)), g_embed.shape)
    eps = 1e-2

    def bumped(sign):
        p = jax.tree.map(lambda x: x, params)
        p["control"]["embed"][...] = p["control"]["embed"][...].at[idx].add(sign * eps)
        return float(loss(p))

    fd = (bumped(+1) - bumped(-1)) / (2 * eps)
    assert fd == pytest.approx(float(g_embed[idx]), rel=2e-2)


def test_running_stats_update_only_in_training():
    _, ctrl = _controlled("add")
    z, c, t, ctx = _inputs()
    ctrl(z, t, ctx, c)
    np.testing.assert_array_equal(ctrl.control.mean[...], 0.0)
    ctrl(z, t, ctx, c, gt_latent_bthwc=z, train=True)
    m = BASE.control_stats_momentum
    np.testing.assert_allclose(ctrl.control.mean[...], m * np.asarray(c).mean(axis=(0, 1, 2, 3)), rtol=1e-5)
    np.testing.assert_allclose(ctrl.control.std[...], (1 - m) + m * np.asarray(c).std(axis=(0, 1, 2, 3)),
                               rtol=1e-5)
    # Through the functional boundary the updated stats come back as state (and into checkpoints).
    graphdef, state = nnx.split(ctrl)

    @jax.jit
    def train_step(state):
        model = nnx.merge(graphdef, state)
        model(z, t, ctx, c, gt_latent_bthwc=z, train=True)
        return nnx.state(model)

    new = train_step(state)
    stats = nnx.to_pure_dict(nnx.state(nnx.merge(graphdef, new), ControlStats))
    assert not np.allclose(stats["control"]["mean"], ctrl.control.mean[...])


def test_alignment_formula():
    _, ctrl = _controlled("add")
    _, c, _, _ = _inputs()
    ctrl.control.mean[...] = jnp.arange(8.0)
    ctrl.control.std[...] = jnp.full((8,), 2.0)
    e = ctrl.control.align(c, None, train=False)
    want = (np.asarray(c) - np.arange(8.0)) / (2.0 + 1e-6) * 0.8 + 0.0
    np.testing.assert_allclose(e, want, rtol=1e-5, atol=1e-6)


def test_bad_control_inputs():
    _, ctrl = _controlled("add")
    base = init_dit(BASE)
    z, c, t, ctx = _inputs()
    with pytest.raises(ValueError, match="pass the control latent"):
        ctrl(z, t, ctx)
    with pytest.raises(ValueError, match="does not align"):
        ctrl(z, t, ctx, c[:, :2])
    with pytest.raises(ValueError, match="channels, expected 8"):
        ctrl(z, t, ctx, c[..., :5])
    with pytest.raises(ValueError, match="cfg.control is 'none'"):
        base(z, t, ctx, c)


def test_released_control_weights_load(monkeypatch):
    cfg = dataclasses.replace(BASE, control="add")
    from tests.test_convert import _tiny_diffusers_state_dict

    sd, _ = _tiny_diffusers_state_dict(BASE, seed=1)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((cfg.dim, 8, 1, 2, 2)).astype(np.float32)
    sd.update({"control_patch_embedding.weight": w,
               "control_patch_embedding.bias": rng.standard_normal(cfg.dim).astype(np.float32),
               "control_scale": np.array([0.37], np.float32),
               "control_running_mean": np.arange(8, dtype=np.float32),
               "control_running_std": np.full(8, 1.5, np.float32)})
    params = dit_params_from_state_dict(sd, cfg)
    loaded = dit_from_params(cfg, params)
    np.testing.assert_array_equal(loaded.control.embed[...], w.transpose(2, 3, 4, 1, 0))
    assert float(loaded.control.gate[...]) == pytest.approx(0.37)
    np.testing.assert_array_equal(loaded.control.std[...], 1.5)
    del sd["control_running_std"]
    with pytest.raises(Exception, match="control_running_std"):
        dit_params_from_state_dict(sd, cfg)


def test_additive_control_needs_matching_channels():
    with pytest.raises(ValueError, match="must equal in_channels"):
        init_dit(dataclasses.replace(BASE, control="add", control_channels=6))
    init_dit(dataclasses.replace(BASE, control="concat", control_channels=6))  # concat has no alignment
