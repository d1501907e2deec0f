"""Behaviour cloning of the policy on robot-layout episodes (the synthetic world's shards).

    python -m rynn_jax.policy.train --config configs/policy_cnn_tiny.py            # CPU smoke run
    python -m rynn_jax.policy.train --config configs/policy_4d.py --set data.train_dirs="('data/sim/*/episode_*',)"

The project's training machinery, as the autoencoder trainer uses it: AdamW + clipping + EMA
(`training.optim`, here the released tri-stage schedule), `TrainState`, the orbax checkpointer
(the grain iterator's position included; a run resumes from its newest step) and the shared
`Loop` (finiteness checks, metrics, SIGINT/SIGTERM save). Frozen vision encoders (the 4D
backbone) are not in the train state: their parameters are passed to the step as an argument and
their features computed inside it under stop_gradient (fresh noise frames per step). At the end
the EMA weights (when kept) are exported as a policy directory (`inference.save`), which
`serve.py policy --policy DIR` evaluates.

Read top to bottom: Config → Input → State → Update → Loop → CLI.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import sys
from collections.abc import Sequence

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from rynn_jax import errors
from rynn_jax.policy import data as data_lib
from rynn_jax.policy import encoders, inference
from rynn_jax.policy.config import PolicyConfig
from rynn_jax.policy.model import init_policy
from rynn_jax.policy.normalize import ActionNormalizer
from rynn_jax.training import checkpointing, optim
from rynn_jax.training import config as config_lib
from rynn_jax.training import loop as loop_lib
from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training.autoencoder import episode_dirs
from rynn_jax.training.config import CheckpointConfig, LogConfig, OptimConfig
from rynn_jax.training.state import TrainState
from rynn_jax.training.step import apply_gradients

log = logging.getLogger("rynn_jax.training")

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyDataConfig:
    train_dirs: tuple[str, ...] = ()  # episode directories or globs ("data/sim/*/episode_*")
    action_stats: str = ""  # action_stats.json (or its directory); "" = the first glob's dataset root
    text_embeddings: str = ""  # umT5 goal embeddings directory; "" = hashed per-task embeddings
    batch_size: int = 64
    seed: int = 0  # shuffle order
    cache_episodes: int = 64  # episodes whose decoded frames are kept in memory


@dataclasses.dataclass(frozen=True, kw_only=True)
class PolicyTrainConfig:
    policy: PolicyConfig = dataclasses.field(default_factory=PolicyConfig.full)
    data: PolicyDataConfig = dataclasses.field(default_factory=PolicyDataConfig)
    # SPEC: AdamW 1e-4, β (0.9, 0.9), wd 0.05, clip 1.0, EMA 0.9999, 2 % warm-up / 8 % hold / decay to 1e-6×
    optim: OptimConfig = dataclasses.field(default_factory=lambda: OptimConfig(
        lr=1e-4, b2=0.9, weight_decay=0.05, grad_clip=1.0, ema_decay=0.9999, ema_warmup=True, schedule="tri_stage",
        warmup_steps=2000, hold_steps=8000, end_lr_factor=1e-6))
    ckpt: CheckpointConfig = dataclasses.field(default_factory=CheckpointConfig)
    log: LogConfig = dataclasses.field(default_factory=LogConfig)
    total_steps: int = 100_000
    color_jitter: float = 0.2  # brightness / contrast / saturation factors in [1 − j, 1 + j] per sample
    seed: int = 0  # noise, flow times, dropout (fold_in(rng, step)); parameter init is policy.seed
    export_dir: str = ""  # after training: the policy directory ("" = none)
    debug_kill_at_step: int = 0  # fault injection for tests (0 = never)

    def __post_init__(self):
        if self.data.batch_size < 1 or self.total_steps < 1:
            raise ValueError("data.batch_size and total_steps must be ≥ 1")
        if not 0 <= self.color_jitter < 1:
            raise ValueError(f"color_jitter must be in [0, 1), got {self.color_jitter}")


# --------------------------------------------------------------------------------------------------
# Input
# --------------------------------------------------------------------------------------------------


def stats_path(cfg: PolicyDataConfig, dirs: Sequence[str]) -> str:
    """The action statistics file: data.action_stats, else `action_stats.json` in the nearest
    ancestor of the first episode directory that has one (the dataset root)."""
    if cfg.action_stats:
        return cfg.action_stats
    d = os.path.dirname(os.path.abspath(dirs[0]))
    while True:
        if os.path.isfile(os.path.join(d, "action_stats.json")):
            return os.path.join(d, "action_stats.json")
        if os.path.dirname(d) == d:
            raise FileNotFoundError(f"no action_stats.json above {dirs[0]}: set data.action_stats")
        d = os.path.dirname(d)


def make_input(cfg: PolicyTrainConfig) -> tuple:
    dirs = episode_dirs(cfg.data.train_dirs, "data.train_dirs")
    normalizer = ActionNormalizer.from_file(stats_path(cfg.data, dirs))
    p = cfg.policy
    cache = data_lib.EpisodeCache(cfg.data.cache_episodes, size=p.image_size, chunk=p.head.chunk,
                                  goal_len=p.head.goal_len, goal_dim=p.head.goal_dim, text_dir=cfg.data.text_embeddings)
    items = data_lib.samples(dirs)
    log.info("%d episodes, %d samples", len(dirs), len(items))
    it = data_lib.make_iterator(items, data_lib.LoadSample(cache, normalizer), cfg.data.batch_size, cfg.data.seed)
    return it, normalizer


# --------------------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------------------


def init_state(cfg: PolicyTrainConfig, tx: optax.GradientTransformation) -> tuple[nnx.GraphDef, TrainState]:
    graphdef, params = nnx.split(init_policy(cfg.policy), nnx.Param)
    ema = jax.tree.map(jnp.copy, params) if cfg.optim.ema_decay > 0 else nnx.State({})
    return graphdef, TrainState(step=jnp.zeros((), jnp.int32), params=params, frozen=nnx.State({}),
                                stats=nnx.State({}), opt_state=tx.init(params), ema=ema,
                                rng=jax.random.PRNGKey(cfg.seed))


# --------------------------------------------------------------------------------------------------
# Update
# --------------------------------------------------------------------------------------------------


def color_jitter(rgb_bhw3: jax.Array, strength: float, rng: jax.Array) -> jax.Array:
    """Per-sample brightness, contrast and saturation factors U(1 − s, 1 + s) on uint8 RGB."""
    if strength == 0:
        return rgb_bhw3
    f = jax.random.uniform(rng, (3, rgb_bhw3.shape[0], 1, 1, 1), minval=1 - strength, maxval=1 + strength)
    x = rgb_bhw3.astype(jnp.float32) * f[0]
    grey = x.mean(-1, keepdims=True)
    x = (x - grey.mean((1, 2), keepdims=True)) * f[1] + grey.mean((1, 2), keepdims=True)
    grey = x.mean(-1, keepdims=True)
    x = (x - grey) * f[2] + grey
    return jnp.clip(jnp.round(x), 0, 255).astype(jnp.uint8)


def make_step(cfg: PolicyTrainConfig, graphdef: nnx.GraphDef, encoder: encoders.VisionEncoder,
              tx: optax.GradientTransformation):
    """(TrainState, encoder params, batch) → (TrainState, metrics), pure; jit with the state donated."""
    schedule_lr = optim.lr_schedule(cfg.optim, cfg.total_steps)

    def step(state: TrainState, enc_params, batch: dict[str, jax.Array]):
        rng = jax.random.fold_in(state.rng, state.step)
        k_jit, k_feat, k_loss = jax.random.split(rng, 3)
        rgb = color_jitter(batch["rgb"], cfg.color_jitter, k_jit)
        vision = jax.lax.stop_gradient(encoder.apply(enc_params, rgb, batch["depth_rgb"], batch["goal"], k_feat))

        def loss_fn(params):
            return inference.chunk_loss(nnx.merge(graphdef, params), vision, batch["goal"], batch["state"],
                                        batch["actions"], k_loss)

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return apply_gradients(state, grads, loss, tx, cfg.optim, schedule_lr)

    return step


def final_params(state: TrainState) -> nnx.State:
    return state.ema if jax.tree.leaves(state.ema) else state.params


# --------------------------------------------------------------------------------------------------
# Loop
# --------------------------------------------------------------------------------------------------


def train(cfg: PolicyTrainConfig) -> list[float]:
    """Runs (or resumes) `cfg`, exports when cfg.export_dir is set; returns this call's losses."""
    data_iter, normalizer = make_input(cfg)
    encoder = encoders.make_encoder(cfg.policy)
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    graphdef, state = init_state(cfg, tx)
    log.info("policy (%s): %d trainable parameters", cfg.policy.encoder,
             sum(x.size for x in jax.tree.leaves(state.params)))
    ckpt = checkpointing.Checkpointer(cfg.ckpt) if cfg.ckpt.dir else None
    if ckpt is not None:
        state = ckpt.resume(state, data_iter)
    train_step = jax.jit(make_step(cfg, graphdef, encoder, tx), donate_argnums=0)
    losses: list[float] = []

    def on_metrics(step: int, m: dict[str, float]) -> None:
        losses.append(m["loss"])
        if step % cfg.log.every == 0:
            loop.writer.scalars(step, {f"train/{k}": v for k, v in m.items()})

    loop = loop_lib.Loop(start=int(state.step), total_steps=cfg.total_steps, log=cfg.log, ckpt_cfg=cfg.ckpt,
                         ckpt=ckpt, data_iter=data_iter, on_metrics=on_metrics,
                         debug_kill_at_step=cfg.debug_kill_at_step)
    for s in loop.steps():
        batch = jax.device_put(next(data_iter))
        state, m = train_step(state, encoder.params, batch)
        loop.dispatched(s, m)
        loop.end_step(s, state)
    loop.close()
    if cfg.export_dir:
        inference.save(cfg.export_dir, cfg.policy, final_params(state), normalizer)
        log.info("exported the policy to %s", cfg.export_dir)
    return losses


