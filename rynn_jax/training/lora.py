"""LoRA for the DiT by module surgery: chosen `nnx.Linear`s are swapped for `LoRALinear`s in place.

    y = x·W + b + (α/r)·(x·A)·B        A: (d_in, r) uniform ±1/√d_in,  B: (r, d_out) zeros

B = 0 at the start, so an adapted model computes exactly what the base model does. The base
kernel and bias keep their paths (`blocks.self_attn.q.kernel`), so converted base checkpoints load
unchanged; A and B are `nnx.LoRAParam`s beside them (`...q.lora_a`). Targets inside the scanned
block stack carry the leading layer axis, and so do their A and B.

The model code (dit.py) is untouched: the surgery happens after construction, inside the jitted
init, so LoRA parameters are created sharded like everything else.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import nnx

# q, k, v, o of self- and cross-attention and the FFN projections of every block (paper: rank 64).
DEFAULT_TARGETS: tuple[str, ...] = tuple(
    [f"blocks.{attn}.{p}" for attn in ("self_attn", "cross_attn") for p in "qkvo"]
    + ["blocks.ffn_up", "blocks.ffn_down"])


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoraConfig:
    rank: int = 0  # 0 = no LoRA (full fine-tuning)
    alpha: float = 64.0  # scale α/r on the low-rank update (α = r → 1)
    targets: tuple[str, ...] = DEFAULT_TARGETS  # dotted paths of nnx.Linear modules to adapt
    # Trained together with the adapters (paper: "patch embeddings + LoRA"; plus the control branch).
    also_train: tuple[str, ...] = ("patch_embed", "patch_embed_bias", "control")


class LoRALinear(nnx.Module):
    """An nnx.Linear's kernel/bias (same Variables, same metadata) plus a low-rank update."""

    def __init__(self, linear: nnx.Linear, rank: int, alpha: float, *, rngs: nnx.Rngs):
        self.kernel = linear.kernel
        self.bias = linear.bias
        self.dtype = linear.dtype
        self.scale = alpha / rank
        kernel_spec = nnx.get_partition_spec(nnx.State({"k": linear.kernel}))["k"].value
        *lead, d_in, d_out = linear.kernel.shape
        *lead_names, in_name, out_name = tuple(kernel_spec) or (None,) * linear.kernel.ndim
        pdtype = linear.kernel.dtype
        bound = d_in ** -0.5
        uniform = lambda key, shape, dtype: jax.random.uniform(key, shape, dtype, -bound, bound)
        init_a = nnx.with_partitioning(uniform, (*lead_names, in_name, "lora_rank"))
        init_b = nnx.with_partitioning(nnx.initializers.zeros_init(), (*lead_names, "lora_rank", out_name))
        self.lora_a = nnx.LoRAParam(init_a(rngs.params(), (*lead, d_in, rank), pdtype))
        self.lora_b = nnx.LoRAParam(init_b(rngs.params(), (*lead, rank, d_out), pdtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.dtype or x.dtype
        x = x.astype(dtype)
        y = x @ self.kernel[...].astype(dtype)
        if self.bias is not None:
            y = y + self.bias[...].astype(dtype)
        low = (x @ self.lora_a[...].astype(dtype)) @ self.lora_b[...].astype(dtype)
        return y + (self.scale * low).astype(dtype)


def _parent_and_name(model: nnx.Module, path: str) -> tuple[nnx.Module, str]:
    *parents, name = path.split(".")
    node = model
    for p in parents:
        node = getattr(node, p)  # a wrong path should raise: no default
    return node, name


def apply_lora(model: nnx.Module, cfg: LoraConfig, rngs: nnx.Rngs) -> nnx.Module:
    """Replace every target Linear by a LoRALinear, in place; returns the model."""
    if cfg.rank <= 0:
        return model
    for path in cfg.targets:
        parent, name = _parent_and_name(model, path)
        linear = getattr(parent, name)
        if not isinstance(linear, nnx.Linear):
            raise TypeError(f"LoRA target {path} is a {type(linear).__name__}, not an nnx.Linear")
        setattr(parent, name, LoRALinear(linear, cfg.rank, cfg.alpha, rngs=rngs))
    return model


def merge_lora(model: nnx.Module) -> nnx.Module:
    """Fold every adapter into its kernel (W += α/r·A·B) and put plain nnx.Linears back, in place:
    the serving graph has no extra matmuls. Returns the model."""
    for path, module in list(nnx.iter_modules(model)):
        if not isinstance(module, LoRALinear):
            continue
        parent, name = _parent_and_name(model, ".".join(map(str, path)))
        a, b = module.lora_a[...].astype(jnp.float32), module.lora_b[...].astype(jnp.float32)
        delta = module.scale * jnp.einsum("...ir,...ro->...io", a, b)
        module.kernel[...] = (module.kernel[...].astype(jnp.float32) + delta).astype(module.kernel.dtype)
        linear = _abstract_linear(*module.kernel.shape[-2:], module.bias is not None, module.dtype,
                                  module.kernel.dtype)
        linear.kernel = module.kernel  # the real (stacked) Variables replace the abstract ones
        linear.bias = module.bias
        setattr(parent, name, linear)
    return model


def _abstract_linear(d_in: int, d_out: int, use_bias: bool, dtype, param_dtype) -> nnx.Linear:
    """An nnx.Linear with ShapeDtypeStruct leaves (no allocation), to receive real Variables."""
    with nnx.use_eager_sharding(False):
        return nnx.eval_shape(lambda: nnx.Linear(d_in, d_out, use_bias=use_bias, dtype=dtype,
                                                 param_dtype=param_dtype, rngs=nnx.Rngs(0)))


def trainable_filter(cfg: LoraConfig) -> nnx.filterlib.Filter:
    """Which parameters the optimizer updates: all of them (SFT), or adapters + `also_train`."""
    if cfg.rank <= 0:
        return nnx.Param
    return nnx.Any(nnx.LoRAParam, nnx.All(nnx.Param, nnx.Any(*(nnx.PathContains(p) for p in cfg.also_train))))
