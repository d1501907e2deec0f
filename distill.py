"""Distil the bidirectional RynnWorld-Teleop model into the 4-step causal streaming student.

    python distill.py --config configs/distill_tiny.py                                  # phase A, CPU
    python distill.py --config configs/distill_tiny.py --set phase=dmd --set student_from=/tmp/a/ckpt
    python distill.py --config configs/distill_5b.py --set phase=dmd --set student_from=runs/distill_a/ckpt

Without ckpt.dir and log.dir a run writes to runs/<recipe>-<time>/. Ctrl-C (or SIGTERM) finishes
the current step, saves it and exits 0 ("saved step N"), printing how to resume.

Phase A (warmup): causal flow matching with block-wise teacher forcing. Phase B (dmd): the student
rolls out block by block through its KV cache and is trained with DMD against the frozen teacher
(real score) and a critic (fake score) trained by flow matching on its samples. Read top to
bottom: Config → Mesh → Input → Models & state → Checkpoint → Update → Loop. The pieces live in
rynn_jax/distill (config, warmup, rollout, dmd, state, step, evaluate) and rynn_jax/training.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from collections.abc import Callable, Sequence

import jax
import numpy as np

from rynn_jax import data as data_lib
from rynn_jax import errors, sharding
from rynn_jax.distill import config as config_lib
from rynn_jax.distill import evaluate
from rynn_jax.distill import state as state_lib
from rynn_jax.distill import step as step_lib
from rynn_jax.distill.state import DistillState
from rynn_jax.training import checkpointing, preflight
from rynn_jax.training import input as input_lib
from rynn_jax.training import loop as loop_lib
from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training import samples as samples_lib
from rynn_jax.training.config import TrainConfig, apply_overrides, to_dict, with_run_dir

Hook = Callable[[int, DistillState], None]  # called every log.sample_every steps


def distill(cfg: config_lib.DistillConfig, hooks: Sequence[Hook] = ()) -> list[dict[str, float]]:
    """Runs (or resumes) `cfg`; returns the metrics of the steps this call ran."""
    preflight.check(cfg)  # teacher/student weights, files, output dirs: before anything is built

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
        logging.info("resumed from step %d", int(state.step))
    elif cfg.phase == "dmd" and cfg.student_from:
        state = state_lib.load_student(cfg, state, tx_s, tx_c, mesh)

    # ----------------------------------------------------------------------------------------------
    # Update (+ the fixed evaluation batch: teacher samples computed once; sample videos as train.py)
    # ----------------------------------------------------------------------------------------------
    update = step_lib.jit_updates(cfg, graphdef, tx_s, tx_c, mesh, shardings, input_lib.TRAIN_KEYS)
    eval_fn = _make_eval(cfg, graphdef, teacher, state, mesh) if cfg.eval_every else None
    if not state_lib.uses_critic(cfg):
        teacher = None  # phase A / regression need the teacher only as the starting weights: free it
    if cfg.log.sample_every and cfg.log.sample_vae:  # skeleton | student | truth MP4s in log.dir
        hooks = [*hooks, evaluate.make_sample_hook(
            cfg, graphdef, samples_lib.load_sample_vae(cfg.log.sample_vae, cfg.model.in_channels),
            next(input_lib.make_iterator(TrainConfig(model=cfg.model, data=cfg.data))),
            os.path.join(cfg.log.dir or ".", "samples"), seed=cfg.seed)]

    # ----------------------------------------------------------------------------------------------
    # Loop: dispatch step s, then read step s−1's metrics; `Loop` checks finiteness before every
    # log line and every checkpoint, so a poisoned state is never saved.
    # ----------------------------------------------------------------------------------------------
    records: list[dict[str, float]] = []

    def on_metrics(step: int, m: dict[str, float]) -> None:
        records.append({"step": step, **m})
        if "sample_distance" in m:
            loop.writer.scalars(step, {"eval/sample_distance": m["sample_distance"]})
        if step % cfg.log.every == 0:
            loop.writer.scalars(step, {f"distill/{k}": v for k, v in m.items() if k != "sample_distance"})

    loop = loop_lib.Loop(start=int(state.step), total_steps=cfg.total_steps, log=cfg.log, ckpt_cfg=cfg.ckpt,
                         ckpt=ckpt, data_iter=data_iter, on_metrics=on_metrics, hooks=hooks,
                         debug_kill_at_step=cfg.debug_kill_at_step, debug_kill_signal=cfg.debug_kill_signal)
    for s in loop.steps():
        batch = to_device(next(data_iter))
        state, m = update(s, state, teacher, batch)
        if eval_fn is not None and (s % cfg.eval_every == 0 or s == cfg.total_steps):
            m = {**m, "sample_distance": eval_fn(state)}  # logged on the step's own metrics line
        loop.dispatched(s, m)
        loop.end_step(s, state)
    loop.close()
    return records


def _make_eval(cfg: config_lib.DistillConfig, graphdef, teacher, state: DistillState, mesh) -> Callable:
    """Student–teacher sample distance (EMA weights) on a fixed synthetic-seeded batch."""
    eval_iter = input_lib.make_iterator(TrainConfig(model=cfg.model, data=cfg.data))
    batch = jax.tree.map(np.asarray, next(eval_iter))
    key = jax.random.PRNGKey(cfg.seed + 12345)
    with sharding.axis_rules(mesh, cfg.mesh.rules):
        teacher_x0 = jax.jit(lambda *a: evaluate.teacher_samples(cfg, graphdef, *a))(teacher, state.stats, batch, key)
        distance = jax.jit(evaluate.make_distance_fn(cfg, graphdef))

    def run(st: DistillState) -> jax.Array:
        with sharding.axis_rules(mesh, cfg.mesh.rules):
            return distance(st.ema if len(st.ema) else st.student, teacher_x0, st.stats, batch,
                            jax.random.fold_in(key, 1))
    return run


def main(argv: Sequence[str] | None = None) -> list[dict[str, float]]:
    parser = errors.ArgumentParser(prog="python distill.py", description=__doc__)
    parser.add_argument("--config", required=True, help="recipe file under configs/")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field, e.g. --set phase=dmd (repeatable)")
    args = parser.parse_args(argv)
    metrics_lib.setup_logging()
    cfg = with_run_dir(apply_overrides(config_lib.load_config(args.config), args.set), args.config)
    logging.info("run: checkpoints in %s, metrics in %s", cfg.ckpt.dir or "(none)", cfg.log.dir or "(none)")
    logging.info("config: %s", json.dumps(to_dict(cfg)))
    return distill(cfg)


if __name__ == "__main__":
    sys.exit(errors.run(main))
