"""The jitted train step: (TrainState, batch) → (TrainState, metrics), a pure function.

Gradient accumulation runs the micro-batches in a `lax.scan` (one compiled micro-step). A step
whose loss or gradient norm is not finite leaves the state unchanged and reports `finite = 0`;
the loop raises on it with the step number (fail loudly, but never checkpoint a poisoned state).
"""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rynn_jax import sharding
from rynn_jax.training import loss as loss_lib
from rynn_jax.training import loss4d
from rynn_jax.training.config import OptimConfig, TrainConfig, World4DLossConfig
from rynn_jax.training.optim import ema_decay_at, ema_update, lr_schedule
from rynn_jax.training.state import TrainState

Batch = dict[str, jax.Array]
Metrics = dict[str, jax.Array]


def _split_micro(batch: Batch, k: int) -> Batch:
    """(B, ...) → (k, B/k, ...); micro-batch i takes rows i, i+k, ... so that each micro-batch is
    spread over all data-parallel devices like the full batch."""
    def one(x: jax.Array) -> jax.Array:
        if x.shape[0] % k:
            raise ValueError(f"batch {x.shape[0]} does not split into {k} micro-batches")
        return jnp.moveaxis(x.reshape(x.shape[0] // k, k, *x.shape[1:]), 1, 0)
    return jax.tree.map(one, batch)


def make_step_fn(cfg: TrainConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation
                 ) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    schedule_lr = lr_schedule(cfg.optim, cfg.total_steps)
    world4d = isinstance(cfg.loss, World4DLossConfig)

    def loss_fn(params: nnx.State, frozen: nnx.State, stats: nnx.State, batch: Batch, rng: jax.Array,
                step: jax.Array):
        # copy: fresh Variables at this trace level (the running stats are mutated in the forward)
        model = nnx.merge(graphdef, params, frozen, stats, copy=True)
        if world4d:
            loss = loss4d.world4d_loss(model, batch, rng, cfg.loss, step)
        else:
            loss = loss_lib.cfm_loss(model, batch, rng, cfg.loss)
        return loss, nnx.state(model, nnx.Not(nnx.Param))  # updated running stats

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        rng = jax.random.fold_in(state.rng, state.step)
        if cfg.grad_accum == 1:
            (loss, stats), grads = grad_fn(state.params, state.frozen, state.stats, batch, rng, state.step)
        else:
            def micro(carry, xs):
                grads_acc, loss_acc, stats = carry
                i, mb = xs
                (loss, stats), grads = grad_fn(state.params, state.frozen, stats, mb, jax.random.fold_in(rng, i),
                                               state.step)
                return (jax.tree.map(jnp.add, grads_acc, grads), loss_acc + loss, stats), None

            zeros = jax.tree.map(jnp.zeros_like, state.params)
            xs = (jnp.arange(cfg.grad_accum), _split_micro(batch, cfg.grad_accum))
            (grads, loss, stats), _ = jax.lax.scan(micro, (zeros, jnp.zeros((), jnp.float32), state.stats), xs)
            grads = jax.tree.map(lambda g: g / cfg.grad_accum, grads)
            loss = loss / cfg.grad_accum

        return apply_gradients(state, grads, loss, tx, cfg.optim, schedule_lr, stats=stats)

    return step


def apply_gradients(state: TrainState, grads: nnx.State, loss: jax.Array, tx: optax.GradientTransformation,
                    optim: OptimConfig, schedule_lr: optax.Schedule, **changes) -> tuple[TrainState, Metrics]:
    """The optimizer update, the EMA and the finiteness guard (shared with training.autoencoder);
    `changes`: other state fields the step produced (running stats). On a non-finite loss or
    gradient norm everything but the step counter keeps its old value and `finite` is 0, for the
    host to raise on."""
    grad_norm = optax.global_norm(grads)
    updates, opt_state = tx.update(grads, state.opt_state, state.params)
    params = optax.apply_updates(state.params, updates)
    ema = ema_update(state.ema, params, ema_decay_at(optim, state.step)) if optim.ema_decay > 0 else state.ema
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    new = state.replace(step=state.step + 1, params=params, opt_state=opt_state, ema=ema, **changes)
    keep = state.replace(step=state.step + 1)
    new = jax.tree.map(lambda a, b: jnp.where(finite, a, b), new, keep)
    metrics = {
        "loss": loss, "grad_norm": grad_norm, "finite": finite.astype(jnp.int32),
        "param_norm": optax.global_norm(params), "update_norm": optax.global_norm(updates),
        "lr": schedule_lr(state.step),
    }
    return new, metrics


def batch_shardings(mesh: Mesh, batch: dict) -> dict[str, NamedSharding]:
    """Batch dimension over (data, fsdp); every other dimension replicated."""
    axes = tuple(a for a in ("data", "fsdp") if mesh.shape[a] > 1) or None
    return {k: NamedSharding(mesh, PartitionSpec(axes)) for k in batch}


def jitted_step(cfg: TrainConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, mesh: Mesh,
                state_shardings: TrainState, batch_spec: dict):
    """The `jax.jit` of the step for `mesh` (shardings explicit, the old state donated), not yet
    traced: trace it (call, or `.lower(...)` for AOT compile and memory analysis) inside
    `sharding.axis_rules(mesh, cfg.mesh.rules)`. bench/sharding_sweep.py compiles it this way."""
    return jax.jit(make_step_fn(cfg, graphdef, tx),
                   in_shardings=(state_shardings, batch_shardings(mesh, batch_spec)),
                   out_shardings=(state_shardings, NamedSharding(mesh, PartitionSpec())),
                   donate_argnums=(0,))


def jit_step(cfg: TrainConfig, graphdef: nnx.GraphDef, tx: optax.GradientTransformation, mesh: Mesh,
             state_shardings: TrainState, batch_spec: dict) -> Callable[[TrainState, Batch], tuple[TrainState, Metrics]]:
    """The step compiled for `mesh`: shardings explicit, the old state donated."""
    jitted = jitted_step(cfg, graphdef, tx, mesh, state_shardings, batch_spec)

    def run(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        with sharding.axis_rules(mesh, cfg.mesh.rules):
            return jitted(state, batch)

    return run
