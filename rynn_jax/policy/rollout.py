"""Closed-loop evaluation in the MuJoCo world: observe, predict a chunk, execute it, repeat.

    python serve.py policy --task dual_pick --episodes 35 --policy runs/policy_cnn/export --out outputs/policy
    python serve.py policy --task all --episodes 35 --scripted --out outputs/policy     # the upper reference

Per trial (held-out seeds `--seed`, `--seed` + 1, …; training data uses attempt seeds from 0): the
task's scene is built and settled, then every `chunk` frames the actor sees the head camera (RGB +
depth) and the 54-D joint state and returns the next `chunk` joint targets, which drive the
simulated robot exactly as recorded episodes are driven (`sim.episode.Robot`: 16 fps targets,
servo, weld grasps). At each chunk boundary the sim's own checks decide: success = the task's
`goal_reached` on the current state with no object held and no object ever flung faster than the
data generator allows (`unstable`); a trial ends on success, instability or at the time
limit (`--time-limit`, default 10 s; the scripted episodes take 7). Writes per trial a video and a
frame strip, `<out>/<method>/<task>/trials.jsonl`, and the success table `<out>/success.json` +
`success.md` (rows = methods, columns = tasks; runs into the same --out add up to one table).
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from typing import Protocol

import jax
import mujoco
import numpy as np

from rynn_jax import errors
from rynn_jax.sim import scenes
from rynn_jax.sim.resolutions import RESOLUTIONS, parse_resolution

STRIP_FRAMES = 6


class Actor(Protocol):
    name: str
    chunk: int

    def reset(self, scene: scenes.Scene, d: mujoco.MjData) -> None: ...

    def act(self, rgb_hw3: np.ndarray, depth_hw: np.ndarray, state: np.ndarray, frame: int) -> np.ndarray:
        """The next `chunk` joint targets (chunk, 54) for frames frame + 1 …"""
        ...


class ScriptedActor:
    """The scripted operator of the synthetic data (its retargeted actions, played open loop)."""
    name = "scripted"

    def __init__(self, chunk: int = 10):
        self.chunk = chunk

    def reset(self, scene, d):
        from rynn_jax.sim import episode

        frames = episode.DEFAULT_FRAMES
        _, stream, _ = episode.script(scene, d, frames)
        self.actions = episode.retarget_stream(stream, np.arange(frames) / episode.FPS)["actions"]

    def act(self, rgb_hw3, depth_hw, state, frame):
        idx = np.minimum(frame + 1 + np.arange(self.chunk), len(self.actions) - 1)
        return self.actions[idx]


class PolicyActor:
    """A trained (or freshly initialised) policy; its noise key is fixed per trial and chunk."""

    def __init__(self, policy, name: str, seed: int = 0, text_dir: str = ""):
        self.policy, self.name, self.seed, self.text_dir = policy, name, seed, text_dir
        self.chunk = policy.cfg.head.chunk

    def reset(self, scene, d):
        from rynn_jax.policy.data import goal_tokens

        h = self.policy.cfg.head
        self.goal = goal_tokens(scenes.DESCRIPTIONS[scene.task], h.goal_len, h.goal_dim, self.text_dir)[None]
        self.key = jax.random.fold_in(jax.random.key(self.seed), scene.seed)

    def act(self, rgb_hw3, depth_hw, state, frame):
        from rynn_jax.policy.data import observation

        rgb, depth_rgb = observation(rgb_hw3, depth_hw, self.policy.cfg.image_size)
        key = jax.random.fold_in(self.key, frame)
        return self.policy.predict(rgb[None], depth_rgb[None], state[None], self.goal, key)[0]


class Camera:
    """The head camera's RGB (uint8) and z-depth (metres) of the current simulation state."""

    def __init__(self, scene: scenes.Scene, height: int, width: int):
        from rynn_jax.kinematics import replay
        from rynn_jax.sim.episode import ensure_headless_gl

        ensure_headless_gl()
        self.renderer = replay.offscreen_renderer(scene.model, height, width)

    def __call__(self, d: mujoco.MjData) -> tuple[np.ndarray, np.ndarray]:
        r = self.renderer
        r.update_scene(d, camera="head_camera")
        rgb = r.render()
        r.enable_depth_rendering()
        depth = r.render()
        r.disable_depth_rendering()
        return rgb, depth

    def close(self) -> None:
        self.renderer.close()


