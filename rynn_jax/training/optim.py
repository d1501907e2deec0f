"""Optimizer: global-norm clipping → AdamW on a warm-up + cosine schedule, plus a parameter EMA.

RynnWorld-4D's joint-attention output projections (`joint/<modality>/out`) can have their own peak
learning rate (`joint_out_lr`, the release's separate `joint_out` group): `optax.multi_transform`
over two AdamWs that differ only in their schedule's peak, under one global-norm clip.

Master weights are the float32 trainable params in the train state; the model casts them to its
compute dtype (bfloat16) inside each matmul, so the optimizer never sees low-precision weights.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import optax

from rynn_jax.training.config import OptimConfig


def ema_decay_at(cfg: OptimConfig, step: jax.Array) -> jax.Array:
    """The EMA decay of the update after `step` optimizer steps (cfg.ema_warmup: the ramp)."""
    decay = jnp.float32(cfg.ema_decay)
    if not cfg.ema_warmup:
        return decay
    step = jnp.asarray(step, jnp.float32)
    return jnp.minimum(decay, (1.0 + step) / (10.0 + step))


def lr_schedule(cfg: OptimConfig, total_steps: int) -> optax.Schedule:
    warmup = min(cfg.warmup_steps, max(total_steps - 1, 0))
    if cfg.schedule == "tri_stage":  # the released policy trainer's: 0.1·lr → lr, hold, exponential decay
        hold = min(cfg.hold_steps, max(total_steps - warmup - 1, 0))
        decay = max(total_steps - warmup - hold, 1)
        return optax.join_schedules(
            [optax.linear_schedule(0.1 * cfg.lr, cfg.lr, warmup), optax.constant_schedule(cfg.lr),
             optax.exponential_decay(cfg.lr, decay, max(cfg.end_lr_factor, 1e-12))], [warmup, warmup + hold])
    if cfg.schedule == "constant":
        return optax.join_schedules(
            [optax.linear_schedule(0.0, cfg.lr, warmup), optax.constant_schedule(cfg.lr)], [warmup])
    return optax.warmup_cosine_decay_schedule(
        init_value=0.0, peak_value=cfg.lr, warmup_steps=warmup,
        decay_steps=max(total_steps, warmup + 1), end_value=cfg.lr * cfg.end_lr_factor)


def make_optimizer(cfg: OptimConfig, total_steps: int) -> optax.GradientTransformation:
    def adamw_at(lr: float) -> optax.GradientTransformation:
        return optax.adamw(lr_schedule(dataclasses.replace(cfg, lr=lr), total_steps), b1=cfg.b1, b2=cfg.b2,
                           eps=cfg.eps, weight_decay=cfg.weight_decay, mu_dtype=jnp.dtype(cfg.mu_dtype))

    adamw = adamw_at(cfg.lr)
    if cfg.joint_out_lr > 0:
        adamw = optax.multi_transform({"default": adamw, "joint_out": adamw_at(cfg.joint_out_lr)}, joint_out_labels)
    if cfg.grad_clip > 0:
        return optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw)
    return adamw


def is_joint_out(path: tuple) -> bool:
    """A parameter path (jax key path or names) inside a joint-attention output projection."""
    names = [k.key if isinstance(k, jax.tree_util.DictKey) else k.name if isinstance(k, jax.tree_util.GetAttrKey)
             else k for k in path]
    return len(names) >= 3 and names[0] == "joint" and names[2] == "out"


def joint_out_labels(params):
    """`multi_transform` labels: "joint_out" for the JA output projections, "default" elsewhere."""
    return jax.tree_util.tree_map_with_path(lambda p, _: "joint_out" if is_joint_out(p) else "default", params)


def ema_update(ema, params, decay: float):
    """ema ← decay·ema + (1 − decay)·params, leafwise in float32."""
    return jax.tree.map(lambda e, p: (decay * e + (1.0 - decay) * p.astype(jnp.float32)).astype(e.dtype),
                        ema, params)
