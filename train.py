"""Train RynnWorld-Teleop (Wan2.2-TI2V-5B + action control) with flow matching.

    python train.py --config configs/tiny.py                       # CPU smoke run → runs/tiny-<time>/
    python train.py --config configs/stage1_lora.py --set optim.lr=1e-5 --set ckpt.dir=/ckpt/s1
    python train.py --config configs/synthetic_ae.py               # our own VAE (rynn_jax/training/autoencoder.py)
    python train.py --config configs/synthetic_decoder.py:tae      # a decoder of its latents (training/decoder.py)

A run with existing checkpoint steps in ckpt.dir resumes from the newest one. Ctrl-C (or SIGTERM)
finishes the current step, saves it and exits 0 ("saved step N"), printing how to resume.

Read top to bottom: Config → Mesh → Input → Model & state → Checkpoint → Update → Loop. The
pieces live in rynn_jax/training (config, loss, lora, optim, state, step, checkpointing, metrics,
samples, loop) and rynn_jax/sharding.py (mesh + the one logical-axis rules table).
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

import jax

from rynn_jax import data as data_lib
from rynn_jax import errors, sharding
from rynn_jax.training import autoencoder, checkpointing, decoder, optim, preflight
from rynn_jax.training import config as config_lib
from rynn_jax.training import input as input_lib
from rynn_jax.training import loop as loop_lib
from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training import samples as samples_lib
from rynn_jax.training import state as state_lib
from rynn_jax.training import step as step_lib
from rynn_jax.training.state import TrainState

Hook = Callable[[int, TrainState], None]  # e.g. render sample videos every log.sample_every steps


def train(cfg: config_lib.TrainConfig, hooks: Sequence[Hook] = ()) -> list[float]:
    """Runs (or resumes) `cfg`; returns the losses of the steps this call ran."""
    preflight.check(cfg)  # files, weights' architecture, output dirs: before anything is built

    # ----------------------------------------------------------------------------------------------
    # Mesh
    # ----------------------------------------------------------------------------------------------
    sharding.initialize_distributed(cfg.distributed)
    mesh = sharding.make_mesh(cfg.mesh)
    logging.info("mesh %s on %d devices (%s)", dict(mesh.shape), mesh.size, jax.devices()[0].platform)

    # ----------------------------------------------------------------------------------------------
    # Input
    # ----------------------------------------------------------------------------------------------
    data_iter = input_lib.make_iterator(cfg)
    batch_spec = dict.fromkeys(input_lib.train_keys(cfg))

    # ----------------------------------------------------------------------------------------------
    # Model & state: sharded init (each device builds its shards), then the startup sharding check
    # ----------------------------------------------------------------------------------------------
    tx = optim.make_optimizer(cfg.optim, cfg.total_steps)
    abstract, shardings = state_lib.state_shardings(cfg, tx, mesh)
    graphdef, state = state_lib.create_train_state(cfg, tx, mesh)
    sharding.check_sharded(state.params, cfg.min_sharded_size)
    sharding.check_sharded(state.frozen, cfg.min_sharded_size)

    # ----------------------------------------------------------------------------------------------
    # Checkpoint: resume from the newest readable step, else start from converted base weights
    # ----------------------------------------------------------------------------------------------
    ckpt = checkpointing.Checkpointer(cfg.ckpt) if cfg.ckpt.dir else None
    restored = None
    if ckpt is not None:
        target = checkpointing.abstract_with_shardings(abstract, shardings)
        restored = ckpt.restore_latest(target, data_iter)
    if restored is not None:
        state = restored
        logging.info("resumed from step %d", int(state.step))
    elif cfg.ckpt.init_from:
        state = state_lib.load_base_weights(state, cfg.ckpt.init_from, shardings)

    # ----------------------------------------------------------------------------------------------
    # Update
    # ----------------------------------------------------------------------------------------------
    train_step = step_lib.jit_step(cfg, graphdef, tx, mesh, shardings, batch_spec)
    if cfg.log.sample_every and cfg.log.sample_vae:  # skeleton | generated | truth MP4s in log.dir
        hooks = [*hooks, samples_lib.make_sample_hook(
            cfg, graphdef, samples_lib.load_sample_vae(cfg.log.sample_vae, cfg.model.in_channels),
            next(input_lib.make_iterator(cfg)), os.path.join(cfg.log.dir or ".", "samples"), cfg.log.sample_steps)]
    to_device = lambda b: data_lib.to_device(b, data_lib.batch_sharding(mesh))

    # ----------------------------------------------------------------------------------------------
    # Loop: dispatch step s, then read step s−1's metrics (keeps the device busy); `Loop` checks
    # finiteness before every log line and every checkpoint, so a poisoned state is never saved.
    # ----------------------------------------------------------------------------------------------
    losses: list[float] = []
    peak_flops = cfg.log.peak_tflops_per_device * 1e12 * jax.device_count()
    work: tuple[int, float] | None = None  # (tokens, model FLOPs) per step, from the first batch
    throughput: metrics_lib.Throughput | None = None

    def on_metrics(step: int, m: dict[str, float]) -> None:
        nonlocal throughput
        losses.append(m["loss"])
        if throughput is None:  # timing starts once the first step (and its compile) is done
            throughput = metrics_lib.Throughput(*work, peak_flops)
        else:
            throughput.tick()
            if step % cfg.log.every == 0:
                perf = throughput.read()
                loop.bar.set_postfix(loss=f"{m['loss']:.4f}", steps_per_s=f"{perf['perf/steps_per_s']:.2f}")
                loop.writer.scalars(step, {f"train/{k}": v for k, v in m.items()} | perf)

    loop = loop_lib.Loop(start=int(state.step), total_steps=cfg.total_steps, log=cfg.log, ckpt_cfg=cfg.ckpt,
                         ckpt=ckpt, data_iter=data_iter, on_metrics=on_metrics, hooks=hooks,
                         debug_kill_at_step=cfg.debug_kill_at_step, debug_kill_signal=cfg.debug_kill_signal)
    for s in loop.steps():
        batch = to_device(next(data_iter))
        work = work or _work_per_step(cfg, batch)
        state, m = train_step(state, batch)
        loop.dispatched(s, m)
        loop.end_step(s, state)
    loop.close()
    return losses


def _work_per_step(cfg: config_lib.TrainConfig, batch: dict) -> tuple[int, float]:
    """(video tokens, model FLOPs) of one training step (forward + backward ≈ 3 × forward)."""
    b, t, h, w, _ = batch["video_latents"].shape
    pt, ph, pw = cfg.model.patch_size
    tokens = (t // pt) * (h // ph) * (w // pw)
    flops = metrics_lib.model_flops_per_token(cfg.model, tokens, (h // ph) * (w // pw))
    return b * tokens, 3.0 * b * tokens * flops


def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = errors.ArgumentParser(prog="python train.py", description=__doc__)
    parser.add_argument("--config", required=True, help="recipe file under configs/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set optim.lr=1e-5 (repeatable)")
    args = parser.parse_args(argv)
    metrics_lib.setup_logging()
    recipe = config_lib.load_config(args.config, (config_lib.TrainConfig, autoencoder.AutoencoderTrainConfig,
                                                  decoder.DecoderTrainConfig))
    cfg = config_lib.apply_overrides(recipe, args.set)
    cfg = config_lib.with_run_dir(cfg, args.config)
    logging.info("run: checkpoints in %s, metrics in %s", cfg.ckpt.dir or "(none)", cfg.log.dir or "(none)")
    logging.info("config: %s", json.dumps(config_lib.to_dict(cfg)))
    if isinstance(cfg, autoencoder.AutoencoderTrainConfig):
        return autoencoder.train(cfg)
    if isinstance(cfg, decoder.DecoderTrainConfig):
        return decoder.train(cfg)
    return train(cfg)


if __name__ == "__main__":
    sys.exit(errors.run(main))
