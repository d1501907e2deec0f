"""`StreamingSession`: skeleton frames in, generated RGB frames out, block by block, re-anchoring
every chunk — the host's frame bookkeeping around the streamed step (`stream_step`), with every
program compiled ahead.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.diffusion import x0_euler
from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiT, unrolled
from rynn_jax.models.fp8 import compiler_options
from rynn_jax.models.tae import TinyAutoencoder
from rynn_jax.models.vae import WanVAE
from rynn_jax.serving import codecs, stream_step
from rynn_jax.serving.block_step import SERVING_STEPS, State, StepConfig


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


def _block_key(rng: jax.Array, block: int | jax.Array) -> jax.Array:
    """The raw key data a session's step gets for its `block`-th block."""
    return jax.random.key_data(x0_euler.fold_in(rng, block))


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
    in one forward with the next block's first denoising pass (`block_step.make_deferred_step`; same
    frames, one executable for a chunk's first block and one for the rest).

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
        enc, enc_params = codecs.split(encoder)
        dec, dec_params = codecs.split(decoder)
        self.codec_params = (enc_params, dec_params)
        self.dit_cfg = dit.cfg
        opts = compiler_options(dit.cfg)
        self._start = jax.jit(stream_step.make_stream_start(self.dit_graphdef, enc, dec, ccfg), compiler_options=opts)
        self.merge_clean_pass = scfg.merge_clean_pass
        if scfg.merge_clean_pass:  # a chunk's first block, then every later one (two executables)
            self._step_first, self._step_after = (
                jax.jit(stream_step.make_deferred_stream_step(self.dit_graphdef, enc, dec, ccfg, scfg,
                                                              after_clean=after),
                        donate_argnums=2, compiler_options=opts) for after in (False, True))
        else:
            self._step = jax.jit(stream_step.make_stream_step(self.dit_graphdef, enc, dec, ccfg, scfg),
                                 donate_argnums=2, compiler_options=opts)
        self._anchor = jax.jit(stream_step.make_stream_anchor(enc), donate_argnums=1)
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
