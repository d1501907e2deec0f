"""Load test of `serve.py live`: N operator clients × M seconds on 127.0.0.1, latency percentiles,
aggregate generated FPS, and a leak check. Bounded: every run stops by itself.

    python bench/bench_live.py --clients 1,2 --seconds 20 --out bench/results/live_cpu.json    # tiny model, CPU
    python bench/bench_live.py --clients 1,2,4,8 --seconds 30 --out bench/results/live_h200.json \\
        -- --dit DIR --vae DIR --tae taew2_2.pth --resolution 480x832                              # the 5B student

One server in this process (the flags after `--` are `serve.py live`'s; `--max-sessions` is the
largest client count), compiled once. Per client count N: N clients connect, start (JPEG frames,
as the page), each plays a synthetic operator (its own seed) at `--hz` in real time for
`--seconds`, then stops. Latencies are the clients' own: a joint command's arrival − the send of
its frame; a block's arrival − the send of the frame that completed its newest tick (input →
generated frame). Aggregate FPS: generated frames received by all clients per second.

Checks: every client got joint commands and frames; after each run and a settling second the
server holds no session, its slots are free and its asyncio task count is back to the idle
count (RSS growth is reported, not checked: allocator caches).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _harness import write_json  # noqa: E402


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    v = np.asarray(values)
    return {"n": len(v), **{f"p{q}": round(float(np.percentile(v, q)), 2) for q in (50, 90, 99)},
            "max": round(float(v.max()), 2)}


async def operator(url: str, seed: int, seconds: float, hz: float) -> dict:
    from rynn_jax.live import protocol
    from rynn_jax.live.client import LiveClient
    from rynn_jax.teleop.camera_hands import synthetic_stream

    frames = protocol.frames_at(synthetic_stream(81, seed=seed), hz)
    span = frames[-1].t - frames[0].t + 1.0 / hz
    async with LiveClient(url, decode=False) as c:
        await c.start(frames="jpeg", prompt="")
        await c.until(lambda c: c.count("ready"), timeout=60)
        t0, k = time.monotonic(), 0
        while time.monotonic() - t0 < seconds:
            f = frames[k % len(frames)]
            t = (k // len(frames)) * span + f.t - frames[0].t
            wait = t0 + t - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            await c.frame(protocol.Frame(t, f.tracker_pose, f.tracker_valid, f.hand_keypoints, f.hand_valid), binary=True)
            k += 1
        elapsed = time.monotonic() - t0
        stats = c.of("stats")[-1] if c.count("stats") else {}
        await c.stop()
        await c.until(lambda c: c.closed, timeout=30)
    sent_t = np.asarray(sorted(c.sent))
    joints = [1e3 * (m["_rx"] - c.sent[m["t"]]) for m in c.of("joints")]
    blocks = []
    for m in c.of("block"):
        i = np.searchsorted(sent_t, m["t"][-1] - 1e-9)  # the first frame at or after the newest tick
        if i < len(sent_t):
            blocks.append(1e3 * (m["_rx"] - c.sent[sent_t[i]]))
    frames_out = sum(m["frames"] for m in c.of("block"))
    return {"frames_sent": k, "seconds": elapsed, "joints": len(joints), "frames_out": frames_out,
            "images": sum(kind == "G" for kind, *_ in c.images), "joint_ms": joints, "block_ms": blocks,
            "errors": [m["code"] for m in c.of("error")], "server_stats": stats}


async def run(server, n: int, seconds: float, hz: float) -> dict:
    url = f"ws://127.0.0.1:{server.port}/ws"
    idle_tasks = len(asyncio.all_tasks())
    before = server.stats()
    t0 = time.monotonic()
    results = await asyncio.gather(*(operator(url, seed, seconds, hz) for seed in range(n)))
    wall = time.monotonic() - t0
    await asyncio.sleep(1.0)
    after = server.stats()
    fps = [r["frames_out"] / r["seconds"] for r in results]
    row = {"sessions": n, "seconds": round(wall, 2), "hz": hz,
           "aggregate_fps": round(sum(fps), 2), "per_session_fps": [round(x, 2) for x in fps],
           "joint_latency_ms": percentiles([x for r in results for x in r["joint_ms"]]),
           "frame_latency_ms": percentiles([x for r in results for x in r["block_ms"]]),
           "joints_per_s": round(sum(r["joints"] for r in results) / wall, 1),
           "dropped": sum(r["server_stats"].get("dropped", 0) for r in results),
           "held": sum(r["server_stats"].get("held", 0) for r in results),
           "errors": sorted({e for r in results for e in r["errors"]}),
           "tasks_idle": idle_tasks, "tasks_after": len(asyncio.all_tasks()),
           "rss_mb_before": before["rss_mb"], "rss_mb_after": after["rss_mb"],
           "connections_after": after["connections"], "slots_taken_after": server.world.members}
    row["checks"] = {"every client got joints and frames": all(r["joints"] and r["images"] for r in results),
                     "no session left": after["connections"] == 0 and server.world.members == 0,
                     "no task left": row["tasks_after"] <= idle_tasks}
    print(f"{n} session(s): {row['aggregate_fps']} FPS aggregate, frame latency {row['frame_latency_ms']}, "
          f"joints {row['joint_latency_ms']}, dropped {row['dropped']}, held {row['held']}, "
          f"tasks {idle_tasks}→{row['tasks_after']}, RSS {before['rss_mb']}→{after['rss_mb']} MB", flush=True)
    return row


async def main_async(a, server_argv: list[str]) -> dict:
    import jax

    from rynn_jax.live import server as live

    counts = sorted({int(x) for x in a.clients.split(",")})
    sa = live.parser().parse_args(["--port", "0", "--max-sessions", str(counts[-1]), *server_argv])
    live.check(sa)
    t = time.perf_counter()
    server = live.build(sa)
    compile_s = time.perf_counter() - t
    await server.start()
    try:
        rows = [await run(server, n, a.seconds, a.hz) for n in counts]
    finally:
        await server.shutdown()
    return {"bench": "live", "backend": jax.default_backend(), "devices": [str(d) for d in jax.devices()],
            "slots": counts[-1], "resolution": [server.world.height, server.world.width], "weights": server.cfg.weights,
            "build_and_compile_s": round(compile_s, 1), "rows": rows,
            "ok": all(all(r["checks"].values()) for r in rows)}


def main() -> int:
    argv = sys.argv[1:]
    server_argv = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--clients", default="1,2", help="client counts to run, comma-separated")
    p.add_argument("--seconds", type=float, default=20.0, help="length of each run")
    p.add_argument("--hz", type=float, default=60.0, help="operator frames per second per client")
    p.add_argument("--out", default="bench/results/live.json")
    a = p.parse_args(argv)
    result = asyncio.run(main_async(a, server_argv))
    write_json(a.out, result)
    print(f"wrote {a.out}; checks {'ok' if result['ok'] else 'FAILED'}")
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
