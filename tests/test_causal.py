"""Causal student: KV-cached rollout == block-causal forward, == teacher for one block, constant
memory and one compilation over long rolling sessions, input checks, streaming re-anchoring."""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from rynn_jax.models import causal
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.serving.block_step import CausalStudent, StepConfig, make_deferred_step, make_start, step_schedule
from rynn_jax.serving.cached_passes import (forward_block_after_clean, forward_block_after_clean_in_place,
                                            forward_block_in_place, has_working_path, working_kv)
from rynn_jax.serving.session import StreamingSession

# Every test here is compiling-bound (sessions of many programs, eager ops on tiny arrays): XLA's
# cheapest compile (tests/conftest.py); the checks compare computations compiled the same way.
pytestmark = pytest.mark.usefixtures("fast_compile")

CFG = WanDiTConfig.tiny(control="add-plus", num_layers=2)
LATENT_HW = (2, 4)  # → 2 tokens per latent frame


@contextlib.contextmanager
def compiled_programs(event: str = "backend_compile"):
    """Names of the programs XLA compiles (any program, eager ops included) while the block runs,
    in order, from JAX's public monitoring events; event="jaxpr_trace": the functions JAX traces."""
    seen: list[str] = []

    def listener(name: str, duration: float, fun_name: str = "?", **_) -> None:
        if name == f"/jax/core/compile/{event}_duration":
            seen.append(fun_name)

    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        yield seen
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)


def rel_err(a, b) -> float:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / np.abs(b).max())


@pytest.fixture(scope="module")
def model():
    m = init_dit(CFG, seed=1)
    # Move every parameter off its init (the control branch starts at zero) so nothing is inert.
    rng = np.random.default_rng(0)
    params = nnx.state(m, nnx.Param)
    nnx.update(m, jax.tree.map(lambda a: a + 0.1 * jnp.asarray(rng.standard_normal(a.shape), a.dtype), params))
    return m


def _latents(rng, b, f, c=8):
    return jnp.asarray(rng.standard_normal((b, f, *LATENT_HW, c)), jnp.float32)


def _jitted_block(model, ccfg, write):
    graphdef, state = nnx.split(model)
    fn = jax.jit(lambda s, cache, z, t, c: causal.forward_block(nnx.merge(graphdef, s), cache, ccfg, z, t, c,
                                                                 write=write))
    return lambda *a: fn(state, *a)


def _padded(model, token_multiple: int):
    """The same weights in a model that pads its token sequence (WanDiTConfig.token_multiple)."""
    m = init_dit(dataclasses.replace(model.cfg, token_multiple=token_multiple), seed=0)
    nnx.update(m, nnx.state(model))
    return m


@pytest.mark.parametrize("token_multiple", [1, 16])
def test_cached_rollout_equals_block_causal_forward(model, token_multiple):
    """Teacher forcing: noisy block i attends to the clean blocks < i and to itself. The rollout
    denoises block i against the cache (no write), then writes the clean block; one masked forward
    of [clean; noisy] must give the same velocities. With token_multiple=16 each 4-token block
    runs padded to 16 tokens (12 pads that must neither be cached nor attended to)."""
    fpb, blocks, b = 2, 3, 2
    f = fpb * blocks
    rng = np.random.default_rng(1)
    clean, noisy, control = _latents(rng, b, f), _latents(rng, b, f), _latents(rng, b, f)
    t_clean = jnp.asarray(rng.uniform(0, 50, (b, f)), jnp.float32)
    t_noisy = jnp.asarray(rng.uniform(0, 1000, (b, f)), jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((b, CFG.text_len, CFG.text_dim)), jnp.float32)

    ref = jax.jit(lambda *a: causal.block_causal_forward(model, *a[:4], frames_per_block=fpb, noisy_bthwc=a[4],
                                                         noisy_t_bf=a[5]))(clean, t_clean, ctx, control, noisy, t_noisy)
    ccfg = causal.CausalConfig(frames_per_block=fpb, window_frames=f - 1)
    student = _padded(model, token_multiple) if token_multiple > 1 else model
    denoise, write = _jitted_block(student, ccfg, False), _jitted_block(student, ccfg, True)
    cache = causal.init_cache(student, ccfg, ctx, LATENT_HW)
    outs = []
    for i in range(blocks):
        blk = slice(i * fpb, (i + 1) * fpb)
        v, same = denoise(cache, noisy[:, blk], t_noisy[:, blk], control[:, blk])
        assert same is cache or all(jnp.all(same[k] == cache[k]) for k in cache)
        _, cache = write(cache, clean[:, blk], t_clean[:, blk], control[:, blk])
        outs.append(v)
    assert int(cache["frames"]) == f
    assert rel_err(jnp.concatenate(outs, 1), ref) < 1e-5


