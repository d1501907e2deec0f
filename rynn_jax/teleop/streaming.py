"""Real-time generation with the causal student: the step function, streaming VAE I/O, re-anchoring.

Three levels, each usable alone:
  * pure functions of (params, state, inputs) — `make_start`, `make_step`, `anchor_state` for
    latents, `make_stream_step` / `make_stream_anchor` for pixels (VAE caches carried in the
    state). These are what gets jitted once and exported (`rynn_jax.step_export`).
  * `CausalStudent`: the jitted latent-level functions with input checks on the host, before any
    device work.
  * `StreamingSession`: skeleton frames in, RGB frames out, re-anchoring every chunk.

One step = a few-step denoise of one block of `frames_per_block` latent frames against the KV cache
(4 steps, shift 5 → timesteps [999, 937, 833, 624]), then one t = 0 pass that writes the clean
block into the cache. Solvers: "x0_euler" (Self-Forcing style: predict x0, re-noise to the next
sigma with fresh noise) and "unipc" (the released multistep solver on the same sigmas).

Frame 0 of every chunk is the reference image latent (clean, t = 0): in the chunk's first block it
is pinned before every model call, as TI2V sampling does. B sessions run in lock step (one chunk
clock), each with its own reference, text, control and noise. There is no future ground truth: an
add-plus control branch aligns each block with the statistics the model carries (the running
clean-video statistics recorded in training; models/control.py), never updating them.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.diffusion import samplers, x0_euler
from rynn_jax.models import causal
from rynn_jax.models import tae as tae_lib
from rynn_jax.models import vae as vae_lib
from rynn_jax.models.dit import WanDiT, unrolled
from rynn_jax.models.fp8 import compiler_options
from rynn_jax.models.tae import TinyAutoencoder
from rynn_jax.models.vae import WanVAE

State = dict[str, Any]  # plain dicts of arrays: jit/export friendly


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepConfig:
    num_steps: int = 4  # denoising model calls per block (plus the clean cache-writing pass)
    shift: float = 5.0  # flow-schedule shift; 4 steps → timesteps [999, 937, 833, 624]
    solver: Literal["x0_euler", "unipc"] = "x0_euler"
    # StreamingSession only: run a block's clean cache-writing pass together with the next block's
    # first denoising pass, as one forward over both blocks (`make_deferred_step`); same results.
    # Off here (the latent-level step and export run the passes in turn); on in SERVING_STEPS.
    merge_clean_pass: bool = False
    # Per-layer (unrolled, served) DiTs, x0_euler: a block's passes share one rotated working copy of the cache,
    # written in place (causal.working_kv); False: every pass copies the cache (forward_block). Same results.
    working_cache: bool = True

    def __post_init__(self) -> None:
        if self.merge_clean_pass and self.solver != "x0_euler":
            raise ValueError("merge_clean_pass needs the x0_euler solver (its first step is run separately)")


# What StreamingSession serves with unless told otherwise: the merged clean pass (same frames; on one
# H200 at 480×832, 73.2 → 74.8 FPS bf16 and 83.7 → 87.6 FPS FP8, docs/PERFORMANCE.md).
SERVING_STEPS = StepConfig(merge_clean_pass=True)


def step_schedule(scfg: StepConfig) -> tuple[np.ndarray, np.ndarray]:
    """Model timesteps (N,) float32 and solver sigmas (N + 1,) ending at 0 (`x0_euler.schedule`)."""
    return x0_euler.schedule(scfg.num_steps, scfg.shift)


# --------------------------------------------------------------------------------------------------
# Latent level: pure functions
# --------------------------------------------------------------------------------------------------


def make_start(graphdef: nnx.GraphDef, ccfg: causal.CausalConfig) -> Callable:
    """start(params, ref_latent_b1hwc, ctx_bsk) -> state: empty cache + the session's text K/V."""

    def start(params: nnx.State, ref_latent_b1hwc: jax.Array, ctx_bsk: jax.Array) -> State:
        model = nnx.merge(graphdef, params)
        cache = causal.init_cache(model, ccfg, ctx_bsk, ref_latent_b1hwc.shape[2:4])
        return {"cache": cache, "ref_latent": ref_latent_b1hwc.astype(jnp.float32)}

    return start


def anchor_state(state: State, ref_latent_b1hwc: jax.Array) -> State:
    """Re-anchoring: a new chunk on a new reference latent (text K/V kept)."""
    return {"cache": causal.restart_chunk(state["cache"]), "ref_latent": ref_latent_b1hwc.astype(jnp.float32)}


