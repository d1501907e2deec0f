"""Official tiny-autoencoder checkpoints (`taew2_2.pth`, `safetensors/taew2_2.safetensors`) → our
TinyAutoencoder (models/tae.py): the name of every parameter in the reference's state dict, and
the loader. The format is described in tae.py's module docstring.

Our own trained tiny decoders (rynn_jax/training/decoder.py) are saved as a directory: `config.json`
(the TAEConfig, rynn_jax.converted_weights' format) and `model.safetensors`, the state dict in the
official names and torch layout (OIHW convs) in the config's dtype, so the reference reads it too.
`load_tae` takes either form."""

from __future__ import annotations

import functools
import os
import re
from collections.abc import Callable, Mapping

import jax
import numpy as np
from flax import nnx

from rynn_jax import converted_weights
from rynn_jax.models.tae import TAEConfig, TinyAutoencoder, abstract_tae, tae_from_params
from rynn_jax.torch_pickle import read_torch_checkpoint
from rynn_jax.weights import (
    ConversionError,
    Rule,
    abstract_pure_params,
    convert_state_dict,
    flatten_params,
    open_safetensors,
    torch_conv2d,
)

_TORCH_SUFFIXES = (".pth", ".pt", ".ckpt", ".bin")

_LEAF_SUFFIX = {"kernel": "weight", "bias": "bias"}


def checkpoint_key(path: tuple[str, ...], cfg: TAEConfig) -> str:
    """The official state-dict name of our leaf, e.g. ("decoder", "stages", "1", "grow", "conv",
    "kernel") → "decoder.13.conv.weight" (index = position in the reference's nn.Sequential)."""
    *module, leaf = path
    if leaf not in _LEAF_SUFFIX:
        raise ConversionError(f"our TAE leaf {'/'.join(path)} has no checkpoint counterpart")
    name, suffix = "/".join(module), _LEAF_SUFFIX[leaf]
    k = cfg.blocks_per_stage
    n, per_enc, per_dec = cfg.num_stages, 2 + k, 3 + k
    block = r"stages/(\d+)/blocks/(\d+)/conv([012])"
    rules: list[tuple[str, Callable[[re.Match], str]]] = [
        ("encoder/conv_in", lambda m: "encoder.0"),
        (r"encoder/stages/(\d+)/pool/conv", lambda m: f"encoder.{2 + per_enc * int(m[1])}.conv"),
        (r"encoder/stages/(\d+)/down", lambda m: f"encoder.{3 + per_enc * int(m[1])}"),
        ("encoder/" + block,
         lambda m: f"encoder.{4 + per_enc * int(m[1]) + int(m[2])}.conv.{2 * int(m[3])}"),
        ("encoder/conv_out", lambda m: f"encoder.{2 + per_enc * n}"),
        ("decoder/conv_in", lambda m: "decoder.1"),
        ("decoder/" + block,
         lambda m: f"decoder.{3 + per_dec * int(m[1]) + int(m[2])}.conv.{2 * int(m[3])}"),
        (r"decoder/stages/(\d+)/grow/conv",
         lambda m: f"decoder.{3 + per_dec * int(m[1]) + k + 1}.conv"),
        (r"decoder/stages/(\d+)/proj",
         lambda m: f"decoder.{3 + per_dec * int(m[1]) + k + 2}"),
        ("decoder/conv_out", lambda m: f"decoder.{3 + per_dec * n + 1}"),
    ]
    for pattern, rename in rules:
        m = re.fullmatch(pattern, name)
        if m:
            return f"{rename(m)}.{suffix}"
    raise ConversionError(f"no checkpoint name for our TAE leaf {'/'.join(path)}")


def _conv_weight(key: str, c_out: int, is_grow: bool) -> Callable[[np.ndarray], np.ndarray]:
    def transform(w: np.ndarray) -> np.ndarray:
        if w.ndim != 4:
            raise ConversionError(f"checkpoint key {key!r} has shape {tuple(w.shape)}; expected a "
                                  "4-D Conv2d weight (out, in, kh, kw)")
        if is_grow and w.shape[0] > c_out and w.shape[0] % c_out == 0:
            w = w[-c_out:]  # as the reference loader: keep the last time step's output channels
        return torch_conv2d(w)
    return transform


