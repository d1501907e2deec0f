"""RynnWorld-4D weights: the paper's init (clone the RGB branch of a Wan2.2 DiT into depth and
flow) and the released checkpoint layout → our param tree.

Released names (diffusers' WanTransformer3DModel names for the RGB branch and the shared parts,
suffixed copies for the other two; `m` ∈ {depth, flow}, JA modality names {video, depth, flow}):

| ours                                   | released                                                 |
|----------------------------------------|----------------------------------------------------------|
| base/...                               | the diffusers Wan names (models/dit_weights.py)           |
| m/patch_embed, m/patch_embed_bias      | patch_embedding_m.{weight,bias}                          |
| m/head                                 | proj_out_m                                               |
| m/blocks/self_attn/...                 | blocks.{i}.attn1_m.{to_q,to_k,to_v,to_out.0,norm_q,norm_k} |
| m/blocks/cross_attn/{q,o,norm_q}       | blocks.{i}.attn2_m.{to_q,to_out.0,norm_q}                |
| (shared: base/blocks/cross_attn/k ...) | blocks.{i}.attn2_m.{to_k,to_v,norm_k}: tied copies of attn2's, optional |
| m/blocks/norm_cross_{scale,bias}       | blocks.{i}.norm2_m.{weight,bias}                         |
| m/blocks/ffn_{up,down}                 | blocks.{i}.ffn_m.net.0.proj / ffn_m.net.2                |
| joint/{rgb,depth,flow}/...  (slot j)   | blocks.{joint_layers[j]}.joint_{align,q,kv,out}_{video,depth,flow}, modality_embed_*, joint_gate_* |
| joint/norm_{q,k}                       | blocks.{i}.joint_norm_{q,k}.weight                       |
| (the `rgb_decay` call argument)        | blocks.{i}.joint_gate_video_decay (a buffer)             |

A DeepSpeed `mp_rank_00_model_states.pt` holds the state dict under "module"; keys may carry
"module." and PEFT's ".base_layer." (the release strips both). `ema_weights.pt` holds the EMA of
the parameters that were trained, by name: it overrides those entries. Every key of both files
must be used, every parameter of ours filled, every shape right (rynn_jax.weights).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np
from flax import nnx

from rynn_jax import converted_weights
from rynn_jax.models import control
from rynn_jax.models.dit4d import MODALITIES, WanDiT4D, WanDiT4DConfig, abstract_dit4d, dit4d_from_params
from rynn_jax.models.dit_weights import dit_rules, with_control_stats
from rynn_jax.torch_pickle import read_torch_checkpoint
from rynn_jax.weights import (
    ConversionError,
    Rule,
    abstract_pure_params,
    convert_state_dict,
    flatten_params,
    torch_linear,
    unflatten_params,
)

_RELEASED_MODALITY = {"rgb": "video", "depth": "depth", "flow": "flow"}
_TIED = ("to_k.weight", "to_k.bias", "to_v.weight", "to_v.bias", "norm_k.weight")  # of attn2_{depth,flow}


# --------------------------------------------------------------------------------------------------
# The paper's init: depth and flow start as copies of RGB
# --------------------------------------------------------------------------------------------------


def clone_rgb(params4d: Mapping, dit_params: Mapping) -> dict:
    """A 4D param tree (`params4d` gives its structure and the JA init) whose base is the Wan DiT
    `dit_params` (a WanDiT pure dict) and whose depth and flow branches are copies of its RGB
    parts: a branch's parameters carry the WanDiT names, so each is looked up by its own path."""
    dit = flatten_params(dit_params, str_keys=False)
    out = flatten_params(params4d, str_keys=False)
    base = {p: v for p, v in out.items() if p[0] == "base"}
    missing = sorted("/".join(map(str, p[1:])) for p in base if p[1:] not in dit)
    if missing or len(base) != len(dit):
        raise ConversionError(f"the Wan DiT params do not fit this 4D model's base: missing {missing[:5]}, "
                              f"{len(dit)} given for {len(base)}")
    for path, value in out.items():
        if path[0] in ("base", "depth", "flow"):
            src = dit[path[1:]]
            if np.shape(src) != np.shape(value):
                raise ConversionError(f"{'/'.join(map(str, path))}: {np.shape(src)} in the Wan DiT, "
                                      f"{np.shape(value)} here")
            out[path] = src
    return unflatten_params(out)