@pytest.mark.parametrize("forcing", [False, True])
def test_blockwise_attention_equals_dense_mask(model, forcing):
    """The mask-free block-by-block attention (the default) gives the dense-mask forward's
    velocities and input gradients; 5 frames in blocks of 2, so the last block is short. The
    blockwise run uses a model that tail-pads its tokens (token_multiple=16: 10 → 16 tokens, 20 → 32
    with teacher forcing), so the pads are held to the unpadded reference too."""
    fpb, f, b = 2, 5, 2
    rng = np.random.default_rng(5)
    z, noisy, control = _latents(rng, b, f), _latents(rng, b, f), _latents(rng, b, f)
    t, t_noisy = (jnp.asarray(rng.uniform(0, 1000, (b, f)), jnp.float32) for _ in range(2))
    ctx = jnp.asarray(rng.standard_normal((b, CFG.text_len, CFG.text_dim)), jnp.float32)
    extra = {"noisy_bthwc": noisy, "noisy_t_bf": t_noisy} if forcing else {}

    padded = _padded(model, 16)

    def run(m, z, blockwise):  # velocities, ∂Σv²/∂z, and ∂(Σ of block 1's velocities)/∂z
        fwd = lambda z: causal.block_causal_forward(m, z, t, ctx, control, frames_per_block=fpb,  # noqa: E731
                                                    blockwise=blockwise, **extra)
        v, vjp = jax.vjp(fwd, z)
        return v, vjp(2 * v)[0], vjp(jnp.zeros_like(v).at[:, fpb:2 * fpb].set(1.0))[0]

    v_dense, g_dense, _ = jax.jit(lambda z: run(model, z, False))(z)
    v_block, g_block, g_block1 = jax.jit(lambda z: run(padded, z, True))(z)
    assert rel_err(v_block, v_dense) < 1e-5 and rel_err(g_block, g_dense) < 1e-5
    padded_fwd = lambda z, blockwise: causal.block_causal_forward(  # noqa: E731
        padded, z, t, ctx, control, frames_per_block=fpb, blockwise=blockwise, **extra)
    assert rel_err(jax.jit(lambda z: padded_fwd(z, False))(z), v_dense) < 1e-5
    # the padded model's FFN really runs on 16 (32) tokens
    assert f"f32[{b},{32 if forcing else 16},{CFG.ffn_dim}]" in str(jax.make_jaxpr(lambda z: padded_fwd(z, True))(z))
    # Causality: block 1's output sees blocks 0..1 of z (teacher forcing: clean block 0 only).
    seen = fpb if forcing else 2 * fpb
    assert float(jnp.abs(g_block1[:, seen:]).max()) == 0.0
    assert float(jnp.abs(g_block1[:, seen - fpb:seen]).max()) > 1e-6