def make_step(graphdef: nnx.GraphDef, ccfg: causal.CausalConfig, scfg: StepConfig) -> Callable:
    """step(params, state, control_latents_block, rng) -> (latents_block, state)."""
    timesteps_n, sigmas_n1 = step_schedule(scfg)

    def step(params: nnx.State, state: State, control_bfhwc: jax.Array, rng: jax.Array) -> tuple[jax.Array, State]:
        model = nnx.merge(graphdef, params)
        cache = state["cache"]
        b, f = control_bfhwc.shape[:2]
        rng, noise, pin_f, pin = _block_setup(state, control_bfhwc, rng, cache["frames"])
        in_place = scfg.working_cache and causal.has_working_path(model) and scfg.solver == "x0_euler"
        velocity = _velocity(model, cache, ccfg, control_bfhwc, pin_f, pin, in_place)

        if scfg.solver == "unipc":
            x0 = samplers.sample_unipc(lambda x, t: velocity(x, t, None)[0], noise, num_steps=scfg.num_steps,
                                       shift=scfg.shift)
            work = None
        else:
            work = causal.working_kv(model, cache, ccfg, cache["frames"], control_bfhwc.shape) if in_place else None
            _, x0, work = x0_euler.run(velocity, noise, rng, timesteps_n, sigmas_n1, carry=work)
        x0 = pin(x0)
        # The clean pass: K/V of the finished block at t = 0 become context for later blocks.
        t_clean = jnp.zeros((b, f), jnp.float32)
        if in_place:
            _, cache, _ = causal.forward_block_in_place(model, cache, work, ccfg, x0, t_clean, control_bfhwc,
                                                        write=True)
        else:
            _, cache = causal.forward_block(model, cache, ccfg, x0, t_clean, control_bfhwc, write=True)
        return x0, {**state, "cache": cache}

    return step


def make_deferred_step(graphdef: nnx.GraphDef, ccfg: causal.CausalConfig, scfg: StepConfig, *,
                       after_clean: bool) -> Callable:
    """`make_step` with the block's clean cache-writing pass left to the next block:
    step(params, state, control, rng, clean_x0, clean_control) -> (x0, state). With `after_clean`,
    the previous block (clean_x0, its control latents) is written to the cache in the same forward
    as this block's first denoising pass (`causal.forward_block_after_clean`); without (a chunk's
    first block), clean_* are ignored. The caller keeps (x0, control) for the next call; a chunk's
    last block is never written (re-anchoring empties the cache anyway). Same outputs as
    `make_step` up to float rounding, one forward fewer per chunk, and 4 instead of 5 passes per
    block of which one is twice as tall. x0_euler solver only."""
    if scfg.solver != "x0_euler":
        raise ValueError("make_deferred_step needs the x0_euler solver")
    timesteps_n, sigmas_n1 = step_schedule(scfg)

    def step(params: nnx.State, state: State, control_bfhwc: jax.Array, rng: jax.Array,
             clean_x0_bfhwc: jax.Array, clean_control_bfhwc: jax.Array) -> tuple[jax.Array, State]:
        model = nnx.merge(graphdef, params)
        cache = state["cache"]
        b, f = control_bfhwc.shape[:2]
        first_frame = cache["frames"] + (clean_x0_bfhwc.shape[1] if after_clean else 0)
        rng, noise, pin_f, pin = _block_setup(state, control_bfhwc, rng, first_frame)
        t_of = lambda t: x0_euler.pinned_t(pin_f, jnp.full((b, f), t, jnp.float32))  # noqa: E731
        # Serving (per-layer blocks): one working copy of the cache for the block's passes, made
        # before the clean block is written where the merged pass can use it (policy "full").
        in_place = scfg.working_cache and causal.has_working_path(model)
        work_first = in_place and (not after_clean or ccfg.policy == "full")
        if work_first:
            work = causal.working_kv(model, cache, ccfg, first_frame, control_bfhwc.shape)

        if after_clean:  # step 0 together with the previous block's clean pass, then the rest
            if work_first:
                v, cache, work = causal.forward_block_after_clean_in_place(
                    model, cache, work, ccfg, clean_x0_bfhwc, clean_control_bfhwc, pin(noise),
                    t_of(timesteps_n[0]), control_bfhwc)
            else:
                v, cache = causal.forward_block_after_clean(model, cache, ccfg, clean_x0_bfhwc, clean_control_bfhwc,
                                                            pin(noise), t_of(timesteps_n[0]), control_bfhwc)
            x, _ = x0_euler.update(noise, v, rng, 0, np.float32(sigmas_n1[0]), np.float32(sigmas_n1[1]))
            first = 1
        else:
            x, first = noise, 0
        if in_place and not work_first:
            work = causal.working_kv(model, cache, ccfg, first_frame, control_bfhwc.shape)

        velocity = _velocity(model, cache, ccfg, control_bfhwc, pin_f, pin, in_place)
        _, x0, _ = x0_euler.run(velocity, x, rng, timesteps_n, sigmas_n1, first=first,
                                carry=work if in_place else None)
        return pin(x0), {**state, "cache": cache}

    return step


def _velocity(model: WanDiT, cache: causal.KVCache, ccfg: causal.CausalConfig, control_bfhwc: jax.Array,
              pin_f: jax.Array, pin: Callable, in_place: bool) -> Callable:
    """velocity(x, t, work) -> (v, work) of a block's denoising pass against `cache` (not written),
    its chunk frame 0 pinned to the reference at t = 0. `in_place`: over the block's working copy
    `work` (`causal.working_kv`), which it returns with the pass's K/V written; else `work` is
    passed through and every pass copies the cache (`causal.forward_block`)."""

    def velocity(x_bfhwc: jax.Array, t_bf: jax.Array, work: causal.Work | None):
        t_bf = x0_euler.pinned_t(pin_f, t_bf)
        if in_place:
            v, _, work = causal.forward_block_in_place(model, cache, work, ccfg, pin(x_bfhwc), t_bf, control_bfhwc,
                                                       write=False)
            return v, work
        return causal.forward_block(model, cache, ccfg, pin(x_bfhwc), t_bf, control_bfhwc, write=False)[0], work

    return velocity