def succeeded(scene: scenes.Scene, d: mujoco.MjData, robot) -> tuple[bool, dict]:
    """The sim's own verdict: the task's goal on this state, nothing still held, and a stable
    simulation so far (the data generator's check, `episode.unstable`: an arm driven to far
    targets at full servo speed can fling a block over the goal line, which is not a success)."""
    from rynn_jax.sim import episode

    unstable = episode.unstable(d.qpos, robot.max_speed)
    ok, measured = episode.goal_reached(scene, d)
    held = [o for o in robot.attached.values() if o is not None]
    return bool(ok and not held and not unstable), {
        "goal": measured, "goal_reached": ok, "held": held, "unstable": unstable,
        "max_object_speed_mps": round(robot.max_speed, 3)}


def run_trial(actor: Actor, task: str, seed: int, *, resolution: tuple[int, int], time_limit_s: float,
              execute: int = 0) -> dict:
    """One closed-loop trial; returns the verdict, timings, the video frames and the final
    simulation (`sim`: scene, data, robot). `execute`: actions of each predicted chunk run before
    the next observation (0 = the whole chunk, as the paper; fewer = a receding horizon)."""
    from rynn_jax.sim import episode

    execute = execute or actor.chunk
    if not 1 <= execute <= actor.chunk:
        raise ValueError(f"execute {execute}: need 1 … {actor.chunk} (the actor's chunk)")
    h, w = resolution
    scene = scenes.build(task, seed, width=w, height=h, shadows=min(h, w) > 64)
    d = episode.settle(scene)
    robot = episode.Robot(scene, d)
    camera = Camera(scene, h, w)
    limit = int(round(time_limit_s * episode.FPS))
    t0 = time.perf_counter()
    actor.reset(scene, d)
    t_act, frames, k, command = 0.0, [], 0, robot.q.copy()
    ok, verdict = False, {}
    try:
        mujoco.mj_forward(scene.model, d)
        rgb, depth = camera(d)
        frames.append(rgb)
        while k < limit:
            t1 = time.perf_counter()
            chunk = np.asarray(actor.act(rgb, depth, robot.q.astype(np.float32), k), np.float64)
            t_act += time.perf_counter() - t1
            if chunk.shape != (actor.chunk, robot.n) or not np.isfinite(chunk).all():
                raise ValueError(f"{actor.name}: chunk of shape {chunk.shape} (finite: {np.isfinite(chunk).all()})")
            for target in chunk[:min(execute, limit - k)]:
                robot.advance(command, target, k)
                command, k = target, k + 1
                mujoco.mj_forward(scene.model, d)
                rgb, depth = camera(d)
                frames.append(rgb)
            robot.finish()
            ok, verdict = succeeded(scene, d, robot)
            if ok or verdict["unstable"]:  # an unstable simulation cannot recover into a success
                break
    finally:
        camera.close()
    return {"task": task, "seed": seed, "success": ok, "frames": k, "seconds_simulated": round(k / episode.FPS, 3),
            "act_s_per_chunk": round(t_act / max(1, -(-k // execute)), 4),
            "wall_s": round(time.perf_counter() - t0, 2), **verdict, "video": np.stack(frames),
            "sim": (scene, d, robot)}


def frame_strip(video_thw3: np.ndarray, n: int = STRIP_FRAMES) -> np.ndarray:
    """`n` frames evenly spaced over the trial (first and last included), side by side."""
    idx = np.linspace(0, len(video_thw3) - 1, n).round().astype(int)
    return np.concatenate(list(video_thw3[idx]), axis=1)


def update_table(out: Path, method: str, task: str, successes: int, trials: int, unstable: int = 0) -> dict:
    """Merge one (method, task) cell into <out>/success.json and rewrite success.md. `unstable`:
    trials that ended with an object flung (counted as failures; in the JSON only)."""
    path = out / "success.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    table.setdefault(method, {})[task] = {"successes": successes, "trials": trials,
                                          "rate": round(successes / trials, 4), "unstable": unstable}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1))
    os.replace(tmp, path)
    tasks = [t for t in scenes.TASKS if any(t in row for row in table.values())]
    lines = ["| method | " + " | ".join(tasks) + " |", "|---|" + "---|" * len(tasks)]
    for name, row in table.items():
        cells = [f"{100 * row[t]['rate']:.1f} % ({row[t]['successes']}/{row[t]['trials']})" if t in row else "–"
                 for t in tasks]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    (out / "success.md").write_text("\n".join(lines) + "\n")
    return table


