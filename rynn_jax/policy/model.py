"""The trainable policy: (CNN) → Flow Former compressor → flow-matching action head (docs/POLICY.md).

    vision (B, T, S, C) ─ token MLP C → 768 → 384, + time embedding (T, 1, 384)
        └ Flow Former × 6: per-frame Perceiver (queries ⊕ frame tokens as K/V), temporal attention
          over T, FFN ×4 ─ LayerNorm ─▶ (B, T·Q, 384)
    encoder (4 × non-causal): [goal 32 | vision T·Q | proprio 1] ─▶ context (B, 369, 384)
    decoder (4 ×, adaLN on sinusoid(5t) → MLP): action tokens (B, 10, 384)
        causal self-attention, cross-attention to the whole context, FFN ─▶ velocity (B, 10, 54)

Dropout takes an explicit key (`rng`; None = evaluation): the policy is merged inside jitted pure
functions, so no mutable RNG state lives in the module. The encoder does not depend on the flow
time, so sampling runs it once per chunk and only the decoder per Euler step.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.policy.config import CnnConfig, CompressorConfig, HeadConfig, PolicyConfig

_INIT = nnx.initializers.normal(0.02)  # the released head's init: N(0, 0.02) weights, zero biases


def _linear(d_in: int, d_out: int, rngs: nnx.Rngs, *, bias: bool = True, zero: bool = False) -> nnx.Linear:
    return nnx.Linear(d_in, d_out, use_bias=bias, rngs=rngs,
                      kernel_init=nnx.initializers.zeros_init() if zero else _INIT)


def dropout(x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
    if rng is None or rate == 0.0:
        return x
    keep = jax.random.bernoulli(rng, 1.0 - rate, x.shape)
    return jnp.where(keep, x / (1.0 - rate), 0.0)


def attend(q_bqnh: jax.Array, k_bknh: jax.Array, v_bknh: jax.Array, *, causal: bool = False,
           rate: float = 0.0, rng: jax.Array | None = None) -> jax.Array:
    """Softmax attention (B, Q, N, H) × (B, K, N, H) → (B, Q, N·H); dropout on the weights."""
    logits = jnp.einsum("bqnh,bknh->bnqk", q_bqnh, k_bknh) / math.sqrt(q_bqnh.shape[-1])
    if causal:
        q, k = logits.shape[-2:]
        logits = jnp.where(jnp.tril(jnp.ones((q, k), bool)), logits, -jnp.inf)
    w = dropout(jax.nn.softmax(logits, axis=-1), rate, rng)
    out = jnp.einsum("bnqk,bknh->bqnh", w, v_bknh)
    return out.reshape(*out.shape[:2], -1)


def _keys(rng: jax.Array | None, n: int) -> list[jax.Array | None]:
    return [None] * n if rng is None else list(jax.random.split(rng, n))


class FeedForward(nnx.Module):
    """LN → Linear → GELU → Linear (the Flow Former's FFN, no biases)."""

    def __init__(self, dim: int, mult: int, rngs: nnx.Rngs):
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.fc = _linear(dim, mult * dim, rngs, bias=False)
        self.proj = _linear(mult * dim, dim, rngs, bias=False)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.proj(jax.nn.gelu(self.fc(self.norm(x)), approximate=False))


# --------------------------------------------------------------------------------------------------
# Compressor (Flow Former)
# --------------------------------------------------------------------------------------------------


class PerceiverLayer(nnx.Module):
    """Learned queries read one frame: K/V = LN(frame tokens) ⊕ LN(queries)."""

    def __init__(self, cfg: CompressorConfig, rngs: nnx.Rngs):
        inner = cfg.heads * cfg.head_dim
        self.heads = cfg.heads
        self.norm_media, self.norm_latents = nnx.LayerNorm(cfg.dim, rngs=rngs), nnx.LayerNorm(cfg.dim, rngs=rngs)
        self.q, self.k, self.v = (_linear(cfg.dim, inner, rngs, bias=False) for _ in range(3))
        self.out = _linear(inner, cfg.dim, rngs, bias=False)

    def __call__(self, media_nsd: jax.Array, latents_nqd: jax.Array) -> jax.Array:
        x, lat = self.norm_media(media_nsd), self.norm_latents(latents_nqd)
        kv = jnp.concatenate([x, lat], axis=1)
        split = lambda a: a.reshape(*a.shape[:2], self.heads, -1)  # noqa: E731
        return self.out(attend(split(self.q(lat)), split(self.k(kv)), split(self.v(kv))))


class SelfAttention(nnx.Module):
    """Pre-LN multi-head self-attention with biased q/k/v (the temporal and the head's)."""

    def __init__(self, dim: int, heads: int, rngs: nnx.Rngs, *, out_bias: bool = True):
        self.heads = heads
        self.norm = nnx.LayerNorm(dim, rngs=rngs)
        self.q, self.k, self.v = (_linear(dim, dim, rngs) for _ in range(3))
        self.out = _linear(dim, dim, rngs, bias=out_bias)

    def __call__(self, x: jax.Array, context: jax.Array | None = None, *, normed: bool = False,
                 causal: bool = False, rate: float = 0.0, rng: jax.Array | None = None) -> jax.Array:
        """Attention of (normed) x over itself or over `context` (taken as is)."""
        h = x if normed else self.norm(x)
        src = h if context is None else context
        split = lambda a: a.reshape(*a.shape[:2], self.heads, -1)  # noqa: E731
        return self.out(attend(split(self.q(h)), split(self.k(src)), split(self.v(src)),
                               causal=causal, rate=rate, rng=rng))


class CompressorLayer(nnx.Module):
    def __init__(self, cfg: CompressorConfig, rngs: nnx.Rngs):
        self.perceiver = PerceiverLayer(cfg, rngs)
        self.temporal = SelfAttention(cfg.dim, cfg.heads, rngs)
        self.ffn = FeedForward(cfg.dim, cfg.ff_mult, rngs)


class Compressor(nnx.Module):
    """(B, T, S, C) features → (B, T·Q, dim) vision tokens."""

    def __init__(self, cfg: CompressorConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.token_mlp_1 = _linear(cfg.in_dim, cfg.hidden_dim, rngs)
        self.token_mlp_2 = _linear(cfg.hidden_dim, cfg.dim, rngs)
        self.time_embed = nnx.Param(jax.random.normal(rngs.params(), (cfg.num_frames, 1, cfg.dim)))
        self.queries = nnx.Param(jax.random.normal(rngs.params(), (cfg.num_frames, cfg.queries_per_frame, cfg.dim)))
        self.layers = nnx.List([CompressorLayer(cfg, rngs) for _ in range(cfg.layers)])
        self.norm = nnx.LayerNorm(cfg.dim, rngs=rngs)

    def __call__(self, feats_btsc: jax.Array) -> jax.Array:
        cfg = self.cfg
        b, t, s, c = feats_btsc.shape
        if (t, c) != (cfg.num_frames, cfg.in_dim):
            raise ValueError(f"compressor expects (B, {cfg.num_frames}, S, {cfg.in_dim}) features, got {feats_btsc.shape}")
        x = self.token_mlp_2(jax.nn.gelu(self.token_mlp_1(feats_btsc.astype(jnp.float32)), approximate=False))
        media = (x + self.time_embed[...]).reshape(b * t, s, cfg.dim)
        q = jnp.broadcast_to(self.queries[...], (b, t, cfg.queries_per_frame, cfg.dim)).reshape(b * t, -1, cfg.dim)
        for layer in self.layers:
            q = q + layer.perceiver(media, q)
            qt = q.reshape(b, t, -1, cfg.dim).transpose(0, 2, 1, 3).reshape(-1, t, cfg.dim)  # (B·Q, T, D)
            qt = qt + layer.temporal(qt)
            q = qt.reshape(b, -1, t, cfg.dim).transpose(0, 2, 1, 3).reshape(b * t, -1, cfg.dim)
            q = q + layer.ffn(q)
        return self.norm(q.reshape(b, t * cfg.queries_per_frame, cfg.dim))


# --------------------------------------------------------------------------------------------------
# Action head
# --------------------------------------------------------------------------------------------------


class Mlp(nnx.Module):
    """Linear → GELU → Linear with dropout (the transformer blocks' FFN)."""

    def __init__(self, dim: int, rngs: nnx.Rngs):
        self.fc = _linear(dim, 4 * dim, rngs, bias=False)
        self.proj = _linear(4 * dim, dim, rngs, bias=False)

    def __call__(self, x: jax.Array, rate: float, rng: jax.Array | None) -> jax.Array:
        return dropout(self.proj(jax.nn.gelu(self.fc(x), approximate=False)), rate, rng)


class EncoderBlock(nnx.Module):
    def __init__(self, cfg: HeadConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.attn = SelfAttention(cfg.dim, cfg.heads, rngs, out_bias=False)
        self.norm_mlp = nnx.LayerNorm(cfg.dim, rngs=rngs)
        self.mlp = Mlp(cfg.dim, rngs)

    def __call__(self, x: jax.Array, rng: jax.Array | None) -> jax.Array:
        cfg, k = self.cfg, _keys(rng, 3)
        x = x + dropout(self.attn(x, rate=cfg.attn_dropout, rng=k[0]), cfg.resid_dropout, k[1])
        return x + self.mlp(self.norm_mlp(x), cfg.mlp_dropout, k[2])


class DecoderBlock(nnx.Module):
    """adaLN-Zero block: x·(1 + scale) + shift before the causal self-attention and the FFN, gated
    residuals; the cross-attention to the context (all of it) is not modulated."""

    def __init__(self, cfg: HeadConfig, rngs: nnx.Rngs):
        self.cfg = cfg
        self.modulation = _linear(cfg.dim, 6 * cfg.dim, rngs, zero=True)
        self.norm_attn = nnx.LayerNorm(cfg.dim, use_scale=False, use_bias=False, rngs=rngs)
        self.norm_mlp = nnx.LayerNorm(cfg.dim, use_scale=False, use_bias=False, rngs=rngs)
        self.attn = SelfAttention(cfg.dim, cfg.heads, rngs, out_bias=False)
        self.cross = SelfAttention(cfg.dim, cfg.heads, rngs, out_bias=False)
        self.mlp = Mlp(cfg.dim, rngs)

    def __call__(self, x: jax.Array, c_b1d: jax.Array, context: jax.Array, rng: jax.Array | None) -> jax.Array:
        cfg, k = self.cfg, _keys(rng, 5)
        shift_a, scale_a, gate_a, shift_m, scale_m, gate_m = jnp.split(self.modulation(jax.nn.silu(c_b1d)), 6, -1)
        h = self.norm_attn(x) * (1 + scale_a) + shift_a
        x = x + gate_a * dropout(self.attn(h, normed=True, causal=True, rate=cfg.attn_dropout, rng=k[0]),
                                 cfg.resid_dropout, k[1])
        x = x + dropout(self.cross(x, context, rate=cfg.attn_dropout, rng=k[2]), cfg.resid_dropout, k[3])
        return x + gate_m * self.mlp(self.norm_mlp(x) * (1 + scale_m) + shift_m, cfg.mlp_dropout, k[4])


def sinusoid(t_b: jax.Array, dim: int) -> jax.Array:
    """[sin | cos] of t · 10000^(−i/(dim/2 − 1)), i < dim/2 (the released head's time features)."""
    half = dim // 2
    freqs = jnp.exp(-math.log(10000.0) / (half - 1) * jnp.arange(half, dtype=jnp.float32))
    arg = t_b.astype(jnp.float32)[:, None] * freqs[None]
    return jnp.concatenate([jnp.sin(arg), jnp.cos(arg)], axis=-1)


class ActionHead(nnx.Module):
    def __init__(self, cfg: HeadConfig, vision_dim: int, rngs: nnx.Rngs):
        d = cfg.dim
        self.cfg = cfg
        self.goal_1, self.goal_2 = _linear(cfg.goal_dim, 2 * d, rngs), _linear(2 * d, d, rngs)
        self.vision = _linear(vision_dim, d, rngs)
        self.proprio_1, self.proprio_2 = _linear(cfg.proprio_dim, 2 * d, rngs), _linear(2 * d, d, rngs)
        self.encoder = nnx.List([EncoderBlock(cfg, rngs) for _ in range(cfg.encoder_layers)])
        self.encoder_norm = nnx.LayerNorm(d, rngs=rngs)
        self.time_1, self.time_2 = _linear(d, 2 * d, rngs), _linear(2 * d, d, rngs)
        self.action_in = _linear(cfg.action_dim, d, rngs)
        self.decoder = nnx.List([DecoderBlock(cfg, rngs) for _ in range(cfg.decoder_layers)])
        self.decoder_norm = nnx.LayerNorm(d, rngs=rngs)
        self.action_out = _linear(d, cfg.action_dim, rngs)

    def encode(self, vision_bnd: jax.Array, goal_bgk: jax.Array, proprio_bp: jax.Array,
               rng: jax.Array | None = None) -> jax.Array:
        """Context (B, goal_len + N + 1, dim) from goal tokens, vision tokens and the raw state."""
        cfg = self.cfg
        goal = self.goal_2(jax.nn.gelu(self.goal_1(goal_bgk[:, :cfg.goal_len].astype(jnp.float32)), approximate=False))
        proprio = self.proprio_2(jax.nn.mish(self.proprio_1(proprio_bp.astype(jnp.float32))))[:, None]
        x = jnp.concatenate([goal, self.vision(vision_bnd), proprio], axis=1)
        for block, k in zip(self.encoder, _keys(rng, len(self.encoder))):
            x = block(x, k)
        return self.encoder_norm(x)

    def velocity(self, context: jax.Array, x_bad: jax.Array, t_b: jax.Array, rng: jax.Array | None = None) -> jax.Array:
        """Flow velocity (B, chunk, action_dim) of the noisy chunk x at flow time t ∈ [0, 1]."""
        cfg = self.cfg
        c = self.time_2(jax.nn.mish(self.time_1(sinusoid(cfg.time_scale * t_b, cfg.dim))))[:, None]
        x = self.action_in(x_bad.astype(jnp.float32))
        for block, k in zip(self.decoder, _keys(rng, len(self.decoder))):
            x = block(x, c, context, k)
        return self.action_out(self.decoder_norm(x))


# --------------------------------------------------------------------------------------------------
# CNN encoder and the policy
# --------------------------------------------------------------------------------------------------


class CnnEncoder(nnx.Module):
    """(B, H, W, 4) RGB + depth in [−1, 1] → (B, 1, H/2^n · W/2^n, C) tokens: stride-2 conv stages."""

    def __init__(self, cfg: CnnConfig, rngs: nnx.Rngs):
        chans = (4, *cfg.channels)
        self.convs = nnx.List([nnx.Conv(a, b, (3, 3), strides=2, padding="SAME", rngs=rngs)
                               for a, b in zip(chans[:-1], chans[1:])])
        self.norms = nnx.List([nnx.GroupNorm(b, num_groups=cfg.groups, rngs=rngs) for b in cfg.channels])
        self.convs_2 = nnx.List([nnx.Conv(b, b, (3, 3), padding="SAME", rngs=rngs) for b in cfg.channels])
        self.norms_2 = nnx.List([nnx.GroupNorm(b, num_groups=cfg.groups, rngs=rngs) for b in cfg.channels])

    def __call__(self, image_bhwc: jax.Array) -> jax.Array:
        x = image_bhwc.astype(jnp.float32)
        for conv, norm, conv_2, norm_2 in zip(self.convs, self.norms, self.convs_2, self.norms_2):
            x = jax.nn.silu(norm(conv(x)))
            x = x + jax.nn.silu(norm_2(conv_2(x)))  # a residual 3×3 per stage
        b, h, w, c = x.shape
        return x.reshape(b, 1, h * w, c)


class Policy(nnx.Module):
    """Everything the optimizer trains: (CNN), compressor, action head."""

    def __init__(self, cfg: PolicyConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.cnn = CnnEncoder(cfg.cnn, rngs) if cfg.encoder == "cnn" else nnx.data(None)
        self.compressor = Compressor(cfg.compressor, rngs)
        self.head = ActionHead(cfg.head, cfg.compressor.dim, rngs)

    def context(self, vision: jax.Array, goal_bgk: jax.Array, proprio_bp: jax.Array,
                rng: jax.Array | None = None) -> jax.Array:
        """The head's context from the vision input (features (B, T, S, C), or the CNN's image)."""
        feats = self.cnn(vision) if self.cnn is not None else vision
        return self.head.encode(self.compressor(feats), goal_bgk, proprio_bp, rng)


def init_policy(cfg: PolicyConfig) -> Policy:
    return Policy(cfg, rngs=nnx.Rngs(params=cfg.seed))


def count_params(cfg: PolicyConfig) -> int:
    """Trainable parameters of `cfg`, from shapes only (jax.eval_shape; nothing allocated)."""
    abstract = nnx.eval_shape(lambda: Policy(cfg, rngs=nnx.Rngs(0)))
    return sum(math.prod(x.shape) for x in jax.tree.leaves(nnx.state(abstract, nnx.Param)))