def _block_key(rng: jax.Array, block: int | jax.Array) -> jax.Array:
    """The raw key data a session's step gets for its `block`-th block."""
    return jax.random.key_data(x0_euler.fold_in(rng, block))


@dataclasses.dataclass(frozen=True)
class BlockFrames:
    """Skeleton frames a block takes (= RGB frames it returns) for F latent frames per block."""
    session_first: int  # the session's first block: 1 + 4(F−1)
    chunk_first: int  # a re-anchored chunk's first block: 4(F−1) (its frame 0 is the anchor, already shown)
    later: int  # every other block: 4F

    @classmethod
    def of(cls, frames_per_block: int) -> BlockFrames:
        return cls(1 + 4 * (frames_per_block - 1), 4 * (frames_per_block - 1), 4 * frames_per_block)


# The session's small programs at block seams (`StreamingSession._executables` compiles them ahead
# with the big ones, so no block waits for a first-use compile of an eager op).
def _pad_session_first(skel_bthw3: jax.Array) -> jax.Array:
    """The session's first block, 1 + 4(F−1) frames → 4F: its frame 0 repeated 4× (the chunk's
    frame 0 is read at index 3)."""
    return jnp.concatenate([jnp.repeat(skel_bthw3[:, :1], 4, 1), skel_bthw3[:, 1:]], 1)


def _pad_chunk_first(last_b1hw3: jax.Array, skel_bthw3: jax.Array) -> jax.Array:
    """A re-anchored chunk's first block, 4(F−1) frames → 4F: the previous block's last skeleton
    frame stands for the anchor's."""
    return jnp.concatenate([jnp.repeat(last_b1hw3, 4, 1), skel_bthw3], 1)


def _seam_programs() -> dict[str, Callable]:
    """name → jitted seam program; `_executables` lowers each for the session's shapes."""
    return {"pad_session_first": jax.jit(_pad_session_first), "pad_chunk_first": jax.jit(_pad_chunk_first),
            "last_frame": jax.jit(lambda x: x[:, -1:]), "block_key": jax.jit(_block_key),
            # the first block's output: drop the decoder's padding (and, re-anchored, the repeated anchor)
            "drop_3": jax.jit(lambda rgb: rgb[:, 3:]), "drop_4": jax.jit(lambda rgb: rgb[:, 4:])}


def _block_setup(state: State, control_bfhwc: jax.Array, rng: jax.Array, first_frame: jax.Array):
    """(key, the block's initial noise, which frames are the chunk's frame 0, a function pinning
    those to the reference latent) for a block that starts at chunk frame `first_frame`."""
    ref = state["ref_latent"]
    b, f = control_bfhwc.shape[:2]
    rng = x0_euler.as_key(rng)
    noise = x0_euler.block_noise(rng, (b, f, *ref.shape[2:]))
    return (rng, noise, *x0_euler.reference_pin(ref, first_frame, f))


# --------------------------------------------------------------------------------------------------
# Latent level: jitted, checked
# --------------------------------------------------------------------------------------------------


class CausalStudent:
    """The causal DiT split once, its start/step jitted once (the state is donated).
    `unroll_layers`: serve the layers unrolled (`dit.unrolled`; faster, longer compile)."""

    def __init__(self, model: WanDiT, ccfg: causal.CausalConfig = causal.CausalConfig(),
                 scfg: StepConfig = StepConfig(), *, unroll_layers: bool = True):
        self.cfg, self.ccfg, self.scfg = model.cfg, ccfg, scfg
        self.graphdef, self.params = nnx.split(unrolled(model) if unroll_layers else model)
        opts = compiler_options(model.cfg)
        self.start_fn = jax.jit(make_start(self.graphdef, ccfg), compiler_options=opts)
        self.step_fn = jax.jit(make_step(self.graphdef, ccfg, scfg), donate_argnums=1, compiler_options=opts)
        self.anchor_fn = jax.jit(anchor_state, donate_argnums=0)

    def start(self, ref_latent_b1hwc: jax.Array, ctx_bsk: jax.Array) -> State:
        return self.start_fn(self.params, ref_latent_b1hwc, ctx_bsk)

    def step(self, state: State, control_bfhwc: jax.Array | np.ndarray, rng: jax.Array) -> tuple[jax.Array, State]:
        check_step_inputs(self.cfg, self.ccfg, state, control_bfhwc)
        # One dtype, one executable (a bf16 or float64 block would otherwise compile anew).
        return self.step_fn(self.params, state, jnp.asarray(control_bfhwc, jnp.float32), rng)

    def anchor(self, state: State, ref_latent_b1hwc: jax.Array) -> State:
        return self.anchor_fn(state, ref_latent_b1hwc)


