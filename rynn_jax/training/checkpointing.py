"""Training checkpoints: one orbax `CheckpointManager` step = the whole TrainState (params,
optimizer, EMA, running stats, step, rng) + the grain iterator position.

Orbax writes each step into a temporary directory and renames it when complete (atomic on local
and POSIX file systems), so a run killed mid-save leaves no step that looks finished; saves are
asynchronous (training continues while the arrays are written) and the newest `keep` are kept.
Restores go straight into the shardings of the *current* mesh, which may differ from the mesh
that saved. A step that fails to restore (corrupt or truncated files) is reported and the
previous step is tried.
"""

from __future__ import annotations

import logging
import os

import grain
import jax
import orbax.checkpoint as ocp

from rynn_jax.errors import InputError

from rynn_jax.training.config import CheckpointConfig
from rynn_jax.training.state import TrainState


class CheckpointError(InputError):
    """No step of a checkpoint directory can be read (entry points print it as one line, exit 1)."""


def abstract_with_shardings(abstract: TrainState, shardings: TrainState) -> TrainState:
    """ShapeDtypeStructs that carry the target sharding: orbax restores each shard in place."""
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s), abstract, shardings)


class Checkpointer:
    def __init__(self, cfg: CheckpointConfig):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=cfg.keep, enable_async_checkpointing=cfg.async_save,
            cleanup_tmp_directories=True)  # leftovers of a save that was killed
        self.manager = ocp.CheckpointManager(os.path.abspath(cfg.dir), options=options)

    def all_steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def save(self, step: int, state: TrainState, data_iter: grain.DatasetIterator) -> None:
        self.manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=grain.checkpoint.CheckpointSave(data_iter)), force=True)

    def restore_latest(self, target: TrainState, data_iter: grain.DatasetIterator | None) -> TrainState | None:
        """The newest readable step restored onto `target`'s shardings (and `data_iter`, unless
        None, moved to its position), or None when there are no steps. Raises CheckpointError when
        there are steps but none of them can be read."""
        steps = self.all_steps()
        errors = []
        items = {} if data_iter is None else {"data": grain.checkpoint.CheckpointRestore(data_iter)}
        for step in reversed(steps):
            try:
                restored = self.manager.restore(step, args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(target), **items))
            # Broken files surface as many error types (tensorstore, JSON, OS, value/key errors).
            except Exception as e:  # noqa: BLE001
                errors.append(f"step {step}: {type(e).__name__}: {e}")
                logging.error("checkpoint step %d in %s cannot be restored (%s: %s); trying the previous step",
                              step, self.manager.directory, type(e).__name__, str(e)[:500])
                continue
            if int(restored.state.step) != step:
                errors.append(f"step {step}: holds state of step {int(restored.state.step)}")
                continue
            if errors:
                logging.warning("resumed from step %d after skipping unreadable steps", step)
            return restored.state
        if steps:
            raise CheckpointError(f"no readable checkpoint in {self.manager.directory}:\n  " + "\n  ".join(errors))
        return None

    def resume(self, state: TrainState, data_iter: grain.DatasetIterator | None) -> TrainState:
        """The newest readable step restored onto `state`'s shapes and shardings (logged), or
        `state` itself when the directory has no step yet."""
        target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
        restored = self.restore_latest(target, data_iter)
        if restored is None:
            return state
        logging.info("resumed at step %d", int(restored.step))
        return restored

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()
