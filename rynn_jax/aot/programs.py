"""The programs to compile, built by the same functions the runs use, as abstract arguments.

  train     `training.step.jitted_step`: train.py's step, its state shardings and rules table
  distill   `distill.step.jitted_updates`: phase A's warm-up update, or phase B's generator and
            critic updates (two programs; the teacher stays resident across both)
  serve     the causal student's streaming step as `rynn_jax.step_export` writes it (layers unrolled),
            `sessions` sessions per replica, parameters in the compute dtype

Nothing is allocated: states come from `jax.eval_shape` of the real init, each leaf a
ShapeDtypeStruct carrying its NamedSharding on the target mesh.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rynn_jax import sharding
from rynn_jax.models.dit import WanDiT, WanDiTConfig, unrolled
from rynn_jax.models.dit4d import WanDiT4DConfig
from rynn_jax.training import metrics as metrics_lib

CLIP_THW = (21, 30, 52)  # 81 frames at 480×832 → 21 × 30 × 52 latents = 8190 tokens


@dataclasses.dataclass(frozen=True)
class Program:
    name: str
    fn: Callable  # a jax.jit, traced by .lower(*args) inside sharding.axis_rules(mesh, rules)
    args: tuple
    mesh: Mesh
    rules: tuple
    resident_bytes: int = 0  # per chip, held in HBM while this program runs but not among its arguments
    info: dict = dataclasses.field(default_factory=dict)  # batch, tokens, model FLOPs, ...


def abstract(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), tree, shardings)


def bytes_per_chip(tree: Any) -> int:
    """Bytes of one chip's shards of an abstract (sharded) tree."""
    return int(sum(math.prod(a.sharding.shard_shape(a.shape)) * np.dtype(a.dtype).itemsize
                   for a in jax.tree.leaves(tree)))


def _dit(model: WanDiTConfig | WanDiT4DConfig) -> WanDiTConfig:
    """The DiT config that sets the latent shapes (RynnWorld-4D: its branches' shared base)."""
    return model.base if isinstance(model, WanDiT4DConfig) else model


def clip_batch(model: WanDiTConfig | WanDiT4DConfig, batch: int, thw: tuple[int, int, int], mesh: Mesh,
               keys: tuple[str, ...] | None = None) -> dict:
    """The training batch the loss reads (`keys`, default `input.TRAIN_KEYS`; RynnWorld-4D's
    `input.train_keys` add the depth and flow latents) as abstract arrays, sharded as the steps
    shard it."""
    from rynn_jax.training import input as input_lib
    from rynn_jax.training import step as step_lib

    m = _dit(model)
    c_ctrl = m.control_channels if m.control != "none" else m.in_channels
    clip, first = (batch, *thw, m.in_channels), (batch, 1, *thw[1:], m.in_channels)
    shapes = {"video_latents": clip, "control_video_latents": (batch, *thw, c_ctrl), "img_latent": first,
              "depth_latents": clip, "depth_img_latent": first, "flow_latents": clip, "flow_img_latent": first,
              "text_embedding": (batch, m.text_len, m.text_dim)}
    keys = input_lib.TRAIN_KEYS if keys is None else keys
    assert set(keys) <= set(shapes), f"training batch keys changed: {sorted(set(keys) - set(shapes))}"
    shapes = {k: shapes[k] for k in keys}
    sh = step_lib.batch_shardings(mesh, shapes)
    return {k: jax.ShapeDtypeStruct(v, jnp.float32, sharding=sh[k]) for k, v in shapes.items()}