def check_step_inputs(cfg, ccfg: causal.CausalConfig, state: State, control_bfhwc: Any) -> None:
    """Shape, dtype and finiteness of a step's control block, with clear messages. Shapes come from
    the state's metadata (no transfer); finiteness is checked on the host for host arrays and by
    one tiny reduction (not the step) for device arrays."""
    ref = state["ref_latent"]
    want = (ref.shape[0], ccfg.frames_per_block, ref.shape[2], ref.shape[3],
            cfg.control_channels if cfg.control != "none" else cfg.in_channels)
    shape = tuple(getattr(control_bfhwc, "shape", ()))
    if shape != want:
        raise ValueError(f"control block must be (B, frames_per_block, h, w, C) = {want}, got {shape}")
    if not jnp.issubdtype(control_bfhwc.dtype, jnp.floating):
        raise ValueError(f"control block must be floating point, got {control_bfhwc.dtype}")
    finite = np.isfinite(control_bfhwc).all() if isinstance(control_bfhwc, np.ndarray) \
        else bool(_all_finite(control_bfhwc))
    if not finite:
        raise ValueError("control block contains NaN or Inf")


@jax.jit
def _all_finite(x: jax.Array) -> jax.Array:
    return jnp.isfinite(x).all()


def check_frames(what: str, frames: Any) -> None:
    """Host frames (numpy) must be finite RGB in [-1, 1], checked in one pass (an 8-bit frame
    passed as is would otherwise stream garbage). Device arrays are taken as they are: checking
    them would wait for the device."""
    if isinstance(frames, np.ndarray) and frames.size:
        lo, hi = float(frames.min()), float(frames.max())  # NaN propagates; no temporary array
        if not (np.isfinite(lo) and np.isfinite(hi)):
            raise ValueError(f"{what} contain NaN or Inf")
        peak = max(-lo, hi)
        if peak > 1.0 + 1e-3:
            raise ValueError(f"{what} must be RGB in [-1, 1]; got values up to {peak:g} "
                             "(8-bit frames: x / 127.5 - 1)")


# --------------------------------------------------------------------------------------------------
# Pixel level: streaming VAE around the step
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Codec:
    """How one pixel codec streams: its module's functions (`rynn_jax.models.vae`, the exact Wan2.2
    VAE, or `rynn_jax.models.tae`, the tiny autoencoder of the same latent space: same signatures)
    and its graphdef. Its params travel separately, as jit arguments. `whole_blocks`: the codec
    streams a whole block (F latents ↔ 4F frames) in one call, the same result as F calls (the tiny
    autoencoder: one frame of memory per layer, so its chunks run in parallel over time); the Wan
    VAE takes one chunk per call, in a scan."""
    lib: Any
    graphdef: nnx.GraphDef
    cfg: Any
    whole_blocks: bool = False

    @classmethod
    def split(cls, model: WanVAE | TinyAutoencoder) -> tuple[Codec, nnx.State]:
        graphdef, params = nnx.split(model)
        if isinstance(model, TinyAutoencoder):
            return cls(tae_lib, graphdef, model.cfg, whole_blocks=True), params
        return cls(vae_lib, graphdef, model.cfg), params

    def encode_chunk(self, params: nnx.State, cache: Any, frames_bthw3: jax.Array,
                     first: bool | None = None) -> tuple[jax.Array, Any]:
        return self.lib.encode_chunk(self.graphdef, params, cache, frames_bthw3, first=first)

    def decode_chunk(self, params: nnx.State, cache: Any, latents_bfhwc: jax.Array,
                     first: bool | None = None) -> tuple[jax.Array, Any]:
        return self.lib.decode_chunk(self.graphdef, params, cache, latents_bfhwc, first=first)

    def encode_image(self, params: nnx.State, fresh_cache: Any, image_bhw3: jax.Array) -> jax.Array:
        """One image → its latent (B, 1, h, w, z), as a stream's first call (on a zero cache)."""
        return self.encode_chunk(params, fresh_cache, jnp.repeat(image_bhw3[:, None], 4, 1), first=True)[0]


def _chunk_scan(call: Callable, cache: Any, chunks_f: jax.Array, first: bool | None) -> tuple[Any, jax.Array]:
    """`call(cache, chunk, first) -> (cache, out)` over the leading axis of `chunks_f`.

    first=None: every call picks its branch on the device (the codec's lax.cond on its step
    counter). True/False: the caller knows whether the cache is fresh, so the first chunk runs the
    first-chunk program (when True) and the scan compiles only the later-chunk one. That matters on
    a GPU beyond compile time: XLA reads a cond's predicate back to the host, which stalls the
    host's queueing of later work once per chunk."""
    if first is None:
        return jax.lax.scan(lambda c, x: call(c, x, None), cache, chunks_f)
    outs = []
    if first:
        cache, out0 = call(cache, chunks_f[0], True)
        outs, chunks_f = [out0[None]], chunks_f[1:]
    if chunks_f.shape[0]:
        cache, rest = jax.lax.scan(lambda c, x: call(c, x, False), cache, chunks_f)
        outs.append(rest)
    return cache, jnp.concatenate(outs) if len(outs) > 1 else outs[0]


