"""Input-pipeline throughput on this machine: clips/s through the pixel path (decode 30 Hz video,
resample to 16 fps, resize + crop, skeleton) and through the latent path (read pre-encoded
ArrayRecord shards), with grain, batch size 1.

    python bench/bench_data.py --out bench/results/data_cpu.json
    python bench/bench_data.py --src-size 640x360 --clips 4      # quick smoke run

Synthetic EgoDex episodes at the real 1920×1080 are written first (frame-coded video); the latent
shards hold real-size records (81 frames → 21×30×52×48 float16 video + control latents, a 64-token
text embedding) made by a stand-in encoder, so the latent path measures I/O and decoding, not the
VAE.
Prints a table and writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from rynn_jax.data import (
    clips,  # noqa: E402
    shards,  # noqa: E402
)
from rynn_jax.data import fixtures as fx  # noqa: E402
from rynn_jax.data import pipeline as pl  # noqa: E402
from rynn_jax.data import preencode as pe  # noqa: E402
from rynn_jax.data.egodex import EgoDexSource  # noqa: E402


def timed_clips(ds, n: int, warmup: int) -> tuple[float, float]:
    """(seconds to first batch, steady clips/s over n batches after `warmup` more). The warm-up
    drains what the read-ahead buffers filled while the first batch was awaited."""
    it = iter(ds)
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    for _ in range(warmup):
        next(it)
    t0 = time.perf_counter()
    for _ in range(n):
        next(it)
    return first, n / (time.perf_counter() - t0)


def write_episodes(root: str, n_eps: int, n_src: int, w: int, h: int) -> None:
    for e in range(n_eps):
        j, el = fx.known_pose(n_src, e)
        fx.write_egodex_episode(root, "bench", e, j, el, width=w, height=h, seed=e)


def fake_latents(frames: int, height: int, width: int):
    t, hh, ww = 1 + (frames - 1) // 4, height // 16, width // 16

    def encode(video):
        rng = np.random.default_rng(int(video.shape[1]))
        return rng.standard_normal((video.shape[0], 1 + (video.shape[1] - 1) // 4, hh, ww, 48),
                                   dtype=np.float32)
    return encode, (t, hh, ww)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--src-size", default="1920x1080", help="synthetic source video WxH")
    p.add_argument("--frames", type=int, default=81)
    p.add_argument("--height", type=int, default=480)
    p.add_argument("--width", type=int, default=832)
    p.add_argument("--clips", type=int, default=8, help="clips to time per path (after the first)")
    p.add_argument("--workers", type=int, nargs="+", default=[0, 2], help="grain worker counts")
    p.add_argument("--threads", type=int, default=2, help="read threads per process")
    p.add_argument("--out", default="bench/results/data_cpu.json")
    a = p.parse_args()
    w, h = (int(x) for x in a.src_size.split("x"))
    cfg = clips.ClipConfig(num_frames=a.frames, height=a.height, width=a.width)
    n_src = int(np.ceil((a.frames + 0.5) * 30 / 16)) + 1  # one clip per episode
    rows = []
    with tempfile.TemporaryDirectory() as d:
        t0 = time.perf_counter()
        write_episodes(os.path.join(d, "egodex"), 3, n_src, w, h)
        print(f"wrote 3 synthetic {w}x{h} episodes in {time.perf_counter() - t0:.1f}s")
        src = EgoDexSource(os.path.join(d, "egodex"), cfg)
        for wc in a.workers:
            lcfg = pl.LoaderConfig(batch_size=1, seed=0, worker_count=wc, read_threads=a.threads,
                                   read_buffer=2, worker_buffer_size=1)
            warm = (wc or 1) * (a.threads + 2)
            first, rate = timed_clips(pl.prefetch(pl.pixel_dataset(src, lcfg), lcfg), a.clips, warm)
            rows.append(dict(path="pixel", workers=wc, threads=a.threads, clips_per_s=rate,
                             first_batch_s=first))
        encode, _ = fake_latents(a.frames, a.height, a.width)
        out = os.path.join(d, "latents")
        pe.preencode(src, out, encode_video=encode, render_control=lambda s: s["video"],
                     embed_text=lambda t: np.ones((64, 4096), np.float32),  # a typical prompt length
                     cfg=pe.PreencodeConfig(records_per_shard=2))
        paths = shards.list_shards(out, "egodex")
        rec_mb = os.path.getsize(paths[0]) / shards.num_records(paths[0]) / 2**20
        for wc in a.workers:
            lcfg = pl.LoaderConfig(batch_size=1, seed=0, worker_count=wc, read_threads=a.threads,
                                   read_buffer=2, worker_buffer_size=1)
            warm = (wc or 1) * (a.threads + 2)
            first, rate = timed_clips(pl.prefetch(pl.latent_dataset(paths, lcfg), lcfg), a.clips, warm)
            rows.append(dict(path="latent", workers=wc, threads=a.threads, clips_per_s=rate,
                             first_batch_s=first, record_mb=rec_mb))
    print(f"\n{'path':8s} {'workers':>7s} {'threads':>7s} {'clips/s':>9s} {'first batch s':>14s}")
    for r in rows:
        print(f"{r['path']:8s} {r['workers']:7d} {r['threads']:7d} {r['clips_per_s']:9.2f} "
              f"{r['first_batch_s']:14.2f}")
    meta = dict(machine=platform.machine(), cpus=os.cpu_count(), src_size=a.src_size, frames=a.frames,
                out_size=f"{a.width}x{a.height}", argv=sys.argv[1:])
    os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
    with open(a.out, "w") as f:
        json.dump(dict(rows=rows, **meta), f, indent=1)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