def test_one_block_with_full_cache_is_the_teacher(model):
    """frames_per_block = all frames: the single block (reference latent at t=0 as frame 0) is
    exactly the bidirectional TI2V forward."""
    f, b = 5, 2
    rng = np.random.default_rng(2)
    z, control = _latents(rng, b, f), _latents(rng, b, f)
    t = jnp.asarray(np.c_[np.zeros((b, 1)), np.full((b, f - 1), 937.0)], jnp.float32)
    ctx = jnp.asarray(rng.standard_normal((b, CFG.text_len, CFG.text_dim)), jnp.float32)
    teacher = jax.jit(model.__call__)(z, t, ctx, control)
    ccfg = causal.CausalConfig(frames_per_block=f, window_frames=f - 1, policy="full")
    v, _ = _jitted_block(model, ccfg, False)(causal.init_cache(model, ccfg, ctx, LATENT_HW), z, t, control)
    assert rel_err(v, teacher) < 1e-5


def test_slot_positions_relative_to_window():
    # W = 4, newest frame 9: ring slots 1..4 hold frames 9, 6, 7, 8 → positions 4, 1, 2, 3.
    assert causal.frame_slots(jnp.arange(10), 4).tolist() == [0, 1, 2, 3, 4, 1, 2, 3, 4, 1]
    assert causal.slot_positions(jnp.int32(9), 4).tolist() == [0, 4, 1, 2, 3]
    # Before the ring is full, positions are absolute (stale slots are masked by the key length).
    assert causal.slot_positions(jnp.int32(3), 4)[:4].tolist() == [0, 1, 2, 3]


def test_step_schedule():
    t, sigmas = step_schedule(StepConfig())
    assert t.tolist() == [999, 937, 833, 624]
    assert sigmas[-1] == 0.0 and np.all(np.diff(sigmas) < 0)


def test_training_rollout_and_served_steps_give_the_same_frames(model):
    """The student is trained through `distill.rollout` and served through `streaming`'s steps; both
    run `diffusion.x0_euler`. For the same key (block i gets fold_in(key, i), as a session's blocks
    do) they give the same frames: the served latent step (unrolled layers, working cache) and the
    merged clean pass StreamingSession serves with, over three blocks of a chunk. Another key gives
    other frames, so the match is not that of a noise-free sampler."""
    from rynn_jax.distill import rollout as rollout_lib
    from rynn_jax.distill.config import DMDConfig
    from rynn_jax.models.dit import unrolled

    fpb, blocks, b = 2, 3, 2
    ccfg, scfg = causal.CausalConfig(frames_per_block=fpb, window_frames=5), StepConfig(num_steps=3)
    rng = np.random.default_rng(13)
    ref, ctx = _start_inputs(rng, b)
    control = _latents(rng, b, fpb * blocks)
    graphdef, params, stats = nnx.split(model, nnx.Param, ...)
    trained = jax.jit(lambda key: rollout_lib.rollout(
        graphdef, params, stats, ref, ctx, control, key, num_frames=fpb * blocks, ccfg=ccfg, scfg=scfg,
        dcfg=DMDConfig(last_step_only=True), grad=False))
    key = jax.random.key(3)
    want = trained(key)
    assert rel_err(trained(jax.random.key(4)), want) > 1e-2
    np.testing.assert_array_equal(want[:, 0], ref[:, 0])  # the chunk's frame 0 is the reference
    blk = lambda i: control[:, i * fpb:(i + 1) * fpb]  # noqa: E731

    student = CausalStudent(model, ccfg, scfg)
    state = student.start(ref, ctx)
    served = []
    for i in range(blocks):
        x, state = student.step(state, blk(i), jax.random.fold_in(key, i))
        served.append(x)
    assert rel_err(jnp.concatenate(served, 1), want) < 1e-5

    g, p = nnx.split(unrolled(model))
    merged = dataclasses.replace(scfg, merge_clean_pass=True)
    first, after = (jax.jit(make_deferred_step(g, ccfg, merged, after_clean=a)) for a in (False, True))
    state = jax.jit(make_start(g, ccfg))(p, ref, ctx)
    none = jnp.zeros((), jnp.float32)
    x, state = first(p, state, blk(0), jax.random.fold_in(key, 0), none, none)
    served = [x]
    for i in range(1, blocks):
        x, state = after(p, state, blk(i), jax.random.fold_in(key, i), served[-1], blk(i - 1))
        served.append(x)
    assert rel_err(jnp.concatenate(served, 1), want) < 1e-5


