"""Distil the bidirectional RynnWorld-Teleop model into the 4-step causal streaming student.

    python distill.py --config configs/distill_tiny.py                                  # phase A, CPU
    python distill.py --config configs/distill_tiny.py --set phase=dmd --set student_from=/tmp/a/ckpt
    python distill.py --config configs/distill_5b.py --set phase=dmd --set student_from=runs/distill_a/ckpt

Phase A (warmup): causal flow matching with block-wise teacher forcing. Phase B (dmd): the student
rolls out block by block through its KV cache and is trained with DMD against the frozen teacher
(real score) and a critic (fake score) trained by flow matching on its samples. Read top to
bottom: Config → Mesh → Input → Models & state → Checkpoint → Update → Loop. The pieces live in
rynn_jax/distill (config, warmup, rollout, dmd, state, step, evaluate) and rynn_jax/training.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
from collections.abc import Callable, Sequence

import jax
import numpy as np
from tqdm import tqdm

from rynn_jax import data as data_lib
from rynn_jax import sharding
from rynn_jax.distill import config as config_lib
from rynn_jax.distill import evaluate
from rynn_jax.distill import state as state_lib
from rynn_jax.distill import step as step_lib
from rynn_jax.distill.state import DistillState
from rynn_jax.training import checkpointing
from rynn_jax.training import input as input_lib
from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training.config import TrainConfig, apply_overrides, to_dict

Hook = Callable[[int, DistillState], None]  # e.g. decode and write sample videos


def distill(cfg: config_lib.DistillConfig, hooks: Sequence[Hook] = ()) -> list[dict[str, float]]:
    """Runs (or resumes) `cfg`; returns the metrics of the steps this call ran."""
    # ----------------------------------------------------------------------------------------------
    # Mesh: teacher, student and critic all live on it, sharded by the same rules table
    # ----------------------------------------------------------------------------------------------
    sharding.initialize_distributed(cfg.distributed)
    mesh = sharding.make_mesh(cfg.mesh)
    logging.info("phase %s, mesh %s on %d devices", cfg.phase, dict(mesh.shape), mesh.size)

    # ----------------------------------------------------------------------------------------------
    # Input: the training pipeline's batches (phase B uses the reference latent, text and control)
    # ----------------------------------------------------------------------------------------------
    data_iter = input_lib.make_iterator(TrainConfig(model=cfg.model, data=cfg.data))
    to_device = lambda b: data_lib.to_device(b, data_lib.batch_sharding(mesh))

    # ----------------------------------------------------------------------------------------------
    # Models & state: sharded init, startup sharding check
    # ----------------------------------------------------------------------------------------------
    tx_s, tx_c = state_lib.make_optimizers(cfg)
    (_, abstract), shardings = state_lib.state_shardings(cfg, tx_s, tx_c, mesh)
    graphdef, teacher, state = state_lib.create(cfg, tx_s, tx_c, mesh)
    for tree in (teacher, state.student, state.critic):
        sharding.check_sharded(tree, cfg.min_sharded_size)

    # ----------------------------------------------------------------------------------------------
    # Checkpoint: the teacher is reloaded every start (never saved); student + critic resume from
    # the newest readable step, else start from the teacher / the phase-A student
    # ----------------------------------------------------------------------------------------------
    if cfg.ckpt.init_from:
        teacher, state = state_lib.load_teacher(cfg, teacher, state, shardings)
    ckpt = checkpointing.Checkpointer(cfg.ckpt) if cfg.ckpt.dir else None
    restored = None
    if ckpt is not None:
        restored = ckpt.restore_latest(checkpointing.abstract_with_shardings(abstract, shardings[1]), data_iter)
    if restored is not None:
        state = restored
        logging.info("resumed at step %d", int(state.step))
    elif cfg.phase == "dmd" and cfg.student_from:
        state = state_lib.load_student(cfg, state, tx_s, tx_c, mesh)

    # ----------------------------------------------------------------------------------------------
    # Update (+ the fixed evaluation batch: teacher samples computed once)
    # ----------------------------------------------------------------------------------------------
    update = step_lib.jit_updates(cfg, graphdef, tx_s, tx_c, mesh, shardings, input_lib.TRAIN_KEYS)
    eval_fn = _make_eval(cfg, graphdef, teacher, state, mesh) if cfg.eval_every else None
    if cfg.phase == "warmup":
        teacher = None  # phase A needs the teacher only as the student's starting weights: free it

    # ----------------------------------------------------------------------------------------------
    # Loop: dispatch step s, then read step s−1's metrics; finiteness is checked before every log
    # line and every checkpoint, so a poisoned state is never saved.
    # ----------------------------------------------------------------------------------------------
    writer = metrics_lib.MetricWriter(cfg.log.dir)
    start = int(state.step)
    records: list[dict[str, float]] = []
    bar = tqdm(total=cfg.total_steps, initial=start, disable=not cfg.log.progress or jax.process_index() != 0)
    pending: tuple[int, dict] | None = None

    def report(step: int, m: dict) -> None:
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        if not m.pop("finite"):
            raise FloatingPointError(f"step {step}: non-finite loss or gradient norm {m} "
                                     f"(state left at step {step - 1}'s values)")
        records.append({"step": step, **m})
        writer.step(step, m)
        bar.set_postfix(loss=f"{m['loss']:.4f}", refresh=False)
        bar.update(1)
        if step % cfg.log.every == 0:
            writer.scalars(step, {f"distill/{k}": v for k, v in m.items()})

    for s in range(start + 1, cfg.total_steps + 1):
        batch = to_device(next(data_iter))
        state, m = update(s, state, teacher, batch)
        if pending is not None:
            report(*pending)
        pending = (s, m)
        if s == cfg.debug_kill_at_step:
            os.kill(os.getpid(), signal.SIGKILL)
        if eval_fn is not None and (s % cfg.eval_every == 0 or s == cfg.total_steps):
            report(*pending)
            pending = None
            records[-1]["sample_distance"] = float(eval_fn(state))
            writer.step(s, {"sample_distance": records[-1]["sample_distance"]})
            writer.scalars(s, {"eval/sample_distance": records[-1]["sample_distance"]})
        if ckpt is not None and (s % cfg.ckpt.every == 0 or s == cfg.total_steps):
            if pending is not None:
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
    return records


def _make_eval(cfg: config_lib.DistillConfig, graphdef, teacher, state: DistillState, mesh) -> Callable:
    """Student–teacher sample distance (EMA weights) on a fixed synthetic-seeded batch."""
    eval_iter = input_lib.make_iterator(TrainConfig(model=cfg.model, data=cfg.data))
    batch = jax.tree.map(np.asarray, next(eval_iter))
    key = jax.random.PRNGKey(cfg.seed + 12345)
    with sharding.axis_rules(mesh):
        teacher_x0 = jax.jit(lambda *a: evaluate.teacher_samples(cfg, graphdef, *a))(teacher, state.stats, batch, key)
        distance = jax.jit(evaluate.make_distance_fn(cfg, graphdef))

    def run(st: DistillState) -> jax.Array:
        with sharding.axis_rules(mesh):
            return distance(st.ema if len(st.ema) else st.student, teacher_x0, st.stats, batch,
                            jax.random.fold_in(key, 1))
    return run


def latent_sample_hook(cfg: config_lib.DistillConfig, graphdef, batch: dict, out_dir: str) -> Hook:
    """A hook writing the EMA student's rollout latents (B, T, H, W, C) as .npy every
    log.sample_every steps; decode them with the VAE (rynn_jax.models.vae) into videos offline."""
    sample = jax.jit(lambda *a: evaluate.student_samples(cfg, graphdef, *a))

    def hook(step: int, st: DistillState) -> None:
        x0 = sample(st.ema if len(st.ema) else st.student, st.stats, batch, jax.random.PRNGKey(step))
        if jax.process_index() == 0:
            os.makedirs(out_dir, exist_ok=True)
            np.save(os.path.join(out_dir, f"student_{step:07d}.npy"), np.asarray(jax.device_get(x0)))
    return hook


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", required=True, help="recipe file under configs/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set phase=dmd (repeatable)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    cfg = apply_overrides(config_lib.load_config(args.config), args.set)
    logging.info("config: %s", json.dumps(to_dict(cfg)))
    hooks = []
    if cfg.log.sample_every and cfg.log.dir:
        batch = jax.tree.map(np.asarray, next(input_lib.make_iterator(TrainConfig(model=cfg.model, data=cfg.data))))
        graphdef = state_lib.graphdef_of(cfg.model)
        hooks.append(latent_sample_hook(cfg, graphdef, batch, os.path.join(cfg.log.dir, "samples")))
    return distill(cfg, hooks)


if __name__ == "__main__":
    main()
