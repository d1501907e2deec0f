"""The served forward passes of the causal student, built on `models.causal`'s reference
formulation and equal to it (`tests/test_causal.py`):

  * the merged clean pass (`forward_block_after_clean`): a block's clean cache-writing pass and the
    next block's first denoising pass as one forward over both blocks' tokens;
  * the working cache (`working_kv`, `forward_block_in_place`, `forward_block_after_clean_in_place`):
    one rotated copy of the cache per block and layer, written in place by the block's passes.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import causal, rope
from rynn_jax.models.dit import WanAttention, WanBlock, WanDiT, pad_tokens, token_grid
from rynn_jax.sharding import constrain


def _two_blocks(model: WanDiT, cache: causal.KVCache, ccfg: causal.CausalConfig, clean_bfhwc: jax.Array,
                clean_control_bfhwc: jax.Array | None, z_bfhwc: jax.Array, t_bf: jax.Array,
                control_bfhwc: jax.Array | None):
    """The merged pass's inputs: both blocks' tokens (padded) and their RoPE, time embeddings, the
    next block's token grid, the clean block's frame count and both blocks' `placement`."""
    cfg = model.cfg
    grid_c, grid = token_grid(clean_bfhwc.shape, cfg), token_grid(z_bfhwc.shape, cfg)
    if grid_c[1:] != grid[1:]:
        raise ValueError(f"clean block {clean_bfhwc.shape} and next block {z_bfhwc.shape} differ in size")
    fc, f, tokens = grid_c[0], grid[0], grid[1] * grid[2]
    b = z_bfhwc.shape[0]
    causal.check_fits(cache, ccfg, max(fc, f), tokens)
    x_bld = jnp.concatenate([causal.input_tokens(model, clean_bfhwc, clean_control_bfhwc),
                             causal.input_tokens(model, z_bfhwc, control_bfhwc)], axis=1)
    t_all = jnp.concatenate([jnp.zeros((b, fc), jnp.float32), t_bf.astype(jnp.float32)], axis=1)
    temb_bfd, tproj_bf6d = model.embed_time(t_all)
    place_c = causal.placement(model, cache["frames"], fc, ccfg.window_frames, grid[1:], b)
    place_n = causal.placement(model, cache["frames"] + fc, f, ccfg.window_frames, grid[1:], b)
    q_rope = tuple(jnp.concatenate(pair, axis=0) for pair in zip(place_c[1], place_n[1]))
    x_bld, q_rope, pad = pad_tokens(x_bld, q_rope, cfg.token_multiple)
    return x_bld, q_rope, pad, temb_bfd, tproj_bf6d, grid, fc, place_c, place_n


def forward_block_after_clean(model: WanDiT, cache: causal.KVCache, ccfg: causal.CausalConfig,
                              clean_bfhwc: jax.Array, clean_control_bfhwc: jax.Array | None, z_bfhwc: jax.Array,
                              t_bf: jax.Array, control_bfhwc: jax.Array | None = None
                              ) -> tuple[jax.Array, causal.KVCache]:
    """The previous block's clean (t = 0) cache-writing pass and the next block's first denoising
    pass as one forward over both blocks' tokens. Returns (the next block's velocity, the cache with
    the clean block written) — the same as

        _, cache = causal.forward_block(model, cache, ccfg, clean, 0, clean_control, write=True)
        v, _ = causal.forward_block(model, cache, ccfg, z, t_bf, control, write=False)

    up to float rounding. Per layer the projections, cross-attention and FFN run once on 2·F frames
    (GEMMs twice as tall: the 1170-token passes are overhead-bound); self-attention runs as the two
    passes would, the clean block over the cache with itself written, the next block over that
    cache with itself added (two key ranges, two positions bases when the ring rolls)."""
    x_bld, q_rope, pad, temb_bfd, tproj_bf6d, grid, fc, place_c, place_n = _two_blocks(
        model, cache, ccfg, clean_bfhwc, clean_control_bfhwc, z_bfhwc, t_bf, control_bfhwc)
    (start_c, _, k_rope_c, kv_len_c), (start_n, _, k_rope_n, kv_len_n) = place_c, place_n
    f, tokens = grid[0], grid[1] * grid[2]
    lc = fc * tokens

    def layer(block: WanBlock, x_bld: jax.Array, xs):
        k_cache, v_cache, text_k, text_v = xs

        def self_attention(attn: WanAttention, h_bld: jax.Array):
            q_blnh, k_new, v_new = attn.self_qkv(h_bld, q_rope, None)  # K pre-RoPE, as cached
            k_c, v_c = k_new[:, :lc], v_new[:, :lc]
            k_clean = causal.put_frames(k_cache, k_c, start_c, tokens)
            v_clean = causal.put_frames(v_cache, v_c, start_c, tokens)
            k_next = causal.put_frames(k_clean, k_new[:, lc:lc + f * tokens], start_n, tokens)
            v_next = causal.put_frames(v_clean, v_new[:, lc:lc + f * tokens], start_n, tokens)
            outs = []
            for q, k_all, v_all, k_rope, kv_len in ((q_blnh[:, :lc], k_clean, v_clean, k_rope_c, kv_len_c),
                                                     (q_blnh[:, lc:], k_next, v_next, k_rope_n, kv_len_n)):
                k_all = constrain(rope.apply_rope(k_all, *k_rope), causal.CACHE_NAMES[1:])
                outs.append(attn.attention(q, k_all, constrain(v_all, causal.CACHE_NAMES[1:]), kv_len_b=kv_len))
            return attn.o(jnp.concatenate(outs, axis=1)), (k_c, v_c)

        return block.forward(x_bld, None, tproj_bf6d, fc + f, self_attention=self_attention,
                             cross_kv=(text_k, text_v), pad=pad)

    xs = (cache["k_lbsnh"], cache["v_lbsnh"], cache["text_k_lbsnh"], cache["text_v_lbsnh"])
    x_bld, clean_kv = model.scan_blocks(layer, x_bld, xs)
    v_bfhwc = model.project_out(x_bld[:, lc:lc + f * tokens], temb_bfd[:, fc:], grid)
    return v_bfhwc, causal.write_block(cache, clean_kv, start_c, tokens)


