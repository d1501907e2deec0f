"""FP8 static activation scales calibrated on pre-encoded training clips.

    python serve.py calibrate-fp8 --latents SHARD_DIR --out scales.safetensors [--dit DIR] [--clips 16]

Static scales (`models/fp8.py`, `WanDiTConfig.fp8_activations="static"`) make the FP8 DiT a little
faster (H200 end to end: 80.4–84.6 FPS against 80.1–80.2 with per-token scales in the same calls;
docs/PERFORMANCE.md), but an input beyond a layer's calibrated range saturates, so the calibration
inputs must look like what is served. Here they come from the
latent shards `rynn_jax.data.preencode` writes: per clip, one window of `frames_per_block` latent
frames noised to each timestep of the 4-step student (x_σ = (1 − σ)·x0 + σ·ε, σ = t / 1000) plus
the clean t = 0 cache pass, with the clip's skeleton latents and text embedding. The file holds
only the scales (a few KB); the weights stay in their checkpoint and are quantized at load:
`serve.py demo --fp8 --fp8-scales FILE`, or
`fp8.with_static_scales(fp8.quantize_dit(dit), fp8.load_scales(FILE))`.

    python serve.py calibrate-vae-fp8 --latents SHARD_DIR --vae DIR --out vae_scales.safetensors [--clips 16]

does the same for the VAE decoder's FP8 convs (`kernels/vae_fp8.py`: H200 decode chunk at 480×832
36.0 ms with static scales vs ≈ 49–50 in bf16): each clip's normalized video latents, a window of
`--frames` latent frames, decoded whole while every kernel conv records max|input|. Serve with
`serve.py demo --vae DIR --vae-fp8-scales FILE` or `vae_fp8.load_static(vae, FILE)`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
from tqdm import tqdm

from rynn_jax import errors
from rynn_jax.atomic import atomic_file
from rynn_jax.models.dit import WanDiTConfig


def read_clips(latent_dir: str, limit: int) -> list[dict[str, np.ndarray]]:
    """The first `limit` records of the finished shards in `latent_dir`, in shard order. A shard
    that cannot be read is an error naming it (calibrating on fewer clips than asked, silently,
    would change the scales)."""
    # Imported here: rynn_jax.data pulls in the video decoder (PyAV), which serving hosts may lack.
    from rynn_jax.data import shards as shards_lib

    paths = shards_lib.list_shards(latent_dir)
    if not paths:
        raise errors.InputError(f"{latent_dir}: no latent shards (*-of-*{shards_lib.SHARD_SUFFIX}; "
                         "write them with python -m rynn_jax.data.preencode)")
    clips: list[dict[str, np.ndarray]] = []
    for path in paths:
        try:
            clips += shards_lib.read_shard(path)
        except Exception as e:  # ArrayRecord and np.load raise several types for a damaged file
            raise errors.InputError(f"{path}: cannot read latent shard ({type(e).__name__}: {e})") from e
        if len(clips) >= limit:
            break
    return clips[:limit]


def calibration_batches(clips: Iterable[dict[str, np.ndarray]], cfg: WanDiTConfig, *, frames: int,
                        timesteps: Sequence[float], seed: int = 0) -> Iterator[tuple[np.ndarray, ...]]:
    """(z_t, t, text, control) batches of one sample each: per clip a random window of `frames`
    latent frames at every timestep (float32 host arrays, as `WanDiT.__call__` takes them)."""
    rng = np.random.default_rng(seed)
    for i, rec in enumerate(clips):
        missing = {"video_latents", "control_video_latents", "text_embedding"} - set(rec)
        if missing:
            raise errors.InputError(f"clip {i}: record lacks {sorted(missing)} (not a preencode latent record?)")
        x0, ctrl = (np.asarray(rec[k], np.float32) for k in ("video_latents", "control_video_latents"))
        emb = np.asarray(rec["text_embedding"], np.float32)
        if x0.ndim != 4 or x0.shape[-1] != cfg.in_channels or ctrl.shape[:3] != x0.shape[:3]:
            raise errors.InputError(f"clip {i}: latents {x0.shape} / control {ctrl.shape} do not fit a DiT with "
                             f"{cfg.in_channels} input channels")
        if x0.shape[0] < frames:
            raise errors.InputError(f"clip {i}: {x0.shape[0]} latent frames, a block needs {frames}")
        if emb.ndim != 2 or emb.shape[1] != cfg.text_dim:
            raise errors.InputError(f"clip {i}: text embedding {emb.shape}, the DiT takes (S, {cfg.text_dim})")
        text = np.zeros((1, cfg.text_len, cfg.text_dim), np.float32)
        text[0, :min(cfg.text_len, len(emb))] = emb[:cfg.text_len]
        start = int(rng.integers(0, x0.shape[0] - frames + 1))
        x0_w, ctrl_w = x0[None, start:start + frames], ctrl[None, start:start + frames]
        for t in timesteps:
            sigma = np.float32(t / 1000.0)
            z = (1 - sigma) * x0_w + sigma * rng.standard_normal(x0_w.shape).astype(np.float32)
            yield z, np.full((1, frames), t, np.float32), text, ctrl_w


def calibration_timesteps() -> list[float]:
    """The model timesteps a served block sees: the 4-step student's, then 0 (the clean cache pass)."""
    from rynn_jax.serving.block_step import StepConfig, step_schedule

    return [float(t) for t in step_schedule(StepConfig())[0]] + [0.0]


