"""Wan2.2 TI2V video diffusion transformer (the 5B DiT), in Flax NNX.

Layout is channels-last throughout: latents are (B, T, H, W, C). Tokens are the (t, h, w) patches in
row-major order. Timesteps are given per latent *frame* (B, T) — TI2V puts frame 0 (the clean image
latent) at t=0 — and every modulation tensor is computed per frame and broadcast over that frame's
tokens, which is what the reference's per-token timesteps amount to at 1/390 of the memory.

Numerics follow the reference where it matters for parity: layer norms, modulation, the time
embedding and the residual stream stay in float32; matmuls and attention run in `cfg.dtype`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, TypeVar

import jax
import jax.numpy as jnp
from flax import nnx

from rynn_jax.models import build, rope
from rynn_jax.models.control import ControlBranch
from rynn_jax.models.dit_blocks import (_REMAT_POLICIES, ATTENTION_FWD_PRIMITIVES, WanAttention, WanBlock, attention,
                                        attention_impl, frames_to_tokens, modulate, pad_tokens,
                                        save_dots_and_attention, timestep_sinusoid)
from rynn_jax.models.dit_config import WanDiTConfig
from rynn_jax.models.fp8_linear import Fp8Linear
from rynn_jax.models.layers import layer_norm, linear, param, patchify_embed

__all__ = [  # the config and the block's pieces are re-exported: callers import them from here
    "WanDiTConfig", "ATTENTION_FWD_PRIMITIVES", "WanAttention", "WanBlock", "attention", "attention_impl",
    "frames_to_tokens", "modulate", "pad_tokens", "save_dots_and_attention", "timestep_sinusoid",
    "patch_embed_params", "stacked", "unstacked", "WanDiT", "token_grid", "unpatchify", "init_dit", "abstract_dit", "unrolled",
    "fuse_qkv", "fuse_cross_kv", "dit_from_params",
]

# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------


def patch_embed_params(cfg: WanDiTConfig, rngs: nnx.Rngs) -> tuple[nnx.Param, nnx.Param]:
    """The patch-embedding Conv3d as a (pt, ph, pw, C_in, D) kernel and its bias."""
    pt, ph, pw = cfg.patch_size
    kernel = param(rngs, nnx.initializers.xavier_uniform(in_axis=(0, 1, 2, 3), out_axis=4),
                   (pt, ph, pw, cfg.in_channels, cfg.dim), cfg.param_dtype,
                   ("patch", "patch", "patch", "in_channels", "embed"))
    return kernel, param(rngs, nnx.initializers.zeros_init(), (cfg.dim,), cfg.param_dtype, ("embed",))


M = TypeVar("M", bound=nnx.Module)


def stacked(make: Callable[[nnx.Rngs], M], n: int, rngs: nnx.Rngs) -> M:
    """`n` modules made by `make(rngs)`, their variables stacked on a leading "layers" axis (what
    `WanDiT.scan_blocks` runs over), each layer from its own split of `rngs`."""
    @nnx.split_rngs(splits=n)
    @nnx.vmap(in_axes=(0,), out_axes=0, transform_metadata={nnx.PARTITION_NAME: "layers"})
    def make_all(rngs: nnx.Rngs) -> M:
        return make(rngs)

    return make_all(rngs)


def unstacked(stack: nnx.Module, abstract_layer: nnx.Module, n: int) -> list[nnx.Module]:
    """The inverse of `stacked`: its first `n` layers as modules of their own, each with the
    structure of `abstract_layer` (an abstract module of one layer) and its slice of every stacked
    variable, copied out once."""
    values = nnx.to_pure_dict(nnx.state(stack))
    slice_layer = jax.jit(lambda tree, i: jax.tree.map(lambda a: a[i], tree))
    graphdef, abstract = nnx.split(abstract_layer)
    layers = []
    for i in range(n):
        state = jax.tree.map(lambda a: a, abstract)  # a fresh State to fill
        nnx.replace_by_pure_dict(state, slice_layer(values, i))
        layers.append(nnx.merge(graphdef, state))
    return layers


class WanDiT(nnx.Module):
    """Velocity prediction v(z_t, t, text) for latents (B, T, H, W, C_in) → (B, T, H, W, C_out)."""

    def __init__(self, cfg: WanDiTConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        d = cfg.dim
        self.patch_embed, self.patch_embed_bias = patch_embed_params(cfg, rngs)
        self.text_embed_1 = linear(cfg, cfg.text_dim, d, ("text_embed", "embed"), rngs)
        self.text_embed_2 = linear(cfg, d, d, ("embed", "embed"), rngs)
        self.time_embed_1 = linear(cfg, cfg.freq_dim, d, ("time_freq", "embed"), rngs)
        self.time_embed_2 = linear(cfg, d, d, ("embed", "embed"), rngs)
        self.time_proj = linear(cfg, d, 6 * d, ("embed", "mlp"), rngs)

        self.blocks = stacked(lambda r: WanBlock(cfg, rngs=r), cfg.num_layers, rngs)
        self.head_modulation = param(rngs, nnx.initializers.normal(d ** -0.5), (2, d), cfg.param_dtype,
                                      ("modulation", "embed"))
        self.head = linear(cfg, d, cfg.patch_dim_out, ("embed", "out_channels"), rngs)
        self.control = ControlBranch(cfg, rngs=rngs) if cfg.control != "none" else None
        # Serving layout only (`fuse_cross_kv`): every block's cross-attention k, v as one
        # (D, layers·2·D) linear over the text context, and the blocks' own k/v set to None.
        self.fused_text_kv: nnx.Linear | Fp8Linear | None = nnx.data(None)

    # -- pieces that later modules (control branch, causal student) reuse -------------------------

    def embed_patches(self, z_bthwc: jax.Array) -> jax.Array:
        """(B, T, H, W, C) latents → (B, L, D) tokens, L = T/pt · H/ph · W/pw in (t, h, w) order."""
        token_grid(z_bthwc.shape, self.cfg)
        return patchify_embed(z_bthwc, self.patch_embed[...], self.patch_embed_bias[...],
                              self.cfg.patch_size, jnp.dtype(self.cfg.dtype))

    def control_tokens(self, z_bthwc: jax.Array, control_bthwc: jax.Array | None, gt_latent_bthwc: jax.Array | None,
                       train: bool, null_control: bool) -> jax.Array | float:
        """What the control branch adds to the patch tokens (B, L, D) float32; 0.0 without a branch
        or under the null condition (`__call__` says what the arguments are)."""
        if self.control is None:
            if control_bthwc is not None:
                raise ValueError("a control latent was given but cfg.control is 'none'")
            return 0.0
        if null_control:
            return 0.0
        if control_bthwc is None:
            raise ValueError("this model has a control branch: pass the control latent (or null_control=True)")
        if control_bthwc.shape[:4] != z_bthwc.shape[:4]:
            raise ValueError(f"control latent {control_bthwc.shape} does not align with {z_bthwc.shape}")
        return self.control(control_bthwc, gt_latent_bthwc, train).astype(jnp.float32)

    def embed_text(self, ctx_bsk: jax.Array) -> jax.Array:
        return self.text_embed_2(jax.nn.gelu(self.text_embed_1(ctx_bsk), approximate=True))

    def embed_time(self, t_bf: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Per-frame time embedding (B, F, D) and block modulation input (B, F, 6, D), float32."""
        cfg = self.cfg
        f32 = lambda lin, a: a @ lin.kernel[...].astype(jnp.float32) + lin.bias[...].astype(jnp.float32)  # noqa: E731
        e = timestep_sinusoid(t_bf, cfg.freq_dim)
        temb = f32(self.time_embed_2, jax.nn.silu(f32(self.time_embed_1, e)))
        tproj = f32(self.time_proj, jax.nn.silu(temb))
        return temb, tproj.reshape(*tproj.shape[:-1], 6, cfg.dim)

    def text_kv(self, ctx_bsd: jax.Array) -> tuple[jax.Array, jax.Array]:
        """Cross-attention K/V of every layer for an embedded text context (B, S, D): two
        (layers, B, S, N, H) arrays. One GEMM when they are fused (`fuse_cross_kv`)."""
        if self.fused_text_kv is None:
            return self.scan_blocks(lambda block, x, _: (x, block.cross_attn.key_value(ctx_bsd)), jnp.zeros(()))[1]
        b, s, d = ctx_bsd.shape
        kv_bsl2d = self.fused_text_kv(ctx_bsd.astype(jnp.dtype(self.cfg.dtype))).reshape(b, s, -1, 2, d)
        kv = [block.cross_attn._key_value_heads(kv_bsl2d[:, :, i, 0], kv_bsl2d[:, :, i, 1], None)
              for i, block in enumerate(self.blocks)]
        return jnp.stack([k for k, _ in kv]), jnp.stack([v for _, v in kv])

    def run_blocks(self, x_bld: jax.Array, ctx_bsd: jax.Array, tproj_bf6d: jax.Array,
                   rope_cs: tuple[jax.Array, jax.Array], num_frames: int, pad: int = 0) -> jax.Array:
        """All blocks (scan_blocks: one `lax.scan` over stacked layers, a loop over `unrolled` ones)."""
        if self.fused_text_kv is not None:  # the serving layout: all layers' text K/V in one GEMM first
            return self.scan_blocks(
                lambda block, x, kv: (block(x, None, tproj_bf6d, rope_cs, num_frames, pad, cross_kv=kv), None),
                x_bld, self.text_kv(ctx_bsd))[0]
        return self.scan_blocks(
            lambda block, x, _: (block(x, ctx_bsd, tproj_bf6d, rope_cs, num_frames, pad), None), x_bld)[0]

    def scan_blocks(self, layer_fn: Callable[[WanBlock, jax.Array, Any], tuple[jax.Array, Any]],
                    x_bld: jax.Array, layer_xs: Any = None, num_layers: int | None = None) -> tuple[jax.Array, Any]:
        """`layer_fn(block, x, xs_l) -> (x, ys_l)` over the first `num_layers` layers (default all)
        with per-layer inputs `layer_xs` (leading layer axis) → (x, stacked ys). The carry `x` may
        be any pytree of arrays.

        Stacked blocks (training, checkpoints): plain `lax.scan` over the split block state, not
        `nnx.scan`: the model may itself be used inside a caller's scan (the sampler's step loop, the
        causal rollout), where NNX transforms refuse modules created at an outer trace level.
        Per-layer blocks (`unrolled`, serving): a Python loop, one layer after another."""
        cfg = self.cfg

        def body(x: jax.Array, inputs, graphdef) -> tuple[jax.Array, Any]:
            layer_state, xs_l = inputs
            return layer_fn(nnx.merge(graphdef, layer_state), x, xs_l)

        if cfg.remat != "none":
            body = jax.checkpoint(body, policy=_REMAT_POLICIES[cfg.remat], static_argnums=(2,))
        if isinstance(self.blocks, nnx.List):
            ys = []
            for i, block in enumerate(self.blocks[:num_layers]):
                graphdef, layer_state = nnx.split(block)
                x_bld, y = body(x_bld, (layer_state, jax.tree.map(lambda a: a[i], layer_xs)), graphdef)
                ys.append(y)
            return x_bld, jax.tree.map(lambda *a: jnp.stack(a), *ys)
        graphdef, state = nnx.split(self.blocks)
        if num_layers is not None and num_layers != cfg.num_layers:
            state = jax.tree.map(lambda a: a[:num_layers], state)
        return jax.lax.scan(lambda x, inputs: body(x, inputs, graphdef), x_bld, (state, layer_xs),
                            unroll=cfg.scan_unroll)

    def project_out(self, x_bld: jax.Array, temb_bfd: jax.Array, grid_thw: tuple[int, int, int],
                    head: nnx.Linear | None = None) -> jax.Array:
        """Modulated final norm and the output linear (`head`, default this model's), unpatchified."""
        cfg = self.cfg
        head = self.head if head is None else head
        b, l, d = x_bld.shape
        f = grid_thw[0]
        mod = self.head_modulation[...].astype(jnp.float32)[None, None] + temb_bfd[:, :, None]
        shift, scale = mod[:, :, 0], mod[:, :, 1]
        h = modulate(layer_norm(x_bld, cfg.eps).reshape(b, f, l // f, d), shift, scale).reshape(b, l, d)
        out = head(h.astype(jnp.dtype(cfg.dtype)))
        return unpatchify(out.astype(jnp.float32), grid_thw, cfg)

    def __call__(self, z_bthwc: jax.Array, t_bf: jax.Array, ctx_bsk: jax.Array,
                 control_bthwc: jax.Array | None = None, *, gt_latent_bthwc: jax.Array | None = None,
                 train: bool = False, null_control: bool = False) -> jax.Array:
        """Velocity for latents z (B, T, H, W, C), per-frame timesteps t (B, T) in [0, 1000],
        and text context (B, S, text_dim) (S = cfg.text_len for official weights). Returns float32.

        With a control branch, `control_bthwc` is the skeleton video's latent (same T, H, W as z);
        `gt_latent_bthwc` (the clean video latent; required in training with add-plus) supplies
        μ_z, σ_z; `train=True` updates the running stats. `null_control=True` is the null condition:
        the branch is skipped (no control latent needed) and the output is the base model's."""
        cfg = self.cfg
        grid = token_grid(z_bthwc.shape, cfg)
        if t_bf.shape != (z_bthwc.shape[0], grid[0]):
            raise ValueError(f"timesteps must be per latent frame, shape {(z_bthwc.shape[0], grid[0])}; "
                             f"got {t_bf.shape}")
        x_bld = self.embed_patches(z_bthwc).astype(jnp.float32)
        x_bld = x_bld + self.control_tokens(z_bthwc, control_bthwc, gt_latent_bthwc, train, null_control)
        ctx_bsd = self.embed_text(ctx_bsk)
        temb, tproj = self.embed_time(t_bf)
        rope_cs = rope.rope_cos_sin(grid, cfg.head_dim, cfg.rope_theta, max_len=cfg.rope_max_len)
        l = x_bld.shape[1]
        x_bld, rope_cs, pad = pad_tokens(x_bld, rope_cs, cfg.token_multiple)  # pads: masked as keys
        x_bld = self.run_blocks(x_bld, ctx_bsd, tproj, rope_cs, grid[0], pad)
        return self.project_out(x_bld[:, :l], temb, grid)


def token_grid(shape_bthwc: tuple[int, ...], cfg: WanDiTConfig) -> tuple[int, int, int]:
    _, t, h, w, c = shape_bthwc
    pt, ph, pw = cfg.patch_size
    if c != cfg.in_channels:
        raise ValueError(f"latent has {c} channels, model expects {cfg.in_channels}")
    if t % pt or h % ph or w % pw:
        raise ValueError(f"latent (T, H, W) = {(t, h, w)} is not divisible by patch size {cfg.patch_size}")
    return t // pt, h // ph, w // pw


def unpatchify(x_blp: jax.Array, grid_thw: tuple[int, int, int], cfg: WanDiTConfig) -> jax.Array:
    """(B, L, pt·ph·pw·C) → (B, T, H, W, C); each token's outputs are patch-major, channel-minor."""
    b = x_blp.shape[0]
    f, h, w = grid_thw
    pt, ph, pw = cfg.patch_size
    x = x_blp.reshape(b, f, h, w, pt, ph, pw, cfg.out_channels)
    return x.transpose(0, 1, 4, 2, 5, 3, 6, 7).reshape(b, f * pt, h * ph, w * pw, cfg.out_channels)


def init_dit(cfg: WanDiTConfig, seed: int = 0) -> WanDiT:
    return build.init_model(WanDiT, cfg, seed)


def abstract_dit(cfg: WanDiTConfig) -> WanDiT:
    """The model with ShapeDtypeStruct leaves: shapes and count without allocating anything."""
    return build.abstract_model(WanDiT, cfg)


def unrolled(model: WanDiT, *, fuse_self_qkv: bool = True, fuse_text_kv: bool = True) -> WanDiT:
    """The serving layout: the layer scan fully unrolled and every block a module of its own
    (`blocks` an nnx.List of per-layer weights instead of (num_layers, …) stacked arrays), for
    serving, where nothing is differentiated. Copies the block weights out of the stacked arrays
    once (drop the stacked model to free them); the other parameters are shared.

    Why (H200, docs/PERFORMANCE.md): the scanned 5B forward at 1170 tokens spent 7.5 of its 28.5 ms
    copying each layer's weights out of the stacked arrays; unrolling the scan made the slices
    static, but XLA still copies a static slice that feeds a cuBLAS call (the bf16 FFN
    up-projection, every FP8 GEMM's weight). Per-layer arrays need no slicing: bf16 forward 25.2 →
    24.4 ms, causal block step −13%, compile 68 → 16 s. `fuse_self_qkv`: see `fuse_qkv`;
    `fuse_text_kv`: see `fuse_cross_kv`."""
    if isinstance(model.blocks, nnx.List):  # already unrolled
        return model
    cfg = dataclasses.replace(model.cfg, scan_unroll=model.cfg.num_layers)
    graphdef, _ = nnx.split(abstract_dit(cfg))
    out = nnx.merge(graphdef, nnx.state(model))
    layers = unstacked(model.blocks, build.abstract_model(WanBlock, cfg), cfg.num_layers)
    if fuse_self_qkv:
        for block in layers:
            fuse_qkv(block.self_attn)
    out.blocks = nnx.List(layers)
    if fuse_text_kv:
        fuse_cross_kv(out)
    return out


def fuse_qkv(attn: WanAttention) -> None:
    """In place: replaces a self-attention's q, k, v linears by one (D, 3D) linear (`attn.qkv`;
    FP8 kernels stay quantized per output channel, so their scales just concatenate). Serving
    only: checkpoints and training keep the three (diffusers' layout).

    Why: XLA's GPU dot merger joins the three GEMMs that read the same input anyway, but with
    per-layer weights it then concatenates the three weights on every call (40 concatenations per
    FP8 forward, ≈ 2 × 57 MB per bf16 block); a pre-concatenated kernel makes it one plain GEMM."""
    parts = [attn.q, attn.k, attn.v]
    if attn.qkv is not None or not _plain_linears(parts):
        return  # already fused, or adapted (LoRA): left as three linears
    attn.qkv = _concatenated_linear(attn.cfg, parts)
    attn.q = attn.k = attn.v = None


def fuse_cross_kv(model: WanDiT) -> None:
    """In place, on the serving layout (`unrolled`): every block's cross-attention k and v
    linears become one (D, layers·2·D) linear (`model.fused_text_kv`, layer-major, k before v), so
    `WanDiT.text_kv` computes all layers' text K/V in one GEMM.

    Why: all 60 projections read the same text context, so XLA's dot merger joins groups of them
    and, with per-layer weights, concatenates those weights on every call (15 merges per bf16
    forward); one GEMM measured −2.0 ms of a 26 ms 1170-token forward (H200, docs/PERFORMANCE.md).
    A single-device layout, like `fuse_qkv`'s: on a tensor-parallel mesh its column split would fall
    between layers, not heads."""
    if not isinstance(model.blocks, nnx.List):
        raise ValueError("fuse_cross_kv: expects the per-layer serving layout (dit.unrolled)")
    parts = [p for block in model.blocks for p in (block.cross_attn.k, block.cross_attn.v)]
    if model.fused_text_kv is not None or not _plain_linears(parts):
        return  # already fused, or adapted (LoRA)
    model.fused_text_kv = _concatenated_linear(model.cfg, parts)
    for block in model.blocks:
        block.cross_attn.k = block.cross_attn.v = None


def _plain_linears(parts: list) -> bool:
    return all(type(p) in (nnx.Linear, Fp8Linear) for p in parts)


def _concatenated_linear(cfg: WanDiTConfig, parts: list) -> nnx.Linear | Fp8Linear:
    """One linear computing the (D → D) `parts` side by side: kernels, biases and FP8 per-channel
    scales concatenate on the output axis; a static FP8 input scale (one per linear, all reading
    the same input) becomes their max, which clips none of them."""
    with nnx.use_eager_sharding(False):
        fused = nnx.eval_shape(lambda: linear(cfg, cfg.dim, len(parts) * cfg.dim, ("embed", "heads"),
                                              nnx.Rngs(0), fp8=isinstance(parts[0], Fp8Linear)))
    graphdef, state = nnx.split(fused)
    values = nnx.to_pure_dict(state)
    for name, shape in values.items():
        arrays = [getattr(p, name)[...] for p in parts]
        if shape.shape == arrays[0].shape:  # FP8 static input_scale
            values[name] = jnp.max(jnp.stack(arrays), axis=0)
            continue
        axis = next(i for i, (n, m) in enumerate(zip(shape.shape, arrays[0].shape)) if n != m)
        values[name] = jnp.concatenate(arrays, axis=axis)
    nnx.replace_by_pure_dict(state, values)
    return nnx.merge(graphdef, state)


def dit_from_params(cfg: WanDiTConfig, params: dict) -> WanDiT:
    """A model whose parameters are the given pure dict (e.g. from the converter or a checkpoint)."""
    return build.model_from_params(WanDiT, cfg, params)