# `causal.forward_block` builds every layer's "cache with the block written, rotated" afresh in every pass:
# two copies of the whole cache per layer (2 × 50 MB at 480×832 for the 5B model; on an H200 30 ms
# of a 148 ms served block went to these copies). All passes of one block share the slots' RoPE
# positions (they depend on the block's newest frame only), so `working_kv` makes one rotated copy
# per layer and block, each pass writes its own K/V into it in place (a loop carry) and cuDNN
# attends to it directly. Per-layer buffers, not one stacked array: a layer slice of a stacked
# array handed to cuDNN is a copy again. Same numbers as `causal.forward_block` (the same roundings).

Work = tuple[list[jax.Array], list[jax.Array]]  # per layer: K rotated to its slot's position, V; (B, S, N, H)


def has_working_path(model: WanDiT) -> bool:
    """Per-layer blocks (`dit.unrolled`, the serving layout): the layer loop is Python, so each layer
    can own its working buffers."""
    return isinstance(model.blocks, nnx.List)


def working_kv(model: WanDiT, cache: causal.KVCache, ccfg: causal.CausalConfig, first_frame: jax.Array,
               block_shape: tuple[int, ...]) -> Work:
    """Per-layer copies of the cache for a block of latents shaped `block_shape` (B, F, H, W, C)
    starting at chunk frame `first_frame`: K rotated to the positions its passes use
    (`placement`), V as cached."""
    grid = token_grid(block_shape, model.cfg)
    a_last = first_frame + grid[0] - 1
    k_rope = causal.frames_rope(causal.slot_positions(a_last, ccfg.window_frames), grid[1:], model)
    layers = cache["k_lbsnh"].shape[0]
    return ([rope.apply_rope(cache["k_lbsnh"][i], *k_rope) for i in range(layers)],
            [cache["v_lbsnh"][i] for i in range(layers)])


