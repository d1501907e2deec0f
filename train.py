"""Train RynnWorld-Teleop (Wan2.2-TI2V-5B + action control) with flow matching.

    python train.py --config configs/tiny.py                       # CPU smoke run, synthetic data
    python train.py --config configs/stage1_lora.py --set optim.lr=1e-5 --set ckpt.dir=/ckpt/s1

Read top to bottom: Config → Mesh → Input → Model & state → Checkpoint → Update → Loop. The
pieces live in rynn_jax/training (config, loss, lora, optim, state, step, checkpointing, metrics)
and rynn_jax/sharding.py (mesh + the one logical-axis rules table).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence

import jax
from tqdm import tqdm

from rynn_jax import data as data_lib
from rynn_jax import sharding
from rynn_jax.training import checkpointing, optim
from rynn_jax.training import config as config_lib
from rynn_jax.training import input as input_lib
from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training import samples as samples_lib
from rynn_jax.training import state as state_lib
from rynn_jax.training import step as step_lib
from rynn_jax.training.state import TrainState

Hook = Callable[[int, TrainState], None]  # e.g. render sample videos every log.sample_every steps


def train(cfg: config_lib.TrainConfig, hooks: Sequence[Hook] = ()) -> list[float]:
    """Runs (or resumes) `cfg`; returns the losses of the steps this call ran."""
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
    batch_spec = dict.fromkeys(input_lib.TRAIN_KEYS)

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
        logging.info("resumed at step %d", int(state.step))
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
    # Loop: dispatch step s, then read step s−1's metrics (keeps the device busy); check finiteness
    # before every log line and every checkpoint, so a poisoned state is never saved.
    # ----------------------------------------------------------------------------------------------
    writer = metrics_lib.MetricWriter(cfg.log.dir)
    start = int(state.step)
    losses: list[float] = []
    bar = tqdm(total=cfg.total_steps, initial=start, disable=not cfg.log.progress or jax.process_index() != 0)
    peak_flops = cfg.log.peak_tflops_per_device * 1e12 * jax.device_count()
    work: tuple[int, float] | None = None  # (tokens, model FLOPs) per step, from the first batch
    throughput: metrics_lib.Throughput | None = None
    pending: tuple[int, dict] | None = None

    def report(step: int, m: dict) -> None:
        nonlocal throughput
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        if not m.pop("finite"):
            raise FloatingPointError(f"step {step}: loss {m['loss']} / grad norm {m['grad_norm']} not finite "
                                     f"(state left at step {step - 1}'s values)")
        losses.append(m["loss"])
        writer.step(step, m)
        bar.set_postfix(loss=f"{m['loss']:.4f}", refresh=False)
        bar.update(1)
        if throughput is None:  # timing starts once the first step (and its compile) is done
            throughput = metrics_lib.Throughput(*work, peak_flops)
        else:
            throughput.tick()
            if step % cfg.log.every == 0:
                perf = throughput.read()
                bar.set_postfix(loss=f"{m['loss']:.4f}", steps_per_s=f"{perf['perf/steps_per_s']:.2f}")
                writer.scalars(step, {f"train/{k}": v for k, v in m.items()} | perf)

    for s in range(start + 1, cfg.total_steps + 1):
        batch = to_device(next(data_iter))
        work = work or _work_per_step(cfg, batch)
        state, m = train_step(state, batch)
        if pending is not None:
            report(*pending)
        pending = (s, m)
        if s == cfg.debug_kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if ckpt is not None and (s % cfg.ckpt.every == 0 or s == cfg.total_steps):
            report(*pending)
            pending = None
            ckpt.save(s, state, data_iter)
        if cfg.log.sample_every and s % cfg.log.sample_every == 0:
            for hook in hooks:
                hook(s, state)
    if pending is not None:
        report(*pending)
    bar.close()
    if ckpt is not None:
        ckpt.wait()
        ckpt.close()
    writer.close()
    return losses


def _work_per_step(cfg: config_lib.TrainConfig, batch: dict) -> tuple[int, float]:
    """(video tokens, model FLOPs) of one training step (forward + backward ≈ 3 × forward)."""
    b, t, h, w, _ = batch["video_latents"].shape
    pt, ph, pw = cfg.model.patch_size
    tokens = (t // pt) * (h // ph) * (w // pw)
    return b * tokens, 3.0 * b * tokens * metrics_lib.model_flops_per_token(cfg.model, tokens)


def main(argv: Sequence[str] | None = None) -> list[float]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="recipe file under configs/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set optim.lr=1e-5 (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = config_lib.apply_overrides(config_lib.load_config(args.config), args.set)
    logging.info("config: %s", json.dumps(config_lib.to_dict(cfg)))
    return train(cfg)


if __name__ == "__main__":
    main()