def _bias(key: str) -> Callable[[np.ndarray], np.ndarray]:
    def transform(b: np.ndarray) -> np.ndarray:
        if b.ndim != 1:
            raise ConversionError(f"checkpoint key {key!r} has shape {tuple(b.shape)}; expected a "
                                  "1-D bias")
        return b
    return transform


@functools.lru_cache(maxsize=8)
def abstract_params(cfg: TAEConfig) -> dict:
    """Our pure param dict with ShapeDtypeStruct leaves (str keys), built once per config."""
    return abstract_pure_params(nnx.state(abstract_tae(cfg), nnx.Param))


def tae_rules(cfg: TAEConfig) -> list[Rule]:
    """One Rule per leaf of our parameter tree, naming its tensor in the official state dict."""
    rules = []
    for path, leaf in flatten_params(abstract_params(cfg)).items():
        key = checkpoint_key(path, cfg)
        transform = (_bias(key) if path[-1] == "bias"
                     else _conv_weight(key, leaf.shape[-1], "grow" in path))
        rules.append(Rule(path, (key,), transform))
    return rules


def tae_from_state_dict(cfg: TAEConfig, state_dict: Mapping[str, np.ndarray]) -> TinyAutoencoder:
    """Our model from an official-format state dict ({name: array}, torch OIHW conv weights).

    Raises ConversionError (a ValueError) naming the key for a missing, unexpected or mis-shaped
    tensor. Parameters are cast to cfg.dtype."""
    return tae_from_params(cfg, convert_state_dict(state_dict, tae_rules(cfg), abstract_params(cfg)))


def read_tae_state_dict(path: str | os.PathLike[str]) -> Mapping[str, np.ndarray]:
    """Open an official checkpoint: a torch pickle (`taew2_2.pth`, read without torch) or a
    `.safetensors` file."""
    path = os.fspath(path)
    if path.endswith(_TORCH_SUFFIXES):
        return read_torch_checkpoint(path)
    return open_safetensors(path)


MODEL_FILE = "model.safetensors"  # a saved directory's weights (beside config.json)


def tae_state_dict(model: TinyAutoencoder) -> dict[str, np.ndarray]:
    """The inverse of `tae_from_state_dict`: official names, torch OIHW conv weights, the model's
    parameter dtype."""
    flat = flatten_params(nnx.to_pure_dict(nnx.state(model, nnx.Param)))
    names = {rule.target: rule.sources[0] for rule in tae_rules(model.cfg)}
    out = {}
    for path, value in flat.items():
        value = np.asarray(jax.device_get(value))
        out[names[path]] = np.ascontiguousarray(value.transpose(3, 2, 0, 1)) if value.ndim == 4 else value
    return out


def save_tae(path: str | os.PathLike[str], model: TinyAutoencoder) -> None:
    """Write `model` as a directory `load_tae` reads: config.json + model.safetensors."""
    from safetensors.numpy import save_file

    os.makedirs(path, exist_ok=True)
    save_file(tae_state_dict(model), os.path.join(path, MODEL_FILE))
    converted_weights.save_config(path, model.cfg)


def load_tae(path: str | os.PathLike[str], cfg: TAEConfig | None = None) -> TinyAutoencoder:
    """The model from an official checkpoint file (default config: `TAEConfig.wan22()`) or from a
    directory `save_tae` wrote (its config.json; `cfg`, when given, must equal it)."""
    if os.path.isdir(path) and os.path.isfile(os.path.join(path, converted_weights.CONFIG_FILE)):
        saved = converted_weights.load_config(path, TAEConfig)
        if cfg is not None and cfg != saved:
            raise ConversionError(f"{path} holds a tiny autoencoder of another config than the one asked for")
        return tae_from_state_dict(saved, open_safetensors(os.path.join(path, MODEL_FILE)))
    return tae_from_state_dict(cfg or TAEConfig.wan22(), read_tae_state_dict(path))