def encode_block(enc: Codec, enc_params: nnx.State, enc_cache: Any, frames_bthwc: jax.Array,
                 first: bool | None = None) -> tuple[jax.Array, Any]:
    """4·F frames → F latent frames, streaming (a chunk's first call reads only frame 3). `first`:
    whether `enc_cache` is fresh (True), not (False), or unknown until run (None); see `_chunk_scan`."""
    if enc.whole_blocks:
        return enc.encode_chunk(enc_params, enc_cache, frames_bthwc, first=first)
    b, t = frames_bthwc.shape[:2]
    chunks = frames_bthwc.reshape(b, t // 4, 4, *frames_bthwc.shape[2:]).swapaxes(0, 1)

    def call(cache, chunk, is_first):
        z, cache = enc.encode_chunk(enc_params, cache, chunk, first=is_first)
        return cache, z[:, 0]

    enc_cache, z_fbhwc = _chunk_scan(call, enc_cache, chunks, first)
    return z_fbhwc.swapaxes(0, 1), enc_cache


def decode_block(dec: Codec, dec_params: nnx.State, dec_cache: Any, latents_bfhwc: jax.Array,
                 first: bool | None = None) -> tuple[jax.Array, Any]:
    """F latent frames → 4·F frames (a chunk's first call gives its frame at index 3, zeros before).
    `first`: as in `encode_block`."""
    if dec.whole_blocks:
        return dec.decode_chunk(dec_params, dec_cache, latents_bfhwc, first=first)

    def call(cache, z_bhwc, is_first):
        y, cache = dec.decode_chunk(dec_params, cache, z_bhwc[:, None], first=is_first)
        return cache, y

    dec_cache, y_fbthwc = _chunk_scan(call, dec_cache, latents_bfhwc.swapaxes(0, 1), first)
    y = y_fbthwc.swapaxes(0, 1)
    return y.reshape(y.shape[0], -1, *y.shape[3:]), dec_cache


def _fresh(vae_cache: Any) -> Any:
    return jax.tree.map(jnp.zeros_like, vae_cache)


# `codec_params` below is the pair (encoder params, decoder params); one model may fill both.

def make_stream_start(dit_graphdef: nnx.GraphDef, enc: Codec, dec: Codec, ccfg: causal.CausalConfig) -> Callable:
    """start(dit_params, codec_params, image_bhw3, ctx_bsk) -> state (image in [-1, 1])."""
    start = make_start(dit_graphdef, ccfg)

    def stream_start(dit_params, codec_params, image_bhw3: jax.Array, ctx_bsk: jax.Array) -> State:
        b, h, w, _ = image_bhw3.shape
        enc_cache = enc.lib.init_encode_cache(enc.cfg, b, h, w)
        ref = enc.encode_image(codec_params[0], enc_cache, image_bhw3)
        return {"dit": start(dit_params, ref, ctx_bsk), "enc": enc_cache,
                "dec": dec.lib.init_decode_cache(dec.cfg, b, h, w), "last_rgb": image_bhw3.astype(jnp.float32)}

    return stream_start


def make_stream_anchor(enc: Codec) -> Callable:
    """anchor(codec_params, state, image_bhw3, use_image) -> state: a new chunk on `image`, or on the
    last generated frame when `use_image` is False."""

    def stream_anchor(codec_params, state: State, image_bhw3: jax.Array, use_image: jax.Array) -> State:
        image_bhw3 = jnp.where(use_image, image_bhw3, state["last_rgb"])
        enc_cache = _fresh(state["enc"])
        ref = enc.encode_image(codec_params[0], enc_cache, image_bhw3)
        return {"dit": anchor_state(state["dit"], ref), "enc": enc_cache, "dec": _fresh(state["dec"]),
                "last_rgb": image_bhw3.astype(jnp.float32)}

    return stream_anchor


def make_stream_step(dit_graphdef: nnx.GraphDef, enc: Codec, dec: Codec, ccfg: causal.CausalConfig,
                     scfg: StepConfig) -> Callable:
    """stream_step(dit_params, codec_params, state, skeleton_bthw3, rng) -> (rgb_bthw3, state):
    4·F skeleton frames → control latents → one causal step → 4·F decoded frames."""
    step = make_step(dit_graphdef, ccfg, scfg)

    def stream_step(dit_params, codec_params, state: State, skeleton_bthw3: jax.Array, rng: jax.Array):
        control, enc_cache = encode_block(enc, codec_params[0], state["enc"], skeleton_bthw3)
        latents, dit_state = step(dit_params, state["dit"], control, rng)
        rgb, dec_cache = decode_block(dec, codec_params[1], state["dec"], latents)
        return rgb, {"dit": dit_state, "enc": enc_cache, "dec": dec_cache, "last_rgb": rgb[:, -1]}

    return stream_step


def make_deferred_stream_step(dit_graphdef: nnx.GraphDef, enc: Codec, dec: Codec, ccfg: causal.CausalConfig,
                              scfg: StepConfig, *, after_clean: bool) -> Callable:
    """`make_stream_step` over `make_deferred_step`: stream_step(dit_params, codec_params, state,
    skeleton_bthw3, rng, clean_x0, clean_control) -> (rgb, state, (x0, control)), the last pair
    being the next call's clean_x0 / clean_control."""
    step = make_deferred_step(dit_graphdef, ccfg, scfg, after_clean=after_clean)

    def stream_step(dit_params, codec_params, state: State, skeleton_bthw3: jax.Array, rng: jax.Array,
                    clean_x0_bfhwc: jax.Array, clean_control_bfhwc: jax.Array):
        # a chunk's first block (after start or a re-anchor) finds both codec caches fresh
        control, enc_cache = encode_block(enc, codec_params[0], state["enc"], skeleton_bthw3, first=not after_clean)
        latents, dit_state = step(dit_params, state["dit"], control, rng, clean_x0_bfhwc, clean_control_bfhwc)
        rgb, dec_cache = decode_block(dec, codec_params[1], state["dec"], latents, first=not after_clean)
        return (rgb, {"dit": dit_state, "enc": enc_cache, "dec": dec_cache, "last_rgb": rgb[:, -1]},
                (latents, control))

    return stream_step


# --------------------------------------------------------------------------------------------------
# Session: frame bookkeeping and re-anchoring on the host
# --------------------------------------------------------------------------------------------------


class StreamingSession:
    """Skeleton frames in, generated RGB frames out, in [-1, 1], (B, T, H, W, 3).

    A chunk is `chunk_frames` latent frames (21 → 81 video frames). Frame 0 of a chunk is its
    reference: the session's start image, then at every chunk boundary a supplied real frame
    (`step(..., next_reference=...)`) or else the last generated frame. Per block the session
    wants `frames_needed` new skeleton frames and returns as many new RGB frames:
    1 + 4(F−1) for the session's first block, 4(F−1) for a re-anchored chunk's first block (its
    frame 0 is the anchor, already shown; its skeleton frame is the previous block's last), 4F else.
    `chunk_frames=None` (rolling cache only) never re-anchors. `unroll_layers`: serve the DiT's
    layers unrolled (`dit.unrolled`; faster, longer compile).

    `scfg.merge_clean_pass` (on in the default `SERVING_STEPS`): each block's clean cache pass runs
    in one forward with the next block's first denoising pass (`make_deferred_step`; same frames,
    one executable for a chunk's first block and one for the rest).

    Every program of a session is compiled ahead, all in parallel: `compile(shapes)` at boot (which
    also runs each once, so no block waits after it), or `start` for shapes it has not seen (then
    the first block waits only for its own programs). Host frames (numpy) are checked: finite, RGB
    in [-1, 1].

    `start(..., rng)` takes one key for the batch, or a (B,) batch of keys: then sample b's noise
    comes from key b alone, so it is the same in any batch and at any place in one.

    `vae` encodes (the skeleton frames, the references) and decodes; `decoder` / `encoder`, when
    given, replace it on that side, e.g. the tiny autoencoder `models.tae` (same latent space,
    ≈ 0.5 ms instead of 12.7 ms per decoded 480×832 frame on an H200, lower fidelity).
    """

    def __init__(self, dit: WanDiT, vae: WanVAE, ccfg: causal.CausalConfig = causal.CausalConfig(),
                 scfg: StepConfig = SERVING_STEPS, *, chunk_frames: int | None = 21,
                 unroll_layers: bool = True, decoder: WanVAE | TinyAutoencoder | None = None,
                 encoder: WanVAE | TinyAutoencoder | None = None):
        fpb = ccfg.frames_per_block
        if chunk_frames is None and ccfg.policy != "rolling":
            raise ValueError("sessions without re-anchoring need the rolling cache policy")
        if chunk_frames is not None and (chunk_frames % fpb or
                                         (ccfg.policy == "full" and chunk_frames > ccfg.cache_frames)):
            raise ValueError(f"chunk_frames ({chunk_frames}) must be a multiple of frames_per_block ({fpb})"
                             f" and, with the full cache, at most {ccfg.cache_frames}")
        encoder, decoder = encoder or vae, decoder or vae
        for side, codec in (("encoder", encoder), ("decoder", decoder)):
            if codec.cfg.z_dim != dit.cfg.in_channels:
                raise ValueError(f"the {side} makes {codec.cfg.z_dim}-channel latents, "
                                 f"the DiT takes {dit.cfg.in_channels}")
        self.ccfg, self.chunk_frames = ccfg, chunk_frames
        self.dit_graphdef, self.dit_params = nnx.split(unrolled(dit) if unroll_layers else dit)
        enc, enc_params = Codec.split(encoder)
        dec, dec_params = Codec.split(decoder)
        self.codec_params = (enc_params, dec_params)
        self.dit_cfg = dit.cfg
        opts = compiler_options(dit.cfg)
        self._start = jax.jit(make_stream_start(self.dit_graphdef, enc, dec, ccfg), compiler_options=opts)
        self.merge_clean_pass = scfg.merge_clean_pass
        if scfg.merge_clean_pass:  # a chunk's first block, then every later one (two executables)
            self._step_first, self._step_after = (
                jax.jit(make_deferred_stream_step(self.dit_graphdef, enc, dec, ccfg, scfg, after_clean=after),
                        donate_argnums=2, compiler_options=opts) for after in (False, True))
        else:
            self._step = jax.jit(make_stream_step(self.dit_graphdef, enc, dec, ccfg, scfg), donate_argnums=2,
                                 compiler_options=opts)
        self._anchor = jax.jit(make_stream_anchor(enc), donate_argnums=1)
        self._seams = _seam_programs()
        # session shapes → the session's executables, compiled ahead (`compile`): "start", "step" or
        # "step_first" + "step_after" (merged clean pass), "anchor", and the seam programs
        self._ahead: dict[Any, dict[str, concurrent.futures.Future]] = {}
        self.state: State | None = None

    def compile(self, image_shape_bhw3: tuple[int, ...], ctx_shape_bsk: tuple[int, ...] | None = None,
                rng: jax.Array | None = None, *, wait: bool = True, run_once: bool = True) -> None:
        """Compile every executable a session of these shapes runs — start, the first block of a
        chunk, the later blocks (merged clean pass), the re-anchor and the small programs at block
        seams — in parallel threads, so a server pays all compilation at boot and the stream never
        stalls on a first use (compiled on first use, the later-block step stalled block 2 for
        29–45 s at 480×832 on an H200). `run_once` (with `wait`) then runs each of them once on
        zeros: a program's first run loads its kernels and records its CUDA graphs (≈ 0.2–0.6 s per
        big program there), which would otherwise land on the first and second blocks. The session's
        own state is left alone. `start` compiles shapes not compiled yet (without waiting or
        running: the first block then waits only for the programs it runs). `ctx_shape_bsk`
        defaults to (B, text_len, text_dim); `rng`: a key (or (B,) batch of keys) of the PRNG
        implementation and shape `start` will get (default: one key of the default one)."""
        image_shape = tuple(image_shape_bhw3)
        ctx_shape = tuple(ctx_shape_bsk or (image_shape[0], self.dit_cfg.text_len, self.dit_cfg.text_dim))
        rng = jax.random.key(0) if rng is None else x0_euler.as_key(rng)
        exe = self._executables(image_shape, ctx_shape, rng)
        if wait:
            compiled = {name: future.result() for name, future in exe.items()}  # a failed compile raises here
            if run_once:
                self._run_once(compiled, image_shape, ctx_shape, rng)

    def _run_once(self, exe: dict[str, Any], image_shape: tuple[int, ...], ctx_shape: tuple[int, ...],
                  rng: jax.Array) -> None:
        """Every executable of `exe` run once, in a session's order, on zeros (outputs dropped)."""
        b, h, w, _ = image_shape
        n = BlockFrames.of(self.ccfg.frames_per_block)
        zeros = lambda *shape: jax.device_put(np.zeros(shape, np.float32))  # noqa: E731  (no eager op to compile)
        params = (self.dit_params, self.codec_params)
        state = exe["start"](*params, zeros(*image_shape), zeros(*ctx_shape))
        skel = exe["pad_session_first"](zeros(b, n.session_first, h, w, 3))
        key = exe["block_key"](rng, np.int32(0))
        if self.merge_clean_pass:
            none = np.zeros((), np.float32)
            rgb, state, clean = exe["step_first"](*params, state, skel, key, none, none)
            rgb, state, clean = exe["step_after"](*params, state, skel, key, *clean)
        else:
            rgb, state = exe["step"](*params, state, skel, key)
        outs = [exe["last_frame"](skel), exe["drop_3"](rgb)]
        if self.chunk_frames is not None:
            outs += [exe["pad_chunk_first"](outs[0], zeros(b, n.chunk_first, h, w, 3)), exe["drop_4"](rgb),
                     exe["anchor"](self.codec_params, state, zeros(*image_shape), np.asarray(False))]
        jax.block_until_ready(outs)

    def _executables(self, image_shape: tuple[int, ...], ctx_shape: tuple[int, ...], rng: jax.Array
                     ) -> dict[str, concurrent.futures.Future]:
        """The session's compiled programs for these shapes, lowered here (tracing holds the GIL)
        and each compiled on a thread of its own as soon as it is lowered (XLA compiles outside
        the GIL). One set per session shape, reused by later `start`s."""
        key = jax.eval_shape(_block_key, rng, 0)
        shape_key = (image_shape, ctx_shape, key.shape, key.dtype)
        cached = self._ahead.get(shape_key)
        if cached is not None and not any(f.done() and f.exception() is not None for f in cached.values()):
            return cached  # (a set with a failed compile, e.g. out of memory, is built again)
        b, h, w, _ = image_shape
        f32 = lambda shape: jax.ShapeDtypeStruct(shape, jnp.float32)  # noqa: E731
        n = BlockFrames.of(self.ccfg.frames_per_block)
        image, skel = f32(image_shape), f32((b, n.later, h, w, 3))
        pool = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="rynn-compile")
        futures: dict[str, concurrent.futures.Future] = {}

        def compile_(name: str, jitted, *args) -> Any:
            lowered = jitted.lower(*args)
            futures[name] = pool.submit(lowered.compile)
            return lowered.out_info  # output shapes, for the programs that follow

        params = (self.dit_params, self.codec_params)
        try:
            state = compile_("start", self._start, *params, image, f32(ctx_shape))
            if self.merge_clean_pass:
                none = f32(())
                rgb, state, clean = compile_("step_first", self._step_first, *params, state, skel, key, none, none)
                compile_("step_after", self._step_after, *params, state, skel, key, *clean)
            else:
                rgb, state = compile_("step", self._step, *params, state, skel, key)
            seams = self._seams
            compile_("pad_session_first", seams["pad_session_first"], f32((b, n.session_first, h, w, 3)))
            compile_("last_frame", seams["last_frame"], skel)
            compile_("block_key", seams["block_key"], rng, jax.ShapeDtypeStruct((), jnp.int32))
            compile_("drop_3", seams["drop_3"], rgb)
            if self.chunk_frames is not None:  # a session that never re-anchors needs none of these
                compile_("anchor", self._anchor, self.codec_params, state, image, jax.ShapeDtypeStruct((), jnp.bool_))
                compile_("pad_chunk_first", seams["pad_chunk_first"], f32((b, 1, h, w, 3)),
                         f32((b, n.chunk_first, h, w, 3)))
                compile_("drop_4", seams["drop_4"], rgb)
        finally:
            pool.shutdown(wait=False)
        self._ahead[shape_key] = futures
        return futures

    def start(self, image_bhw3: jax.Array, ctx_bsk: jax.Array, rng: jax.Array) -> None:
        check_frames("the start image", image_bhw3)
        image, ctx = jnp.asarray(image_bhw3, jnp.float32), jnp.asarray(ctx_bsk, jnp.float32)
        if image.ndim != 4 or image.shape[-1] != 3 or ctx.ndim != 3 or ctx.shape[0] != image.shape[0]:
            raise ValueError(f"start wants an image (B, H, W, 3) and a text context (B, S, D); got "
                             f"{tuple(image.shape)} and {tuple(ctx.shape)}")
        rng = x0_euler.as_key(rng)
        if rng.shape not in ((), image.shape[:1]):
            raise ValueError(f"rng must be one key or one key per session sample, shape {image.shape[:1]}; "
                             f"got a key array of shape {rng.shape}")
        self._exe = self._executables(tuple(image.shape), tuple(ctx.shape), rng)
        self.state = self._exe["start"].result()(self.dit_params, self.codec_params, image, ctx)
        self.rng, self.blocks, self.chunk_pos, self.chunks = rng, 0, 0, 0
        self._next_reference = None
        self.image_shape = tuple(image.shape)
        self._last_skeleton = None
        self._zero_image = jax.device_put(np.zeros(self.image_shape, np.float32))  # the anchor's unused input

    @property
    def frames_needed(self) -> int:
        n = BlockFrames.of(self.ccfg.frames_per_block)
        if self.chunk_pos > 0 and not self._chunk_done:
            return n.later
        return n.session_first if self.chunks == 0 and self.chunk_pos == 0 else n.chunk_first

    @property
    def _chunk_done(self) -> bool:
        return self.chunk_frames is not None and self.chunk_pos == self.chunk_frames

    def step(self, skeleton_bthw3: np.ndarray | jax.Array, next_reference_bhw3: Any = None) -> jax.Array:
        if self.state is None:
            raise RuntimeError("call start() first")
        if next_reference_bhw3 is not None:
            if tuple(next_reference_bhw3.shape) != self.image_shape:
                raise ValueError(f"next_reference must be one frame per session, {self.image_shape} like the "
                                 f"start image; got {tuple(next_reference_bhw3.shape)}")
            check_frames("next_reference frames", next_reference_bhw3)
            self._next_reference = jnp.asarray(next_reference_bhw3, jnp.float32)
        if self._chunk_done:
            self._reanchor()
        want = (self.image_shape[0], self.frames_needed, *self.image_shape[1:])
        if tuple(skeleton_bthw3.shape) != want:
            raise ValueError(f"this block needs skeleton frames {want}, got {tuple(skeleton_bthw3.shape)}")
        check_frames("skeleton frames", skeleton_bthw3)
        skel = jnp.asarray(skeleton_bthw3, jnp.float32)
        f = self.ccfg.frames_per_block
        run = lambda name: self._exe[name].result()  # noqa: E731  (compiled ahead; their errors surface here)
        if self.chunk_pos == 0:  # pad to 4F: the chunk's frame 0 is read from index 3
            skel = (run("pad_session_first")(skel) if self.chunks == 0 else
                    run("pad_chunk_first")(self._last_skeleton, skel))
        key = run("block_key")(self.rng, np.int32(self.blocks))
        if not self.merge_clean_pass:
            rgb, self.state = run("step")(self.dit_params, self.codec_params, self.state, skel, key)
        elif self.chunk_pos == 0:  # nothing pending: the cache is empty (a new chunk)
            placeholder = np.zeros((), np.float32)
            rgb, self.state, self._clean = run("step_first")(
                self.dit_params, self.codec_params, self.state, skel, key, placeholder, placeholder)
        else:
            rgb, self.state, self._clean = run("step_after")(
                self.dit_params, self.codec_params, self.state, skel, key, *self._clean)
        self._last_skeleton = run("last_frame")(skel)
        self.blocks += 1
        self.chunk_pos += f
        if self.chunk_pos == f:  # first block: drop the decoder's padding (and a repeated anchor)
            rgb = run("drop_3")(rgb) if self.chunks == 0 else run("drop_4")(rgb)
        return rgb

    def _reanchor(self) -> None:
        image = self._next_reference
        self._next_reference = None
        use_image = image is not None
        image = image if use_image else self._zero_image  # ignored (use_image False)
        anchor = self._exe["anchor"].result()
        self.state = anchor(self.codec_params, self.state, image, np.asarray(use_image))
        self.chunk_pos, self.chunks = 0, self.chunks + 1