def _start_inputs(rng, b=2):
    ref = _latents(rng, b, 1)
    ctx = jnp.asarray(rng.standard_normal((b, CFG.text_len, CFG.text_dim)), jnp.float32)
    return ref, ctx


def test_rolling_session_constant_memory_one_compile(model):
    ccfg = causal.CausalConfig(frames_per_block=2, window_frames=3, policy="rolling")
    student = CausalStudent(model, ccfg, StepConfig(num_steps=2))
    rng = np.random.default_rng(3)
    ref, ctx = _start_inputs(rng)
    with compiled_programs("jaxpr_trace") as traced:  # the first session traces them
        state = student.start(ref, ctx)
    assert "start" in traced
    shapes0 = jax.tree.map(lambda a: (a.shape, a.dtype), state)
    live = []
    for i in range(12):  # 24 frames through a 1 + 3 frame cache: wraps many times
        x, state = student.step(state, rng.standard_normal((2, 2, *LATENT_HW, 8)).astype(np.float32),
                                jax.random.key(i))
        assert bool(jnp.isfinite(x).all())
        if i == 0:
            assert bool(jnp.all(x[:, 0] == ref[:, 0]))  # the chunk's frame 0 is the reference
        del x
        live.append(sum(a.nbytes for a in jax.live_arrays()))
    assert int(state["cache"]["frames"]) == 24
    assert jax.tree.map(lambda a: (a.shape, a.dtype), state) == shapes0
    assert len(set(live[2:])) == 1, live  # no growth
    # A second session and re-anchoring reuse the same executables: start and step are not traced again.
    with compiled_programs("jaxpr_trace") as traced:
        state = student.anchor(student.start(ref, ctx), ref)
        _, state = student.step(state, np.zeros((2, 2, *LATENT_HW, 8), np.float32), jax.random.key(0))
    assert not {"start", "step"} & set(traced), traced


def test_unipc_solver_runs_and_pins_reference(model):
    ccfg = causal.CausalConfig(frames_per_block=2, window_frames=4)
    student = CausalStudent(model, ccfg, StepConfig(solver="unipc"))
    rng = np.random.default_rng(4)
    ref, ctx = _start_inputs(rng, b=1)
    x, state = student.step(student.start(ref, ctx), np.zeros((1, 2, *LATENT_HW, 8), np.float32), jax.random.key(1))
    assert bool(jnp.isfinite(x).all()) and bool(jnp.all(x[:, 0] == ref[:, 0]))
    assert int(state["cache"]["frames"]) == 2


def test_bad_step_inputs_fail_before_device_work(model):
    student = CausalStudent(model, causal.CausalConfig(frames_per_block=2, window_frames=4))
    rng = np.random.default_rng(5)
    state = student.start(*_start_inputs(rng))
    bad = np.zeros((2, 2, *LATENT_HW, 8), np.float32)
    bad[1, 1, 0, 0, 3] = np.nan
    with compiled_programs("jaxpr_trace") as traced:
        with pytest.raises(ValueError, match="control block must be"):
            student.step(state, np.zeros((2, 3, *LATENT_HW, 8), np.float32), jax.random.key(0))
        with pytest.raises(ValueError, match="control block must be"):
            student.step(state, np.zeros((2, 2, 4, 4, 8), np.float32), jax.random.key(0))
        with pytest.raises(ValueError, match="NaN"):
            student.step(state, bad, jax.random.key(0))
        with pytest.raises(ValueError, match="NaN"):
            student.step(state, jnp.asarray(bad), jax.random.key(0))
    assert "step" not in traced, traced  # the step never traced, let alone run


# the seam programs every session compiles ahead with its big ones (serving.session._seam_programs)
SEAMS = {"pad_session_first", "pad_chunk_first", "last_frame", "block_key", "drop_3", "drop_4"}


