"""The umT5 text encoder (umT5-XXL conditions Wan2.2 and the RynnWorld models), in Flax NNX.

A T5 v1.1 encoder whose every block has its own relative-position bias table (T5 shares one):

    x = embed(ids)
    per block:  x += Attn(RMSNorm x) + bias_l(j - i)      (no 1/√d scaling of the logits, as T5)
                x += W_down(gelu_tanh(W_gate h) · W_up h),  h = RMSNorm x
    out = RMSNorm x

Numerics: matmuls in `cfg.dtype` (bfloat16 to serve), RMS norms, attention logits, softmax and the
residual stream in float32. Prompts are right-padded; `lengths_b` masks the padded keys. Padding
changes nothing for the real tokens (relative positions and masked keys only), so a batch may be
encoded at any length ≥ its longest prompt: `rynn_jax.text_encoder` uses short buckets, not 512.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.models import build
from rynn_jax.models.layers import param, rms_norm
from rynn_jax.sharding import constrain

# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class UMT5Config:
    vocab_size: int = 256384  # token embedding rows
    dim: int = 4096  # model width (d_model); the DiT's text_dim
    num_heads: int = 64  # attention heads
    head_dim: int = 64  # per-head width (d_kv); attention width = num_heads × head_dim
    ffn_dim: int = 10240  # gated-GELU hidden width (d_ff)
    num_layers: int = 24  # blocks, run with scan
    num_buckets: int = 32  # relative-position buckets per block, half for each direction
    max_distance: int = 128  # distances ≥ this share the last bucket of their direction
    eps: float = 1e-6  # RMS norm epsilon
    dtype: str = "float32"  # compute dtype of matmuls ("bfloat16" to serve)
    param_dtype: str = "float32"  # storage dtype of parameters
    attention: Literal["xla", "cudnn"] = "xla"  # jax.nn.dot_product_attention implementation

    def __post_init__(self) -> None:
        if self.num_buckets < 4 or self.num_buckets % 2:
            raise ValueError(f"num_buckets must be even and ≥ 4, got {self.num_buckets}")

    @property
    def attn_dim(self) -> int:
        return self.num_heads * self.head_dim

    @classmethod
    def xxl(cls, **overrides) -> "UMT5Config":
        """umT5-XXL, the encoder Wan2.x ships (`models_t5_umt5-xxl-enc-bf16.pth`), ≈ 5.7B parameters."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "UMT5Config":
        """A small random encoder for tests and CPU smoke runs."""
        return cls(**{**dict(vocab_size=256, dim=32, num_heads=4, head_dim=8, ffn_dim=64, num_layers=2,
                             num_buckets=8, max_distance=16), **overrides})


# --------------------------------------------------------------------------------------------------
# Relative positions
# --------------------------------------------------------------------------------------------------


def relative_buckets(length: int, num_buckets: int, max_distance: int) -> np.ndarray:
    """(length, length) int32 bucket of key j seen from query i (bidirectional T5 bucketing).

    Half the buckets per direction; within one, the first half are exact distances, the rest
    log-spaced up to `max_distance`. Computed on the host in float32 as the reference does (its
    truncation of the log ratio decides the bucket at the boundaries), so it is a constant of
    the compiled program."""
    rel_ll = np.arange(length)[None, :] - np.arange(length)[:, None]
    half = num_buckets // 2
    exact = half // 2
    dist = np.abs(rel_ll)
    with np.errstate(divide="ignore"):
        log_ratio = np.log(dist.astype(np.float32) / np.float32(exact)) / np.float32(math.log(max_distance / exact))
    far = exact + np.nan_to_num(log_ratio * np.float32(half - exact), neginf=0.0).astype(np.int64)
    bucket = np.where(dist < exact, dist, np.minimum(far, half - 1))
    return (bucket + (rel_ll > 0) * half).astype(np.int32)


# --------------------------------------------------------------------------------------------------
# Block and encoder
# --------------------------------------------------------------------------------------------------


def _linear(cfg: UMT5Config, d_in: int, d_out: int, names: tuple[str, str], rngs: nnx.Rngs,
            std: float | None = None) -> nnx.Linear:
    """Bias-free linear with logical axis names (T5 linears have no bias); init std d_in^-1/2 unless given."""
    std = d_in ** -0.5 if std is None else std
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=jnp.dtype(cfg.dtype),
                      param_dtype=jnp.dtype(cfg.param_dtype),
                      kernel_init=nnx.with_partitioning(nnx.initializers.normal(std), names), rngs=rngs)


