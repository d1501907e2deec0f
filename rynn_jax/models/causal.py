"""Block-causal Wan DiT with a static KV cache: the causal student of RynnWorld-Teleop (paper §3.5),
in its reference formulation (one block against the cache, and the whole chunk under the
block-causal mask). The served passes built on it (one working copy of the cache per block, the
merged clean pass) are `rynn_jax.serving.cached_passes`; tests hold them equal to these.

It runs the teacher's parameters unchanged. A chunk's latent frames are cut into blocks of
`frames_per_block`; attention is bidirectional within a block and causal across blocks. Block 0
holds the reference-image latent as its frame 0 (clean, t = 0) exactly as TI2V does, so with
frames_per_block = all frames the student *is* the bidirectional teacher; afterwards that frame's
K/V stay in the cache as a persistent sink.

Cache layout, per layer, in frame slots of `tokens_per_frame` tokens each:
    slot 0         the sink (chunk frame 0)
    slots 1 .. W   a ring of the last W frames: chunk frame a ≥ 1 lives in slot 1 + (a − 1) mod W
A block's K/V go into the slots it will occupy (evicting the oldest frames once the ring is full)
and its queries attend to all valid slots, itself included. The denoising passes write a per-layer
copy that is thrown away (serving: one working copy per block, `serving.cached_passes`); only the clean
(t = 0) pass writes the cache (`write=True`). Valid slots
are always a prefix, so the mask is a key length — cuDNN's padding mask, not a dense mask.

Positions. K is cached *before* RoPE, and every pass rotates the whole cache at the slots' current
time positions (fused into the copy the layer's attention reads anyway; the serving path rotates
once per block, as all passes of a block share the positions). Positions are relative to
the window: with a_last the newest frame of the current block and base = max(0, a_last − W), frame
a sits at a − base and the sink at 0. Within a 21-frame chunk with W = 20 (the released setting,
policy "full") base is 0 and positions are absolute. In an unbounded "rolling" session RoPE being
relative keeps query–window geometry exactly as in training, the sink stays just before the oldest
window frame instead of drifting away, and no position (or float32 angle) grows with time.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np

from rynn_jax.models import rope
from rynn_jax.models.dit import WanAttention, WanBlock, WanDiT, pad_tokens, token_grid
from rynn_jax.sharding import constrain

# K/V cache: a plain dict of arrays (exportable without custom pytree nodes).
#   k_lbsnh, v_lbsnh             self-attention K (pre-RoPE) / V, (layers, B, (1 + W)·tokens, heads, head_dim)
#   text_k_lbsnh, text_v_lbsnh   cross-attention K/V of the text context, computed once per session
#   frames                       int32 (): chunk frames written so far = chunk index of the next frame
KVCache = dict[str, jax.Array]
CACHE_NAMES = ("layers", "act_batch", "act_kv_len", "act_heads", None)


@dataclasses.dataclass(frozen=True, kw_only=True)
class CausalConfig:
    frames_per_block: int = 3  # latent frames denoised together (bidirectional within a block)
    window_frames: int = 20  # W: cached frames after the sink; 20 → the released 21-frame cache
    # "full": a chunk holds at most 1 + W frames (re-anchor before; as released, nothing is evicted).
    # "rolling": the ring evicts the oldest frames, so a chunk may run forever. Same device code.
    policy: Literal["full", "rolling"] = "full"

    def __post_init__(self):
        # Block 0 puts one frame in the sink, later blocks put all theirs in the ring.
        limit = self.window_frames + (1 if self.policy == "full" else 0)
        if not 1 <= self.frames_per_block <= limit:
            raise ValueError(f"frames_per_block ({self.frames_per_block}) must be in [1, {limit}] for "
                             f"window_frames {self.window_frames} and policy {self.policy!r}")

    @property
    def cache_frames(self) -> int:
        return 1 + self.window_frames


# --------------------------------------------------------------------------------------------------
# Cache construction
# --------------------------------------------------------------------------------------------------


def text_kv(model: WanDiT, ctx_bsk: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Cross-attention K/V of every layer for a text context: two (layers, B, S, N, H) arrays."""
    return model.text_kv(model.embed_text(ctx_bsk))