def test_streaming_session_reanchors(model):
    from rynn_jax.models.vae import WanVAEConfig, init_vae

    dit = init_dit(dataclasses.replace(CFG, in_channels=4, out_channels=4, control_channels=4), seed=2)
    vae = init_vae(WanVAEConfig.tiny(), seed=0)
    ccfg = causal.CausalConfig(frames_per_block=2, window_frames=3)
    session = StreamingSession(dit, vae, ccfg, StepConfig(num_steps=1), chunk_frames=4)
    rng = np.random.default_rng(6)
    image = rng.uniform(-1, 1, (1, 32, 64, 3)).astype(np.float32)  # latent 2×4
    session.compile(image.shape)  # as at a server's boot: compiled, and each program run once on zeros
    got, refs, outs = [], [], []
    with compiled_programs() as compiled:  # every program runs from the set compiled ahead
        session.start(image, rng.standard_normal((1, CFG.text_len, CFG.text_dim)).astype(np.float32),
                      jax.random.key(0))
        for i in range(6):  # 3 chunks of 2 blocks; the second boundary uses a supplied real frame
            n = session.frames_needed
            supplied = image if i == 3 else None
            outs.append(np.asarray(session.step(rng.uniform(-1, 1, (1, n, 32, 64, 3)).astype(np.float32), supplied)))
            got.append(n)
            refs.append(np.asarray(session.state["dit"]["ref_latent"]))
    assert compiled == []
    assert [o.shape[1] for o in outs] == got and all(np.isfinite(o).all() for o in outs)
    # chunk of 4 latent frames = 13 video frames; later chunks add 12 (their frame 0 is the anchor)
    assert got == [5, 8, 4, 8, 4, 8] and session.chunks == 2
    # chunk 1 re-anchors on the last generated frame, chunk 2 on the supplied start image again
    assert not np.allclose(refs[2], refs[0], atol=1e-3)
    np.testing.assert_allclose(refs[4], refs[0], atol=1e-5)
    assert len(session._ahead) == 1 and set(session._exe) == {"start", "step", "anchor"} | SEAMS
    with pytest.raises(ValueError, match="needs skeleton frames"):
        session.step(np.zeros((1, 3, 32, 64, 3), np.float32))
    # Bad pixels fail before any device work and lose nothing: the block is then served as usual.
    n, blocks = session.frames_needed, session.blocks
    good = rng.uniform(-1, 1, (1, n, 32, 64, 3)).astype(np.float32)
    with pytest.raises(ValueError, match=r"must be RGB in \[-1, 1\]; got values up to 255"):
        session.step(np.full(good.shape, 255, np.uint8))  # 8-bit frames passed as they are
    nan = good.copy()
    nan[0, 1, 2, 3, 0] = np.nan
    with pytest.raises(ValueError, match="skeleton frames contain NaN or Inf"):
        session.step(nan)
    with pytest.raises(ValueError, match="next_reference frames must be RGB"):
        session.step(good, (image + 1) * 127.5)
    assert session.blocks == blocks and session.frames_needed == n
    assert session.step(good).shape[1] == n and session.blocks == blocks + 1
    with pytest.raises(ValueError, match="the start image must be RGB"):
        session.start((image + 1) * 127.5, np.zeros((1, CFG.text_len, CFG.text_dim), np.float32), jax.random.key(0))