def branch_as_dit(params4d: Mapping, branch: str) -> dict:
    """The WanDiT pure dict that computes `branch` alone (joint attention left out): the shared
    parameters from base, the branch's own from it. For "rgb", the base itself."""
    if branch not in MODALITIES:
        raise ValueError(f"branch must be one of {MODALITIES}, got {branch!r}")
    flat = flatten_params(params4d, str_keys=False)
    dit = {p[1:]: v for p, v in flat.items() if p[0] == "base"}
    if branch != "rgb":
        dit.update({p[1:]: v for p, v in flat.items() if p[0] == branch})
    return unflatten_params(dit)


def load_dit4d(path: str | os.PathLike[str], dtype=None) -> WanDiT4D:
    """A 4D model from a converted-weights directory (`training.export_weights` of a 4D run; with a
    control branch, its running statistics from the record beside the weights)."""
    cfg = converted_weights.load_config(path, WanDiT4DConfig)
    abstract = abstract_pure_params(nnx.state(abstract_dit4d(cfg), nnx.Param))
    params = converted_weights.restore_params(path, abstract, dtype)
    if cfg.base.control == "add-plus":
        params["base"] = with_control_stats(params["base"], cfg.base, control.stats_file_of(path))
    return dit4d_from_params(cfg, params)


# --------------------------------------------------------------------------------------------------
# The released layout
# --------------------------------------------------------------------------------------------------

_BRANCH_RENAMES = (("attn1.", "attn1_{m}."), ("attn2.", "attn2_{m}."), ("norm2.", "norm2_{m}."),
                   ("ffn.", "ffn_{m}."), ("patch_embedding.", "patch_embedding_{m}."), ("proj_out.", "proj_out_{m}."))


def _branch_key(key: str, m: str) -> str:
    """A diffusers Wan key → the released key of branch m's copy."""
    prefix, rest = (key.split(".", 2)[:2], key.split(".", 2)[2]) if key.startswith("blocks.") else ([], key)
    for old, new in _BRANCH_RENAMES:
        if rest.startswith(old):
            return ".".join(prefix + [new.format(m=m) + rest[len(old):]])
    raise ValueError(f"no branch copy of {key}")


def released_rules(cfg: WanDiT4DConfig) -> list[Rule]:
    abstract = abstract_pure_params(nnx.state(abstract_dit4d(cfg), nnx.Param))
    base_rules = dit_rules(cfg.base, "diffusers")
    rules = [Rule(("base",) + r.target, r.sources, r.transform, r.stacked) for r in base_rules]
    branch_paths = set(flatten_params(abstract["depth"]))
    for m in ("depth", "flow"):
        rules += [Rule((m,) + r.target, tuple(_branch_key(k, m) for k in r.sources), r.transform, r.stacked)
                  for r in base_rules if r.target in branch_paths]
    blk = [f"blocks.{i}." for i in cfg.joint_layers]
    stack = lambda target, name, transform=lambda x: x: Rule(  # noqa: E731
        ("joint",) + target, tuple(b + name for b in blk), transform, stacked=True)
    for m in MODALITIES:
        r = _RELEASED_MODALITY[m]
        rules += [stack((m, "align_scale"), f"joint_align_{r}.weight"), stack((m, "align_bias"), f"joint_align_{r}.bias"),
                  stack((m, "embed"), f"modality_embed_{r}", lambda x: x.reshape(x.shape[-1])),
                  stack((m, "gate"), f"joint_gate_{r}")]
        for ours, theirs in (("q", "q"), ("kv", "kv"), ("out", "out")):
            rules += [stack((m, ours, "kernel"), f"joint_{theirs}_{r}.weight", torch_linear),
                      stack((m, ours, "bias"), f"joint_{theirs}_{r}.bias")]
    rules += [stack(("norm_q",), "joint_norm_q.weight"), stack(("norm_k",), "joint_norm_k.weight")]
    return rules


