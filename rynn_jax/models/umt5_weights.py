"""umT5 encoder checkpoints → our parameter tree, from either naming.

| ours (blocks stacked)  | Hugging Face UMT5EncoderModel (safetensors)              | Wan (`models_t5_umt5-xxl-enc-bf16.pth`) |
|------------------------|----------------------------------------------------------|-----------------------------------------|
| token_embed            | shared.weight (and/or its tie encoder.embed_tokens.weight) | token_embedding.weight                |
| blocks/norm_attn       | encoder.block.{i}.layer.0.layer_norm.weight              | blocks.{i}.norm1.weight                 |
| blocks/{q,k,v,o}       | encoder.block.{i}.layer.0.SelfAttention.{q,k,v,o}.weight | blocks.{i}.attn.{q,k,v,o}.weight        |
| blocks/rel_bias        | ….layer.0.SelfAttention.relative_attention_bias.weight   | blocks.{i}.pos_embedding.embedding.weight |
| blocks/norm_ffn        | encoder.block.{i}.layer.1.layer_norm.weight              | blocks.{i}.norm2.weight                 |
| blocks/ffn_gate        | ….layer.1.DenseReluDense.wi_0.weight                     | blocks.{i}.ffn.gate.0.weight            |
| blocks/ffn_up          | ….layer.1.DenseReluDense.wi_1.weight                     | blocks.{i}.ffn.fc1.weight               |
| blocks/ffn_down        | ….layer.1.DenseReluDense.wo.weight                       | blocks.{i}.ffn.fc2.weight               |
| norm_out               | encoder.final_layer_norm.weight                          | norm.weight                             |

Linear weights are transposed to (in, out). Neither file needs a config: the architecture is read
off the tensor shapes (`config_from_shapes`); a Hugging Face config.json beside the weights is
checked for the parts shapes cannot tell (activation, norm epsilon, bucket distance).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from typing import Literal

import numpy as np
from flax import nnx

from rynn_jax.models.umt5 import UMT5Config, UMT5Encoder, abstract_umt5, umt5_from_params
from rynn_jax.torch_pickle import read_torch_checkpoint
from rynn_jax.weights import (ConversionError, Rule, abstract_pure_params, convert_state_dict, open_safetensors,
                              read_config_json, torch_linear)

Layout = Literal["hf", "wan"]
_TORCH_SUFFIXES = (".pth", ".pt", ".bin")
_HF_TIED = ("shared.weight", "encoder.embed_tokens.weight")  # one tensor, saved under either or both names

# our leaf → (Hugging Face name, Wan name) inside block i
_BLOCK_NAMES: dict[tuple[str, ...], tuple[str, str]] = {
    ("norm_attn",): ("layer.0.layer_norm.weight", "norm1.weight"),
    **{(p, "kernel"): (f"layer.0.SelfAttention.{p}.weight", f"attn.{p}.weight") for p in "qkvo"},
    ("rel_bias",): ("layer.0.SelfAttention.relative_attention_bias.weight", "pos_embedding.embedding.weight"),
    ("norm_ffn",): ("layer.1.layer_norm.weight", "norm2.weight"),
    ("ffn_gate", "kernel"): ("layer.1.DenseReluDense.wi_0.weight", "ffn.gate.0.weight"),
    ("ffn_up", "kernel"): ("layer.1.DenseReluDense.wi_1.weight", "ffn.fc1.weight"),
    ("ffn_down", "kernel"): ("layer.1.DenseReluDense.wo.weight", "ffn.fc2.weight"),
}
_TOP_NAMES = {"token_embed": ("shared.weight", "token_embedding.weight"),
              "norm_out": ("encoder.final_layer_norm.weight", "norm.weight")}
_BLOCK_PREFIX = {"hf": "encoder.block.{i}.", "wan": "blocks.{i}."}


def umt5_rules(cfg: UMT5Config, layout: Layout) -> list[Rule]:
    if layout not in _BLOCK_PREFIX:
        raise ValueError(f"layout must be 'hf' or 'wan', got {layout!r}")
    col = 0 if layout == "hf" else 1
    rules = [Rule((ours,), (names[col],)) for ours, names in _TOP_NAMES.items()]
    for leaf, names in _BLOCK_NAMES.items():
        keys = tuple(_BLOCK_PREFIX[layout].format(i=i) + names[col] for i in range(cfg.num_layers))
        rules.append(Rule(("blocks", *leaf), keys, torch_linear if leaf[-1] == "kernel" else lambda x: x,
                          stacked=True))
    return rules


def detect_layout(keys: Iterator[str] | Mapping[str, object]) -> Layout:
    keys = set(keys)
    if keys & set(_HF_TIED) or "encoder.final_layer_norm.weight" in keys:
        return "hf"
    if "token_embedding.weight" in keys or "norm.weight" in keys:
        return "wan"
    raise ConversionError("cannot tell the umT5 checkpoint layout: neither Hugging Face (shared.weight) nor "
                          "Wan (token_embedding.weight) encoder keys are present")


class _UntiedHF(Mapping[str, np.ndarray]):
    """A Hugging Face state dict with its tied embedding under one name, `shared.weight`: a file may
    hold it under either name or both; both must then be the same tensor."""

    def __init__(self, inner: Mapping[str, np.ndarray]):
        self._inner = inner
        present = [k for k in _HF_TIED if k in inner]
        if len(present) == 2 and not np.array_equal(inner[present[0]], inner[present[1]]):
            raise ConversionError("shared.weight and encoder.embed_tokens.weight differ: they are one tied "
                                  "embedding in UMT5EncoderModel")
        self._source = present[0] if present else None
        self._keys = [k for k in inner if k not in _HF_TIED] + (["shared.weight"] if present else [])

    def __getitem__(self, key: str) -> np.ndarray:
        return self._inner[self._source if key == "shared.weight" and self._source else key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def _shape(sd: Mapping[str, np.ndarray], key: str) -> tuple[int, ...]:
    return sd.shape(key) if hasattr(sd, "shape") else tuple(np.shape(sd[key]))


def config_from_shapes(sd: Mapping[str, np.ndarray], layout: Layout, **fields) -> UMT5Config:
    """The architecture a state dict's tensor shapes state; `fields` (eps, max_distance, dtypes)
    are what shapes cannot say. Missing keys are left for `convert_state_dict` to name."""
    col = 0 if layout == "hf" else 1
    pattern = re.compile(re.escape(_BLOCK_PREFIX[layout]).replace(r"\{i\}", r"(\d+)") + ".*")
    blocks = {int(m[1]) for k in sd if (m := pattern.fullmatch(k))}
    block = lambda leaf: _BLOCK_PREFIX[layout].format(i=0) + _BLOCK_NAMES[leaf][col]  # noqa: E731
    try:
        vocab, dim = _shape(sd, _TOP_NAMES["token_embed"][col])
        attn_dim = _shape(sd, block(("q", "kernel")))[0]
        num_buckets, num_heads = _shape(sd, block(("rel_bias",)))
        ffn_dim = _shape(sd, block(("ffn_up", "kernel")))[0]
    except (KeyError, ValueError) as e:
        raise ConversionError(f"not a umT5 encoder state dict ({layout} layout): cannot read {e}") from None
    if attn_dim % num_heads:
        raise ConversionError(f"attention width {attn_dim} is not a multiple of the {num_heads} heads")
    return UMT5Config(vocab_size=vocab, dim=dim, num_heads=num_heads, head_dim=attn_dim // num_heads,
                      ffn_dim=ffn_dim, num_layers=max(blocks) + 1 if blocks else 0, num_buckets=num_buckets,
                      **fields)


def umt5_params_from_state_dict(state_dict: Mapping[str, np.ndarray], cfg: UMT5Config | None = None,
                                **fields) -> tuple[UMT5Config, dict]:
    """(config, our pure param dict in numpy, in cfg.param_dtype) from a state dict in either
    layout; every key of the checkpoint must be used and every parameter of ours filled. `cfg`
    defaults to the shapes' own architecture plus `fields` (UMT5Config fields)."""
    layout = detect_layout(state_dict)
    sd = _UntiedHF(state_dict) if layout == "hf" else state_dict
    cfg = cfg or config_from_shapes(sd, layout, **fields)
    abstract = abstract_pure_params(nnx.state(abstract_umt5(cfg), nnx.Param))
    return cfg, convert_state_dict(sd, umt5_rules(cfg, layout), abstract)