class UMT5Block(nnx.Module):
    def __init__(self, cfg: UMT5Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d, a = cfg.dim, cfg.attn_dim
        ones = nnx.initializers.ones_init()
        self.norm_attn = param(rngs, ones, (d,), cfg.param_dtype, ("embed",))
        # T5's query init, (d_model·d_kv)^-1/2: the logits are not scaled by 1/sqrt(d_kv), so a query
        # drawn like the other kernels gives logits of std ≈ sqrt(d_kv) and near-one-hot softmaxes whose
        # rounding differences grow layer by layer (random XXL weights: 30 % apart between batch sizes).
        self.q = _linear(cfg, d, a, ("embed", "heads"), rngs, std=(d * cfg.head_dim) ** -0.5)
        self.k = _linear(cfg, d, a, ("embed", "heads"), rngs)
        self.v = _linear(cfg, d, a, ("embed", "heads"), rngs)
        self.o = _linear(cfg, a, d, ("heads", "embed"), rngs)
        self.rel_bias = param(rngs, nnx.initializers.normal(d ** -0.5), (cfg.num_buckets, cfg.num_heads),
                              cfg.param_dtype, ("rel_buckets", None))
        self.norm_ffn = param(rngs, ones, (d,), cfg.param_dtype, ("embed",))
        self.ffn_gate = _linear(cfg, d, cfg.ffn_dim, ("embed", "mlp"), rngs)  # through the GELU
        self.ffn_up = _linear(cfg, d, cfg.ffn_dim, ("embed", "mlp"), rngs)  # linear branch
        self.ffn_down = _linear(cfg, cfg.ffn_dim, d, ("mlp", "embed"), rngs)

    def position_bias(self, buckets_ll: np.ndarray) -> jax.Array:
        """This block's attention bias (1, N, L, L), float32."""
        return jnp.transpose(self.rel_bias[...].astype(jnp.float32)[buckets_ll], (2, 0, 1))[None]

    def __call__(self, x_bld: jax.Array, lengths_b: jax.Array, buckets_ll: np.ndarray) -> jax.Array:
        cfg = self.cfg
        b, l, _ = x_bld.shape
        dtype = jnp.dtype(cfg.dtype)
        h = rms_norm(x_bld, self.norm_attn[...], cfg.eps).astype(dtype)
        heads = lambda a: a.reshape(b, l, cfg.num_heads, cfg.head_dim)  # noqa: E731
        q_blnh = constrain(heads(self.q(h)), ("act_batch", "act_len", "act_heads", None))
        k_blnh, v_blnh = (constrain(heads(p(h)), ("act_batch", "act_kv_len", "act_heads", None))
                          for p in (self.k, self.v))
        bias_1nll = self.position_bias(buckets_ll)
        if cfg.attention == "cudnn":  # cuDNN wants the bias in the inputs' dtype
            bias_1nll = bias_1nll.astype(dtype)
        out_blnh = jax.nn.dot_product_attention(
            q_blnh, k_blnh, v_blnh, bias=bias_1nll, scale=1.0,
            key_value_seq_lengths=lengths_b, implementation=cfg.attention)
        x_bld = x_bld + self.o(out_blnh.reshape(b, l, cfg.attn_dim)).astype(jnp.float32)

        h = rms_norm(x_bld, self.norm_ffn[...], cfg.eps).astype(dtype)
        h = jax.nn.gelu(self.ffn_gate(h), approximate=True) * self.ffn_up(h)
        h = constrain(h, ("act_batch", "act_len", "act_mlp"))
        x_bld = x_bld + self.ffn_down(h).astype(jnp.float32)
        return constrain(x_bld, ("act_batch", "act_len", "act_embed"))


class UMT5Encoder(nnx.Module):
    """Token ids (B, L), right-padded, and true lengths (B,) → hidden states (B, L, D) float32
    (rows past a prompt's length are not meaningful)."""

    def __init__(self, cfg: UMT5Config, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.token_embed = param(rngs, nnx.initializers.normal(1.0), (cfg.vocab_size, cfg.dim), cfg.param_dtype,
                                 ("vocab", "embed"))

        @nnx.split_rngs(splits=cfg.num_layers)
        @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
        def make_blocks(rngs: nnx.Rngs) -> UMT5Block:
            return UMT5Block(cfg, rngs=rngs)

        self.blocks = make_blocks(rngs)
        self.norm_out = param(rngs, nnx.initializers.ones_init(), (cfg.dim,), cfg.param_dtype, ("embed",))

    def __call__(self, ids_bl: jax.Array, lengths_b: jax.Array) -> jax.Array:
        cfg = self.cfg
        buckets_ll = relative_buckets(ids_bl.shape[1], cfg.num_buckets, cfg.max_distance)
        x_bld = jnp.take(self.token_embed[...], ids_bl, axis=0).astype(jnp.float32)
        x_bld = constrain(x_bld, ("act_batch", "act_len", "act_embed"))
        graphdef, state = nnx.split(self.blocks)

        def layer(x: jax.Array, layer_state: nnx.State) -> tuple[jax.Array, None]:
            return nnx.merge(graphdef, layer_state)(x, lengths_b, buckets_ll), None

        x_bld = jax.lax.scan(layer, x_bld, state)[0]
        return rms_norm(x_bld, self.norm_out[...], cfg.eps)


def init_umt5(cfg: UMT5Config, seed: int = 0) -> UMT5Encoder:
    return build.init_model(UMT5Encoder, cfg, seed)


def abstract_umt5(cfg: UMT5Config) -> UMT5Encoder:
    """The encoder with ShapeDtypeStruct leaves: shapes and parameter count without allocating."""
    return build.abstract_model(UMT5Encoder, cfg)


def umt5_from_params(cfg: UMT5Config, params: dict) -> UMT5Encoder:
    return build.model_from_params(UMT5Encoder, cfg, params)
