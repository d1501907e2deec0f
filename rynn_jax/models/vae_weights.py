"""Wan2.2 VAE checkpoints → our parameter tree, from either naming.

Two layouts exist in the wild:
  * "diffusers": `vae/diffusion_pytorch_model.safetensors` of Wan2.2-TI2V-5B-Diffusers. Our module
    tree uses diffusers' names, so each of our leaves maps to `<our path>.weight|bias|gamma`
    (the spatial conv of a resampler is `….resample.1.weight`, index 1 of a torch Sequential).
  * "wan": `Wan2.2_VAE.pth` of the original repo (a torch pickle; see `rynn_jax.torch_pickle`).
    Its names are produced from the diffusers name by `wan_key`, the rename table below:

      diffusers                                  wan
      quant_conv. / post_quant_conv.             conv1. / conv2.
      {enc,dec}oder.conv_in.                     {enc,dec}oder.conv1.
      {enc,dec}oder.norm_out.gamma               {enc,dec}oder.head.0.gamma
      {enc,dec}oder.conv_out.                    {enc,dec}oder.head.2.
      *.mid_block.resnets.0. / attentions.0. / resnets.1.    *.middle.0. / middle.1. / middle.2.
      encoder.down_blocks.{i}.resnets.{j}.       encoder.downsamples.{i}.downsamples.{j}.
      encoder.down_blocks.{i}.downsampler.       encoder.downsamples.{i}.downsamples.{R}.
      decoder.up_blocks.{i}.resnets.{j}.         decoder.upsamples.{i}.upsamples.{j}.
      decoder.up_blocks.{i}.upsampler.           decoder.upsamples.{i}.upsamples.{R+1}.
      (inside a residual block)
      norm1.gamma / conv1. / norm2.gamma         residual.0.gamma / residual.2. / residual.3.gamma
      conv2. / conv_shortcut.                    residual.6. / shortcut.

    with R = num_res_blocks (the resampler follows the R, resp. R+1, residual blocks of a level).

Tensor transforms: Conv3d (O,I,T,H,W) → (T,H,W,I,O); Conv2d (O,I,H,W) → (H,W,I,O); the 1×1
Conv2d of attention (O,I,1,1) → (I,O); RMS-norm gamma (C,1,1[,1]) → (C,).
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import numpy as np
from flax import nnx

from rynn_jax import converted_weights
from rynn_jax.weights import (ConversionError, Fixed, Rule, abstract_pure_params, agree, config_fields,
                              convert_state_dict, flatten_params, open_safetensors, read_config_json,
                              torch_conv2d, torch_conv3d)
from rynn_jax.models.vae import WanVAE, WanVAEConfig, abstract_vae, vae_from_params
from rynn_jax.torch_pickle import read_torch_checkpoint

Layout = Literal["diffusers", "wan"]

_TORCH_SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")

# --------------------------------------------------------------------------------------------------
# Names
# --------------------------------------------------------------------------------------------------

_RESNET_PARTS = {
    "norm1.gamma": "residual.0.gamma",
    "conv1.weight": "residual.2.weight",
    "conv1.bias": "residual.2.bias",
    "norm2.gamma": "residual.3.gamma",
    "conv2.weight": "residual.6.weight",
    "conv2.bias": "residual.6.bias",
    "conv_shortcut.weight": "shortcut.weight",
    "conv_shortcut.bias": "shortcut.bias",
}


def _resnet(prefix: str, part: str) -> str:
    if part not in _RESNET_PARTS:
        raise ConversionError(f"no original-Wan name for residual-block tensor {part!r}")
    return prefix + _RESNET_PARTS[part]


def wan_key(key: str, cfg: WanVAEConfig) -> str:
    """The original Wan2.2 name of a diffusers-named VAE tensor (see the module docstring)."""
    r = cfg.num_res_blocks
    rules: list[tuple[str, Callable[[re.Match], str]]] = [
        (r"quant_conv\.(.+)", lambda m: f"conv1.{m[1]}"),
        (r"post_quant_conv\.(.+)", lambda m: f"conv2.{m[1]}"),
        (r"(encoder|decoder)\.conv_in\.(.+)", lambda m: f"{m[1]}.conv1.{m[2]}"),
        (r"(encoder|decoder)\.norm_out\.gamma", lambda m: f"{m[1]}.head.0.gamma"),
        (r"(encoder|decoder)\.conv_out\.(.+)", lambda m: f"{m[1]}.head.2.{m[2]}"),
        (r"(encoder|decoder)\.mid_block\.resnets\.([01])\.(.+)",
         lambda m: _resnet(f"{m[1]}.middle.{2 * int(m[2])}.", m[3])),
        (r"(encoder|decoder)\.mid_block\.attentions\.0\.(.+)", lambda m: f"{m[1]}.middle.1.{m[2]}"),
        (r"encoder\.down_blocks\.(\d+)\.resnets\.(\d+)\.(.+)",
         lambda m: _resnet(f"encoder.downsamples.{m[1]}.downsamples.{m[2]}.", m[3])),
        (r"encoder\.down_blocks\.(\d+)\.downsampler\.(.+)",
         lambda m: f"encoder.downsamples.{m[1]}.downsamples.{r}.{m[2]}"),
        (r"decoder\.up_blocks\.(\d+)\.resnets\.(\d+)\.(.+)",
         lambda m: _resnet(f"decoder.upsamples.{m[1]}.upsamples.{m[2]}.", m[3])),
        (r"decoder\.up_blocks\.(\d+)\.upsampler\.(.+)",
         lambda m: f"decoder.upsamples.{m[1]}.upsamples.{r + 1}.{m[2]}"),
    ]
    for pattern, rename in rules:
        m = re.fullmatch(pattern, key)
        if m:
            return rename(m)
    raise ConversionError(f"no original-Wan name for diffusers VAE key {key!r}")


def diffusers_key(path: tuple[str, ...]) -> str:
    """Diffusers name of our leaf, e.g. (…, "resample", "kernel") → "….resample.1.weight"."""
    *module, leaf = path
    if module and module[-1] == "resample":
        module = [*module, "1"]
    suffix = {"kernel": "weight", "bias": "bias", "gamma": "gamma"}.get(leaf)
    if suffix is None:
        raise ConversionError(f"our VAE leaf {'/'.join(path)} has no checkpoint counterpart")
    return ".".join([*module, suffix])


# --------------------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------------------


def _checked(fn: Callable[[np.ndarray], np.ndarray], ndim: int, key: str):
    def transform(x: np.ndarray) -> np.ndarray:
        if x.ndim != ndim:
            raise ConversionError(
                f"checkpoint key {key!r} has shape {tuple(x.shape)}; expected a {ndim}-D tensor")
        return fn(x)
    return transform


def _transform_for(path: tuple[str, ...], ndim: int, key: str) -> Callable:
    leaf = path[-1]
    if leaf == "bias":
        return _checked(lambda x: x, 1, key)
    if leaf == "gamma":  # (C, 1, 1, 1) for 3D norms, (C, 1, 1) for attention's
        ref_ndim = 3 if "attentions" in path else 4
        return _checked(lambda x: x.reshape(-1), ref_ndim, key)
    if ndim == 5:
        return _checked(torch_conv3d, 5, key)
    if ndim == 4:
        return _checked(torch_conv2d, 4, key)
    if ndim == 2:  # 1×1 Conv2d (O, I, 1, 1) → (I, O)
        return _checked(lambda x: np.ascontiguousarray(x[:, :, 0, 0].T), 4, key)
    raise ConversionError(f"no transform for our leaf {'/'.join(path)} of rank {ndim}")


@functools.lru_cache(maxsize=8)
def abstract_params(cfg: WanVAEConfig) -> dict:
    """Our pure param dict with ShapeDtypeStruct leaves (str keys), built once per config."""
    return abstract_pure_params(nnx.state(abstract_vae(cfg), nnx.Param))


def vae_rules(cfg: WanVAEConfig, layout: Layout = "diffusers") -> list[Rule]:
    """One Rule per leaf of our VAE param tree, naming its tensor in the given checkpoint layout."""
    if layout not in ("diffusers", "wan"):
        raise ValueError(f"layout must be 'diffusers' or 'wan', got {layout!r}")
    rules = []
    for path, leaf in flatten_params(abstract_params(cfg)).items():
        key = diffusers_key(path)
        if layout == "wan":
            key = wan_key(key, cfg)
        rules.append(Rule(path, (key,), _transform_for(path, len(leaf.shape), key)))
    return rules


def detect_vae_layout(keys: Iterable[str]) -> Layout:
    """'diffusers' or 'wan' from a checkpoint's key names."""
    keys = set(keys)
    if any(k.startswith(("encoder.conv_in.", "encoder.down_blocks.")) for k in keys):
        return "diffusers"
    if any(k.startswith(("encoder.conv1.", "encoder.downsamples.")) for k in keys):
        return "wan"
    sample = sorted(keys)[:5]
    raise ConversionError(f"not a Wan VAE checkpoint (diffusers or original names); keys {sample}")


