"""The causal student's block step: a few-step denoise of one block of `frames_per_block` latent
frames against the KV cache, then the clean (t = 0) pass that writes the block into the cache.

Pure functions of (params, state, inputs) — `make_start`, `make_step`, `make_deferred_step`,
`anchor_state` — jitted once and exported (`rynn_jax.step_export`), and `CausalStudent`, the jitted
latent-level step with its inputs checked on the host. Solvers: "x0_euler" (`diffusion.x0_euler`,
the very functions the student is trained through) and "unipc" (the released multistep solver on
the same sigmas). 4 steps, shift 5 → timesteps [999, 937, 833, 624].

As served (`SERVING_STEPS`): the DiT's layers unrolled (`dit.unrolled`), one working copy of the
cache per block (`cached_passes.working_kv`), and each block's clean pass merged into the next
block's first denoising pass (`make_deferred_step`). Frame 0 of every chunk is the reference
image latent (clean, t = 0), pinned before every model call of the chunk's first block, as TI2V
sampling does. An add-plus control branch aligns each block with the statistics the model carries
(models/control.py), never updating them: there is no future ground truth.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.diffusion import samplers, x0_euler
from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiT, unrolled
from rynn_jax.models.fp8 import compiler_options
from rynn_jax.serving import cached_passes

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
    # Per-layer (unrolled, served) DiTs, x0_euler: a block's passes share one rotated working copy of
    # the cache, written in place (cached_passes.working_kv); False: every pass copies the cache
    # (causal.forward_block). Same results.
    working_cache: bool = True

    def __post_init__(self) -> None:
        if self.merge_clean_pass and self.solver != "x0_euler":
            raise ValueError("merge_clean_pass needs the x0_euler solver (its first step is run separately)")


# What StreamingSession serves with unless told otherwise: the merged clean pass (same frames; on one
# H200 at 480×832, 73.2 → 74.8 FPS bf16 and 83.7 → 87.6 FPS FP8, docs/PERFORMANCE.md). The other
# settings stay for what needs them: the sequential step for export and the unipc solver, and
# `bench/bench_stream.py --ab merge | working-cache`, which times each served choice against them.
SERVING_STEPS = StepConfig(merge_clean_pass=True)


def step_schedule(scfg: StepConfig) -> tuple[np.ndarray, np.ndarray]:
    """Model timesteps (N,) float32 and solver sigmas (N + 1,) ending at 0 (`x0_euler.schedule`)."""
    return x0_euler.schedule(scfg.num_steps, scfg.shift)


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
        in_place = scfg.working_cache and cached_passes.has_working_path(model) and scfg.solver == "x0_euler"
        velocity = _velocity(model, cache, ccfg, control_bfhwc, pin_f, pin, in_place)

        if scfg.solver == "unipc":
            x0 = samplers.sample_unipc(lambda x, t: velocity(x, t, None)[0], noise, num_steps=scfg.num_steps,
                                       shift=scfg.shift)
            work = None
        else:
            work = (cached_passes.working_kv(model, cache, ccfg, cache["frames"], control_bfhwc.shape) if in_place
                    else None)
            _, x0, work = x0_euler.run(velocity, noise, rng, timesteps_n, sigmas_n1, carry=work)
        x0 = pin(x0)
        # The clean pass: K/V of the finished block at t = 0 become context for later blocks.
        t_clean = jnp.zeros((b, f), jnp.float32)
        if in_place:
            _, cache, _ = cached_passes.forward_block_in_place(model, cache, work, ccfg, x0, t_clean, control_bfhwc,
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
    as this block's first denoising pass (`cached_passes.forward_block_after_clean`); without (a
    chunk's first block), clean_* are ignored. The caller keeps (x0, control) for the next call; a chunk's
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
        in_place = scfg.working_cache and cached_passes.has_working_path(model)
        work_first = in_place and (not after_clean or ccfg.policy == "full")
        if work_first:
            work = cached_passes.working_kv(model, cache, ccfg, first_frame, control_bfhwc.shape)

        if after_clean:  # step 0 together with the previous block's clean pass, then the rest
            if work_first:
                v, cache, work = cached_passes.forward_block_after_clean_in_place(
                    model, cache, work, ccfg, clean_x0_bfhwc, clean_control_bfhwc, pin(noise),
                    t_of(timesteps_n[0]), control_bfhwc)
            else:
                v, cache = cached_passes.forward_block_after_clean(
                    model, cache, ccfg, clean_x0_bfhwc, clean_control_bfhwc, pin(noise), t_of(timesteps_n[0]),
                    control_bfhwc)
            x, _ = x0_euler.update(noise, v, rng, 0, np.float32(sigmas_n1[0]), np.float32(sigmas_n1[1]))
            first = 1
        else:
            x, first = noise, 0
        if in_place and not work_first:
            work = cached_passes.working_kv(model, cache, ccfg, first_frame, control_bfhwc.shape)

        velocity = _velocity(model, cache, ccfg, control_bfhwc, pin_f, pin, in_place)
        _, x0, _ = x0_euler.run(velocity, x, rng, timesteps_n, sigmas_n1, first=first,
                                carry=work if in_place else None)
        return pin(x0), {**state, "cache": cache}

    return step


def _velocity(model: WanDiT, cache: causal.KVCache, ccfg: causal.CausalConfig, control_bfhwc: jax.Array,
              pin_f: jax.Array, pin: Callable, in_place: bool) -> Callable:
    """velocity(x, t, work) -> (v, work) of a block's denoising pass against `cache` (not written),
    its chunk frame 0 pinned to the reference at t = 0. `in_place`: over the block's working copy
    `work` (`cached_passes.working_kv`), which it returns with the pass's K/V written; else `work` is
    passed through and every pass copies the cache (`causal.forward_block`)."""

    def velocity(x_bfhwc: jax.Array, t_bf: jax.Array, work: cached_passes.Work | None):
        t_bf = x0_euler.pinned_t(pin_f, t_bf)
        if in_place:
            v, _, work = cached_passes.forward_block_in_place(model, cache, work, ccfg, pin(x_bfhwc), t_bf,
                                                              control_bfhwc, write=False)
            return v, work
        return causal.forward_block(model, cache, ccfg, pin(x_bfhwc), t_bf, control_bfhwc, write=False)[0], work

    return velocity


def _block_setup(state: State, control_bfhwc: jax.Array, rng: jax.Array, first_frame: jax.Array):
    """(key, the block's initial noise, which frames are the chunk's frame 0, a function pinning
    those to the reference latent) for a block that starts at chunk frame `first_frame`."""
    ref = state["ref_latent"]
    b, f = control_bfhwc.shape[:2]
    rng = x0_euler.as_key(rng)
    noise = x0_euler.block_noise(rng, (b, f, *ref.shape[2:]))
    return (rng, noise, *x0_euler.reference_pin(ref, first_frame, f))


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