@pytest.mark.parametrize("policy", ["full", "rolling"])
def test_merged_clean_pass_equals_sequential(model, policy):
    """forward_block_after_clean (a block's clean pass + the next block's first denoising
    pass in one forward) == the two passes one after the other: velocity and written cache, over
    enough blocks for the rolling ring to wrap, with and without token padding."""
    ccfg = causal.CausalConfig(frames_per_block=2, window_frames=3, policy=policy)
    rng = np.random.default_rng(11)
    for m in (model, _padded(model, 16)):
        ctx = jnp.asarray(rng.standard_normal((2, CFG.text_len, CFG.text_dim)), jnp.float32)
        cache = causal.init_cache(m, ccfg, ctx, LATENT_HW)
        for _ in range(3 if policy == "rolling" else 1):
            clean, clean_c, z, c = (_latents(rng, 2, 2) for _ in range(4))
            t = jnp.asarray([[937.0, 937.0], [624.0, 624.0]])
            _, written = causal.forward_block(m, cache, ccfg, clean, jnp.zeros((2, 2)), clean_c, write=True)
            v_seq, _ = causal.forward_block(m, written, ccfg, z, t, c, write=False)
            v, merged = forward_block_after_clean(m, cache, ccfg, clean, clean_c, z, t, c)
            assert rel_err(v, v_seq) < 1e-5 and int(merged["frames"]) == int(written["frames"])
            for name in ("k_lbsnh", "v_lbsnh"):
                assert rel_err(merged[name], written[name]) < 1e-5, name
            stale, _ = causal.forward_block(m, cache, ccfg, z, t, c, write=False)  # the clean block matters
            assert rel_err(v, stale) > 1e-3
            cache = written


@pytest.mark.parametrize("policy", ["full", "rolling"])
def test_in_place_working_cache_equals_forward_block(model, policy):
    """The serving path (per-layer blocks): one rotated working copy of the cache per block, which
    each pass overwrites at the block's slots, == `forward_block` copying the cache every pass:
    two denoising passes then the clean pass per block, over enough blocks for the rolling ring to
    wrap, padded and not; and the in-place merged pass (policy "full") == the sequential passes."""
    from rynn_jax.models.dit import unrolled

    ccfg = causal.CausalConfig(frames_per_block=2, window_frames=3, policy=policy)
    rng = np.random.default_rng(12)
    for m in (model, _padded(model, 16)):
        served = unrolled(m)
        assert has_working_path(served) and not has_working_path(m)
        ctx = jnp.asarray(rng.standard_normal((2, CFG.text_len, CFG.text_dim)), jnp.float32)
        cache = causal.init_cache(m, ccfg, ctx, LATENT_HW)
        for _ in range(4 if policy == "rolling" else 2):
            work = working_kv(served, cache, ccfg, cache["frames"], (2, 2, *LATENT_HW, 8))
            c = _latents(rng, 2, 2)
            for t in (937.0, 624.0):
                z = _latents(rng, 2, 2)
                v_ref, _ = causal.forward_block(m, cache, ccfg, z, jnp.full((2, 2), t), c, write=False)
                v, same, work = forward_block_in_place(served, cache, work, ccfg, z, jnp.full((2, 2), t), c,
                                                              write=False)
                assert same is cache and rel_err(v, v_ref) < 1e-5
            clean = _latents(rng, 2, 2)
            _, want = causal.forward_block(m, cache, ccfg, clean, jnp.zeros((2, 2)), c, write=True)
            _, got, _ = forward_block_in_place(served, cache, work, ccfg, clean, jnp.zeros((2, 2)), c, write=True)
            for name in ("k_lbsnh", "v_lbsnh", "frames"):
                assert rel_err(got[name], want[name]) < 1e-5, name
            if policy == "full" and int(want["frames"]) + 2 <= ccfg.cache_frames:
                z, c2 = _latents(rng, 2, 2), _latents(rng, 2, 2)
                t = jnp.asarray([[937.0, 937.0], [624.0, 624.0]])
                v_seq, _ = causal.forward_block(m, want, ccfg, z, t, c2, write=False)
                work = working_kv(served, cache, ccfg, want["frames"], (2, 2, *LATENT_HW, 8))
                v, merged, _ = forward_block_after_clean_in_place(served, cache, work, ccfg, clean, c, z, t, c2)
                assert rel_err(v, v_seq) < 1e-5 and rel_err(merged["k_lbsnh"], want["k_lbsnh"]) < 1e-5
            cache = want
    with pytest.raises(ValueError, match="full cache policy"):
        rolling = causal.CausalConfig(frames_per_block=2, window_frames=3, policy="rolling")
        forward_block_after_clean_in_place(served, cache, work, rolling, clean, c, z, jnp.zeros((2, 2)), c)


