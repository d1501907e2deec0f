"""Checkpoint names of the Wan2.2 DiT (original Wan layout and diffusers layout) → our param tree.

Mapping (ours ← diffusers ← original Wan), one row per parameter; `{i}` is the block index and our
blocks are stacked on a leading layer axis:

| ours                              | diffusers                                     | original Wan                  |
|-----------------------------------|-----------------------------------------------|-------------------------------|
| patch_embed, patch_embed_bias     | patch_embedding.{weight,bias}                 | same                          |
| text_embed_1 / text_embed_2       | condition_embedder.text_embedder.linear_1/_2  | text_embedding.0 / .2         |
| time_embed_1 / time_embed_2       | condition_embedder.time_embedder.linear_1/_2  | time_embedding.0 / .2         |
| time_proj                         | condition_embedder.time_proj                  | time_projection.1             |
| blocks/self_attn/{q,k,v,o}        | blocks.{i}.attn1.to_{q,k,v}, attn1.to_out.0   | blocks.{i}.self_attn.{q,k,v,o}|
| blocks/self_attn/norm_{q,k}       | blocks.{i}.attn1.norm_{q,k}.weight            | blocks.{i}.self_attn.norm_{q,k}.weight |
| blocks/cross_attn/...             | blocks.{i}.attn2....                          | blocks.{i}.cross_attn....     |
| blocks/norm_cross_{scale,bias}    | blocks.{i}.norm2.{weight,bias}                | blocks.{i}.norm3.{weight,bias}|
| blocks/ffn_up / ffn_down          | blocks.{i}.ffn.net.0.proj / ffn.net.2         | blocks.{i}.ffn.0 / ffn.2      |
| blocks/modulation (6, D)          | blocks.{i}.scale_shift_table (1, 6, D)        | blocks.{i}.modulation         |
| head_modulation (2, D)            | scale_shift_table (1, 2, D)                   | head.modulation               |
| head                              | proj_out                                      | head.head                     |

(Wan calls the cross-attention norm `norm3` and the FFN norm `norm2`; diffusers swaps the two.
Only the cross-attention norm has parameters.) Linear weights are transposed to (in, out), the
patch Conv3d weight to (t, h, w, in, out).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import numpy as np
from flax import nnx

from rynn_jax import converted_weights
from rynn_jax.weights import (
    ConversionError,
    Fixed,
    Rule,
    abstract_pure_params,
    agree,
    config_fields,
    convert_state_dict,
    open_safetensors,
    read_config_json,
    torch_conv3d,
    torch_linear,
)
from rynn_jax.models import control
from rynn_jax.models.dit import WanDiTConfig, abstract_dit, dit_from_params

Layout = Literal["diffusers", "wan"]
# Prefixes some repackaged original checkpoints carry (e.g. ComfyUI's single-file format).
_STRIP_PREFIXES = ("model.diffusion_model.",)


def _squeeze0(x: np.ndarray) -> np.ndarray:
    return x.reshape(x.shape[1:])


def _linear_rules(target: tuple[str, ...], key: str, stacked_keys: list[str] | None = None) -> list[Rule]:
    if stacked_keys is None:
        return [Rule(target + ("kernel",), (f"{key}.weight",), torch_linear),
                Rule(target + ("bias",), (f"{key}.bias",))]
    return [Rule(target + ("kernel",), tuple(f"{k}.weight" for k in stacked_keys), torch_linear, stacked=True),
            Rule(target + ("bias",), tuple(f"{k}.bias" for k in stacked_keys), stacked=True)]


def dit_rules(cfg: WanDiTConfig, layout: Layout) -> list[Rule]:
    if layout not in ("diffusers", "wan"):
        raise ValueError(f"layout must be 'diffusers' or 'wan', got {layout!r}")
    dif = layout == "diffusers"
    n = cfg.num_layers
    blk = lambda name: [f"blocks.{i}.{name}" for i in range(n)]  # noqa: E731
    rules = [
        Rule(("patch_embed",), ("patch_embedding.weight",), torch_conv3d),
        Rule(("patch_embed_bias",), ("patch_embedding.bias",)),
    ]
    top = {
        "text_embed_1": ("condition_embedder.text_embedder.linear_1", "text_embedding.0"),
        "text_embed_2": ("condition_embedder.text_embedder.linear_2", "text_embedding.2"),
        "time_embed_1": ("condition_embedder.time_embedder.linear_1", "time_embedding.0"),
        "time_embed_2": ("condition_embedder.time_embedder.linear_2", "time_embedding.2"),
        "time_proj": ("condition_embedder.time_proj", "time_projection.1"),
        "head": ("proj_out", "head.head"),
    }
    for ours, (d_name, w_name) in top.items():
        rules += _linear_rules((ours,), d_name if dif else w_name)
    rules.append(Rule(("head_modulation",), ("scale_shift_table" if dif else "head.modulation",), _squeeze0))

    for ours, (d_attn, w_attn) in {"self_attn": ("attn1", "self_attn"), "cross_attn": ("attn2", "cross_attn")}.items():
        attn = d_attn if dif else w_attn
        projections = {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"} if dif else \
            {p: p for p in "qkvo"}
        for p, name in projections.items():
            rules += _linear_rules(("blocks", ours, p), "", blk(f"{attn}.{name}"))
        for p in ("norm_q", "norm_k"):
            rules.append(Rule(("blocks", ours, p), tuple(blk(f"{attn}.{p}.weight")), stacked=True))
    norm = "norm2" if dif else "norm3"
    rules.append(Rule(("blocks", "norm_cross_scale"), tuple(blk(f"{norm}.weight")), stacked=True))
    rules.append(Rule(("blocks", "norm_cross_bias"), tuple(blk(f"{norm}.bias")), stacked=True))
    rules += _linear_rules(("blocks", "ffn_up"), "", blk("ffn.net.0.proj" if dif else "ffn.0"))
    rules += _linear_rules(("blocks", "ffn_down"), "", blk("ffn.net.2" if dif else "ffn.2"))
    rules.append(Rule(("blocks", "modulation"), tuple(blk("scale_shift_table" if dif else "modulation")),
                      _squeeze0, stacked=True))
    if cfg.control != "none":
        rules += control_rules(cfg)
    return rules


def control_rules(cfg: WanDiTConfig) -> list[Rule]:
    """Released RynnWorld-Teleop control weights, the same names in both layouts. The running
    statistics are not among them: the release keeps them in a separate record (models/control.py)."""
    rules = [Rule(("control", "embed"), ("control_patch_embedding.weight",), torch_conv3d),
             Rule(("control", "embed_bias"), ("control_patch_embedding.bias",))]
    if cfg.control in ("add", "add-plus"):
        rules.append(Rule(("control", "gate"), ("control_scale",), lambda x: x.reshape(())))
    return rules


def detect_dit_layout(keys: Iterable[str]) -> Layout:
    keys = set(keys)
    if "proj_out.weight" in keys or "condition_embedder.time_proj.weight" in keys:
        return "diffusers"
    if "head.head.weight" in keys or "time_projection.1.weight" in keys:
        return "wan"
    raise ConversionError("cannot tell the checkpoint layout: neither diffusers (proj_out.weight) "
                          "nor original Wan (head.head.weight) DiT keys are present")


class _Renamed(Mapping[str, np.ndarray]):
    """View of a state dict with known wrapper prefixes stripped from its keys."""

    def __init__(self, inner: Mapping[str, np.ndarray]):
        self._inner = inner
        self._keys = {}
        for k in inner:
            stripped = k
            for p in _STRIP_PREFIXES:
                if stripped.startswith(p):
                    stripped = stripped[len(p):]
            self._keys[stripped] = k

    def __getitem__(self, k: str) -> np.ndarray:
        return self._inner[self._keys[k]]

    def __iter__(self):
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def dit_params_from_state_dict(state_dict: Mapping[str, np.ndarray], cfg: WanDiTConfig,
                               layout: Layout | None = None, dtype=None) -> dict:
    """Our pure param dict (numpy; weights only, no running statistics) from a checkpoint state dict
    in either layout."""
    sd = _Renamed(state_dict)
    layout = layout or detect_dit_layout(sd)
    abstract = abstract_pure_params(nnx.state(abstract_dit(cfg), nnx.Param))
    return convert_state_dict(sd, dit_rules(cfg, layout), abstract, dtype)


# --------------------------------------------------------------------------------------------------
# The checkpoint's config.json → WanDiTConfig (diffusers' WanTransformer3DModel, original WanModel)
# --------------------------------------------------------------------------------------------------

_CONFIG_TABLES: dict[Layout, dict[str, Any]] = {
    "diffusers": {  # WanTransformer3DModel.__init__; dim = num_attention_heads × attention_head_dim
        "num_layers": "num_layers", "num_attention_heads": "num_heads", "attention_head_dim": "head_dim",
        "ffn_dim": "ffn_dim", "freq_dim": "freq_dim", "in_channels": "in_channels",
        "out_channels": "out_channels", "text_dim": "text_dim", "patch_size": "patch_size", "eps": "eps",
        "rope_max_seq_len": "rope_max_len", "cross_attn_norm": Fixed((True,)),
        "qk_norm": Fixed(("rms_norm_across_heads",)), "image_dim": Fixed((None,)),
        "added_kv_proj_dim": Fixed((None,)), "pos_embed_seq_len": Fixed((None,))},
    "wan": {  # WanModel.__init__ of the original repo (it leaves patch_size and text_dim out of the file)
        "num_layers": "num_layers", "num_heads": "num_heads", "dim": "dim", "ffn_dim": "ffn_dim",
        "freq_dim": "freq_dim", "in_dim": "in_channels", "out_dim": "out_channels", "text_dim": "text_dim",
        "text_len": "text_len", "patch_size": "patch_size", "eps": "eps", "model_type": Fixed(("t2v", "ti2v")),
        "window_size": Fixed(((-1, -1),)), "qk_norm": Fixed((True,)), "cross_attn_norm": Fixed((True,))},
}


def dit_config_from_json(raw: Mapping[str, Any], base: WanDiTConfig | None = None,
                         source: str = "config.json") -> WanDiTConfig:
    """The architecture a checkpoint's config.json states — diffusers' WanTransformer3DModel or the
    original Wan repo's WanModel, told apart by their keys — as our config. What the file does not
    state (compute dtype, control branch, a diffusers file's text_len, ...) comes from `base`
    (default: TI2V-5B)."""
    layout: Layout = "diffusers" if "num_attention_heads" in raw else "wan"
    fields = config_fields(raw, _CONFIG_TABLES[layout], source)
    if "head_dim" in fields:
        fields["dim"] = fields.pop("head_dim") * fields["num_heads"]
    return dataclasses.replace(base or WanDiTConfig.ti2v_5b(), **fields)


def checkpoint_dit_config(path: str | os.PathLike[str], cfg: WanDiTConfig | None = None) -> WanDiTConfig:
    """The config to load an official checkpoint with: its own config.json's (beside the weights,
    or in a pipeline's `transformer/`) if it has one — checked against `cfg` when both are given —
    else `cfg`, else TI2V-5B."""
    root = _weights_path(path)
    root = root if os.path.isdir(root) else os.path.dirname(os.path.abspath(root))
    raw = read_config_json(root)
    if raw is None or raw.get("_class_name", "WanModel") not in ("WanModel", "WanTransformer3DModel"):
        return cfg or WanDiTConfig.ti2v_5b()  # no config.json, or one describing another model
    source = os.path.join(root, "config.json")
    found = dit_config_from_json(raw, cfg, source)
    return found if cfg is None else agree(cfg, found, source)


def _weights_path(path: str | os.PathLike[str]) -> str:
    """A checkpoint's weights: `path`, or a diffusers pipeline's `transformer/` subfolder."""
    path = os.fspath(path)
    return os.path.join(path, "transformer") if os.path.isdir(os.path.join(path, "transformer")) else path


def load_dit_checkpoint(path: str | os.PathLike[str], cfg: WanDiTConfig, dtype=None) -> dict:
    """Read an official DiT checkpoint: a safetensors file, a sharded index, a directory with either,
    or a diffusers pipeline directory (its `transformer/` subfolder is used)."""
    return dit_params_from_state_dict(open_safetensors(_weights_path(path)), cfg, dtype=dtype)


def with_control_stats(params: dict, cfg: WanDiTConfig, stats: str | os.PathLike[str] | None) -> dict:
    """`params` (weights only) plus the control branch's running statistics: read from the record
    `stats` (control.STATS_FILE format) when given, else none recorded (control.py says what the
    branch then uses). Only add-plus has statistics; a record for another mode is an error."""
    if stats is not None:
        values = control.read_stats(stats, cfg)
    else:
        values = control.default_stats(cfg)
    if not values:
        return params
    return {**params, "control": {**params["control"], **values}}


def load_dit(path: str | os.PathLike[str], cfg: WanDiTConfig | None = None, dtype=None,
             stats: str | os.PathLike[str] | None = None):
    """`from_pretrained` for the DiT. `path` is either a directory our converter (or
    training.export_weights) wrote (orbax params + config.json, and control.STATS_FILE for a trained
    add-plus model; fast) or an official safetensors checkpoint in Wan or diffusers layout (its
    architecture from its own config.json when it has one, `checkpoint_dit_config`; `cfg` then adds
    what the file does not say, e.g. the control branch). `stats` names a control statistics record to
    use (default: the converted directory's own, if any). Returns a `WanDiT`."""

    if converted_weights.is_converted_dir(path):
        saved = converted_weights.load_config(path, WanDiTConfig)
        if cfg is not None and cfg != saved:
            raise ValueError(f"{path} was converted for {saved}, not {cfg}")
        abstract = abstract_pure_params(nnx.state(abstract_dit(saved), nnx.Param))
        params = converted_weights.restore_params(path, abstract, dtype)
        own = control.stats_file_of(path) if saved.control == "add-plus" else None
        return dit_from_params(saved, with_control_stats(params, saved, stats if stats is not None else own))
    cfg = checkpoint_dit_config(path, cfg)
    return dit_from_params(cfg, with_control_stats(load_dit_checkpoint(path, cfg, dtype), cfg, stats))
