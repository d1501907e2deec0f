"""Synthetic-world benchmark: scripted success rate per task and generation throughput.

    python bench/bench_sim.py --success 20 --tiny 4 --full 1 --json bench_sim.json

* success: `--success` episodes per task without rendering (scene → stream → retarget → simulate
  → checks), success rate and failure reasons per task;
* throughput: `--tiny` / `--full` rendered episodes per resolution (cycling through the tasks),
  written as robot shards by `sim.cli.generate` in this process (`--workers` spawns processes),
  episodes/minute after the one-off compile, and the per-stage split.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rynn_jax.sim import cli, episode, robot_shards, scenes  # noqa: E402
from rynn_jax.sim.resolutions import RESOLUTIONS  # noqa: E402


def success_rates(n: int, seed0: int) -> dict:
    out = {}
    for task in scenes.TASKS:
        reasons: collections.Counter = collections.Counter()
        ok, t0 = 0, time.perf_counter()
        for s in range(seed0, seed0 + n):
            ep = episode.generate(task, s, render=False)
            ok += ep.success
            reasons.update(ep.failures)
        out[task] = {"episodes": n, "success_rate": round(ok / n, 3), "failures": dict(reasons),
                     "seconds_per_episode_no_render": round((time.perf_counter() - t0) / n, 3)}
    return out


def throughput(resolution: str, n: int, workers: int, seed0: int) -> dict:
    stages: dict[str, list[float]] = collections.defaultdict(list)
    with tempfile.TemporaryDirectory() as tmp:
        if workers <= 1:   # in-process: time each episode + export separately (compile excluded)
            episode.generate(scenes.TASKS[0], seed0, resolution=resolution, render=False)   # compile
            t0 = time.perf_counter()
            done = 0
            for i in range(n):
                task = scenes.TASKS[i % len(scenes.TASKS)]
                ep = episode.generate(task, seed0 + i, resolution=resolution)
                t1 = time.perf_counter()
                robot_shards.write_episode(ep, robot_shards.episode_dir(tmp, task, i))
                stages["export_s"].append(time.perf_counter() - t1)
                for k, v in ep.info["timings_s"].items():
                    stages[k].append(v)
                done += 1
            wall = time.perf_counter() - t0
            size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()) / max(done, 1)
        else:              # the CLI with worker processes (includes each worker's compile)
            per_task = max(1, n // len(scenes.TASKS))
            t0 = time.perf_counter()
            s = cli.generate(list(scenes.TASKS), per_task, tmp, workers=workers, resolution=resolution,
                             seed=seed0, progress=False)
            wall = time.perf_counter() - t0
            done = sum(t["successes"] for t in s["tasks"].values())
            size = sum(f.stat().st_size for f in Path(tmp).rglob("*") if f.is_file()) / max(done, 1)
    h, w = RESOLUTIONS[resolution]
    return {"resolution": [h, w], "episodes": done, "frames_per_episode": episode.DEFAULT_FRAMES,
            "workers": workers, "wall_s": round(wall, 2), "episodes_per_minute": round(60 * done / wall, 3),
            "stage_mean_s": {k: round(sum(v) / len(v), 3) for k, v in stages.items()},
            "shard_mb_per_episode": round(size / 2**20, 2)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--success", type=int, default=20, help="episodes per task for success rates (0: skip)")
    ap.add_argument("--tiny", type=int, default=4, help="rendered tiny episodes (0: skip)")
    ap.add_argument("--full", type=int, default=1, help="rendered full-resolution episodes (0: skip)")
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--seed", type=int, default=1000, help="first seed (distinct from the tests' 0..4)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    os.environ.setdefault("MUJOCO_GL", "osmesa")
    result = {"cpu_count": os.cpu_count()}
    if a.success:
        result["success"] = success_rates(a.success, a.seed)
        print(json.dumps(result["success"], indent=1), flush=True)
    for res, n in (("tiny", a.tiny), ("full", a.full)):
        if n:
            result[f"throughput_{res}"] = throughput(res, n, a.workers, a.seed)
            print(json.dumps(result[f"throughput_{res}"], indent=1), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
