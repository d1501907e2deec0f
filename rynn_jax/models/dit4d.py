"""RynnWorld-4D: joint RGB + depth + optical-flow generation on the Wan2.2 DiT (docs/RYNNWORLD4D.md).

Three branches, one per modality, each a Wan2.2 DiT over latents of the same shape (B, T, H, W, C):

    shared      time and text embedders, every block's adaLN table (`modulation`), the text
                cross-attention's K/V (and its norm_k), the head's modulation, 3D RoPE
    per branch  patch embedding, self-attention, cross-attention q/o/norm_q, the affine
                cross-attention norm, FFN, output head
    optional    the skeleton-control branch (`base.control`, not in the paper's text-and-image model):
                one, shared, its tokens added to every branch's patch tokens

`WanDiT4D.base` *is* a `WanDiT`: the RGB branch plus everything shared, under the same parameter
names, so a Wan2.2-TI2V-5B checkpoint loads into it unchanged. `depth` and `flow` hold stacks of
`WanBlock`s without the shared tensors; at run time each block borrows RGB's modulation table and
reads the text K/V RGB's block computed once. The block code is dit.py's, split in two around the
joint attention:

    x_m += SA_m(mod(LN x_m))·g           (per branch; dit.WanBlock.self_attention_residual)
    x_m += JointAttention(x_rgb, x_depth, x_flow)_m      at `joint_layers` only
    x_m += CA_m(LN_m x_m, text);  x_m += FFN_m(mod(LN x_m))·g      (dit.WanBlock.text_ffn_residual)

Joint Cross-Modal Attention (per JA layer, modality m ∈ {rgb, depth, flow}):

    x_m += e_m                                   modality embedding (zero-init), kept in the stream
    h_m  = LN_m(x_m)                             affine, eps 1e-5, per modality
    q_m  = RMS_q(W_q^m h_m),  [k_m, v_m] = W_kv^m h_m,  k_m = RMS_k(k_m)   (RMS_q/k shared, full width)
    q, k rotated by the 3D RoPE (`joint_rope`); attention within each frame (`joint_frame_wise`,
    (B, T·S) → (B·T, S)) or over the whole clip
    bidirectional:  m attends to the concatenated K/V of the two other modalities
    unidirectional: depth and flow attend to RGB's K/V; RGB is left untouched
    x_m += tanh(g_m) · W_out^m(attention)        W_out zero-init, g_m = 1 at init

In bidirectional mode RGB's embedding and injection are scaled by `rgb_decay` (a call argument:
the release's cosine 1 → 0 decay of the RGB injection is a schedule of the training step). Every
JA parameter exists in both modes (the release's layout), so one checkpoint layout serves both.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rynn_jax.models import build, rope
from rynn_jax.models.dit import (WanBlock, WanDiT, WanDiTConfig, attention, fuse_qkv, patch_embed_params, stacked,
                                   token_grid, unrolled, unstacked)
from rynn_jax.models.fp8_linear import Fp8InputAmax
from rynn_jax.models.layers import linear, param, patchify_embed, rms_norm

MODALITIES = ("rgb", "depth", "flow")
JointMode = Literal["bidirectional", "unidirectional"]


# --------------------------------------------------------------------------------------------------
# Config
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class WanDiT4DConfig:
    # Each branch's architecture (the released model runs Wan2.2-TI2V-5B with eps 1e-5, not 1e-6).
    base: WanDiTConfig = dataclasses.field(default_factory=lambda: WanDiTConfig.ti2v_5b(eps=1e-5))
    joint_layers: tuple[int, ...] = tuple(range(0, 30, 3))  # blocks with joint attention (0-based)
    joint_mode: JointMode = "bidirectional"  # paper; the release's training scripts: unidirectional
    joint_frame_wise: bool = True  # attend only to the same latent frame of the other modalities
    joint_rope: bool = True  # rotate joint q/k by the 3D RoPE
    joint_align_eps: float = 1e-5  # the per-modality alignment LayerNorm's epsilon (torch default)

    def __post_init__(self) -> None:
        b = self.base
        if b.control == "concat" or b.token_multiple != 1:
            raise ValueError("WanDiT4DConfig.base: the 4D model takes no concatenated control or token padding "
                             f"(got control={b.control!r}, token_multiple={b.token_multiple})")
        layers = self.joint_layers
        if list(layers) != sorted(set(layers)) or any(not 0 <= i < b.num_layers for i in layers):
            raise ValueError(f"joint_layers must be increasing block indices in [0, {b.num_layers}), got {layers}")
        if self.joint_mode not in ("bidirectional", "unidirectional"):
            raise ValueError(f"joint_mode must be 'bidirectional' or 'unidirectional', got {self.joint_mode!r}")

    # What the training code reads off any model config.
    patch_size = property(lambda self: self.base.patch_size)
    in_channels = property(lambda self: self.base.in_channels)
    text_len = property(lambda self: self.base.text_len)
    text_dim = property(lambda self: self.base.text_dim)

    @classmethod
    def full(cls, **overrides) -> "WanDiT4DConfig":
        """The released model: TI2V-5B branches, JA at blocks 0, 3, …, 27."""
        return cls(**overrides)

    @classmethod
    def tiny(cls, **overrides) -> "WanDiT4DConfig":
        """Three-block toy for tests and CPU recipes: JA at blocks 0 and 2 (block 1 has none)."""
        base = overrides.pop("base", WanDiTConfig.tiny(num_layers=3, eps=1e-5))
        return cls(base=base, **{"joint_layers": (0, 2), **overrides})

    def every(self, n: int, start: int = 0, end: int | None = None) -> "WanDiT4DConfig":
        """This config with JA at blocks start, start + n, … < end (the release's
        joint_start_layer / joint_every_n_layers / joint_end_layer)."""
        end = self.base.num_layers if end is None else end
        return dataclasses.replace(self, joint_layers=tuple(range(start, end, n)))


# --------------------------------------------------------------------------------------------------
# Joint cross-modal attention
# --------------------------------------------------------------------------------------------------


class JointBranch(nnx.Module):
    """One modality's part of a JA module: alignment LN, q and kv projections, gated output,
    modality embedding."""

    def __init__(self, cfg: WanDiTConfig, *, rngs: nnx.Rngs):
        d = cfg.dim
        ones, zeros = nnx.initializers.ones_init(), nnx.initializers.zeros_init()
        self.align_scale = param(rngs, ones, (d,), cfg.param_dtype, ("embed",))
        self.align_bias = param(rngs, zeros, (d,), cfg.param_dtype, ("embed",))
        self.q = linear(cfg, d, d, ("embed", "heads"), rngs)
        self.kv = linear(cfg, d, 2 * d, ("embed", "heads"), rngs)
        self.out = linear(cfg, d, d, ("heads", "embed"), rngs, zero=True)
        self.embed = param(rngs, zeros, (d,), cfg.param_dtype, ("embed",))
        self.gate = param(rngs, ones, (1,), cfg.param_dtype, (None,))  # (1,) as released; scalars lose "layers"


class JointAttention(nnx.Module):
    def __init__(self, cfg: WanDiT4DConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        b = cfg.base
        self.rgb = JointBranch(b, rngs=rngs)
        self.depth = JointBranch(b, rngs=rngs)
        self.flow = JointBranch(b, rngs=rngs)
        self.norm_q = param(rngs, nnx.initializers.ones_init(), (b.dim,), b.param_dtype, ("heads",))
        self.norm_k = param(rngs, nnx.initializers.ones_init(), (b.dim,), b.param_dtype, ("heads",))

    def __call__(self, x_rgb: jax.Array, x_depth: jax.Array, x_flow: jax.Array,
                 rope_cs: tuple[jax.Array, jax.Array], num_frames: int, rgb_decay: jax.Array | float = 1.0
                 ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The three residual streams (B, L, D), float32, after the joint-attention update."""
        cfg, base = self.cfg, self.cfg.base
        dtype = jnp.dtype(base.dtype)
        bidirectional = cfg.joint_mode == "bidirectional"
        branches = dict(zip(MODALITIES, (self.rgb, self.depth, self.flow)))
        xs = {"rgb": x_rgb, "depth": x_depth + self.depth.embed[...], "flow": x_flow + self.flow.embed[...]}
        if bidirectional:
            xs["rgb"] = x_rgb + self.rgb.embed[...] * rgb_decay
        b, l, d = x_rgb.shape
        heads = lambda a: a.reshape(b, l, base.num_heads, base.head_dim)  # noqa: E731
        rotate = (lambda a: rope.apply_rope(a, *rope_cs)) if cfg.joint_rope else (lambda a: a)  # noqa: E731
        # (B, T·S, N, H) → (B·T, S, N, H): every frame attends only within itself
        frames = (lambda a: a.reshape(b * num_frames, l // num_frames, *a.shape[2:])) \
            if cfg.joint_frame_wise else (lambda a: a)  # noqa: E731

        h = {m: self._aligned(branches[m], xs[m]).astype(dtype) for m in MODALITIES}
        sources = MODALITIES if bidirectional else ("rgb",)
        kv = {}
        for m in sources:
            k, v = jnp.split(branches[m].kv(h[m]), 2, axis=-1)
            kv[m] = frames(rotate(heads(rms_norm(k, self.norm_k[...], base.eps)))), frames(heads(v))
        out = dict(xs)
        for m in (MODALITIES if bidirectional else ("depth", "flow")):
            q = frames(rotate(heads(rms_norm(branches[m].q(h[m]), self.norm_q[...], base.eps))))
            others = [o for o in sources if o != m]
            k = jnp.concatenate([kv[o][0] for o in others], axis=1)
            v = jnp.concatenate([kv[o][1] for o in others], axis=1)
            a = attention(base, q, k, v).reshape(b, l, d)
            y = branches[m].out(a).astype(jnp.float32) * jnp.tanh(branches[m].gate[...].astype(jnp.float32))
            out[m] = xs[m] + (y * rgb_decay if m == "rgb" else y)
        return out["rgb"], out["depth"], out["flow"]

    def _aligned(self, branch: JointBranch, x_bld: jax.Array) -> jax.Array:
        x = x_bld.astype(jnp.float32)
        mean = x.mean(-1, keepdims=True)
        var = jnp.square(x - mean).mean(-1, keepdims=True)
        y = (x - mean) * jax.lax.rsqrt(var + self.cfg.joint_align_eps)
        return y * branch.align_scale[...].astype(jnp.float32) + branch.align_bias[...].astype(jnp.float32)


# --------------------------------------------------------------------------------------------------
# Depth and flow branches
# --------------------------------------------------------------------------------------------------


def _branch_block(cfg: WanDiTConfig, rngs: nnx.Rngs) -> WanBlock:
    """A WanBlock without the tensors the branches share (modulation, text K/V and norm_k)."""
    block = WanBlock(cfg, rngs=rngs)
    block.modulation = None
    block.cross_attn.k = block.cross_attn.v = block.cross_attn.norm_k = None
    return block


class Branch(nnx.Module):
    """An extra modality's own parameters: patch embedding, stacked blocks, output head."""

    def __init__(self, cfg: WanDiTConfig, *, rngs: nnx.Rngs):
        self.patch_embed, self.patch_embed_bias = patch_embed_params(cfg, rngs)
        self.blocks = stacked(lambda r: _branch_block(cfg, r), cfg.num_layers, rngs)
        self.head = linear(cfg, cfg.dim, cfg.patch_dim_out, ("embed", "out_channels"), rngs)


# --------------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------------

Latents = tuple[jax.Array, jax.Array, jax.Array]  # (rgb, depth, flow), each (B, T, H, W, C)


class WanDiT4D(nnx.Module):
    """Velocities of the three modalities from their noisy latents, shared timesteps and text."""

    def __init__(self, cfg: WanDiT4DConfig, *, rngs: nnx.Rngs):
        self.cfg = cfg
        self.base = WanDiT(cfg.base, rngs=rngs)
        self.depth = Branch(cfg.base, rngs=rngs)
        self.flow = Branch(cfg.base, rngs=rngs)
        n = len(cfg.joint_layers)
        self.joint = stacked(lambda r: JointAttention(cfg, rngs=r), n, rngs) if n else nnx.data(None)

    def __call__(self, z_rgb: jax.Array, z_depth: jax.Array, z_flow: jax.Array, t_bf: jax.Array,
                 ctx_bsk: jax.Array, control_bthwc: jax.Array | None = None, *, rgb_decay: jax.Array | float = 1.0,
                 gt_latent_bthwc: jax.Array | None = None, train: bool = False, null_control: bool = False
                 ) -> Latents:
        """Velocities (float32) for latents (B, T, H, W, C) of one shape, per-frame timesteps
        (B, T) in [0, 1000] shared by the branches (frame 0, the clean condition, at 0) and the
        text context (B, S, text_dim). With a control branch (`base.control`, an extension of the
        paper's text-and-image model), the skeleton latent and its options as `WanDiT.__call__`'s."""
        xs, temb, grid = self.hidden((z_rgb, z_depth, z_flow), t_bf, ctx_bsk, rgb_decay=rgb_decay,
                                     control_bthwc=control_bthwc, gt_latent_bthwc=gt_latent_bthwc, train=train,
                                     null_control=null_control)
        heads = (self.base.head, self.depth.head, self.flow.head)
        return tuple(self.base.project_out(x, temb, grid, head) for x, head in zip(xs, heads))

    def features(self, z: Latents, t_bf: jax.Array, ctx_bsk: jax.Array, layer: int) -> jax.Array:
        """The policy's backbone features: the three streams after block `layer` (0-based),
        concatenated on channels, (B, L, 3·D) float32; later blocks and the heads are not run. A
        policy has no operator skeleton: a control branch is off (its null condition)."""
        return jnp.concatenate(self.hidden(z, t_bf, ctx_bsk, num_layers=layer + 1, null_control=True)[0], axis=-1)

    def hidden(self, z: Latents, t_bf: jax.Array, ctx_bsk: jax.Array, *, rgb_decay: jax.Array | float = 1.0,
               num_layers: int | None = None, control_bthwc: jax.Array | None = None,
               gt_latent_bthwc: jax.Array | None = None, train: bool = False, null_control: bool = False
               ) -> tuple[Latents, jax.Array, tuple[int, int, int]]:
        """The residual streams after the first `num_layers` blocks (default all), the time
        embedding (B, F, D) and the token grid. A control branch's tokens (`WanDiT.control_tokens`,
        computed once) join every branch's patch tokens: the skeleton says where the arms are in
        the RGB, depth and flow videos alike, and a cloned branch computes what RGB does."""
        cfg, base = self.cfg, self.base
        bcfg = cfg.base
        n = bcfg.num_layers if num_layers is None else num_layers
        grid = token_grid(z[0].shape, bcfg)
        for name, zm in zip(MODALITIES[1:], z[1:]):
            if zm.shape != z[0].shape:
                raise ValueError(f"{name} latent {zm.shape} does not match the RGB latent {z[0].shape}")
        if t_bf.shape != (z[0].shape[0], grid[0]):
            raise ValueError(f"timesteps must be per latent frame, shape {(z[0].shape[0], grid[0])}; got {t_bf.shape}")
        embed = lambda zm, br: patchify_embed(zm, br.patch_embed[...], br.patch_embed_bias[...],  # noqa: E731
                                              bcfg.patch_size, jnp.dtype(bcfg.dtype)).astype(jnp.float32)
        xs = (base.embed_patches(z[0]).astype(jnp.float32), embed(z[1], self.depth), embed(z[2], self.flow))
        c_bld = base.control_tokens(z[0], control_bthwc, gt_latent_bthwc, train, null_control)
        xs = tuple(x + c_bld for x in xs)
        ctx_bsd = base.embed_text(ctx_bsk)
        temb, tproj = base.embed_time(t_bf)
        rope_cs = rope.rope_cos_sin(grid, bcfg.head_dim, bcfg.rope_theta, max_len=bcfg.rope_max_len)
        num_frames = grid[0]
        rgb_decay = jnp.asarray(rgb_decay, jnp.float32)

        def run_layer(blocks: list[WanBlock], xs: Latents, joint_fn, text_kv) -> Latents:
            """One block of the three branches (RGB's first): self-attention, the joint attention
            (`joint_fn`), text cross-attention with RGB's K/V and FFN."""
            self_attention = lambda attn, h: (attn(h, rope_cs=rope_cs), None)  # noqa: E731
            xs = tuple(blk.self_attention_residual(x, tproj, num_frames, self_attention)[0]
                       for blk, x in zip(blocks, xs))
            xs = joint_fn(xs)
            return tuple(blk.text_ffn_residual(x, None, tproj, num_frames, cross_kv=text_kv)
                         for blk, x in zip(blocks, xs))

        if isinstance(base.blocks, nnx.List):  # the serving layout (unrolled4d): JA placed statically
            text_k, text_v = (base.text_kv(ctx_bsd) if base.fused_text_kv is not None else (None, None))
            for i in range(n):
                rgb = base.blocks[i]
                blocks = [rgb] + [_with_modulation(nnx.merge(*nnx.split(br.blocks[i])), rgb)
                                  for br in (self.depth, self.flow)]
                slot = cfg.joint_layers.index(i) if i in cfg.joint_layers else None
                joint_fn = ((lambda a, m=self.joint[slot]: m(*a, rope_cs, num_frames, rgb_decay))
                            if slot is not None else (lambda a: a))
                text_kv = rgb.cross_attn.key_value(ctx_bsd) if text_k is None else (text_k[i], text_v[i])
                xs = run_layer(blocks, xs, joint_fn, text_kv)
            return xs, temb, grid

        branch_defs, branch_states = zip(*(nnx.split(br.blocks) for br in (self.depth, self.flow)))
        slot_l = np.full((bcfg.num_layers,), -1, np.int32)
        slot_l[list(cfg.joint_layers)] = np.arange(len(cfg.joint_layers))
        layer_xs = (tuple(jax.tree.map(lambda a: a[:n], s) for s in branch_states), jnp.asarray(slot_l[:n]))
        joint = nnx.split(self.joint) if self.joint is not None else None
        every_layer = len(cfg.joint_layers) == bcfg.num_layers
        # FP8 calibration (fp8.calibrate): the blocks' linears record their largest input; a layer
        # inside the scan is a copy, so each returns what it saw and it is written back below
        observing = bool(jax.tree.leaves(nnx.state(base.blocks, Fp8InputAmax)))

        def joint_attention(xs: Latents, slot: jax.Array) -> Latents:
            graphdef, state = joint
            layer_state = jax.tree.map(lambda a: jax.lax.dynamic_index_in_dim(a, slot, keepdims=False), state)
            return nnx.merge(graphdef, layer_state)(*xs, rope_cs, num_frames, rgb_decay)

        def layer(block: WanBlock, xs: Latents, inputs) -> tuple[Latents, None]:
            states, slot = inputs
            blocks = [block] + [_with_modulation(nnx.merge(g, s), block) for g, s in zip(branch_defs, states)]
            if joint is None:
                joint_fn = lambda a: a  # noqa: E731
            elif every_layer:
                joint_fn = lambda a: joint_attention(a, slot)  # noqa: E731
            else:  # one scan over all blocks: JA runs where this block has a slot
                joint_fn = lambda a: jax.lax.cond(  # noqa: E731
                    slot >= 0, lambda b: joint_attention(b, jnp.maximum(slot, 0)), lambda b: b, a)
            text_kv = block.cross_attn.key_value(ctx_bsd)  # shared by the branches: computed once
            xs = run_layer(blocks, xs, joint_fn, text_kv)
            return xs, (tuple(nnx.state(blk, Fp8InputAmax) for blk in blocks) if observing else None)

        xs, seen = base.scan_blocks(layer, xs, layer_xs, num_layers=n)
        if observing:  # layers ≥ n ran no input and keep their value
            for stack, got in zip((base.blocks, self.depth.blocks, self.flow.blocks), seen):
                old = nnx.state(stack, Fp8InputAmax)
                nnx.update(stack, jax.tree.map(lambda a, new: a.at[:n].set(new), old, got))
        return xs, temb, grid


def unrolled4d(model: WanDiT4D, *, num_layers: int | None = None, fuse_self_qkv: bool = True,
               fuse_text_kv: bool = True) -> WanDiT4D:
    """The serving layout of a WanDiT4D, `dit.unrolled` for all three branches: every block and
    every joint-attention module a module of its own instead of stacked (layers, …) arrays, so
    `hidden` runs a Python loop with the joint attention where it belongs. The scanned form slices
    each layer's weights out of the stacks on every call (XLA copies a slice that feeds a GEMM)
    and, with JA every third block, picks JA by a lax.cond per layer. Weights are copied out of
    the stacks once (drop the stacked model to free them); apply FP8 (`fp8.quantize_dit`, static
    scales, FP8 attention) to the stacked model first: those work on the stacked layout.
    `fuse_self_qkv` / `fuse_text_kv`: as in `dit.unrolled` (RGB's text K/V, which the branches
    share, then comes from one GEMM over all layers). `num_layers` keeps only the first blocks: a
    feature extractor (the policy's pass to its block), whose fused text K/V covers only the blocks
    that run (with static FP8 scales their text inputs are one tensor, so one scale is exact)."""
    if isinstance(model.base.blocks, nnx.List):  # already unrolled
        return model
    if num_layers is not None and num_layers != model.cfg.base.num_layers:
        model = _truncated(model, num_layers)
    base = unrolled(model.base, fuse_self_qkv=fuse_self_qkv, fuse_text_kv=fuse_text_kv)
    cfg = dataclasses.replace(model.cfg, base=base.cfg)
    out = nnx.merge(*nnx.split(model))  # a new module graph over the same arrays
    out.cfg, out.base = cfg, base
    with nnx.use_eager_sharding(False):
        abstract_block = nnx.eval_shape(lambda: _branch_block(base.cfg, nnx.Rngs(0)))
        abstract_joint = nnx.eval_shape(lambda: JointAttention(cfg, rngs=nnx.Rngs(0)))
    for branch in (out.depth, out.flow):
        branch.blocks = nnx.List(unstacked(branch.blocks, abstract_block, base.cfg.num_layers))
        if fuse_self_qkv:
            for block in branch.blocks:
                fuse_qkv(block.self_attn)
    if out.joint is not None:
        out.joint = nnx.List(unstacked(out.joint, abstract_joint, len(cfg.joint_layers)))
    return out


def _truncated(model: WanDiT4D, n: int) -> WanDiT4D:
    """The stacked model's first `n` blocks (and the joint attention among them) as a model."""
    cfg = model.cfg
    if not 0 < n <= cfg.base.num_layers:
        raise ValueError(f"num_layers {n} outside [1, {cfg.base.num_layers}]")
    joint_layers = tuple(i for i in cfg.joint_layers if i < n)
    cfg = dataclasses.replace(cfg, base=dataclasses.replace(cfg.base, num_layers=n), joint_layers=joint_layers)
    values = nnx.to_pure_dict(nnx.state(model))
    cut = lambda tree, k: jax.tree.map(lambda a: a[:k], tree)  # noqa: E731
    for name in ("base", "depth", "flow"):
        values[name]["blocks"] = cut(values[name]["blocks"], n)
    if "joint" in values:
        values["joint"] = cut(values["joint"], len(joint_layers))
        if not joint_layers:
            del values["joint"]
    return build.model_from_params(WanDiT4D, cfg, values)


def _with_modulation(block: WanBlock, rgb_block: WanBlock) -> WanBlock:
    """A branch block (merged inside the layer scan) lent the shared adaLN table of RGB's."""
    block.modulation = rgb_block.modulation
    return block


def init_dit4d(cfg: WanDiT4DConfig, seed: int = 0) -> WanDiT4D:
    return build.init_model(WanDiT4D, cfg, seed)


def abstract_dit4d(cfg: WanDiT4DConfig) -> WanDiT4D:
    """The model with ShapeDtypeStruct leaves: shapes and count without allocating anything."""
    return build.abstract_model(WanDiT4D, cfg)


def dit4d_from_params(cfg: WanDiT4DConfig, params: dict) -> WanDiT4D:
    return build.model_from_params(WanDiT4D, cfg, params)
