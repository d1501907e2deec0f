"""Phase B's generator: the student rolls out a chunk block by block with its KV cache (self
forcing: every block is conditioned on the student's *own* earlier blocks), differentiably.

Per block (Self-Forcing's procedure, with the cache kept in the gradient path):
  1. one exit step e ∈ {0..N−1} is drawn per rollout (shared by all blocks; `last_step_only`: N−1);
  2. steps 0..e−1 of the 4-step x0-Euler schedule run without gradient (stochastic truncation of
     the denoising chain: a `fori_loop` of traced length, so only e calls are made);
  3. step e runs with gradient: x0 = x_e − σ_e·v(x_e, t_e | cache) — the block's sample;
  4. the clean pass (t = 0) on x0 writes the block's K/V into the cache — with gradient when
     `cache_grad`, so later blocks' losses reach this block's sample and weights through the cache.
Memory: `grad_blocks = K` rolls the first blocks out with stop-gradiented weights (no residuals are
kept) and differentiates only the last K; `remat_blocks` keeps just the cache carry per block and
recomputes the block in the backward pass. Frame 0 of the chunk is the reference latent (pinned).
The steps, noise keys and pinning are `diffusion.x0_euler`'s, the functions the served step runs.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.diffusion import x0_euler
from rynn_jax.distill.config import DMDConfig
from rynn_jax.models import causal
from rynn_jax.serving.block_step import StepConfig, step_schedule

sg = jax.lax.stop_gradient


def cut(cache: causal.KVCache) -> causal.KVCache:
    """The cache with its self-attention K/V out of the gradient path. The text K/V (a function of
    the weights only, not of earlier blocks) stay differentiable."""
    return {**cache, "k_lbsnh": sg(cache["k_lbsnh"]), "v_lbsnh": sg(cache["v_lbsnh"])}


def rollout(graphdef: nnx.GraphDef, params: nnx.State, stats: nnx.State, ref_b1hwc: jax.Array,
            ctx_bsk: jax.Array, control_bthwc: jax.Array | None, rng: jax.Array, *, num_frames: int,
            ccfg: causal.CausalConfig, scfg: StepConfig, dcfg: DMDConfig, grad: bool) -> jax.Array:
    """A chunk of `num_frames` latent frames (B, T, H, W, C), float32. `grad=False` gives a sample
    with no gradient path at all (the critic's training data, evaluation)."""
    fpb = ccfg.frames_per_block
    if num_frames % fpb:
        raise ValueError(f"num_frames ({num_frames}) must be a multiple of frames_per_block ({fpb})")
    num_blocks = num_frames // fpb
    timesteps_n, sigmas_n1 = step_schedule(scfg)
    n = scfg.num_steps
    exit_step = jnp.asarray(n - 1) if dcfg.last_step_only else jax.random.randint(
        jax.random.fold_in(rng, 1 << 30), (), 0, n)

    model_g = nnx.merge(graphdef, params, stats)
    model_s = nnx.merge(graphdef, sg(params), stats)
    ref = ref_b1hwc.astype(jnp.float32)
    b, _, h, w, c = ref.shape
    cache = causal.init_cache(model_g if grad else model_s, ccfg, ctx_bsk, (h, w))

    def block(grad_block: bool):
        cache_grad = grad_block and dcfg.cache_grad

        def body(cache, xs):
            i, control_b = xs
            key = x0_euler.fold_in(rng, i)
            pin_f, pin = x0_euler.reference_pin(ref, cache["frames"], fpb)
            cache_sg = jax.tree.map(sg, cache)  # the no-gradient denoising steps

            def velocity(model, cache_, x, t_bf):
                return causal.forward_block(model, cache_, ccfg, pin(x), x0_euler.pinned_t(pin_f, t_bf), control_b,
                                            write=False)[0]

            def denoise(stop):  # steps 0..stop−1 without gradient → (re-noised x, the last step's x0)
                v_sg = lambda x, t_bf, carry: (velocity(model_s, cache_sg, x, t_bf), carry)  # noqa: E731
                x, x0, _ = x0_euler.run(v_sg, x0_euler.block_noise(key, (b, fpb, h, w, c)), key, timesteps_n,
                                        sigmas_n1, stop=stop)
                return sg(x), sg(x0)

            if grad_block:  # steps 0..e−1 without gradient, step e with
                x, _ = denoise(exit_step)
                exit_cache = cache if cache_grad else cut(cache)
                t_exit = jnp.full((b, fpb), jnp.asarray(timesteps_n)[exit_step])
                sigma_exit = jnp.asarray(sigmas_n1, jnp.float32)[exit_step]
                x0 = pin(x0_euler.predict_x0(x, velocity(model_g, exit_cache, x, t_exit), sigma_exit))
            else:  # steps 0..e in one loop (one compiled model call); its last x0 is the sample
                x0 = pin(denoise(exit_step + 1)[1])
            t0 = jnp.zeros((b, fpb), jnp.float32)
            if cache_grad:
                _, cache = causal.forward_block(model_g, cache, ccfg, x0, t0, control_b, write=True)
            else:
                _, new = causal.forward_block(model_s, cache_sg, ccfg, sg(x0), t0, control_b, write=True)
                cache = {**new, "text_k_lbsnh": cache["text_k_lbsnh"], "text_v_lbsnh": cache["text_v_lbsnh"]}
            return cache, x0

        if grad_block and dcfg.remat_blocks:
            body = jax.checkpoint(body)
        return body

    idx = jnp.arange(num_blocks)
    ctrl = None if control_bthwc is None else jnp.moveaxis(
        control_bthwc.reshape(b, num_blocks, fpb, *control_bthwc.shape[2:]), 1, 0)
    k = num_blocks if not grad else (dcfg.grad_blocks or num_blocks)
    k = min(k, num_blocks)
    split = (num_blocks - k) if grad else num_blocks
    outs = []
    if split:
        # No tangents enter the prefix (no residuals kept); the text K/V are re-attached afterwards.
        pre, x0_pre = jax.lax.scan(block(False), jax.tree.map(sg, cache),
                                   (idx[:split], None if ctrl is None else ctrl[:split]))
        cache = {**pre, "text_k_lbsnh": cache["text_k_lbsnh"], "text_v_lbsnh": cache["text_v_lbsnh"]}
        outs.append(x0_pre)
    if split < num_blocks:
        _, x0_post = jax.lax.scan(block(True), cache, (idx[split:], None if ctrl is None else ctrl[split:]))
        outs.append(x0_post)
    x0_nbfhwc = jnp.concatenate(outs, axis=0)  # (blocks, B, fpb, H, W, C)
    return jnp.moveaxis(x0_nbfhwc, 0, 1).reshape(b, num_frames, h, w, c)