def _work(model: WanDiTConfig | WanDiT4DConfig, batch: int, thw: tuple[int, int, int], forwards: float) -> dict:
    pt, ph, pw = _dit(model).patch_size
    per_frame = (thw[1] // ph) * (thw[2] // pw)
    tokens = (thw[0] // pt) * per_frame
    return {"batch": batch, "latent_thw": list(thw), "tokens": batch * tokens,
            "model_flops": forwards * batch * tokens * metrics_lib.model_flops_per_token(model, tokens, per_frame)}


def train(cfg, mesh: Mesh, batch: int, thw: tuple[int, int, int]) -> list[Program]:
    from rynn_jax.training import optim
    from rynn_jax.training import state as state_lib
    from rynn_jax.training import step as step_lib

    from rynn_jax.training import input as input_lib

    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    abs_state, shardings = state_lib.state_shardings(cfg, tx, mesh)
    graphdef = state_lib.split_model(state_lib.abstract_model(cfg), cfg)[0]
    data = clip_batch(cfg.model, batch, thw, mesh, input_lib.train_keys(cfg))
    jitted = step_lib.jitted_step(cfg, graphdef, tx, mesh, shardings, data)
    return [Program("train", jitted, (abstract(abs_state, shardings), data), mesh, cfg.mesh.rules,
                    info=_work(cfg.model, batch, thw, 3.0))]


def distill(cfg, mesh: Mesh, batch: int, thw: tuple[int, int, int]) -> list[Program]:
    from rynn_jax.distill import state as state_lib
    from rynn_jax.distill import step as step_lib

    tx_s, tx_c = state_lib.make_optimizers(cfg)
    (abs_teacher, abs_state), (t_sh, s_sh) = state_lib.state_shardings(cfg, tx_s, tx_c, mesh)
    fns = step_lib.jitted_updates(cfg, state_lib.graphdef_of(cfg.model), tx_s, tx_c, mesh, (t_sh, s_sh),
                                  ("video_latents", "control_video_latents", "img_latent", "text_embedding"))
    state, teacher = abstract(abs_state, s_sh), abstract(abs_teacher, t_sh)
    data = clip_batch(cfg.model, batch, thw, mesh)
    work = {"batch": batch, "latent_thw": list(thw)}
    if len(fns) == 1:  # phase A, or phase B's regression objective: one program, no teacher
        (name, fn), = fns.items()
        return [Program(f"distill:{name}", fn, (state, data), mesh, cfg.mesh.rules, info=work)]
    # the teacher is not an argument of the critic update but stays in HBM between the two
    return [Program("distill:generator", fns["generator"], (state, teacher, data), mesh, cfg.mesh.rules, info=work),
            Program("distill:critic", fns["critic"], (state, data), mesh, cfg.mesh.rules,
                    resident_bytes=bytes_per_chip(teacher), info=work)]


def serve(model_cfg: WanDiTConfig, ccfg, scfg, mesh: Mesh, rules: tuple, sessions: int,
          latent_hw: tuple[int, int]) -> list[Program]:
    """The exported streaming step (`step_export.causal_step_signature`), parameters cast to the compute
    dtype and sharded by the rules table; state, control and key replicated over the mesh."""
    from rynn_jax import step_export

    with nnx.use_eager_sharding(False):  # the serving layout, traced: nothing is allocated
        model = nnx.eval_shape(lambda: unrolled(WanDiT(model_cfg, rngs=nnx.Rngs(0))))
    sig = step_export.causal_step_signature(model, ccfg, scfg, batch=sessions, latent_hw=latent_hw)
    dtype = jnp.dtype(model_cfg.dtype)
    leaves = [jax.ShapeDtypeStruct(x.shape, dtype if jnp.issubdtype(x.dtype, jnp.floating) else x.dtype,
                                   sharding=NamedSharding(mesh, sharding.resolve(tuple(spec), rules, mesh)))
              for x, spec in zip(sig.leaf_specs, sig.leaf_logical, strict=True)]
    replicated = NamedSharding(mesh, PartitionSpec())
    rest = [jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=replicated), x)
            for x in (sig.state, sig.control, sig.rng)]
    jitted = jax.jit(sig.step, donate_argnums=1)
    info = {"sessions": sessions, "latent_hw": list(latent_hw), "frames_per_block": ccfg.frames_per_block,
            "window_frames": ccfg.window_frames, "model_calls": scfg.num_steps + 1}  # + the clean pass
    return [Program("serve", jitted, (leaves, *rest), mesh, rules, info=info)]