def fp8_distance(float_model, per_token, static, batch: tuple) -> dict[str, float]:
    """Relative L2 distance of the per-token and static FP8 models' outputs from the float model's
    on one batch `model(*batch)` (each model jitted with its own compiler options)."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.models import fp8

    outs = {}
    for name, m in (("float", float_model), ("fp8_per_token", per_token), ("fp8_static", static)):
        graphdef, state = nnx.split(m)
        fwd = jax.jit(lambda s, b, g=graphdef: nnx.merge(g, s)(*b), compiler_options=fp8.compiler_options(m.cfg))
        outs[name] = np.asarray(fwd(state, tuple(jnp.asarray(x) for x in batch)), np.float64)
    return {k: float(np.linalg.norm(outs[k] - outs["float"]) / np.linalg.norm(outs["float"]))
            for k in ("fp8_per_token", "fp8_static")}


def main(argv: list[str] | None = None) -> dict:
    from rynn_jax.models import fp8
    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.serving.assemble import build_dit

    p = errors.ArgumentParser(prog="python serve.py calibrate-fp8", description=__doc__)
    p.add_argument("--latents", required=True, help="directory of latent shards (rynn_jax.data.preencode)")
    p.add_argument("--out", required=True, help="scales file to write (.safetensors)")
    p.add_argument("--dit", default=None, help="converted DiT directory or official checkpoint (default: the "
                                               "demo's tiny random model)")
    p.add_argument("--clips", type=int, default=16, help="clips to calibrate on (one block window each)")
    p.add_argument("--margin", type=float, default=1.0, help="scale = margin · max |input| / 448 (≥ 1)")
    p.add_argument("--seed", type=int, default=0, help="window and noise draws (and the tiny model's init)")
    a = p.parse_args(argv)
    if a.clips < 1:
        raise errors.UsageError(f"--clips {a.clips}: must be ≥ 1")
    errors.existing(a.latents, "--latents", kind="directory")
    if a.dit is not None:
        errors.existing(a.dit, "--dit")
    errors.writable_dir(os.path.dirname(os.path.abspath(a.out)), "--out")
    clips = read_clips(a.latents, a.clips)  # before the model: a bad shard fails fast
    dit = build_dit(a.dit, a.seed)
    timesteps = calibration_timesteps()
    frames = CausalConfig().frames_per_block
    batches = list(calibration_batches(clips, dit.cfg, frames=frames, timesteps=timesteps, seed=a.seed))
    quantized = fp8.quantize_dit(dit)
    static = fp8.calibrate(quantized, lambda m, b: m(*b), tqdm(batches, desc="calibrate", unit="batch"),
                           margin=a.margin)

    rel = fp8_distance(dit, quantized, static, batches[1])  # per-token vs static, on one calibration batch

    with atomic_file(a.out) as tmp:
        fp8.save_scales(tmp, static, clips=str(len(clips)), timesteps=json.dumps(timesteps), margin=str(a.margin),
                        latents=os.path.basename(os.path.normpath(a.latents)))
    summary = dict(out=os.path.abspath(a.out), clips=len(clips), batches=len(batches), timesteps=timesteps,
                   margin=a.margin, rel_l2_vs_float_on_one_batch=rel)
    print(json.dumps(summary, indent=1))
    return summary


def vae_calibration_batches(clips: Iterable[dict[str, np.ndarray]], z_dim: int, *, frames: int,
                            seed: int = 0) -> Iterator[np.ndarray]:
    """(1, frames, h, w, z) float32 windows of each clip's normalized video latents (what the DiT
    hands the decoder when serving), one random window per clip."""
    rng = np.random.default_rng(seed)
    for i, rec in enumerate(clips):
        if "video_latents" not in rec:
            raise errors.InputError(f"clip {i}: record lacks 'video_latents' (not a preencode latent record?)")
        x0 = np.asarray(rec["video_latents"], np.float32)
        if x0.ndim != 4 or x0.shape[-1] != z_dim:
            raise errors.InputError(f"clip {i}: latents {x0.shape} do not fit a VAE with {z_dim} latent channels")
        if x0.shape[0] < frames:
            raise errors.InputError(f"clip {i}: {x0.shape[0]} latent frames, fewer than --frames {frames}")
        if not np.isfinite(x0).all():
            raise errors.InputError(f"clip {i}: non-finite latents")
        start = int(rng.integers(0, x0.shape[0] - frames + 1))
        yield x0[None, start:start + frames]


def main_vae(argv: list[str] | None = None) -> dict:
    """`serve.py calibrate-vae-fp8`: static FP8 scales for the VAE decoder's kernel convs."""
    import functools

    import jax
    import jax.numpy as jnp
    from flax import nnx

    from rynn_jax.kernels import vae_fp8
    from rynn_jax.models import vae as vae_lib
    from rynn_jax.models.vae_weights import load_vae

    p = errors.ArgumentParser(prog="python serve.py calibrate-vae-fp8",
                              description="Static FP8 activation scales for the VAE decoder's convs")
    p.add_argument("--latents", required=True, help="directory of latent shards (rynn_jax.data.preencode)")
    p.add_argument("--vae", required=True, help="converted VAE directory or official checkpoint")
    p.add_argument("--out", required=True, help="scales file to write (.safetensors)")
    p.add_argument("--clips", type=int, default=16, help="clips to calibrate on (one window each)")
    p.add_argument("--frames", type=int, default=3, help="latent frames per window (3 → 9 video frames)")
    p.add_argument("--margin", type=float, default=1.0, help="scale = margin · max |input| / 448 (≥ 1)")
    p.add_argument("--seed", type=int, default=0, help="window draws")
    a = p.parse_args(argv)
    if a.clips < 1 or a.frames < 1:
        raise errors.UsageError(f"--clips {a.clips} / --frames {a.frames}: must be ≥ 1")
    errors.existing(a.latents, "--latents", kind="directory")
    errors.existing(a.vae, "--vae")
    errors.writable_dir(os.path.dirname(os.path.abspath(a.out)), "--out")
    clips = read_clips(a.latents, a.clips)  # before the model: a bad shard fails fast
    vae = load_vae(a.vae)
    batches = list(vae_calibration_batches(clips, vae.cfg.z_dim, frames=a.frames, seed=a.seed))
    scales = vae_fp8.calibrate(vae, vae_fp8.decode_clip, tqdm(batches, desc="calibrate", unit="clip"),
                               margin=a.margin)

    # How far the served decoder lands from the float one, on the first window (each decode jitted:
    # op by op, a full-size decoder would crawl).
    def decoded(model) -> np.ndarray:
        graphdef, params = nnx.split(model)
        return np.asarray(jax.jit(functools.partial(vae_lib.decode, graphdef))(params, z), np.float64)

    z = jnp.asarray(batches[0])
    served = vae_fp8.with_static_scales(vae, scales, conv_impl=vae_fp8.fp8_conv_impl())
    ref, got = decoded(vae), decoded(served)
    rel = float(np.linalg.norm(got - ref) / np.linalg.norm(ref))

    with atomic_file(a.out) as tmp:
        vae_fp8.save_scales(tmp, scales, clips=str(len(clips)), frames=str(a.frames), margin=str(a.margin),
                            latents=os.path.basename(os.path.normpath(a.latents)))
    summary = dict(out=os.path.abspath(a.out), clips=len(clips), frames=a.frames, convs=len(scales),
                   margin=a.margin, conv_impl=served.cfg.conv_name, rel_l2_vs_float_on_one_window=rel)
    print(json.dumps(summary, indent=1))
    return summary
