"""The train state and its sharded creation.

The model is split once into a static graphdef and three states: `params` (what the optimizer
trains, float32 master weights), `frozen` (base weights under LoRA; empty for SFT) and `stats`
(ControlStats running statistics). Everything that a resumed run needs is in `TrainState`, a pure
pytree the jitted step takes and returns.

Creation is sharded from the start: `jax.eval_shape` gives shapes and logical axis names, the rules
table turns them into shardings, and `jax.jit(init, out_shardings=...)` makes every device build
only its own shard — the 5B model never exists whole on one host.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rynn_jax import sharding
from rynn_jax.models.dit import WanDiT, WanDiTConfig
from rynn_jax.models.dit4d import WanDiT4D, WanDiT4DConfig
from rynn_jax.training import lora
from rynn_jax.training.config import TrainConfig, World4DLossConfig
from rynn_jax.weights import flatten_params, unflatten_params


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer steps taken
    params: nnx.State  # trained parameters, float32
    frozen: nnx.State  # parameters not trained (LoRA's base); empty under SFT
    stats: nnx.State  # non-parameter model state (ControlStats)
    opt_state: optax.OptState
    ema: nnx.State  # EMA of `params` (empty when optim.ema_decay == 0)
    rng: jax.Array  # base key (uint32[2]); step key = fold_in(rng, step)


def build_model(model_cfg: WanDiTConfig | WanDiT4DConfig, lora_cfg: lora.LoraConfig, rngs: nnx.Rngs
                ) -> WanDiT | WanDiT4D:
    if isinstance(model_cfg, WanDiT4DConfig):
        if lora_cfg.rank > 0:
            raise ValueError("RynnWorld-4D trains without LoRA: set lora.rank=0")
        return WanDiT4D(model_cfg, rngs=rngs)
    return lora.apply_lora(WanDiT(model_cfg, rngs=rngs), lora_cfg, rngs)


def trainable(cfg: TrainConfig) -> nnx.filterlib.Filter:
    """What the optimizer updates: LoRA's choice, or for RynnWorld-4D its stage's (loss.train)."""
    if isinstance(cfg.loss, World4DLossConfig) and cfg.loss.train != "all":
        joint = nnx.All(nnx.Param, nnx.PathContains("joint"))
        return joint if cfg.loss.train == "joint" else nnx.All(nnx.Param, nnx.Not(joint))
    return lora.trainable_filter(cfg.lora)


def split_model(model: WanDiT | WanDiT4D, cfg: TrainConfig) -> tuple[nnx.GraphDef, nnx.State, nnx.State, nnx.State]:
    """graphdef, trained params, frozen params, other state."""
    return nnx.split(model, trainable(cfg), nnx.Param, ...)


def abstract_model(cfg: TrainConfig) -> WanDiT | WanDiT4D:
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: build_model(cfg.model, cfg.lora, nnx.Rngs(0)))


def _init_fn(cfg: TrainConfig, tx: optax.GradientTransformation):
    def init(rng: jax.Array) -> TrainState:
        init_rng, train_rng = jax.random.split(rng)
        with nnx.use_eager_sharding(False):
            model = build_model(cfg.model, cfg.lora, nnx.Rngs(params=init_rng))
        _, params, frozen, stats = split_model(model, cfg)
        frozen = jax.tree.map(lambda x: x.astype(cfg.frozen_dtype), frozen)
        ema = jax.tree.map(jnp.copy, params) if cfg.optim.ema_decay > 0 else nnx.State({})
        return TrainState(step=jnp.zeros((), jnp.int32), params=params, frozen=frozen, stats=stats,
                          opt_state=tx.init(params), ema=ema, rng=train_rng)
    return init


def logical_specs(abstract: TrainState, tx: optax.GradientTransformation) -> TrainState:
    """A TrainState of logical PartitionSpecs: params by their axis names, optimizer moments like
    their params, scalars and running stats replicated."""
    def specs(state: nnx.State) -> nnx.State:
        return nnx.get_partition_spec(state)

    param_specs = specs(abstract.params)
    unwrap = lambda tree: jax.tree.map(lambda v: v, tree, is_leaf=lambda x: isinstance(x, PartitionSpec))
    # multi_transform (optim.joint_out_lr) keeps each group's moments as the params with the other
    # group's entries masked out (MaskedNode, no leaves): those stay masked
    masked = optax.transforms.MaskedNode
    opt_specs = optax.tree_map_params(
        tx, lambda v, spec: v if isinstance(v, masked) else spec, abstract.opt_state, unwrap(param_specs),
        transform_non_params=lambda _: PartitionSpec(), is_leaf=lambda x: isinstance(x, PartitionSpec | masked))
    replicated = lambda tree: jax.tree.map(lambda _: PartitionSpec(), tree)
    return TrainState(step=PartitionSpec(), params=param_specs, frozen=specs(abstract.frozen),
                      stats=replicated(abstract.stats), opt_state=opt_specs,
                      ema=specs(abstract.ema) if len(abstract.ema) else nnx.State({}), rng=PartitionSpec())


def state_shardings(cfg: TrainConfig, tx: optax.GradientTransformation, mesh: Mesh) -> tuple[TrainState, TrainState]:
    """(abstract state, NamedSharding tree) — no allocation."""
    abstract = jax.eval_shape(_init_fn(cfg, tx), jax.random.PRNGKey(cfg.seed))
    return abstract, sharding.named_shardings(logical_specs(abstract, tx), mesh, cfg.mesh.rules)


def create_train_state(cfg: TrainConfig, tx: optax.GradientTransformation, mesh: Mesh
                       ) -> tuple[nnx.GraphDef, TrainState]:
    """Sharded init: each device materialises only its shards."""
    graphdef = split_model(abstract_model(cfg), cfg)[0]
    _, shardings = state_shardings(cfg, tx, mesh)
    init = jax.jit(_init_fn(cfg, tx), out_shardings=shardings)
    return graphdef, init(jax.random.PRNGKey(cfg.seed))


def load_base_weights(state: TrainState, path: str, shardings: TrainState) -> TrainState:
    """Overwrite the base-model parameters (in `params` and `frozen`) with converted weights at
    `path` (rynn_jax.converted_weights layout: a plain WanDiT), restored straight into their shardings.
    LoRA keeps base paths, so they match; adapters and a control branch the checkpoint lacks keep
    their init. The EMA restarts from the loaded params; an add-plus model's running statistics
    come from its control_stats.json when it has one.

    RynnWorld-4D: a Wan DiT becomes the base (RGB branch) and is cloned into depth and flow (the
    paper's init); its control branch, if any, is left out unless the 4D model has one (then it and
    its statistics are the base's). A 4D model's own export (the previous stage) loads path by path;
    joint-attention parameters it lacks (stage 1 has none) keep their init."""
    from rynn_jax import converted_weights  # orbax, only when used
    from rynn_jax.models import control
    from rynn_jax.models.dit import abstract_dit

    have = {**_flat(nnx.to_pure_dict(state.params)), **_flat(nnx.to_pure_dict(state.frozen))}
    have_sh = {**_flat(nnx.to_pure_dict(shardings.params)), **_flat(nnx.to_pure_dict(shardings.frozen))}
    world4d = any(k[0] == "base" for k in have)  # RynnWorld-4D: the Wan DiT is its base (RGB branch)
    if world4d and converted_weights.saved_class(path) == WanDiT4DConfig.__name__:
        return _load_4d_export(state, path, have, have_sh)
    ckpt_cfg = converted_weights.load_config(path, WanDiTConfig)
    want = _flat(nnx.to_pure_dict(nnx.state(abstract_dit(ckpt_cfg), nnx.Param)))
    # restored (replicated), then left out: a control branch the 4D model does not have
    dropped = {k for k in want if world4d and k[0] == "control" and ("base",) + k not in have}
    at = (lambda k: ("base",) + k) if world4d else (lambda k: k)  # noqa: E731
    bad = sorted(".".join(map(str, k)) for k in want
                 if k not in dropped and (at(k) not in have or have[at(k)].shape != want[k].shape))
    if bad:
        raise ValueError(f"{path}: parameters missing from or shaped unlike this model: {bad[:5]}")
    replicated = NamedSharding(next(iter(have_sh.values())).mesh, PartitionSpec())
    restored = _flat(converted_weights.restore_params(path, unflatten_params(want), shardings=unflatten_params(
        {k: replicated if k in dropped else have_sh[at(k)] for k in want})))
    if world4d:  # the paper's init: depth and flow start as copies of RGB
        from rynn_jax.models.dit4d_weights import clone_rgb
        kept = unflatten_params({k: v for k, v in restored.items() if k not in dropped})
        restored = _flat(clone_rgb(unflatten_params(have), kept))
        # own buffers for the copies: the train step donates the state, and one buffer twice fails
        restored = {k: jnp.copy(v) if k[0] in ("depth", "flow") else v for k, v in restored.items()}

    state = _filled(state, restored)
    return dataclasses.replace(state, stats=control.load_stats_into(state.stats, path, ckpt_cfg))


def _load_4d_export(state: TrainState, path: str, have: dict, have_sh: dict) -> TrainState:
    from rynn_jax import converted_weights
    from rynn_jax.models import control
    from rynn_jax.models.dit4d import abstract_dit4d

    saved = converted_weights.load_config(path, WanDiT4DConfig)
    want = _flat(nnx.to_pure_dict(nnx.state(abstract_dit4d(saved), nnx.Param)))
    bad = sorted(".".join(map(str, k)) for k in want if k not in have or have[k].shape != want[k].shape)
    if bad:
        raise ValueError(f"{path}: parameters missing from or shaped unlike this model: {bad[:5]}")
    restored = _flat(converted_weights.restore_params(path, unflatten_params(want),
                                                      shardings=unflatten_params({k: have_sh[k] for k in want})))
    state = _filled(state, restored)
    return dataclasses.replace(state, stats=control.load_stats_into(state.stats, path, saved.base))


def _filled(state: TrainState, restored: dict) -> TrainState:
    """`state` with the `restored` params (flat) in place, the EMA restarted from them."""
    def fill(tree: nnx.State) -> nnx.State:
        flat = _flat(nnx.to_pure_dict(tree))
        flat.update({k: restored[k].astype(v.dtype) for k, v in flat.items() if k in restored})
        nnx.replace_by_pure_dict(tree, unflatten_params(flat))
        return tree

    params, frozen = fill(state.params), fill(state.frozen)
    ema = jax.tree.map(jnp.copy, params) if len(state.ema) else state.ema
    return dataclasses.replace(state, params=params, frozen=frozen, ema=ema)


def _flat(tree: dict) -> dict[tuple, Any]:
    return flatten_params(tree, str_keys=False)  # keys as NNX wrote them, for replace_by_pure_dict