# --------------------------------------------------------------------------------------------------
# CLI
# --------------------------------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> list[float]:
    p = errors.ArgumentParser(prog="python -m rynn_jax.policy.train", description=__doc__)
    p.add_argument("--config", required=True, help="recipe file (configs/policy_*.py)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override (repeatable)")
    a = p.parse_args(argv)
    metrics_lib.setup_logging()
    cfg = config_lib.apply_overrides(config_lib.load_config(a.config, (PolicyTrainConfig,)), a.set)
    cfg = config_lib.with_run_dir(cfg, a.config)
    try:
        episode_dirs(cfg.data.train_dirs, "data.train_dirs")
    except (FileNotFoundError, ValueError) as e:
        raise errors.UsageError(f"--config {a.config}: {e}", fix="--set data.train_dirs=\"('data/sim/*/episode_*',)\"") from None
    if not cfg.export_dir:
        cfg = dataclasses.replace(cfg, export_dir=os.path.join(os.path.dirname(cfg.ckpt.dir or cfg.log.dir), "export"))
    log.info("config: %s", json.dumps(config_lib.to_dict(cfg)))
    return train(cfg)


if __name__ == "__main__":
    from rynn_jax.policy import train as this  # the recipe's PolicyTrainConfig is this module's class

    sys.exit(errors.run(this.main))
