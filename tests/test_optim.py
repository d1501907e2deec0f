"""The optimizer chain (global-norm clip → AdamW on the schedule) against a float64 NumPy AdamW,
and the bfloat16 first-moment option."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rynn_jax.training import optim
from rynn_jax.training.config import OptimConfig


def _reference_adamw(params, grads_seq, cfg: OptimConfig):
    """Decoupled-weight-decay Adam with bias correction and global-norm clipping, float64."""
    p = {k: np.asarray(v, np.float64) for k, v in params.items()}
    mu = {k: np.zeros_like(v) for k, v in p.items()}
    nu = {k: np.zeros_like(v) for k, v in p.items()}
    for t, grads in enumerate(grads_seq, start=1):
        g = {k: np.asarray(v, np.float64) for k, v in grads.items()}
        norm = np.sqrt(sum(np.sum(v ** 2) for v in g.values()))
        if cfg.grad_clip > 0 and norm > cfg.grad_clip:
            g = {k: v * cfg.grad_clip / norm for k, v in g.items()}
        for k in p:
            mu[k] = cfg.b1 * mu[k] + (1 - cfg.b1) * g[k]
            nu[k] = cfg.b2 * nu[k] + (1 - cfg.b2) * g[k] ** 2
            mu_hat, nu_hat = mu[k] / (1 - cfg.b1 ** t), nu[k] / (1 - cfg.b2 ** t)
            p[k] = p[k] - cfg.lr * (mu_hat / (np.sqrt(nu_hat) + cfg.eps) + cfg.weight_decay * p[k])
    return p


def _run(cfg: OptimConfig, params, grads_seq):
    tx = optim.make_optimizer(cfg, total_steps=100)
    params = jax.tree.map(jnp.asarray, params)
    state = tx.init(params)
    for grads in grads_seq:
        updates, state = tx.update(jax.tree.map(jnp.asarray, grads), state, params)
        params = optax.apply_updates(params, updates)
    return params, state


@pytest.mark.parametrize("grad_scale", [0.1, 10.0])  # below / above the clip threshold
def test_adamw_chain_matches_float64_reference(grad_scale):
    cfg = OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.1, grad_clip=1.0)
    rng = np.random.default_rng(0)
    params = {"w": rng.standard_normal((8, 4)).astype(np.float32), "b": rng.standard_normal(4).astype(np.float32)}
    grads_seq = [{k: (grad_scale * rng.standard_normal(v.shape)).astype(np.float32) for k, v in params.items()}
                 for _ in range(5)]
    got, _ = _run(cfg, params, grads_seq)
    want = _reference_adamw(params, grads_seq, cfg)
    for k in params:
        np.testing.assert_allclose(np.asarray(got[k]), want[k], rtol=1e-5, atol=1e-6, err_msg=k)
        assert np.abs(want[k] - params[k]).max() > 1e-3  # the steps moved the params


def test_bfloat16_first_moment():
    """mu_dtype="bfloat16": the first moment is stored in bf16 (second stays float32) and the
    trajectory stays within bf16 rounding of the float32 one."""
    rng = np.random.default_rng(1)
    params = {"w": rng.standard_normal((16, 8)).astype(np.float32)}
    grads_seq = [{"w": rng.standard_normal((16, 8)).astype(np.float32)} for _ in range(5)]
    base = OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0)
    p32, s32 = _run(base, params, grads_seq)
    p16, s16 = _run(OptimConfig(**{**base.__dict__, "mu_dtype": "bfloat16"}), params, grads_seq)
    adam16 = next(s for s in jax.tree.leaves(s16, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
                  if isinstance(s, optax.ScaleByAdamState))
    assert adam16.mu["w"].dtype == jnp.bfloat16 and adam16.nu["w"].dtype == jnp.float32
    step32 = np.asarray(p32["w"]) - params["w"]
    step16 = np.asarray(p16["w"]) - params["w"]
    rel = np.linalg.norm(step16 - step32) / np.linalg.norm(step32)
    assert 0 < rel < 1e-2, rel


def test_overrides_check_choice_fields():
    """`--set` on a Literal field takes only its listed values (a typo fails at once, naming them)."""
    from rynn_jax.training import config as config_lib

    cfg = config_lib.load_config("configs/tiny.py")
    assert config_lib.apply_overrides(cfg, ["optim.mu_dtype=bfloat16"]).optim.mu_dtype == "bfloat16"
    assert config_lib.apply_overrides(cfg, ["model.remat=save_dots_attn"]).model.remat == "save_dots_attn"
    with pytest.raises(ValueError, match="must be one of.*'float32', 'bfloat16'"):
        config_lib.apply_overrides(cfg, ["optim.mu_dtype=float16"])
    with pytest.raises(ValueError, match="--set 'model.remat=save_dot'"):
        config_lib.apply_overrides(cfg, ["model.remat=save_dot"])


@pytest.mark.parametrize("warmup", [False, True])
def test_ema_through_apply_gradients_matches_the_float64_recurrence(warmup):
    """The train step's EMA (apply_gradients) over 40 updates against the float64 recurrence
    e ← d_t·e + (1 − d_t)·p_t, d_t = min(decay, (1 + t)/(10 + t)) with the ramp, decay without; with
    the ramp the initialisation's share after n steps is 9!·n!/(n + 9)!, not decay^n."""
    import math

    from flax import nnx

    from rynn_jax.training.state import TrainState
    from rynn_jax.training.step import apply_gradients

    cfg = OptimConfig(lr=1e-2, warmup_steps=0, schedule="constant", weight_decay=0.0, grad_clip=0.0,
                      ema_decay=0.99, ema_warmup=warmup)
    tx = optim.make_optimizer(cfg, total_steps=100)
    rng = np.random.default_rng(0)
    params = nnx.State({"w": jnp.asarray(rng.standard_normal(5), jnp.float32)})
    state = TrainState(step=jnp.zeros((), jnp.int32), params=params, frozen=nnx.State({}), stats=nnx.State({}),
                       opt_state=tx.init(params), ema=jax.tree.map(jnp.copy, params), rng=jax.random.key_data(
                           jax.random.key(0)))
    step = jax.jit(lambda s, g: apply_gradients(s, g, jnp.float32(0), tx, cfg, optax.constant_schedule(cfg.lr))[0])
    e, share = np.asarray(params["w"], np.float64), 1.0
    for t in range(40):
        state = step(state, nnx.State({"w": jnp.asarray(rng.standard_normal(5), jnp.float32)}))
        d = min(0.99, (1 + t) / (10 + t)) if warmup else 0.99
        e, share = d * e + (1 - d) * np.asarray(state.params["w"], np.float64), share * d
    np.testing.assert_allclose(np.asarray(state.ema["w"]), e, rtol=1e-5, atol=1e-6)
    want_share = math.factorial(9) * math.factorial(40) / math.factorial(49) if warmup else 0.99 ** 40
    assert share == pytest.approx(want_share, rel=1e-9)
