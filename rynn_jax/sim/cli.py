"""`generate` CLI: N successful synthetic episodes per task, as robot shards, in parallel, resumable.

    python -m rynn_jax.sim.cli generate --task dual_pick --n 20 --out data/sim --workers 2 --resolution tiny
    python -m rynn_jax.sim.cli generate --task all --n 500 --out data/sim --workers 16 --resolution full

Attempt k of task t uses seed `--seed + k`; a successful attempt is written as
`<out>/<t>/episode_<k:06d>/`, a failed one is dropped (its reasons go to `<out>/<t>/attempts.jsonl`
and `summary.json`). Every finished attempt leaves `<out>/<t>/.attempts/<k>.json`, so running the
same command again skips finished attempts and continues (resume); the set of episodes does not
depend on the number of workers except for which attempts beyond the N-th success were started.
Workers are spawned processes (each compiles the retargeting once, ≈20–30 s); `--workers 0` runs
in this process. Rendering uses MuJoCo's OSMesa backend unless MUJOCO_GL is already set.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import multiprocessing.connection
import os
import shutil
import sys
import threading
import time
from pathlib import Path

from tqdm import tqdm

from rynn_jax import errors
from rynn_jax.sim import scenes
from rynn_jax.sim.resolutions import parse_resolution


CACHE_ENV = "RYNN_JAX_SIM_COMPILE_CACHE"  # set by --compile-cache; spawned workers inherit it


def _exit_with_parent() -> None:
    """The pool's worker initializer: exit as soon as the parent process is gone. A parent killed by
    SIGTERM or SIGKILL cannot shut its pool down, and orphaned workers would go on simulating for
    nobody."""
    parent = mp.parent_process()

    def watch() -> None:
        mp.connection.wait([parent.sentinel])  # becomes ready when the parent exits, however it exits
        os._exit(1)
    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def _setup_worker() -> None:
    os.environ.setdefault("MUJOCO_GL", "osmesa")
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    if os.environ.get(CACHE_ENV):
        # Each worker compiles the scripted operator and the retargeting (≈ 40 s on one core, 176
        # programs) before its first episode; with a shared persistent cache only the first process
        # of a machine pays that, and every later worker and generation round loads the executables.
        from rynn_jax import compile_cache

        compile_cache.enable(os.environ[CACHE_ENV])


def run_attempt(task: str, attempt: int, seed: int, out: str, resolution: str, frames: int,
                shadows: bool | None) -> dict:
    """Generate one attempt; write it if it succeeded; leave the attempt marker either way."""
    _setup_worker()
    from rynn_jax.sim import episode, robot_shards

    t0 = time.perf_counter()
    ep = episode.generate(task, seed, resolution=parse_resolution(resolution), num_frames=frames, shadows=shadows)
    if ep.success:
        robot_shards.write_episode(ep, robot_shards.episode_dir(out, task, attempt))
    record = {"task": task, "attempt": attempt, "seed": seed, "success": ep.success, "failures": ep.failures,
              "seconds": round(time.perf_counter() - t0, 3), "timings_s": ep.info["timings_s"]}
    marker = Path(out) / task / ".attempts" / f"{attempt}.json"
    marker.parent.mkdir(parents=True, exist_ok=True)
    tmp = marker.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    os.replace(tmp, marker)
    return record


def _done_attempts(out: str, task: str) -> dict[int, dict]:
    d = Path(out) / task / ".attempts"
    done = {}
    if d.is_dir():
        for p in d.glob("*.json"):
            rec = json.loads(p.read_text())
            ok_dir = rec["success"] and (Path(out) / task / f"episode_{rec['attempt']:06d}").is_dir()
            if rec["success"] and not ok_dir:
                continue                      # marker without its episode: redo
            done[rec["attempt"]] = rec
    return done


def generate(tasks: list[str], n: int, out: str, *, workers: int = 1, resolution: str = "tiny",
             frames: int | None = None, seed: int = 0, shadows: bool | None = None,
             max_attempts: int | None = None, progress: bool = True) -> dict:
    """Make `n` successful episodes per task under `out` (resuming what is there)."""
    from rynn_jax.sim import episode, robot_shards

    frames = frames or episode.DEFAULT_FRAMES
    max_attempts = max_attempts or 3 * n + 5
    os.makedirs(out, exist_ok=True)
    for stale in Path(out).glob("*/episode_*.tmp"):
        shutil.rmtree(stale)
    done = {t: _done_attempts(out, t) for t in tasks}
    succ = {t: sum(r["success"] for r in done[t].values()) for t in tasks}
    next_attempt = {t: 0 for t in tasks}
    inflight: dict[cf.Future, str] = {}
    t0 = time.perf_counter()
    new_records: list[dict] = []
    bar = tqdm(total=n * len(tasks), initial=sum(min(succ[t], n) for t in tasks), desc="episodes",
               unit="ep", disable=not progress)

    def pending(t: str) -> int:
        return sum(1 for task in inflight.values() if task == t)

    def submit_ready(submit) -> None:
        # Always the task furthest behind (successes + attempts in flight, then attempts made), so
        # that a run stopped at any moment holds about as many episodes of every task.
        while (workers <= 1 and not inflight) or len(inflight) < workers:
            open_tasks = [t for t in tasks if succ[t] + pending(t) < n and next_attempt[t] < max_attempts]
            if not open_tasks:
                return
            t = min(open_tasks, key=lambda task: (succ[task] + pending(task), next_attempt[task], tasks.index(task)))
            while next_attempt[t] in done[t]:
                next_attempt[t] += 1
            if next_attempt[t] >= max_attempts:
                continue  # re-evaluated: t is no longer open
            k = next_attempt[t]
            next_attempt[t] += 1
            inflight[submit(t, k)] = t
            if workers <= 1:
                return

    def record(rec: dict) -> None:
        t = rec["task"]
        done[t][rec["attempt"]] = rec
        new_records.append(rec)
        with open(Path(out) / t / "attempts.jsonl", "a") as f:
            f.write(json.dumps(rec) + "\n")
        if rec["success"]:
            succ[t] += 1
            bar.update()
        bar.set_postfix(failed=sum(not r["success"] for r in new_records))

    args = lambda t, k: (t, k, seed + k, out, resolution, frames, shadows)  # noqa: E731
    if workers <= 1:
        _setup_worker()
        while True:
            submit_ready(lambda t, k: ("local", t, k))
            if not inflight:
                break
            (_, t, k), = inflight.keys()
            inflight.clear()
            record(run_attempt(*args(t, k)))
    else:
        _setup_worker()   # children inherit the environment
        pool = cf.ProcessPoolExecutor(workers, mp_context=mp.get_context("spawn"), initializer=_exit_with_parent)
        try:
            submit_ready(lambda t, k: pool.submit(run_attempt, *args(t, k)))
            while inflight:
                finished, _ = cf.wait(list(inflight), return_when=cf.FIRST_COMPLETED)
                for fut in finished:
                    inflight.pop(fut)
                    record(fut.result())
                submit_ready(lambda t, k: pool.submit(run_attempt, *args(t, k)))
        finally:  # interrupted (Ctrl-C) or failed: queue nothing more; a re-run resumes
            pool.shutdown(wait=False, cancel_futures=True)
    bar.close()
    wall = time.perf_counter() - t0
    stats = robot_shards.write_action_stats(out) if any(succ.values()) else None
    summary = {"tasks": {}, "resolution": resolution, "frames": frames, "workers": workers,
               "wall_s": round(wall, 2), "new_attempts": len(new_records)}
    for t in tasks:
        recs = list(done[t].values())
        summary["tasks"][t] = {"attempts": len(recs), "successes": sum(r["success"] for r in recs),
                               "success_rate": round(sum(r["success"] for r in recs) / max(len(recs), 1), 3),
                               "failures": sorted({f for r in recs for f in r["failures"]})}
    new_ok = sum(r["success"] for r in new_records)
    summary["episodes_per_minute"] = round(60.0 * new_ok / wall, 2) if new_ok else 0.0
    summary["action_stats_episodes"] = stats["episodes"] if stats else 0
    (Path(out) / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = errors.ArgumentParser(prog="python -m rynn_jax.sim.cli", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True, parser_class=errors.ArgumentParser)
    g = sub.add_parser("generate", help="write N successful episodes per task as robot shards", description=__doc__)
    g.add_argument("--task", default="all", help=f"one of {', '.join(scenes.TASKS)}, a comma list, or 'all'")
    g.add_argument("--n", type=int, required=True, help="successful episodes per task")
    g.add_argument("--out", required=True, help="output root (created; re-run to resume)")
    g.add_argument("--workers", type=int, default=1, help="worker processes (0/1: in this process)")
    g.add_argument("--resolution", default="tiny",
                   help="tiny 64×112 (tests), small 240×416, full 480×832, or HxW (e.g. 128x224)")
    g.add_argument("--frames", type=int, default=None, help="frames per episode at 16 fps (default 113)")
    g.add_argument("--seed", type=int, default=0, help="attempt k uses seed + k")
    g.add_argument("--shadows", action=argparse.BooleanOptionalAction, default=None,
                   help="key-light shadows (default: on except at tiny resolution)")
    g.add_argument("--max-attempts", type=int, default=None, help="per task (default 3N + 5)")
    g.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="persistent XLA compilation cache shared by the workers (the first worker's "
                        "compilation serves every later worker and run)")
    a = ap.parse_args(argv)
    try:
        parse_resolution(a.resolution)
    except ValueError as e:
        raise errors.UsageError(f"--resolution {a.resolution}: {e}") from None
    tasks = list(scenes.TASKS) if a.task == "all" else a.task.split(",")
    for t in tasks:
        if t not in scenes.TASKS:
            raise errors.UsageError(f"--task {t}: unknown", fix=f"choose from {', '.join(scenes.TASKS)} or all")
    if a.n < 1 or a.workers < 0 or (a.frames is not None and a.frames < 2) or \
            (a.max_attempts is not None and a.max_attempts < 1):
        raise errors.UsageError(f"--n {a.n}, --workers {a.workers}, --frames {a.frames}, --max-attempts "
                                f"{a.max_attempts}: need n ≥ 1, workers ≥ 0, frames ≥ 2, max-attempts ≥ 1")
    errors.writable_dir(a.out, "--out")
    if a.compile_cache:
        errors.writable_dir(a.compile_cache, "--compile-cache")
        os.environ[CACHE_ENV] = os.path.abspath(a.compile_cache)
    summary = generate(tasks, a.n, a.out, workers=a.workers, resolution=a.resolution, frames=a.frames,
                       seed=a.seed, shadows=a.shadows, max_attempts=a.max_attempts)
    print(json.dumps(summary, indent=1))
    short = [t for t in tasks if summary["tasks"][t]["successes"] < a.n]
    if short:
        print(f"fewer than {a.n} successes within --max-attempts for: {', '.join(short)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(errors.run(main))