@dataclasses.dataclass(frozen=True)
class ActorSpec:
    """What to build an actor from, in this process or in a worker process (actors hold jitted
    functions and MuJoCo state, which do not pickle)."""
    scripted: bool = False
    policy: str = ""  # a policy directory, or "tiny-cnn" (an untrained toy policy)
    name: str = ""
    text_dir: str = ""

    def build(self) -> Actor:
        if self.scripted:
            return ScriptedActor()
        from rynn_jax.policy import inference
        from rynn_jax.policy.config import PolicyConfig
        from rynn_jax.policy.normalize import ActionNormalizer

        if self.policy == "tiny-cnn":
            norm = ActionNormalizer(np.zeros(54, np.float32), np.ones(54, np.float32))
            policy = inference.from_params(PolicyConfig.tiny("cnn"), None, norm)
        else:
            policy = inference.load(self.policy)
        return PolicyActor(policy, self.name or Path(self.policy).name, text_dir=self.text_dir)

    @property
    def chunk(self) -> int:
        """Actions per chunk of the actor `build` makes, read without building it."""
        if self.scripted:
            return ScriptedActor().chunk
        from rynn_jax.policy import inference
        from rynn_jax.policy.config import PolicyConfig

        return (PolicyConfig.tiny("cnn") if self.policy == "tiny-cnn" else inference.load_config(self.policy)).head.chunk

    @property
    def label(self) -> str:
        return "scripted" if self.scripted else self.name or Path(self.policy).name


_WORKER_ACTOR: Actor | None = None


def _init_worker(spec: ActorSpec) -> None:
    global _WORKER_ACTOR
    _WORKER_ACTOR = spec.build()


def _trial(job: tuple) -> dict:
    """One trial in this process's actor; writes its video and strip, returns its record."""
    from rynn_jax.render.preview import save_png, save_video
    from rynn_jax.sim.episode import FPS

    task, seed, resolution, time_limit_s, execute, video_dir = job
    r = run_trial(_WORKER_ACTOR, task, seed, resolution=resolution, time_limit_s=time_limit_s, execute=execute)
    video, _ = r.pop("video"), r.pop("sim")
    if video_dir:
        save_video(Path(video_dir) / f"trial_{seed}.mp4", video, fps=int(FPS))
        save_png(Path(video_dir) / f"trial_{seed}_strip.png", frame_strip(video))
    return r


def evaluate(spec: ActorSpec, tasks: list[str], episodes: int, out: str | os.PathLike[str], *, seed: int = 100_000,
             resolution: tuple[int, int] = (64, 112), time_limit_s: float = 10.0, videos: bool = True,
             workers: int = 1, execute: int = 0) -> dict:
    """`episodes` trials per task on seeds seed, seed + 1, …; returns the success table. `workers`
    > 1 runs trials in that many processes (spawned, each with its own actor; trials are
    independent, so the records are the same as in one process)."""
    out = Path(out)
    table: dict = {}
    pool = None
    if workers > 1:
        import multiprocessing

        pool = multiprocessing.get_context("spawn").Pool(workers, initializer=_init_worker, initargs=(spec,))
    else:
        _init_worker(spec)
    try:
        for task in tasks:
            d = out / spec.label / task
            d.mkdir(parents=True, exist_ok=True)
            jobs = [(task, seed + i, resolution, time_limit_s, execute, str(d) if videos else "")
                    for i in range(episodes)]
            results = pool.imap(_trial, jobs) if pool else map(_trial, jobs)
            wins = unstable = 0
            with open(d / "trials.jsonl", "w") as log:
                for r in results:  # in seed order
                    wins += r["success"]
                    unstable += r.get("unstable", False)
                    log.write(json.dumps(r) + "\n")
                    print(json.dumps({k: r[k] for k in ("task", "seed", "success", "frames", "wall_s")}), flush=True)
            table = update_table(out, spec.label, task, wins, episodes, unstable)
    finally:
        if pool:
            pool.terminate()
    return table


