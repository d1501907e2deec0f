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
