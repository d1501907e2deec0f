"""Official checkpoints (original Wan layout or diffusers layout) → our parameter trees: the engine
the models' name maps (`models/*_weights.py`) and the converter CLI (`rynn_jax.convert`) use.

The engine here is model-agnostic: a model's name map is a list of `Rule`s, each saying which
checkpoint tensor(s) fill one leaf of our parameter tree and how to transform them (transpose a
torch Linear, stack 30 per-layer tensors for `scan`, ...). `convert_state_dict` applies the rules
and refuses to produce a tree that is not exactly right: every checkpoint key must be consumed,
every leaf of ours must be filled, and every shape must match, with errors that name the key.

Reading uses `safetensors` with numpy (bf16 arrives as `ml_dtypes.bfloat16`), never torch.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from flax import nnx
from safetensors import safe_open
from tqdm import tqdm

from rynn_jax.errors import InputError

Array = np.ndarray


class ConversionError(InputError):
    """A checkpoint does not fit the model: missing, unexpected or mis-shaped tensors (a user's
    input error: the CLI prints it as one line; a ValueError for library callers)."""


def _identity(x: Array) -> Array:
    return x


@dataclasses.dataclass(frozen=True)
class Rule:
    """How one leaf of our parameter tree is built from checkpoint tensors."""

    target: tuple[str, ...]  # path into our pure param dict, e.g. ("blocks", "attn1", "q", "kernel")
    sources: tuple[str, ...]  # checkpoint keys; several = one per scanned layer, stacked on axis 0
    transform: Callable[[Array], Array] = _identity  # applied to each source tensor before stacking
    stacked: bool = False  # True: the target has a leading layer axis built from `sources`


# --------------------------------------------------------------------------------------------------
# Reading safetensors (single file, a directory, or a sharded `*.index.json`)
# --------------------------------------------------------------------------------------------------


class SafetensorsDict(Mapping[str, Array]):
    """Lazy read-only mapping over one or more safetensors files; tensors load on access."""

    def __init__(self, files_by_key: dict[str, str]):
        self._files_by_key = files_by_key

    def __getitem__(self, key: str) -> Array:
        path = self._files_by_key[key]
        try:
            with safe_open(path, framework="numpy") as f:
                return f.get_tensor(key)
        except Exception as e:  # safetensors raises its own types; name the file and key
            raise ConversionError(f"cannot read tensor {key!r} from {path}: {e}") from e

    def shape(self, key: str) -> tuple[int, ...]:
        with safe_open(self._files_by_key[key], framework="numpy") as f:
            return tuple(f.get_slice(key).get_shape())

    def __iter__(self) -> Iterator[str]:
        return iter(self._files_by_key)

    def __len__(self) -> int:
        return len(self._files_by_key)


def _keys_of(path: str) -> list[str]:
    try:
        with safe_open(path, framework="numpy") as f:
            return list(f.keys())
    except Exception as e:
        raise ConversionError(f"{path} is not a readable safetensors file: {e}") from e


def open_safetensors(path: str | os.PathLike[str], prefix: str = "") -> SafetensorsDict:
    """Open a `.safetensors` file, a `*.safetensors.index.json`, or a directory holding either.

    `prefix` selects a component inside a diffusers pipeline directory, e.g. "transformer".
    """
    path = os.fspath(path)
    if prefix:
        path = os.path.join(path, prefix)
    if os.path.isdir(path):
        indexes = sorted(f for f in os.listdir(path) if f.endswith(".safetensors.index.json"))
        files = sorted(f for f in os.listdir(path) if f.endswith(".safetensors"))
        if indexes:
            path = os.path.join(path, indexes[0])
        elif len(files) == 1:
            path = os.path.join(path, files[0])
        elif files:
            files_by_key = {}
            for name in files:
                for key in _keys_of(os.path.join(path, name)):
                    files_by_key[key] = os.path.join(path, name)
            return SafetensorsDict(files_by_key)
        else:
            raise ConversionError(f"no .safetensors or .safetensors.index.json in {path}")
    if path.endswith(".index.json"):
        with open(path) as f:
            weight_map = json.load(f)["weight_map"]
        root = os.path.dirname(path)
        missing = sorted({v for v in weight_map.values() if not os.path.exists(os.path.join(root, v))})
        if missing:
            raise ConversionError(f"{path} names shard files that do not exist: {missing}")
        return SafetensorsDict({k: os.path.join(root, v) for k, v in weight_map.items()})
    if not os.path.exists(path):
        raise ConversionError(f"checkpoint not found: {path}")
    return SafetensorsDict({k: path for k in _keys_of(path)})


# --------------------------------------------------------------------------------------------------
# Applying rules
# --------------------------------------------------------------------------------------------------


def flatten_params(tree: Mapping[Any, Any], str_keys: bool = True) -> dict[tuple[Any, ...], Any]:
    """Nested dict (as `nnx.to_pure_dict` returns) → {path tuple: leaf}; keys become str unless
    `str_keys=False` (then they round-trip into `nnx.replace_by_pure_dict` unchanged)."""
    flat: dict[tuple[Any, ...], Any] = {}

    def visit(prefix: tuple[Any, ...], node: Any) -> None:
        if isinstance(node, Mapping):
            for k, v in node.items():
                visit(prefix + ((str(k) if str_keys else k),), v)
        else:
            flat[prefix] = node

    visit((), tree)
    return flat


def unflatten_params(flat: Mapping[tuple[Any, ...], Any]) -> dict[Any, Any]:
    tree: dict[str, Any] = {}
    for path, leaf in flat.items():
        node = tree
        for k in path[:-1]:
            node = node.setdefault(k, {})
        node[path[-1]] = leaf
    return tree


def convert_state_dict(
    state_dict: Mapping[str, Array],
    rules: Sequence[Rule],
    abstract_params: Mapping[str, Any],
    dtype: Any | None = None,
) -> dict[str, Any]:
    """Build our param tree from `state_dict` by `rules`, checking it against `abstract_params`.

    `abstract_params` is the pure dict of `jax.ShapeDtypeStruct` (from `nnx.eval_shape`) that the
    result must match leaf for leaf. `dtype` casts every leaf (None keeps the model's dtype).
    """
    expected = {p: leaf for p, leaf in flatten_params(abstract_params).items()}
    by_target: dict[tuple[str, ...], Rule] = {}
    for rule in rules:
        if rule.target in by_target:
            raise ConversionError(f"two rules fill {'/'.join(rule.target)}")
        by_target[rule.target] = rule

    unfilled = sorted("/".join(p) for p in expected if p not in by_target)
    if unfilled:
        raise ConversionError(f"no checkpoint tensor maps to our parameter(s): {unfilled[:10]}")
    unknown = sorted("/".join(p) for p in by_target if p not in expected)
    if unknown:
        raise ConversionError(f"rules name parameters the model does not have: {unknown[:10]}")

    needed = [k for rule in rules for k in rule.sources]
    missing = [k for k in needed if k not in state_dict]
    if missing:
        raise ConversionError(
            f"checkpoint is missing key {missing[0]!r}"
            + (f" (and {len(missing) - 1} more: {missing[1:6]})" if len(missing) > 1 else "")
        )
    unused = sorted(set(state_dict) - set(needed))
    if unused:
        raise ConversionError(
            f"checkpoint has unexpected key {unused[0]!r}"
            + (f" (and {len(unused) - 1} more: {unused[1:6]})" if len(unused) > 1 else "")
            + "; is this the right model config and layout?"
        )

    out: dict[tuple[str, ...], Array] = {}
    # Reading is lazy (safetensors memory maps, the .pth's storages): this loop is the conversion's time.
    for path, rule in tqdm(by_target.items(), desc="convert", unit="tensor", disable=len(by_target) < 64):
        want = expected[path]
        per_source = []
        for key in rule.sources:
            value = rule.transform(np.asarray(state_dict[key]))
            want_one = tuple(want.shape[1:]) if rule.stacked else tuple(want.shape)
            if tuple(value.shape) != want_one:
                raise ConversionError(
                    f"checkpoint key {key!r} has shape {tuple(np.shape(state_dict[key]))} "
                    f"(→ {tuple(value.shape)} after transform) but our {'/'.join(path)} needs "
                    f"{want_one}"
                )
            per_source.append(value)
        if rule.stacked:
            if len(per_source) != want.shape[0]:
                raise ConversionError(
                    f"{'/'.join(path)} stacks {want.shape[0]} layers but the rule has {len(per_source)}"
                )
            value = np.stack(per_source, axis=0)
        elif len(per_source) == 1:
            value = per_source[0]
        else:
            raise ConversionError(f"rule for {'/'.join(path)} has several sources but is not stacked")
        out[path] = value.astype(dtype if dtype is not None else want.dtype)
    return unflatten_params(out)


def abstract_pure_params(abstract_state: Any) -> dict[str, Any]:
    """`nnx.State` of ShapeDtypeStructs → pure nested dict with str keys (scan layers are arrays)."""

    pure = nnx.to_pure_dict(abstract_state)
    return unflatten_params(flatten_params(pure))


# --------------------------------------------------------------------------------------------------
# A checkpoint's own config.json
# --------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Fixed:
    """A config.json key whose value must be one of `allowed`: the others build parts our model
    does not have (an image embedder, a non-residual VAE, ...)."""
    allowed: tuple[Any, ...]


# config.json key → our config field, or `Fixed` (checked, not stored); keys starting with "_" are
# the writer's bookkeeping (_class_name, _diffusers_version, ...).
ConfigTable = Mapping[str, "str | Fixed"]


def config_fields(raw: Mapping[str, Any], table: ConfigTable, source: str) -> dict[str, Any]:
    """Our config fields from a checkpoint's config.json by `table`; a key the table does not know
    or a `Fixed` value we do not implement is refused by name (rather than loading a model that
    silently differs). Lists become tuples, as our frozen configs hold them."""
    fields: dict[str, Any] = {}
    for key, value in raw.items():
        if key.startswith("_"):
            continue
        if key not in table:
            raise ConversionError(f"{source}: key {key!r} is not one rynn-jax knows; is this a Wan-family "
                                  "checkpoint of a supported architecture?")
        target = table[key]
        value = tuple(value) if isinstance(value, list) else value
        if isinstance(target, Fixed):
            if value not in target.allowed:
                raise ConversionError(f"{source}: {key}={value!r} is not supported (rynn-jax implements "
                                      f"{' or '.join(map(repr, target.allowed))})")
        else:
            fields[target] = value
    return fields


def read_config_json(directory: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The `config.json` in `directory` as a dict, or None when there is none."""
    path = os.path.join(directory, "config.json")
    if not os.path.isfile(path):
        return None
    try:
        with open(path) as f:
            raw = json.load(f)
    except (OSError, ValueError) as e:
        raise ConversionError(f"cannot read {path}: {e}") from e
    if not isinstance(raw, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return raw


def agree(given: Any, found: Any, source: str) -> Any:
    """`given` (a config the caller passed) if the checkpoint's config.json (`found`, built on top
    of `given`) says the same; else an error naming each field they disagree on."""
    diff = [f.name for f in dataclasses.fields(given) if getattr(given, f.name) != getattr(found, f.name)]
    if diff:
        pairs = (f"{n}={getattr(found, n)!r} there, {getattr(given, n)!r} given" for n in diff)
        raise ConversionError(f"{source} disagrees with the given config: " + ", ".join(pairs))
    return given


def torch_linear(w_oi: Array) -> Array:
    """torch Linear weight (out, in) → our kernel (in, out)."""
    return np.ascontiguousarray(w_oi.T)


def torch_conv3d(w_oitwh: Array) -> Array:
    """torch Conv3d weight (out, in, t, h, w) → our kernel (t, h, w, in, out)."""
    return np.ascontiguousarray(np.transpose(w_oitwh, (2, 3, 4, 1, 0)))


def torch_conv2d(w_oihw: Array) -> Array:
    """torch Conv2d weight (out, in, h, w) → our kernel (h, w, in, out)."""
    return np.ascontiguousarray(np.transpose(w_oihw, (2, 3, 1, 0)))