def main(argv: list[str] | None = None) -> int:
    ap = errors.ArgumentParser(prog="python serve.py policy", description=__doc__)
    ap.add_argument("--task", default="all", help=f"one of {', '.join(scenes.TASKS)}, a comma list, or 'all'")
    ap.add_argument("--episodes", type=int, default=35, help="trials per task")
    who = ap.add_mutually_exclusive_group(required=True)
    who.add_argument("--policy", help="policy directory (the trainer's export); 'tiny-cnn' = untrained toy policy")
    who.add_argument("--scripted", action="store_true", help="the scripted operator (upper reference)")
    ap.add_argument("--name", default="", help="row name in the success table (default: the policy directory's name)")
    ap.add_argument("--out", default="outputs/policy", help="output directory (videos, strips, success table)")
    ap.add_argument("--seed", type=int, default=100_000, help="first trial seed (held out from training's 0, 1, …)")
    ap.add_argument("--resolution", default="tiny", help="render size: tiny 64×112, small, full, or HxW")
    ap.add_argument("--time-limit", type=float, default=10.0, help="seconds of simulated time per trial")
    ap.add_argument("--text-embeddings", default="", help="umT5 goal embeddings directory (default: hashed)")
    ap.add_argument("--no-videos", action="store_true", help="skip per-trial videos and strips")
    ap.add_argument("--workers", type=int, default=1, help="trials run in this many processes at once")
    ap.add_argument("--execute", type=int, default=0,
                    help="actions of each chunk executed before the next observation (default: the whole chunk)")
    a = ap.parse_args(argv)
    tasks = list(scenes.TASKS) if a.task == "all" else a.task.split(",")
    for t in tasks:
        if t not in scenes.TASKS:
            raise errors.UsageError(f"--task {t}: unknown", fix=f"choose from {', '.join(scenes.TASKS)} or all")
    if a.episodes < 1 or a.time_limit <= 0:
        raise errors.UsageError(f"--episodes {a.episodes}, --time-limit {a.time_limit}: need ≥ 1 and > 0")
    try:
        res = parse_resolution(a.resolution)
    except ValueError as e:
        raise errors.UsageError(f"--resolution {a.resolution}: {e}") from None
    res = RESOLUTIONS[res] if isinstance(res, str) else res
    if a.text_embeddings:
        errors.existing(a.text_embeddings, "--text-embeddings", kind="directory")
    errors.writable_dir(a.out, "--out")
    if a.workers < 1:
        raise errors.UsageError(f"--workers {a.workers}: need ≥ 1")
    if not a.scripted and a.policy != "tiny-cnn":
        errors.existing(a.policy, "--policy", kind="directory")
    spec = ActorSpec(scripted=a.scripted, policy=a.policy or "", name=a.name, text_dir=a.text_embeddings)
    if not 0 <= a.execute <= spec.chunk:
        raise errors.UsageError(f"--execute {a.execute}: need 1 … {spec.chunk} (actions of one chunk; 0 = all)")
    table = evaluate(spec, tasks, a.episodes, a.out, seed=a.seed, resolution=res, time_limit_s=a.time_limit,
                     videos=not a.no_videos, workers=a.workers, execute=a.execute)
    print((Path(a.out) / "success.md").read_text())
    return 0 if table else 1