# --------------------------------------------------------------------------------------------------
# Files
# --------------------------------------------------------------------------------------------------


def _hf_fields(directory: str) -> dict:
    """What a Hugging Face config.json says that the shapes cannot (checked where we implement
    only one choice)."""
    raw = read_config_json(directory)
    if raw is None:
        return {}
    source = os.path.join(directory, "config.json")
    act = raw.get("feed_forward_proj", "gated-gelu")
    if act != "gated-gelu" or raw.get("dense_act_fn", "gelu_new") not in ("gelu_new", "gelu_pytorch_tanh"):
        raise ConversionError(f"{source}: feed_forward_proj={act!r}, dense_act_fn={raw.get('dense_act_fn')!r}; "
                              "umT5 is gated-gelu with the tanh GELU, the only FFN implemented")
    return {"eps": float(raw.get("layer_norm_epsilon", 1e-6)),
            "max_distance": int(raw.get("relative_attention_max_distance", 128))}


def read_umt5_state_dict(path: str | os.PathLike[str]) -> tuple[Mapping[str, np.ndarray], dict]:
    """(state dict, config fields) of an encoder checkpoint: Wan's `.pth` (a torch pickle, read
    without torch), a Hugging Face safetensors file / index / directory, or a diffusers pipeline
    directory (its `text_encoder/`)."""
    path = os.fspath(path)
    if os.path.isdir(os.path.join(path, "text_encoder")):
        path = os.path.join(path, "text_encoder")
    if not os.path.exists(path):
        raise ConversionError(f"umT5 checkpoint not found: {path}")
    if path.endswith(_TORCH_SUFFIXES):
        try:
            return read_torch_checkpoint(path), {}
        except ValueError as e:
            raise ConversionError(str(e)) from None
    directory = path if os.path.isdir(path) else os.path.dirname(os.path.abspath(path))
    return open_safetensors(path), _hf_fields(directory)


def load_umt5(path: str | os.PathLike[str], dtype: str = "bfloat16", param_dtype: str | None = None,
              attention: str = "xla") -> UMT5Encoder:
    """`from_pretrained` for the encoder: architecture from the checkpoint, matmuls in `dtype`,
    parameters stored in `param_dtype` (default: `dtype`)."""
    state_dict, fields = read_umt5_state_dict(path)
    cfg, params = umt5_params_from_state_dict(state_dict, **fields, dtype=dtype,
                                              param_dtype=param_dtype or dtype, attention=attention)
    return umt5_from_params(cfg, params)


def hf_config_dict(cfg: UMT5Config) -> dict:
    """The transformers `UMT5Config` arguments of `cfg` (parity tests, parameter counts)."""
    return dict(vocab_size=cfg.vocab_size, d_model=cfg.dim, d_kv=cfg.head_dim, d_ff=cfg.ffn_dim,
                num_layers=cfg.num_layers, num_heads=cfg.num_heads, relative_attention_num_buckets=cfg.num_buckets,
                relative_attention_max_distance=cfg.max_distance, layer_norm_epsilon=cfg.eps,
                feed_forward_proj="gated-gelu", dense_act_fn="gelu_new", dropout_rate=0.0)

