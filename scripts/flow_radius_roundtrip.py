"""How much flow survives an autoencoder, per colour-wheel radius: the sim's exact flow of each
episode is colour-coded at radius R (`geometry_video.flow_to_rgb`), sent through the autoencoder
and back, decoded to pixels, and compared with the exact flow (end-point error, px). `--no-vae`
scores the colour coding alone (8-bit quantisation + saturation beyond R).

    python scripts/flow_radius_roundtrip.py --vae weights/synthetic/autoencoder \
        --episodes 'data/synthetic/heldout_long/*/episode_000000' --radius 32 16 8 4 2
"""

from __future__ import annotations

import argparse
import glob
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--vae", default="weights/synthetic/autoencoder")
    p.add_argument("--no-vae", action="store_true", help="the colour coding alone")
    p.add_argument("--episodes", required=True, help="glob of episode folders with flow.npz")
    p.add_argument("--frames", type=int, default=33, help="video frames per episode (flow frames + 1)")
    p.add_argument("--radius", type=float, nargs="+", default=[32.0, 16.0, 8.0, 4.0, 2.0])
    a = p.parse_args()

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.data import geometry_video as gv
    from rynn_jax.models.vae_weights import load_vae
    from rynn_jax.training.autoencoder import Codec

    eps = sorted(glob.glob(a.episodes))
    eps = [e for e in eps if os.path.exists(os.path.join(e, "flow.npz"))]
    if not eps:
        p.error(f"--episodes {a.episodes}: no episode folder with a flow.npz")
    rec = None
    if not a.no_vae:
        rec = jax.jit(Codec(*nnx.split(load_vae(a.vae), nnx.Param)).reconstruct)
    print("| radius (px) | flow EPE (px) | zero-flow EPE (px) | pixels beyond the radius |")
    print("|---|---|---|---|")
    for r in a.radius:
        epe, zero, clipped = [], [], []
        for e in eps:
            with np.load(os.path.join(e, "flow.npz")) as z:
                flow = z[z.files[0]][:a.frames - 1].astype(np.float32)  # frame t: flow t → t + 1
            video = np.concatenate([np.full((1, *flow.shape[1:3], 3), 255, np.uint8), gv.flow_to_rgb(flow, r)])
            if rec is not None:
                y = np.asarray(rec(jnp.asarray(video[None], jnp.float32) / 127.5 - 1))[0]
                video = np.clip(np.round((y + 1) * 127.5), 0, 255).astype(np.uint8)
            back = gv.rgb_to_flow(video[1:], r)
            epe.append(np.hypot(*np.moveaxis(back - flow, -1, 0)).mean())
            zero.append(np.hypot(flow[..., 0], flow[..., 1]).mean())
            clipped.append(gv.clipped_fraction(flow, r))
        print(f"| {r:g} | {np.mean(epe):.3f} | {np.mean(zero):.3f} | {100 * np.mean(clipped):.2f} % |", flush=True)


if __name__ == "__main__":
    main()
