"""The distillation state and its sharded creation.

Three copies of one WanDiT graph, on one mesh, sharded by the one logical-axis rules table:
  teacher   frozen (real score), `teacher_dtype` storage, never differentiated, NOT checkpointed
            (reloaded from `ckpt.init_from`, or rebuilt from the seed, at every start);
  student   the causal generator: float32 master weights, optimiser state, EMA;
  critic    the fake score (phase B only): initialised from the teacher, its own optimiser.
The control branch's running statistics (`stats`) are shared and frozen: distillation calls the
models in inference mode. `DistillState` is what a resumed run needs; it has a `.step`, so the
training `Checkpointer` saves and restores it unchanged.
"""

from __future__ import annotations

import dataclasses
import os

import flax.struct
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from flax import nnx
from jax.sharding import Mesh, PartitionSpec

from rynn_jax import sharding
from rynn_jax.distill.config import DistillConfig
from rynn_jax.models import control
from rynn_jax.models.dit import WanDiT, WanDiTConfig
from rynn_jax.training import optim


@flax.struct.dataclass
class DistillState:
    step: jax.Array  # int32 scalar: iterations taken
    student: nnx.State  # generator parameters, float32
    student_opt: optax.OptState
    ema: nnx.State  # EMA of the student (empty when optim.ema_decay == 0)
    critic: nnx.State  # fake-score parameters (empty in the warm-up)
    critic_opt: optax.OptState
    stats: nnx.State  # control running statistics (frozen)
    rng: jax.Array  # base key; iteration key = fold_in(rng, step)


def uses_critic(cfg: DistillConfig) -> bool:
    """Phase B with the DMD objective trains a critic (and needs the teacher); the warm-up and the
    regression objective need neither."""
    return cfg.phase == "dmd" and cfg.dmd.objective == "dmd"


