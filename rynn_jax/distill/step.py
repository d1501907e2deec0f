"""Jitted distillation updates, pure functions of (state, [teacher,] batch) → (state, metrics).

  warmup_update      phase A: one AdamW step of the student on the teacher-forced causal loss.
  generator_update   phase B: student rollout with gradients (through the cache) → DMD loss against
                     teacher (stop-gradiented) and critic (stop-gradiented) → AdamW + EMA 0.99.
  critic_update      phase B: a fresh no-gradient student rollout → flow matching of the critic.
  regression_update  phase B with `dmd.objective="regression"`: the generator's rollout regressed onto
                     the clip's ground-truth latents; no teacher, no critic, one update per iteration.
One phase-B iteration s = generator_update when (s − 1) % critic_updates == 0, then
critic_update: `critic_updates` critic steps per generator step, as released. A step whose loss or
gradient norm is not finite leaves the state unchanged (bar the step counter) and reports
`finite = 0`; the loop raises on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rynn_jax import sharding
from rynn_jax.distill import dmd, warmup
from rynn_jax.distill import rollout as rollout_lib
from rynn_jax.distill.config import DistillConfig
from rynn_jax.distill.state import DistillState
from rynn_jax.training.optim import ema_update

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]

sg = jax.lax.stop_gradient


def _control(cfg: DistillConfig, batch: Batch) -> jax.Array | None:
    return batch["control_video_latents"] if cfg.model.control != "none" else None


def _guard(old: DistillState, new: DistillState, loss: jax.Array, grad_norm: jax.Array) -> tuple[DistillState, jax.Array]:
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    keep = old.replace(step=old.step + 1)
    return jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, keep), finite.astype(jnp.int32)


def _apply(tx: optax.GradientTransformation, params, opt_state, grads):
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, optax.global_norm(updates)


def _student_step(cfg: DistillConfig, tx: optax.GradientTransformation, state: DistillState, loss: jax.Array,
                  grads) -> tuple[DistillState, Metrics]:
    """One AdamW (+ EMA) step of the student alone, counted as one iteration (phase A, regression)."""
    grad_norm = optax.global_norm(grads)
    student, opt, update_norm = _apply(tx, state.student, state.student_opt, grads)
    ema = ema_update(state.ema, student, cfg.optim.ema_decay) if len(state.ema) else state.ema
    new = state.replace(step=state.step + 1, student=student, student_opt=opt, ema=ema)
    new, finite = _guard(state, new, loss, grad_norm)
    return new, {"loss": loss, "grad_norm": grad_norm, "update_norm": update_norm, "finite": finite,
                 "param_norm": optax.global_norm(student)}


def student_rollout(cfg: DistillConfig, graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State,
                    batch: Batch, rng: jax.Array, *, grad: bool, last_step_only: bool | None = None) -> jax.Array:
    dcfg = cfg.dmd if last_step_only is None else dataclasses.replace(cfg.dmd, last_step_only=last_step_only)
    return rollout_lib.rollout(graphdef, params, stats, batch["img_latent"], batch["text_embedding"],
                               _control(cfg, batch), rng, num_frames=batch["video_latents"].shape[1],
                               ccfg=cfg.causal, scfg=cfg.student_steps, dcfg=dcfg, grad=grad)


# --------------------------------------------------------------------------------------------------
# Phase A
# --------------------------------------------------------------------------------------------------


def make_warmup_update(cfg: DistillConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation) -> Callable:
    def loss_fn(params, stats, batch, rng):
        model = nnx.merge(graphdef, params, stats)
        return warmup.warmup_loss(model, batch, rng, frames_per_block=cfg.causal.frames_per_block,
                                  shift=cfg.warmup.shift, use_control=cfg.model.control != "none")

    def update(state: DistillState, batch: Batch) -> tuple[DistillState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        return _student_step(cfg, tx, state, *jax.value_and_grad(loss_fn)(state.student, state.stats, batch, rng))

    return update


# --------------------------------------------------------------------------------------------------
# Phase B
# --------------------------------------------------------------------------------------------------


def make_generator_update(cfg: DistillConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation) -> Callable:
    d = cfg.dmd

    def loss_fn(params, critic, teacher, stats, batch, rng):
        x0 = student_rollout(cfg, graphdef, params, stats, batch, jax.random.fold_in(rng, 0), grad=True)
        loss, aux = dmd.generator_loss(
            x0, nnx.merge(graphdef, sg(teacher), stats), nnx.merge(graphdef, sg(critic), stats), batch,
            jax.random.fold_in(rng, 1), control=_control(cfg, batch), shift=d.shift, min_sigma=d.min_sigma,
            max_sigma=d.max_sigma, guidance_scale=d.guidance_scale)
        return loss, aux

    def update(state: DistillState, teacher: nnx.State, batch: Batch) -> tuple[DistillState, Metrics]:
        rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 0)
        (loss, aux), grads = jax.value_and_grad(loss_fn, has_aux=True)(
            state.student, state.critic, teacher, state.stats, batch, rng)
        grad_norm = optax.global_norm(grads)
        student, opt, update_norm = _apply(tx, state.student, state.student_opt, grads)
        ema = ema_update(state.ema, student, cfg.optim.ema_decay) if len(state.ema) else state.ema
        new = state.replace(student=student, student_opt=opt, ema=ema)  # the critic update counts the step
        finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
        new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, state)
        return new, {"gen_loss": loss, "gen_grad_norm": grad_norm, "gen_update_norm": update_norm,
                     "gen_finite": finite.astype(jnp.int32), **aux}

    return update


def make_regression_update(cfg: DistillConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation) -> Callable:
    def loss_fn(params, stats, batch, rng):
        x0 = student_rollout(cfg, graphdef, params, stats, batch, rng, grad=True)
        return dmd.regression_loss(x0, batch["video_latents"])

    def update(state: DistillState, batch: Batch) -> tuple[DistillState, Metrics]:
        rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 0)
        return _student_step(cfg, tx, state, *jax.value_and_grad(loss_fn)(state.student, state.stats, batch, rng))

    return update


def make_critic_update(cfg: DistillConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation) -> Callable:
    d = cfg.dmd

    def loss_fn(critic, x0, stats, batch, rng):
        return dmd.critic_loss(nnx.merge(graphdef, critic, stats), x0, batch, rng, control=_control(cfg, batch),
                               shift=d.shift, min_sigma=d.min_sigma, max_sigma=d.max_sigma)

    def update(state: DistillState, batch: Batch) -> tuple[DistillState, Metrics]:
        rng = jax.random.fold_in(jax.random.fold_in(state.rng, state.step), 1)
        x0 = student_rollout(cfg, graphdef, state.student, state.stats, batch, jax.random.fold_in(rng, 0),
                             grad=False)
        loss, grads = jax.value_and_grad(loss_fn)(state.critic, x0, state.stats, batch, jax.random.fold_in(rng, 1))
        grad_norm = optax.global_norm(grads)
        critic, opt, update_norm = _apply(tx, state.critic, state.critic_opt, grads)
        new = state.replace(step=state.step + 1, critic=critic, critic_opt=opt)
        new, finite = _guard(state, new, loss, grad_norm)
        return new, {"loss": loss, "grad_norm": grad_norm, "update_norm": update_norm, "finite": finite,
                     "param_norm": optax.global_norm(state.student)}

    return update


def trains_generator(cfg: DistillConfig, step: int) -> bool:
    """Whether iteration `step` (1-based) starts with a generator update."""
    return (step - 1) % cfg.dmd.critic_updates == 0


# --------------------------------------------------------------------------------------------------
# Compiled for a mesh
# --------------------------------------------------------------------------------------------------


def _batch_shardings(mesh: Mesh, keys) -> dict[str, NamedSharding]:
    axes = tuple(a for a in ("data", "fsdp") if mesh.shape[a] > 1) or None
    return {k: NamedSharding(mesh, PartitionSpec(axes)) for k in keys}


def jitted_updates(cfg: DistillConfig, graphdef: nnx.GraphDef, tx_s, tx_c, mesh: Mesh, shardings, batch_keys
                   ) -> dict[str, Callable]:
    """The phase's `jax.jit`s, not yet traced (trace or `.lower` them inside `sharding.axis_rules`):
    {"warmup": (state, batch)}, {"regression": (state, batch)} or {"generator": (state, teacher, batch),
    "critic": (state, batch)};
    shardings explicit, the state donated. rynn_jax.aot compiles them ahead of time this way."""
    t_sh, s_sh = shardings
    b_sh = _batch_shardings(mesh, batch_keys)
    out = (s_sh, NamedSharding(mesh, PartitionSpec()))
    if cfg.phase == "warmup":
        return {"warmup": jax.jit(make_warmup_update(cfg, graphdef, tx_s), in_shardings=(s_sh, b_sh),
                                  out_shardings=out, donate_argnums=(0,))}
    if cfg.dmd.objective == "regression":
        return {"regression": jax.jit(make_regression_update(cfg, graphdef, tx_s), in_shardings=(s_sh, b_sh),
                                      out_shardings=out, donate_argnums=(0,))}
    # two programs, not one per iteration kind: the critic update compiles once
    return {"generator": jax.jit(make_generator_update(cfg, graphdef, tx_s), in_shardings=(s_sh, t_sh, b_sh),
                                 out_shardings=out, donate_argnums=(0,)),
            "critic": jax.jit(make_critic_update(cfg, graphdef, tx_c), in_shardings=(s_sh, b_sh),
                              out_shardings=out, donate_argnums=(0,))}


def jit_updates(cfg: DistillConfig, graphdef: nnx.GraphDef, tx_s, tx_c, mesh: Mesh, shardings, batch_keys
                ) -> Callable[[int, DistillState, nnx.State, Batch], tuple[DistillState, Metrics]]:
    """update(step, state, teacher, batch): the phase's compiled update(s), state donated."""
    fns = jitted_updates(cfg, graphdef, tx_s, tx_c, mesh, shardings, batch_keys)

    def run(step: int, state: DistillState, teacher: nnx.State, batch: Batch):
        with sharding.axis_rules(mesh, cfg.mesh.rules):
            if len(fns) == 1:  # phase A, or phase B's regression: one update per iteration
                (fn,) = fns.values()
                return fn(state, batch)
            metrics = {}
            if trains_generator(cfg, step):
                state, metrics = fns["generator"](state, teacher, batch)
            state, m = fns["critic"](state, batch)
            if metrics:  # a non-finite generator step fails the iteration too
                gen_finite = metrics.pop("gen_finite")
                m = {**metrics, **m, "finite": m["finite"] * gen_finite}
            return state, m

    return run
