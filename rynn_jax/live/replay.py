"""The MuJoCo replay panel of a sim session: the sim task's robot following the session's joint commands.

Every 16 fps tick's 54-D command (the joint command of the frame that completed the tick: a
recording's `action`) drives the task's settled scene through `episode.Robot`, as a sim episode's
`simulate` does (the command interpolated over the tick, a servo following it, physical objects,
weld grasps), and the head camera's view goes to the client as an "M" frame: the robot's own view
beside the generated one.

Rate: physics follows every tick; at most `fps` frames a second are rendered, and when the replay is
behind (ticks came in while it rendered) only the newest is rendered, the others counted in
`skipped`. All MuJoCo work runs on the catalog's MuJoCo thread (`SimCatalog.gl`), never on the
event loop.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
from collections.abc import Callable
from concurrent.futures import Executor

import mujoco
import numpy as np

from rynn_jax.kinematics import replay as mj_replay
from rynn_jax.live import protocol
from rynn_jax.live.operator import Tick
from rynn_jax.live.sim_start import CAMERA, SimTask, settled_copy
from rynn_jax.sim import episode

MAX_PENDING = 32  # ticks waiting for the physics (2 s); older ones are skipped without it


class Replay:
    def __init__(self, sim: SimTask, gl: Executor, send: Callable[[bytes], None], fmt: str, fps: float = 16.0,
                 on_error: Callable[[str, str], None] | None = None):
        self.sim, self.gl, self.send, self.fmt, self.fps, self.on_error = sim, gl, send, fmt, fps, on_error
        self.frames = 0  # rendered and sent
        self.skipped = 0  # ticks not rendered (the replay was behind)
        self.ticks = 0  # ticks received
        self._pending: list[Tick] = []
        self._wake = asyncio.Event()
        self._task: asyncio.Task | None = None
        self._robot: episode.Robot | None = None
        self._renderer: mujoco.Renderer | None = None
        self._last: np.ndarray | None = None  # the command the servo moved to last
        self._k = 0  # ticks simulated (the MuJoCo thread's count: grasp event times)

    async def open(self) -> None:
        """Make the robot and the renderer (on the MuJoCo thread) and start replaying."""
        try:
            await asyncio.get_running_loop().run_in_executor(self.gl, self._make)
        except Exception as e:
            raise protocol.ProtocolError("sim_failed", f"the MuJoCo replay could not start: {type(e).__name__}: "
                                                       f"{e}") from None
        self._task = asyncio.create_task(self._run())

    def put(self, ticks: list[Tick]) -> None:
        self._pending += ticks
        self.ticks += len(ticks)
        if len(self._pending) > MAX_PENDING:
            self.skipped += len(self._pending) - MAX_PENDING
            del self._pending[:-MAX_PENDING]
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._renderer is not None:
            await asyncio.get_running_loop().run_in_executor(self.gl, self._renderer.close)
            self._renderer = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._wake.wait()
            self._wake.clear()
            if not self._pending:
                continue
            ticks, self._pending = self._pending, []
            began = loop.time()
            try:
                frame = await loop.run_in_executor(self.gl, self._step, [t.action for t in ticks], self.ticks - 1,
                                                   ticks[-1].t)
            except Exception as e:  # a broken replay stops; the session goes on
                if self.on_error is not None:
                    self.on_error("sim_failed", f"the MuJoCo replay stopped: {type(e).__name__}: {e}")
                return
            self.frames += 1
            self.skipped += len(ticks) - 1
            self.send(frame)
            await asyncio.sleep(max(0.0, 1.0 / self.fps - (loop.time() - began)))

    # -- the MuJoCo thread -------------------------------------------------------------------------

    def _make(self) -> None:
        episode.ensure_headless_gl()
        model = copy.deepcopy(self.sim.scene.model)  # grasps write the welds' eq_data: a model of its own
        d = settled_copy(self.sim, model)
        self._robot = episode.Robot(dataclasses.replace(self.sim.scene, model=model), d)
        self._last = self._robot.q.copy()
        h, w = self.sim.image.shape[:2]
        self._renderer = mj_replay.offscreen_renderer(model, h, w)

    def _step(self, actions: list[np.ndarray], index: int, t: float) -> bytes:
        """Physics through every command (`episode.simulate`'s steps: advance, then forward), then
        the head camera's view after the last, encoded."""
        robot = self._robot
        for a in actions:
            a = np.asarray(a, np.float64)
            robot.advance(self._last, a, self._k)
            mujoco.mj_forward(robot.m, robot.d)
            self._last, self._k = a, self._k + 1
        self._renderer.update_scene(robot.d, camera=CAMERA)
        return protocol.encode_frame("M", self._renderer.render(), self.fmt, index, t)