def make_optimizers(cfg: DistillConfig) -> tuple[optax.GradientTransformation, optax.GradientTransformation]:
    """(generator, critic) optimisers: clipping → AdamW (training/optim.py)."""
    gen_steps = cfg.total_steps if not uses_critic(cfg) else -(-cfg.total_steps // cfg.dmd.critic_updates)
    return optim.make_optimizer(cfg.optim, gen_steps), optim.make_optimizer(cfg.critic_optim, cfg.total_steps)


def _cast(tree: nnx.State, dtype: str) -> nnx.State:
    return jax.tree.map(lambda x: x.astype(dtype), tree)


def _init_fn(cfg: DistillConfig, tx_s: optax.GradientTransformation, tx_c: optax.GradientTransformation):
    def init(rng: jax.Array) -> tuple[nnx.State, DistillState]:
        init_rng, train_rng = jax.random.split(rng)
        with nnx.use_eager_sharding(False):
            model = WanDiT(cfg.model, rngs=nnx.Rngs(params=init_rng))
        _, params, stats = nnx.split(model, nnx.Param, ...)
        critic = _cast(params, cfg.critic_dtype) if uses_critic(cfg) else nnx.State({})
        ema = jax.tree.map(jnp.copy, params) if cfg.optim.ema_decay > 0 else nnx.State({})
        state = DistillState(step=jnp.zeros((), jnp.int32), student=params, student_opt=tx_s.init(params), ema=ema,
                             critic=critic, critic_opt=tx_c.init(critic), stats=stats, rng=train_rng)
        return _cast(params, cfg.teacher_dtype), state
    return init


def _opt_specs(tx: optax.GradientTransformation, opt_state, param_specs):
    """Optimiser moments sharded like their parameters, counters replicated."""
    unwrap = jax.tree.map(lambda v: v, param_specs, is_leaf=lambda x: isinstance(x, PartitionSpec))
    return optax.tree_map_params(tx, lambda _, spec: spec, opt_state, unwrap,
                                 transform_non_params=lambda _: PartitionSpec(),
                                 is_leaf=lambda x: isinstance(x, PartitionSpec))


def logical_specs(abstract: tuple[nnx.State, DistillState], tx_s, tx_c) -> tuple[nnx.State, DistillState]:
    teacher, st = abstract
    spec = nnx.get_partition_spec
    replicated = lambda tree: jax.tree.map(lambda _: PartitionSpec(), tree)
    student = spec(st.student)
    critic = spec(st.critic) if len(st.critic) else nnx.State({})
    return spec(teacher), DistillState(
        step=PartitionSpec(), student=student, student_opt=_opt_specs(tx_s, st.student_opt, student),
        ema=spec(st.ema) if len(st.ema) else nnx.State({}), critic=critic,
        critic_opt=_opt_specs(tx_c, st.critic_opt, critic), stats=replicated(st.stats), rng=PartitionSpec())


def state_shardings(cfg: DistillConfig, tx_s, tx_c, mesh: Mesh):
    """((abstract teacher, abstract state), (teacher shardings, state shardings)) — no allocation."""
    abstract = jax.eval_shape(_init_fn(cfg, tx_s, tx_c), jax.random.PRNGKey(cfg.seed))
    return abstract, sharding.named_shardings(logical_specs(abstract, tx_s, tx_c), mesh, cfg.mesh.rules)


def graphdef_of(model_cfg: WanDiTConfig) -> nnx.GraphDef:
    with nnx.use_eager_sharding(False):
        return nnx.split(nnx.eval_shape(lambda: WanDiT(model_cfg, rngs=nnx.Rngs(0))), nnx.Param, ...)[0]


def create(cfg: DistillConfig, tx_s, tx_c, mesh: Mesh) -> tuple[nnx.GraphDef, nnx.State, DistillState]:
    """Sharded init (each device builds only its shards): graphdef, teacher, state. Without
    `ckpt.init_from` all three models are the same seeded random DiT (tiny runs, tests)."""
    _, shardings = state_shardings(cfg, tx_s, tx_c, mesh)
    teacher, state = jax.jit(_init_fn(cfg, tx_s, tx_c), out_shardings=shardings)(jax.random.PRNGKey(cfg.seed))
    return graphdef_of(cfg.model), teacher, state


# --------------------------------------------------------------------------------------------------
# Starting weights
# --------------------------------------------------------------------------------------------------


def load_teacher(cfg: DistillConfig, teacher: nnx.State, state: DistillState, shardings
                 ) -> tuple[nnx.State, DistillState]:
    """Teacher = converted weights at `ckpt.init_from` (rynn_jax.converted_weights layout), restored
    straight into their shardings; student, EMA and critic start as copies of it. The shared control
    statistics come from the directory's control_stats.json (add-plus)."""
    from rynn_jax import converted_weights

    t_sh, s_sh = shardings
    pure = nnx.to_pure_dict(teacher)
    restored = converted_weights.restore_params(cfg.ckpt.init_from, jax.tree.map(lambda a: a, pure),
                                          shardings=nnx.to_pure_dict(t_sh))
    nnx.replace_by_pure_dict(teacher, jax.tree.map(lambda r, a: r.astype(a.dtype), restored, pure))
    saved = converted_weights.load_config(cfg.ckpt.init_from, WanDiTConfig)
    stats = control.load_stats_into(state.stats, cfg.ckpt.init_from, saved)
    return teacher, _start_from(dataclasses.replace(state, stats=stats), teacher, cfg, s_sh)


def _start_from(state: DistillState, weights: nnx.State, cfg: DistillConfig, shardings: DistillState,
                critic_too: bool = True) -> DistillState:
    def copy(dst: nnx.State, sh: nnx.State) -> nnx.State:
        # A fresh buffer per copy: the state is donated to the update, the teacher is not.
        return jax.tree.map(lambda w, d, s: jax.device_put(jnp.array(w, d.dtype, copy=True), s), weights, dst, sh)

    student = copy(state.student, shardings.student)
    ema = copy(state.ema, shardings.ema) if len(state.ema) else state.ema
    critic = copy(state.critic, shardings.critic) if critic_too and len(state.critic) else state.critic
    return dataclasses.replace(state, student=student, ema=ema, critic=critic)


def load_student(cfg: DistillConfig, state: DistillState, tx_s, tx_c, mesh: Mesh) -> DistillState:
    """Phase B's student (and its EMA) from the newest step of the phase-A run at `student_from`,
    or from exported student weights there (`rynn_jax.distill.export`: a later lease continues)."""
    from rynn_jax import converted_weights

    _, s_sh = state_shardings(cfg, tx_s, tx_c, mesh)[1]
    if converted_weights.is_converted_dir(cfg.student_from):
        pure = nnx.to_pure_dict(state.student)
        weights = converted_weights.restore_params(cfg.student_from, jax.tree.map(lambda a: a, pure),
                                             shardings=nnx.to_pure_dict(s_sh.student))
        student = jax.tree.map(lambda a: a, state.student)
        nnx.replace_by_pure_dict(student, weights)
        return _start_from(state, student, cfg, s_sh, critic_too=False)
    warm_cfg = dataclasses.replace(cfg, phase="warmup", optim=_warmup_like(cfg))
    tx_ws, tx_wc = make_optimizers(warm_cfg)
    (_, abstract), (_, shardings) = state_shardings(warm_cfg, tx_ws, tx_wc, mesh)
    target = jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)
    manager = ocp.CheckpointManager(os.path.abspath(cfg.student_from))
    step = manager.latest_step()
    if step is None:
        raise FileNotFoundError(f"student_from: no checkpoint steps in {cfg.student_from}")
    warm = manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target))).state
    manager.close()
    weights = warm.ema if cfg.student_from_ema and len(warm.ema) else warm.student
    return _start_from(state, weights, cfg, s_sh, critic_too=False)


def _warmup_like(cfg: DistillConfig):
    # Phase A's optimiser state has the same structure whatever its hyper-parameters (clip → AdamW);
    # only its EMA presence matters, which phase A always keeps in the recipes.
    return dataclasses.replace(cfg.optim, ema_decay=cfg.optim.ema_decay or 0.99)
