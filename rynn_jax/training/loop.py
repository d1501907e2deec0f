"""The host side of the step loop that train.py and distill.py share.

Step s is dispatched before step s−1's metrics are read, so the device always has queued work and
the host waits on it only to log one step late. Metrics are pulled to the host and checked for
finiteness (the jitted steps report `finite`) before they are logged, and the pending step is read
before every checkpoint, so a poisoned state is never saved. After the checkpoint come the sample
hooks; `close` reads what is left and closes the progress bar, the checkpointer and the writer.

    loop = Loop(...)
    for s in loop.steps():
        state, m = update(state, batch)    # dispatched, not waited on
        loop.dispatched(s, m)              # reads step s − 1
        loop.end_step(s, state)            # checkpoint, sample hooks
    loop.close()
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable, Sequence
from typing import Any

import grain
import jax
from tqdm import tqdm

from rynn_jax.training import metrics as metrics_lib
from rynn_jax.training.checkpointing import Checkpointer
from rynn_jax.training.config import CheckpointConfig, LogConfig

OnMetrics = Callable[[int, dict[str, float]], None]  # (step, host metrics without `finite`)
Hook = Callable[[int, Any], None]  # (step, state), every log.sample_every steps


class Loop:
    def __init__(self, *, start: int, total_steps: int, log: LogConfig, ckpt_cfg: CheckpointConfig,
                 ckpt: Checkpointer | None, data_iter: grain.DatasetIterator, on_metrics: OnMetrics,
                 hooks: Sequence[Hook] = (), debug_kill_at_step: int = 0):
        self.start, self.total_steps = start, total_steps
        self.log, self.ckpt_cfg, self.ckpt, self.data_iter = log, ckpt_cfg, ckpt, data_iter
        self.on_metrics, self.hooks, self.kill_at = on_metrics, tuple(hooks), debug_kill_at_step
        self.writer = metrics_lib.MetricWriter(log.dir)
        self.bar = tqdm(total=total_steps, initial=start, disable=not log.progress or jax.process_index() != 0)
        self._pending: tuple[int, dict[str, jax.Array]] | None = None

    def steps(self) -> range:
        return range(self.start + 1, self.total_steps + 1)

    def dispatched(self, step: int, metrics: dict[str, jax.Array]) -> None:
        """Call right after dispatching `step`: reads the previous step's metrics, queues these."""
        self.flush()
        self._pending = (step, metrics)
        if step == self.kill_at:  # fault injection (resume tests): die with a step in flight
            os.kill(os.getpid(), signal.SIGKILL)

    def flush(self) -> None:
        """Read, check and log the pending step's metrics (a no-op when none is pending)."""
        if self._pending is None:
            return
        step, m = self._pending
        self._pending = None
        m = {k: float(v) for k, v in jax.device_get(m).items()}
        if not m.pop("finite"):
            raise FloatingPointError(f"step {step}: non-finite loss or gradient norm {m} "
                                     f"(state left at step {step - 1}'s values)")
        self.writer.step(step, m)
        self.bar.set_postfix(loss=f"{m['loss']:.4f}", refresh=False)
        self.bar.update(1)
        self.on_metrics(step, m)

    def end_step(self, step: int, state: Any) -> None:
        """Checkpoint (every ckpt.every steps and at the end), then the sample hooks."""
        if self.ckpt is not None and (step % self.ckpt_cfg.every == 0 or step == self.total_steps):
            self.flush()
            self.ckpt.save(step, state, self.data_iter)
        if self.log.sample_every and step % self.log.sample_every == 0:
            for hook in self.hooks:
                hook(step, state)

    def close(self) -> None:
        self.flush()
        self.bar.close()
        if self.ckpt is not None:
            self.ckpt.wait()
            self.ckpt.close()
        self.writer.close()