@pytest.fixture(scope="module")
def sessions():
    """One episode (two re-anchorings, the second on a supplied reference frame) served three ways:
    stacked layers (forward_block's per-pass cache copies), unrolled (the in-place working cache),
    and unrolled with the merged clean pass (StepConfig(merge_clean_pass=True)), whose session is
    kept for the tests below, with the names of the programs compiled while its episode ran."""
    from rynn_jax.models.vae import WanVAEConfig, init_vae

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)  # as `fast_compile`, for the module
    try:
        dit = init_dit(dataclasses.replace(CFG, in_channels=4, out_channels=4, control_channels=4), seed=2)
        vae = init_vae(WanVAEConfig.tiny(), seed=0)
        ccfg = causal.CausalConfig(frames_per_block=2, window_frames=3)
        rng = np.random.default_rng(7)
        image = rng.uniform(-1, 1, (1, 32, 64, 3)).astype(np.float32)
        ctx = rng.standard_normal((1, CFG.text_len, CFG.text_dim)).astype(np.float32)
        skeletons = [rng.uniform(-1, 1, (1, n, 32, 64, 3)).astype(np.float32) for n in (5, 8, 4, 8, 4)]
        reference = rng.uniform(-1, 1, (1, 32, 64, 3)).astype(np.float32)
        frames = {}
        for merge, unroll in ((False, False), (False, True), (True, True)):
            session = StreamingSession(dit, vae, ccfg, StepConfig(num_steps=3,
                                                                                      merge_clean_pass=merge),
                                                 chunk_frames=4, unroll_layers=unroll)
            with compiled_programs() as names:
                session.start(image, ctx, jax.random.key(0))
                frames[merge, unroll] = [np.asarray(session.step(s, reference if i == 3 else None))
                                         for i, s in enumerate(skeletons)]
        yield types.SimpleNamespace(dit=dit, vae=vae, ccfg=ccfg, image=image, ctx=ctx, skeletons=skeletons,
                                    reference=reference, frames=frames, session=session, names=names)
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


def _episode(session, s, keys=None, batch: int = 1, blocks: int = 2) -> list[np.ndarray]:
    """The first `blocks` blocks of the fixture's episode on `session`, `batch` copies of it."""
    cat = lambda x: np.concatenate([x] * batch)  # noqa: E731
    session.start(cat(s.image), cat(s.ctx), jax.random.key(0) if keys is None else keys)
    return [np.asarray(session.step(cat(k), cat(s.reference) if i == 3 else None))
            for i, k in enumerate(s.skeletons[:blocks])]


def test_merged_clean_pass_session_gives_the_sequential_frames(sessions):
    """The merged clean pass and the working cache give the frames of the plain sequential session,
    across re-anchoring."""
    want = sessions.frames[False, False]
    for variant in ((False, True), (True, True)):
        for a, b in zip(want, sessions.frames[variant]):
            assert a.shape == b.shape and rel_err(b, a) < 1e-4, variant
    assert [f.shape[1] for f in want] == [5, 8, 4, 8, 4]


def test_session_programs_are_compiled_ahead_once(sessions):
    """Each program of a session is compiled once, ahead (at start), never again through a jit
    cache; a new episode of the same shapes — through both re-anchors, with compile() (which runs
    every program once on zeros) called in the middle of it — compiles nothing, not even an eager op
    at a block seam, and gives the same frames."""
    session = sessions.session
    big = [n for n in sessions.names if n.startswith("jit(stream_")]
    assert sorted(big) == ["jit(stream_anchor)", "jit(stream_start)", "jit(stream_step)", "jit(stream_step)"]
    assert set(session._exe) == {"start", "step_first", "step_after", "anchor"} | SEAMS
    image, s = sessions.image, sessions
    with compiled_programs() as names:
        session.start(image, s.ctx, jax.random.key(0))
        again = []
        for i, k in enumerate(s.skeletons):
            again.append(np.asarray(session.step(k, s.reference if i == 3 else None)))
            if i == 1:
                session.compile(image.shape)
    assert names == []
    for got, want in zip(again, s.frames[True, True]):
        np.testing.assert_array_equal(got, want)