# --------------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------------


# diffusers' AutoencoderKLWan.__init__ keys → our fields ("_…": derived, checked below). The
# original repo ships its VAE as a bare pickle (Wan2.2_VAE.pth) with no config file.
_CONFIG_TABLE: dict[str, Any] = {
    "base_dim": "base_dim", "decoder_base_dim": "decoder_base_dim", "z_dim": "z_dim", "dim_mult": "dim_mult",
    "num_res_blocks": "num_res_blocks", "temperal_downsample": "temporal_downsample",  # (diffusers' spelling)
    "latents_mean": "latents_mean", "latents_std": "latents_std", "patch_size": "patch_size",
    "in_channels": "_in_channels", "out_channels": "_out_channels",
    "scale_factor_temporal": "_scale_factor_temporal", "scale_factor_spatial": "_scale_factor_spatial",
    "attn_scales": Fixed(((),)), "is_residual": Fixed((True,)), "dropout": Fixed((0.0,)),
}


def vae_config_from_json(raw: Mapping[str, Any], base: WanVAEConfig | None = None,
                         source: str = "config.json") -> WanVAEConfig:
    """The architecture a diffusers AutoencoderKLWan config.json states, as our config; what it
    does not state (compute dtype, conv implementation, ...) comes from `base` (default: Wan2.2)."""
    fields = config_fields(raw, _CONFIG_TABLE, source)
    base = base or WanVAEConfig.wan22()
    if fields.get("decoder_base_dim", 0) is None:  # diffusers: the encoder's width
        fields["decoder_base_dim"] = fields.get("base_dim", base.base_dim)
    if fields.get("patch_size", 1) is None:
        raise ConversionError(f"{source}: patch_size=None (the Wan2.1 VAE) is not supported; rynn-jax "
                              "implements the patchified Wan2.2 VAE")
    derived = {k: fields.pop(k) for k in list(fields) if k.startswith("_")}
    p = fields.get("patch_size", base.patch_size)
    channels = {derived.get(k, base.patch_channels) for k in ("_in_channels", "_out_channels")}
    if len(channels) > 1 or next(iter(channels)) % (p * p):
        raise ConversionError(f"{source}: in/out_channels {sorted(channels)} must be equal and 3·patch_size² "
                              f"(patch_size {p})")
    cfg = dataclasses.replace(base, **fields, image_channels=next(iter(channels)) // (p * p))
    for key, have in (("_scale_factor_temporal", cfg.temporal_stride), ("_scale_factor_spatial", cfg.spatial_stride)):
        if derived.get(key, have) not in (None, have):
            raise ConversionError(f"{source}: {key[1:]}={derived[key]} does not match the architecture's "
                                  f"stride {have}")
    return cfg


def checkpoint_vae_config(path: str | os.PathLike[str], cfg: WanVAEConfig | None = None) -> WanVAEConfig:
    """The config to load an official VAE checkpoint with: its diffusers config.json's (beside the
    safetensors, or in a pipeline's `vae/`) if it has one — checked against `cfg` when both are
    given — else `cfg`, else Wan2.2."""
    path = os.fspath(path)
    if path.endswith(_TORCH_SUFFIXES):
        return cfg or WanVAEConfig.wan22()
    root = os.path.join(path, "vae") if os.path.isdir(os.path.join(path, "vae")) else path
    root = root if os.path.isdir(root) else os.path.dirname(os.path.abspath(root))
    raw = read_config_json(root)
    if raw is None or raw.get("_class_name", "AutoencoderKLWan") != "AutoencoderKLWan":
        return cfg or WanVAEConfig.wan22()  # no config.json, or one describing another model
    source = os.path.join(root, "config.json")
    found = vae_config_from_json(raw, cfg, source)
    return found if cfg is None else agree(cfg, found, source)


def read_vae_state_dict(path: str | os.PathLike[str]):
    """Open a VAE checkpoint: a torch pickle (.pth …), a .safetensors file, or a directory (a
    diffusers pipeline root with `vae/`, or the `vae/` folder itself)."""
    path = os.fspath(path)
    if path.endswith(_TORCH_SUFFIXES):
        return read_torch_checkpoint(path)
    if os.path.isdir(path) and os.path.isdir(os.path.join(path, "vae")):
        return open_safetensors(path, prefix="vae")
    return open_safetensors(path)


def load_vae_checkpoint(path: str | os.PathLike[str], cfg: WanVAEConfig, dtype=None,
                        layout: Layout | None = None) -> dict:
    """Our pure param dict from an official VAE checkpoint (either layout, detected unless given)."""
    state_dict = read_vae_state_dict(path)
    layout = layout or detect_vae_layout(state_dict.keys())
    return convert_state_dict(state_dict, vae_rules(cfg, layout), abstract_params(cfg), dtype)


def load_vae(path: str | os.PathLike[str], cfg: WanVAEConfig | None = None, dtype=None,
             layout: Layout | None = None) -> WanVAE:
    """`from_pretrained` for the VAE: a directory our converter wrote (orbax params + config.json;
    fast), or an official checkpoint (`Wan2.2_VAE.pth`, diffusers safetensors or pipeline dir; a
    diffusers one's architecture from its config.json, `checkpoint_vae_config`).

    `dtype` casts every parameter (None: cfg.param_dtype). Errors name the offending key.
    """

    if converted_weights.is_converted_dir(path):
        saved = converted_weights.load_config(path, WanVAEConfig)
        if cfg is not None and cfg != saved:
            raise ValueError(f"{path} was converted for {saved}, not {cfg}")
        return vae_from_params(saved, converted_weights.restore_params(path, abstract_params(saved), dtype))
    cfg = checkpoint_vae_config(path, cfg)
    return vae_from_params(cfg, load_vae_checkpoint(path, cfg, dtype, layout))