def init_cache(model: WanDiT, ccfg: CausalConfig, ctx_bsk: jax.Array, latent_hw: tuple[int, int]) -> KVCache:
    """An empty cache for latents of spatial size `latent_hw` with the session's text K/V."""
    cfg = model.cfg
    tokens = (latent_hw[0] // cfg.patch_size[1]) * (latent_hw[1] // cfg.patch_size[2])
    shape = (cfg.num_layers, ctx_bsk.shape[0], ccfg.cache_frames * tokens, cfg.num_heads, cfg.head_dim)
    zeros = lambda: constrain(jnp.zeros(shape, jnp.dtype(cfg.dtype)), CACHE_NAMES)  # noqa: E731
    text_k, text_v = text_kv(model, ctx_bsk)
    return {"k_lbsnh": zeros(), "v_lbsnh": zeros(), "text_k_lbsnh": text_k, "text_v_lbsnh": text_v,
            "frames": jnp.zeros((), jnp.int32)}


def restart_chunk(cache: KVCache) -> KVCache:
    """A new chunk (re-anchoring): the cache is empty again. Stale slots are masked, never cleared."""
    return {**cache, "frames": jnp.zeros((), jnp.int32)}


# --------------------------------------------------------------------------------------------------
# Slots and positions
# --------------------------------------------------------------------------------------------------


def frame_slots(a_f: jax.Array, window: int) -> jax.Array:
    """Cache slot of chunk frame a: the sink for a = 0, else the ring."""
    return jnp.where(a_f == 0, 0, 1 + (a_f - 1) % window)


def slot_positions(a_last: jax.Array, window: int) -> jax.Array:
    """Time position of every slot (1 + W,) once frames up to `a_last` are written (see module doc)."""
    ring = jnp.arange(window)
    a_ring = a_last - (a_last - 1 - ring) % window  # newest frame that maps to each ring slot
    base = jnp.maximum(0, a_last - window)
    return jnp.concatenate([jnp.zeros((1,), a_ring.dtype), a_ring - base])


def frames_rope(pos_f: jax.Array, grid_hw: tuple[int, int], model: WanDiT) -> tuple[jax.Array, jax.Array]:
    """RoPE cos/sin (F·H·W, head_dim/2) for frames at arbitrary (traced) time positions."""
    cfg = model.cfg
    one = lambda p: rope.rope_cos_sin((1, *grid_hw), cfg.head_dim, cfg.rope_theta, t_offset=p,  # noqa: E731
                                      max_len=cfg.rope_max_len)
    cos_f, sin_f = jax.vmap(one)(pos_f)
    return cos_f.reshape(-1, cos_f.shape[-1]), sin_f.reshape(-1, sin_f.shape[-1])


# --------------------------------------------------------------------------------------------------
# One block against the cache
# --------------------------------------------------------------------------------------------------


def input_tokens(model: WanDiT, z_bfhwc: jax.Array, control_bfhwc: jax.Array | None) -> jax.Array:
    x_bld = model.embed_patches(z_bfhwc).astype(jnp.float32)
    if model.control is not None:
        if control_bfhwc is None or control_bfhwc.shape[:4] != z_bfhwc.shape[:4]:
            raise ValueError(f"this model has a control branch: pass a control latent aligned with "
                             f"{z_bfhwc.shape[:4]}, got {None if control_bfhwc is None else control_bfhwc.shape}")
        # Inference: running statistics, no ground truth; per-frame, so blocks equal the whole clip.
        x_bld = x_bld + model.control(control_bfhwc, None, False)
    elif control_bfhwc is not None:
        raise ValueError("a control latent was given but cfg.control is 'none'")
    return x_bld


def placement(model: WanDiT, first_frame: jax.Array, frames: int, window: int, grid_hw: tuple[int, int],
               batch: int):
    """Where a block starting at chunk frame `first_frame` goes: (first cache token of each frame,
    query RoPE, RoPE of every cache slot, key length per sample) once its frames are written."""
    tokens = grid_hw[0] * grid_hw[1]
    a_f = first_frame + jnp.arange(frames, dtype=jnp.int32)  # chunk index of each block frame
    a_last = a_f[-1]
    q_rope = frames_rope(a_f - jnp.maximum(0, a_last - window), grid_hw, model)
    k_rope = frames_rope(slot_positions(a_last, window), grid_hw, model)
    kv_len_b = jnp.full((batch,), (1 + jnp.minimum(a_last, window)) * tokens, jnp.int32)
    return frame_slots(a_f, window) * tokens, q_rope, k_rope, kv_len_b


def put_frames(cache_bsnh: jax.Array, new_bsnh: jax.Array, start_f: jax.Array, tokens: int) -> jax.Array:
    """Write a block's K or V (B, F·tokens, N, H) into the cache, frame by frame (a block may wrap
    around the ring's end)."""
    for j in range(start_f.shape[0]):
        frame = jax.lax.dynamic_slice_in_dim(new_bsnh, j * tokens, tokens, axis=1)
        cache_bsnh = jax.lax.dynamic_update_slice_in_dim(cache_bsnh, frame, start_f[j], axis=1)
    return cache_bsnh


def check_fits(cache: KVCache, ccfg: CausalConfig, frames: int, tokens: int) -> None:
    if frames > ccfg.window_frames + 1:
        raise ValueError(f"a block of {frames} frames does not fit a window of {ccfg.window_frames} (+ the sink)")
    if cache["k_lbsnh"].shape[2] != ccfg.cache_frames * tokens:
        raise ValueError(f"cache holds {cache['k_lbsnh'].shape[2]} tokens, expected "
                         f"{ccfg.cache_frames} frames × {tokens}")


def write_block(cache: KVCache, new_kv: tuple[jax.Array, jax.Array], start_f: jax.Array, tokens: int) -> KVCache:
    """The cache with a block's per-layer K/V (layers, B, F·tokens, N, H) written at its frames'
    slots, and `frames` advanced past it."""
    write = lambda c, n: put_frames(c, n, start_f, tokens)  # noqa: E731
    k_lbsnh, v_lbsnh = (jax.vmap(write)(c, n) for c, n in zip((cache["k_lbsnh"], cache["v_lbsnh"]), new_kv))
    return {**cache, "k_lbsnh": constrain(k_lbsnh, CACHE_NAMES), "v_lbsnh": constrain(v_lbsnh, CACHE_NAMES),
            "frames": cache["frames"] + start_f.shape[0]}


def one_block(model: WanDiT, cache: KVCache, ccfg: CausalConfig, z_bfhwc: jax.Array, t_bf: jax.Array,
               control_bfhwc: jax.Array | None):
    """A block pass's inputs: its tokens (padded) and their RoPE, time embeddings, token grid and
    `placement` (of which the query RoPE is unpadded). Tail pads (cfg.token_multiple) ride along
    as queries only: the cache takes the first F·tokens K/V, and the key length ends at the real tokens."""
    cfg = model.cfg
    grid = token_grid(z_bfhwc.shape, cfg)
    f, tokens = grid[0], grid[1] * grid[2]
    check_fits(cache, ccfg, f, tokens)
    x_bld = input_tokens(model, z_bfhwc, control_bfhwc)
    temb_bfd, tproj_bf6d = model.embed_time(t_bf)
    place = placement(model, cache["frames"], f, ccfg.window_frames, grid[1:], z_bfhwc.shape[0])
    x_bld, x_rope, pad = pad_tokens(x_bld, place[1], cfg.token_multiple)
    return x_bld, x_rope, pad, temb_bfd, tproj_bf6d, grid, place


def forward_block(model: WanDiT, cache: KVCache, ccfg: CausalConfig, z_bfhwc: jax.Array, t_bf: jax.Array,
                  control_bfhwc: jax.Array | None = None, *, write: bool) -> tuple[jax.Array, KVCache]:
    """Velocity (B, F, H, W, C) of the block that starts at chunk frame `cache["frames"]`, attending to
    the cache and itself. `write=True` stores the block's K/V and advances `frames` (the clean pass);
    otherwise the cache is returned unchanged."""
    x_bld, q_rope, pad, temb_bfd, tproj_bf6d, grid, (start_f, _, k_rope, kv_len_b) = one_block(
        model, cache, ccfg, z_bfhwc, t_bf, control_bfhwc)
    f, tokens = grid[0], grid[1] * grid[2]
    put_block = lambda c, n: put_frames(c, n, start_f, tokens)  # noqa: E731

    def layer(block: WanBlock, x_bld: jax.Array, xs):
        k_cache, v_cache, text_k, text_v = xs

        def self_attention(attn: WanAttention, h_bld: jax.Array):
            q_blnh, k_new, v_new = attn.self_qkv(h_bld, q_rope, None)  # K pre-RoPE, as cached
            k_all = rope.apply_rope(put_block(k_cache, k_new), *k_rope)
            v_all = put_block(v_cache, v_new)
            k_all, v_all = (constrain(a, CACHE_NAMES[1:]) for a in (k_all, v_all))
            out = attn.attend(q_blnh, k_all, v_all, kv_len_b=kv_len_b)
            return out, ((k_new, v_new) if write else None)

        return block.forward(x_bld, None, tproj_bf6d, f, self_attention=self_attention,
                             cross_kv=(text_k, text_v), pad=pad)

    xs = (cache["k_lbsnh"], cache["v_lbsnh"], cache["text_k_lbsnh"], cache["text_v_lbsnh"])
    x_bld, new_kv = model.scan_blocks(layer, x_bld, xs)
    v_bfhwc = model.project_out(x_bld[:, :f * tokens], temb_bfd, grid)
    return v_bfhwc, (write_block(cache, new_kv, start_f, tokens) if write else cache)


# --------------------------------------------------------------------------------------------------
# The whole sequence under the block-causal mask (reference for the cache, and teacher forcing)
# --------------------------------------------------------------------------------------------------


def block_causal_mask(num_frames: int, tokens_per_frame: int, frames_per_block: int,
                      teacher_forcing: bool = False) -> np.ndarray:
    """Boolean (L, L) mask over tokens. Plain: block i attends to blocks ≤ i. Teacher forcing: the
    sequence is [clean frames; noisy frames]; clean tokens as plain, noisy block i attends to clean
    blocks < i and to itself (what the cached rollout sees when the cache holds clean blocks)."""
    block_t = np.repeat(np.arange(num_frames) // frames_per_block, tokens_per_frame)
    plain = block_t[:, None] >= block_t[None, :]
    if not teacher_forcing:
        return plain
    before = block_t[:, None] > block_t[None, :]
    same = block_t[:, None] == block_t[None, :]
    no = np.zeros_like(plain)
    return np.block([[plain, no], [before, same]])


def block_spans(num_frames: int, tokens_per_frame: int, frames_per_block: int) -> list[tuple[int, int]]:
    """Token [start, end) of every block (the last one may be shorter)."""
    n = -(-num_frames // frames_per_block)
    return [(i * frames_per_block * tokens_per_frame, min((i + 1) * frames_per_block, num_frames) * tokens_per_frame)
            for i in range(n)]


def blockwise_attention(attn: WanAttention, q_blnh: jax.Array, k_blnh: jax.Array, v_blnh: jax.Array,
                        spans: list[tuple[int, int]], teacher_forcing: bool) -> jax.Array:
    """`block_causal_mask` attention (+ output projection) without a mask: one unmasked call per
    query block over exactly the keys it may see, so only the allowed logits are computed and
    cuDNN runs its plain flash kernel (a dense mask would become a (2L)² bias, computed in full,
    with a dbias in the backward pass). Plain: block i's queries see keys [0, end_i). Teacher
    forcing ([clean; noisy], L tokens each): clean block i as plain; noisy block i sees
    clean [0, start_i) + noisy [start_i, end_i)."""
    length = spans[-1][1]
    outs, noisy_outs = [], []
    for start, end in spans:
        outs.append(attn.attend(q_blnh[:, start:end], k_blnh[:, :end], v_blnh[:, :end]))
        if teacher_forcing:
            k = jnp.concatenate([k_blnh[:, :start], k_blnh[:, length + start:length + end]], axis=1)
            v = jnp.concatenate([v_blnh[:, :start], v_blnh[:, length + start:length + end]], axis=1)
            noisy_outs.append(attn.attend(q_blnh[:, length + start:length + end], k, v))
    return jnp.concatenate(outs + noisy_outs, axis=1)


def block_causal_forward(model: WanDiT, z_bthwc: jax.Array, t_bf: jax.Array, ctx_bsk: jax.Array,
                         control_bthwc: jax.Array | None = None, *, frames_per_block: int,
                         noisy_bthwc: jax.Array | None = None, noisy_t_bf: jax.Array | None = None,
                         blockwise: bool = True) -> jax.Array:
    """One forward of a whole chunk under the block-causal mask (absolute positions, no cache).

    With `noisy_bthwc` (teacher forcing, e.g. the causal flow-matching warm-up) the clean chunk
    `z_bthwc` is context and the velocity of the noisy copy is returned; else the velocity of z.
    `blockwise` (the default) computes the attention block by block (`blockwise_attention`: no
    mask, no masked-out logits); `blockwise=False` makes one attention call with the dense (L, L)
    boolean mask, the reference the tests hold it to. Dense is fine at toy sizes, but at 5B
    (2 × 8190 tokens) it would be 13 GB of logits per layer with XLA attention, and even on CPU at
    the synthetic student's size (2 × 2,352 tokens) a teacher-forced step takes ≈ 4.5× as long.

    `cfg.token_multiple` tail-pads the whole sequence (2 × 8190 → 16384 with the 5B recipes' 16):
    the pads are no block's keys, and their own outputs are dropped before the head."""
    cfg = model.cfg
    grid = token_grid(z_bthwc.shape, cfg)
    f, tokens = grid[0], grid[1] * grid[2]
    x_bld = input_tokens(model, z_bthwc, control_bthwc)
    rope_cs = rope.rope_cos_sin(grid, cfg.head_dim, cfg.rope_theta, max_len=cfg.rope_max_len)
    forcing = noisy_bthwc is not None
    if forcing:
        x_bld = jnp.concatenate([x_bld, input_tokens(model, noisy_bthwc, control_bthwc)], axis=1)
        t_bf = jnp.concatenate([t_bf, noisy_t_bf], axis=1)
        rope_cs = tuple(jnp.concatenate([a, a], axis=0) for a in rope_cs)  # same positions twice
    x_bld, rope_cs, pad = pad_tokens(x_bld, rope_cs, cfg.token_multiple)
    spans = block_spans(f, tokens, frames_per_block)
    mask = None if blockwise else jnp.asarray(_padded_mask(block_causal_mask(f, tokens, frames_per_block, forcing),
                                                           pad))[None, None]
    ctx_bsd = model.embed_text(ctx_bsk)
    temb_bfd, tproj_bf6d = model.embed_time(t_bf)
    num_frames = t_bf.shape[1]

    def self_attention(attn: WanAttention, h_bld: jax.Array):
        q_blnh, k_blnh, v_blnh = attn.self_qkv(h_bld, rope_cs, rope_cs)
        if blockwise:
            out_bld = blockwise_attention(attn, q_blnh, k_blnh, v_blnh, spans, forcing)
            return jnp.pad(out_bld, ((0, 0), (0, pad), (0, 0))), None
        return attn.attend(q_blnh, k_blnh, v_blnh, mask_bnls=mask), None

    def layer(block: WanBlock, x, _):
        return block.forward(x, ctx_bsd, tproj_bf6d, num_frames, self_attention=self_attention, pad=pad)

    x_bld = model.scan_blocks(layer, x_bld)[0]
    if forcing:
        x_bld, temb_bfd = x_bld[:, f * tokens:2 * f * tokens], temb_bfd[:, f:]
    else:
        x_bld = x_bld[:, :f * tokens]
    return model.project_out(x_bld, temb_bfd, grid)


def _padded_mask(mask_ll: np.ndarray, pad: int) -> np.ndarray:
    """The dense mask with `pad` tail tokens: no real query sees them; each pad query sees token 0
    only (a finite softmax; pad outputs are dropped)."""
    if not pad:
        return mask_ll
    out = np.pad(mask_ll, ((0, pad), (0, pad)))
    out[-pad:, 0] = True
    return out