def _layers_in_place(model: WanDiT, cache: causal.KVCache, work: Work, x_bld: jax.Array, x_rope,
                     tproj_bf6d: jax.Array, frames: int, pad: int, tokens: int, groups
                     ) -> tuple[jax.Array, Work, tuple[jax.Array, jax.Array]]:
    """The layers over `work`. `groups`: per query group (query slice, its own keys' token slice,
    their slots' first tokens, their RoPE, key length). Every group's K/V are written first, then
    every group attends to the same buffers, so a later group's keys must lie past an earlier
    group's key length. → (x, work, pre-RoPE K/V of the first group stacked over layers)."""
    ks, vs = list(work[0]), list(work[1])
    new_k, new_v = [], []
    for i, block in enumerate(model.blocks):
        def self_attention(attn: WanAttention, h_bld: jax.Array):
            q_blnh, k_new, v_new = attn.self_qkv(h_bld, x_rope, None)  # K pre-RoPE, as cached
            for _, k_span, start_f, k_rope, _ in groups:
                ks[i] = causal.put_frames(ks[i], rope.apply_rope(k_new[:, k_span], *k_rope), start_f, tokens)
                vs[i] = causal.put_frames(vs[i], v_new[:, k_span], start_f, tokens)
            k_all, v_all = (constrain(a, causal.CACHE_NAMES[1:]) for a in (ks[i], vs[i]))
            outs = [attn.attention(q_blnh[:, q_span], k_all, v_all, kv_len_b=kv_len) for q_span, *_, kv_len in groups]
            k_span = groups[0][1]
            return attn.o(outs[0] if len(outs) == 1 else jnp.concatenate(outs, axis=1)), (k_new[:, k_span],
                                                                                           v_new[:, k_span])

        cross_kv = (cache["text_k_lbsnh"][i], cache["text_v_lbsnh"][i])
        x_bld, (k_i, v_i) = block.forward(x_bld, None, tproj_bf6d, frames, self_attention=self_attention,
                                          cross_kv=cross_kv, pad=pad)
        new_k.append(k_i)
        new_v.append(v_i)
    return x_bld, (ks, vs), (jnp.stack(new_k), jnp.stack(new_v))


def forward_block_in_place(model: WanDiT, cache: causal.KVCache, work: Work, ccfg: causal.CausalConfig,
                           z_bfhwc: jax.Array, t_bf: jax.Array, control_bfhwc: jax.Array | None = None, *, write: bool
                           ) -> tuple[jax.Array, causal.KVCache, Work]:
    """`causal.forward_block` over the block's `working_kv` (per-layer blocks only): → (velocity, cache
    — with the block written when `write` —, work with the block's K/V written)."""
    x_bld, x_rope, pad, temb_bfd, tproj_bf6d, grid, (start_f, q_rope, _, kv_len_b) = causal.one_block(
        model, cache, ccfg, z_bfhwc, t_bf, control_bfhwc)
    f, tokens = grid[0], grid[1] * grid[2]
    groups = [(slice(None), slice(0, f * tokens), start_f, q_rope, kv_len_b)]
    x_bld, work, new_kv = _layers_in_place(model, cache, work, x_bld, x_rope, tproj_bf6d, f, pad, tokens, groups)
    v_bfhwc = model.project_out(x_bld[:, :f * tokens], temb_bfd, grid)
    return v_bfhwc, (causal.write_block(cache, new_kv, start_f, tokens) if write else cache), work


def forward_block_after_clean_in_place(model: WanDiT, cache: causal.KVCache, work: Work, ccfg: causal.CausalConfig,
                                       clean_bfhwc: jax.Array, clean_control_bfhwc: jax.Array | None,
                                       z_bfhwc: jax.Array, t_bf: jax.Array, control_bfhwc: jax.Array | None = None
                                       ) -> tuple[jax.Array, causal.KVCache, Work]:
    """`forward_block_after_clean` over the next block's `working_kv` (made before the clean block
    is written). Policy "full" only: the next block's slots then lie past the clean block's key
    length (a rolling ring may put them over frames the clean block still sees)."""
    if ccfg.policy != "full":
        raise ValueError("the in-place merged pass needs the full cache policy")
    x_bld, x_rope, pad, temb_bfd, tproj_bf6d, grid, fc, place_c, place_n = _two_blocks(
        model, cache, ccfg, clean_bfhwc, clean_control_bfhwc, z_bfhwc, t_bf, control_bfhwc)
    (start_c, q_rope_c, _, kv_len_c), (start_n, q_rope_n, _, kv_len_n) = place_c, place_n
    f, tokens = grid[0], grid[1] * grid[2]
    lc = fc * tokens
    groups = [(slice(0, lc), slice(0, lc), start_c, q_rope_c, kv_len_c),
              (slice(lc, None), slice(lc, lc + f * tokens), start_n, q_rope_n, kv_len_n)]
    x_bld, work, clean_kv = _layers_in_place(model, cache, work, x_bld, x_rope, tproj_bf6d, fc + f, pad, tokens,
                                             groups)
    v_bfhwc = model.project_out(x_bld[:, lc:lc + f * tokens], temb_bfd[:, fc:], grid)
    return v_bfhwc, causal.write_block(cache, clean_kv, start_c, tokens), work