def _clean(key: str) -> str:
    return key.replace("module.", "", 1) if key.startswith("module.") else key


def released_state_dict(model_states: Mapping[str, np.ndarray], ema: Mapping[str, np.ndarray] | None = None
                        ) -> dict[str, np.ndarray]:
    """The model's state dict from a released checkpoint's tensors, names cleaned as the release
    cleans them, the EMA entries (if given) put in place of the trained ones."""
    def cleaned(sd: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
        out = {}
        for k, v in sd.items():
            name = _clean(k).replace(".base_layer.", ".")
            if name in out:
                raise ConversionError(f"{source}: keys {k!r} and another both clean to {name!r}")
            out[name] = v
        return out

    sd = cleaned(model_states, "model states")
    if ema is not None:
        overrides = cleaned(ema, "EMA weights")
        unknown = sorted(set(overrides) - set(sd))
        if unknown:
            raise ConversionError(f"EMA weights name parameters the model states lack: {unknown[:5]}")
        sd.update(overrides)
    return sd


def dit4d_params_from_released(state_dict: Mapping[str, np.ndarray], cfg: WanDiT4DConfig, dtype=None
                               ) -> tuple[dict, float]:
    """(our pure param dict, the RGB-injection decay the checkpoint was saved with). Tied text K/V
    copies, where present, must equal the shared tensors; every other key must map to a parameter."""
    sd = dict(state_dict)
    for i in range(cfg.base.num_layers):
        for m in ("depth", "flow"):
            for name in _TIED:
                key = f"blocks.{i}.attn2_{m}.{name}"
                if key in sd:
                    shared = sd.get(f"blocks.{i}.attn2.{name}")
                    if shared is None or not np.array_equal(np.asarray(sd[key]), np.asarray(shared)):
                        raise ConversionError(f"{key}: the release ties it to blocks.{i}.attn2.{name}, "
                                              "but the two differ")
                    del sd[key]
    decays = {float(np.asarray(sd.pop(k)).reshape(())) for k in list(sd) if k.endswith(".joint_gate_video_decay")}
    if len(decays) > 1:
        raise ConversionError(f"joint_gate_video_decay differs between blocks: {sorted(decays)}")
    abstract = abstract_pure_params(nnx.state(abstract_dit4d(cfg), nnx.Param))
    return convert_state_dict(sd, released_rules(cfg), abstract, dtype), decays.pop() if decays else 1.0


def load_released(model_states: str | os.PathLike[str], cfg: WanDiT4DConfig, ema: str | os.PathLike[str] | None = None,
                  dtype=None) -> tuple[dict, float]:
    """Read a released checkpoint: `model_states` = a DeepSpeed `mp_rank_00_model_states.pt` (or a
    directory holding `pytorch_model/` with it), `ema` = its `ema_weights.pt`; both through the
    restricted unpickler (no torch, no code run). Returns `dit4d_params_from_released`'s pair."""
    path = os.fspath(model_states)
    if os.path.isdir(path):
        path = os.path.join(path, "pytorch_model", "mp_rank_00_model_states.pt")
    sd = released_state_dict(read_torch_checkpoint(path), read_torch_checkpoint(ema) if ema is not None else None)
    return dit4d_params_from_released(sd, cfg, dtype)


def param_count(cfg: WanDiT4DConfig) -> dict[str, int]:
    """Parameters by part (base = the Wan DiT: RGB + shared; depth; flow; joint) and the total,
    from the abstract model (nothing allocated)."""
    flat = flatten_params(abstract_pure_params(nnx.state(abstract_dit4d(cfg), nnx.Param)))
    counts: dict[str, int] = {}
    for path, leaf in flat.items():
        counts[path[0]] = counts.get(path[0], 0) + int(np.prod(leaf.shape))
    return {**counts, "total": sum(counts.values())}