def test_session_keeps_a_program_set_per_shape(sessions):
    """Another shape (batch 2), compiled ahead as a server would at boot, gets its own set of
    programs; going back to batch 1 uses the first set again (same frames, nothing compiled)."""
    session, s = sessions.session, sessions
    sets = len(session._ahead)  # the fixture's batch-1 set
    session.compile((2, *s.image.shape[1:]))
    assert len(session._ahead) == sets + 1
    assert all(f.done() for exe in session._ahead.values() for f in exe.values())
    pair = _episode(session, s, batch=2)
    assert pair[1].shape[0] == 2 and len(session._ahead) == sets + 1
    with compiled_programs() as names:
        again = _episode(session, s)
    assert not [n for n in names if n.startswith("jit(stream_")]
    np.testing.assert_array_equal(again[1], s.frames[True, True][1])


def test_session_rebuilds_a_failed_compile(sessions):
    """A failed compile (say, out of memory) is not kept: the next start builds the set again."""
    session, s = sessions.session, sessions
    one = next(k for k in session._ahead if k[0] == s.image.shape)
    failed = concurrent.futures.Future()
    failed.set_exception(RuntimeError("compile failed"))
    session._ahead[one] = {**session._ahead[one], "step_after": failed}
    again = _episode(session, s)
    assert session._ahead[one]["step_after"] is not failed
    np.testing.assert_array_equal(again[1], s.frames[True, True][1])


def test_session_keys_per_sample(sessions):
    """One key per sample: sample b's noise comes from key b alone, so sample 1 (key 0) is the
    batch-1 session's episode with key 0, and sample 0 (same inputs, key 5) is another."""
    session, s = sessions.session, sessions
    keys = jnp.stack([jax.random.key(5), jax.random.key(0)])
    mixed = _episode(session, s, keys, batch=2)
    for got, want in zip(mixed, s.frames[True, True]):
        assert rel_err(got[1:], want) < 1e-5 and rel_err(got[:1], want) > 1e-2
    with pytest.raises(ValueError, match="one key per session sample"):
        session.start(s.image, s.ctx, keys)


def test_session_refuses_bad_inputs(sessions):
    session, s = sessions.session, sessions
    with pytest.raises(ValueError, match="start wants"):
        session.start(s.image[0], s.ctx, jax.random.key(0))
    session.start(s.image, s.ctx, jax.random.key(0))
    for k in s.skeletons[:2]:
        session.step(k)
    with pytest.raises(ValueError, match="next_reference"):
        session.step(s.skeletons[2], s.reference[:, :16])
    with pytest.raises(ValueError, match="x0_euler"):
        StepConfig(solver="unipc", merge_clean_pass=True)


def test_rolling_session_compiles_no_anchor_program(sessions):
    """A rolling session that never re-anchors compiles no anchor program (nor its seams)."""
    s = sessions
    rolling = StreamingSession(s.dit, s.vae, causal.CausalConfig(frames_per_block=2, window_frames=3,
                                                                           policy="rolling"),
                                         StepConfig(num_steps=3, merge_clean_pass=True), chunk_frames=None)
    rolling.compile(s.image.shape)
    rolling.start(s.image, s.ctx, jax.random.key(0))
    out = [np.asarray(rolling.step(k)) for k in (s.skeletons[0], s.skeletons[1], s.skeletons[3], s.skeletons[1])]
    assert set(rolling._exe) == {"start", "step_first", "step_after"} | SEAMS - {"pad_chunk_first", "drop_4"}
    assert rolling.chunks == 0
    assert [o.shape[1] for o in out] == [5, 8, 8, 8] and all(np.isfinite(o).all() for o in out)
