"""Live sessions started from a sim task (`rynn_jax.sim`): its scene, view, prompt and scripted operator.

A start message with `"sim": {"task": T, "seed": N}` gets, instead of a reference picture and a camera,

  * the task's scene for the seed (`scenes.build`, settled as an episode starts: `episode.settle`) and
    its head camera's first frame, rendered at the world model's H×W, as the reference view;
  * that camera's intrinsics at H×W and its pose in the robot frame, for the skeleton: the
    operator's hands go through the calibrated tracker chain into the robot frame and are seen from
    there, as in the episode's skeleton video (`chain_hands.hands_through_chain`; the stream's own
    `T_world_camera` is approximate: seen from it, the hands are s = 1.5 times too large);
  * the task's prompt (`scenes.DESCRIPTIONS`) unless the start gives one;
  * the task's scripted operator stream (`episode.script`), whose frames
    `GET /sim/<task>.json?seed=N` serves (what the page plays).

Each (task, seed) is built once (scene, settle, script on a worker thread; the first frame on the
MuJoCo thread) and kept, the last `CACHE` of them. MuJoCo renders on one thread of its own: an
offscreen GL context belongs to the thread that made it (`live.replay` renders there too).
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import json
from collections.abc import Callable
from concurrent.futures import Executor, ThreadPoolExecutor

import mujoco
import numpy as np
from aiohttp import web

from rynn_jax.kinematics import replay, streams
from rynn_jax.live import protocol
from rynn_jax.sim import episode, scenes

CACHE = 8  # (task, seed) entries kept
# The rate `/sim/<task>.json` serves the operator at: a multiple of the video's 16 fps, so every
# tick falls on a frame and the live skeleton is the episode's (at 60 Hz, resampling the resampled
# stream moved keypoints by up to 3 mm).
STREAM_HZ = 64.0
CAMERA = "head_camera"


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimTask:
    task: str
    seed: int
    prompt: str
    scene: scenes.Scene
    data: mujoco.MjData  # the settled state (read only: a replay starts from a copy)
    stream: streams.Stream  # the scripted operator (`rynn-teleop-stream/1`)
    camera: np.ndarray  # (4, 4) T_world_camera of the stream's tracking world (approximate)
    robot_camera: np.ndarray  # (4, 4) the head camera in the robot frame (OpenCV axes): the skeleton's
    intrinsics: np.ndarray  # (3, 3) float32, the head camera at (H, W)
    image: np.ndarray | None = None  # (H, W, 3) uint8, the head camera's first frame

    @functools.cached_property
    def stream_json(self) -> bytes:
        """The operator as live frames at `STREAM_HZ` from t = 0 (the page's `/sample.json` layout)."""
        frames = protocol.frames_at(self.stream, STREAM_HZ)
        frames = [{**protocol.frame_json(f), "t": f.t - frames[0].t} for f in frames]
        return json.dumps({"schema": protocol.SCHEMA, "task": self.task, "seed": self.seed, "prompt": self.prompt,
                           "T_world_camera": self.camera.tolist(), "frames": frames}).encode()


def build(task: str, seed: int, height: int, width: int, num_frames: int = episode.DEFAULT_FRAMES) -> SimTask:
    """Scene, settled state and scripted operator of (task, seed) for an H×W head camera (no image yet)."""
    scene = scenes.build(task, seed, width=width, height=height, shadows=False)
    d = episode.settle(scene)
    _, stream, _ = episode.script(scene, d, num_frames)
    return SimTask(task=task, seed=seed, prompt=scenes.DESCRIPTIONS[task], scene=scene, data=d, stream=stream,
                   camera=np.asarray(stream.meta["T_world_camera"], np.float64),
                   robot_camera=scenes.camera_pose_opencv(scene.model, d),
                   intrinsics=scenes.camera_intrinsics(scene.model, width, height, CAMERA))


def first_frame(sim: SimTask, height: int, width: int) -> np.ndarray:
    """The head camera's view of the settled scene (call on the MuJoCo thread)."""
    episode.ensure_headless_gl()
    m = sim.scene.model
    d = settled_copy(sim, m)
    r = replay.offscreen_renderer(m, height, width)
    try:
        r.update_scene(d, camera=CAMERA)
        return r.render().copy()
    finally:
        r.close()


def settled_copy(sim: SimTask, model: mujoco.MjModel) -> mujoco.MjData:
    """A copy of the settled state for `model` (the scene's model or a copy of it), forward-computed."""
    d = mujoco.MjData(model)
    mujoco.mj_copyData(d, model, sim.data)
    mujoco.mj_forward(model, d)
    return d


def check_task(task: str) -> None:
    if task not in scenes.TASKS:
        raise protocol.ProtocolError("bad_start", f"start: unknown sim task {task!r}; choose from "
                                                  f"{', '.join(scenes.TASKS)}")


class SimCatalog:
    """The sim tasks a server offers: built on demand, cached per (task, seed), and their HTTP routes."""

    def __init__(self, height: int, width: int, pool: Executor):
        self.height, self.width, self.pool = height, width, pool
        self.gl = ThreadPoolExecutor(1, thread_name_prefix="rynn-live-mujoco")
        self.builder: Callable[..., SimTask] = build  # (task, seed, height, width) → SimTask
        self._built: collections.OrderedDict[tuple[str, int], asyncio.Future] = collections.OrderedDict()

    def routes(self, authorized: Callable[[web.Request], bool]) -> list[web.RouteDef]:
        async def tasks(request: web.Request) -> web.Response:
            return web.json_response({"tasks": [{"task": t, "prompt": scenes.DESCRIPTIONS[t]} for t in scenes.TASKS]})

        async def stream(request: web.Request) -> web.Response:
            if not authorized(request):  # building a task costs seconds: not for anyone on a public bind
                return web.Response(status=401, text="a valid token is needed (?token=)")
            try:
                check_task(request.match_info["task"])
            except protocol.ProtocolError as e:
                return web.Response(status=404, text=str(e))
            try:
                seed = protocol.parse_seed(request.query.get("seed", "0"))
            except protocol.ProtocolError as e:
                return web.Response(status=400, text=str(e))
            try:
                sim = await self.get(protocol.SimRef(request.match_info["task"], seed))
            except protocol.ProtocolError as e:
                return web.Response(status=500, text=str(e))
            body = await asyncio.get_running_loop().run_in_executor(self.pool, lambda: sim.stream_json)
            return web.Response(body=body, content_type="application/json")

        return [web.get("/sim.json", tasks), web.get("/sim/{task}.json", stream)]

    async def get(self, ref: protocol.SimRef) -> SimTask:
        """The built task (shared: one build per (task, seed) however many ask at once); a
        `ProtocolError` `bad_start` for an unknown task, `sim_failed` when building it raised."""
        check_task(ref.task)
        key = (ref.task, ref.seed)
        if key not in self._built:
            self._built[key] = asyncio.ensure_future(self._build(*key))
            while len(self._built) > CACHE:
                self._built.popitem(last=False)
        self._built.move_to_end(key)
        job = self._built[key]
        try:
            return await asyncio.shield(job)
        except Exception as e:
            if self._built.get(key) is job:  # a later start tries again
                del self._built[key]
            raise protocol.ProtocolError("sim_failed", f"sim task {ref.task} (seed {ref.seed}) failed: "
                                                       f"{type(e).__name__}: {e}") from None

    async def _build(self, task: str, seed: int) -> SimTask:
        loop = asyncio.get_running_loop()
        sim = await loop.run_in_executor(self.pool, self.builder, task, seed, self.height, self.width)
        image = await loop.run_in_executor(self.gl, first_frame, sim, self.height, self.width)
        return dataclasses.replace(sim, image=image)

    def close(self) -> None:
        self.gl.shutdown(wait=True)
