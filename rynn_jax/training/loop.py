"""The host side of the step loop that train.py and distill.py share.

Step s is dispatched before step s−1's metrics are read, so the device always has queued work and
the host waits on it only to log one step late. Metrics are pulled to the host and checked for
finiteness (the jitted steps report `finite`) before they are logged, and the pending step is read
before every checkpoint, so a poisoned state is never saved. After the checkpoint come the sample
hooks; `close` reads what is left and closes the progress bar, the checkpointer and the writer.

SIGINT (Ctrl-C) and SIGTERM end the run cleanly: the step in flight finishes, a checkpoint of it
is saved, the metrics are flushed and `close` prints "saved step N" (a second Ctrl-C aborts at
once). The metrics file keeps no line past the step a run resumes from, so a resumed run's file
has each step once. The progress bar starts after the first step, so its ETA leaves compiling out.

    loop = Loop(...)
    for s in loop.steps():
        state, m = update(state, batch)    # dispatched, not waited on
        loop.dispatched(s, m)              # reads step s − 1
        loop.end_step(s, state)            # checkpoint, sample hooks
    loop.close()
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Sequence
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
                 hooks: Sequence[Hook] = (), debug_kill_at_step: int = 0, debug_kill_signal: str = "SIGKILL"):
        self.start, self.total_steps = start, total_steps
        self.log, self.ckpt_cfg, self.ckpt, self.data_iter = log, ckpt_cfg, ckpt, data_iter
        self.on_metrics, self.hooks, self.kill_at = on_metrics, tuple(hooks), debug_kill_at_step
        self.kill_signal = signal.Signals[debug_kill_signal]
        self.writer = metrics_lib.MetricWriter(log.dir, resume_step=start)
        self.bar: tqdm | None = None  # made after the first step: its rate and ETA exclude compiling
        self._t0 = time.perf_counter()
        self._pending: tuple[int, dict[str, jax.Array]] | None = None
        self._saved_step = start if start else None
        self.stop_signal: str | None = None  # set by SIGINT/SIGTERM: stop after the current step
        self._handlers = {}
        if threading.current_thread() is threading.main_thread():  # signals reach the main thread only
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._handlers[sig] = signal.signal(sig, self._on_signal)

    def _on_signal(self, signum: int, frame) -> None:
        name = signal.Signals(signum).name
        if self.stop_signal is not None:  # asked twice: abort now
            self._restore_handlers()
            raise KeyboardInterrupt(name)
        self.stop_signal = name
        logging.warning("%s: finishing the current step, saving a checkpoint, then exiting "
                        "(again to abort without saving)", name)

    def _restore_handlers(self) -> None:
        for sig, handler in self._handlers.items():
            signal.signal(sig, handler)
        self._handlers = {}

    def steps(self) -> Iterator[int]:
        """Steps start + 1 … total_steps, ending early (after a checkpoint) on SIGINT/SIGTERM."""
        try:
            for step in range(self.start + 1, self.total_steps + 1):
                yield step
                if self.stop_signal is not None:
                    self.flush()
                    if self.ckpt is not None and self._saved_step != step:
                        self.ckpt.save(step, self._last_state, self.data_iter)
                        self._saved_step = step
                    self._stopped_at = step
                    return
        finally:  # also when the loop body raises: Ctrl-C behaves as usual again
            self._restore_handlers()

    def dispatched(self, step: int, metrics: dict[str, jax.Array]) -> None:
        """Call right after dispatching `step`: reads the previous step's metrics, queues these."""
        self.flush()
        self._pending = (step, metrics)
        if step == self.kill_at:  # fault injection (resume and interrupt tests), a step in flight
            os.kill(os.getpid(), self.kill_signal)

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
        if self.bar is None:
            logging.info("step %d (with compiling) took %.1f s", step, time.perf_counter() - self._t0)
            self.bar = tqdm(total=self.total_steps, initial=step, unit="step",
                            disable=not self.log.progress or jax.process_index() != 0)
        else:
            self.bar.set_postfix(loss=f"{m['loss']:.4f}", refresh=False)
            self.bar.update(1)
        self.on_metrics(step, m)

    def end_step(self, step: int, state: Any) -> None:
        """Checkpoint (every ckpt.every steps and at the end), then the sample hooks."""
        self._last_state = state
        if self.ckpt is not None and (step % self.ckpt_cfg.every == 0 or step == self.total_steps):
            self.flush()
            self.ckpt.save(step, state, self.data_iter)
            self._saved_step = step
        if self.log.sample_every and step % self.log.sample_every == 0:
            for hook in self.hooks:
                hook(step, state)

    def close(self) -> None:
        self.flush()
        if self.bar is not None:
            self.bar.close()
        if self.ckpt is not None:
            self.ckpt.wait()
            self.ckpt.close()
        self.writer.close()
        self._restore_handlers()
        stopped = getattr(self, "_stopped_at", None)
        if stopped is not None and jax.process_index() == 0:
            if self.ckpt is None:
                print(f"{self.stop_signal}: stopped at step {stopped}, nothing saved (no ckpt.dir)", flush=True)
            else:
                print(f"{self.stop_signal}: saved step {stopped} in {self.ckpt_cfg.dir}; to resume, run the same "
                      f"command with --set ckpt.dir={self.ckpt_cfg.dir} --set log.dir={self.log.dir}", flush=True)
