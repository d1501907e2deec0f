"""Converted-weights directories (orbax): written once by the converter and the exporters, so later
loads are fast. (Training state checkpoints are `training/checkpointing.py`.)

A converted model directory holds `params/` (an orbax StandardCheckpointer tree of the pure param
dict) and `config.json` (the dataclass config it was built with). Restores go straight to the
requested dtype and, when shardings are given, straight onto the devices — no full host copy.
"""

from __future__ import annotations

import dataclasses
import json
import os
import typing
from typing import Any

import jax
import orbax.checkpoint as ocp

PARAMS_DIR = "params"
CONFIG_FILE = "config.json"


def is_converted_dir(path: str | os.PathLike[str]) -> bool:
    return os.path.isdir(os.path.join(path, PARAMS_DIR)) and os.path.isfile(os.path.join(path, CONFIG_FILE))


def save_params(path: str | os.PathLike[str], params: dict, config: Any) -> None:
    """Write `params` (pure dict of arrays) and `config` (a dataclass) under `path`."""
    path = os.path.abspath(os.fspath(path))
    os.makedirs(path, exist_ok=True)
    ckptr = ocp.StandardCheckpointer()
    ckptr.save(os.path.join(path, PARAMS_DIR), params, force=True)
    ckptr.wait_until_finished()
    save_config(path, config)


def save_config(path: str | os.PathLike[str], config: Any) -> None:
    """Write `config` (a dataclass) as `path/config.json`, with its class name (`load_config`)."""
    cfg = dataclasses.asdict(config)
    cfg["__class__"] = type(config).__name__
    with open(os.path.join(path, CONFIG_FILE), "w") as f:
        json.dump(cfg, f, indent=1)


def saved_class(path: str | os.PathLike[str]) -> str | None:
    """The name of the config class the directory's model was written with (None: not recorded)."""
    with open(os.path.join(path, CONFIG_FILE)) as f:
        return json.load(f).get("__class__")


def load_config(path: str | os.PathLike[str], cls: type) -> Any:
    with open(os.path.join(path, CONFIG_FILE)) as f:
        raw = json.load(f)
    name = raw.pop("__class__", cls.__name__)
    if name != cls.__name__:
        raise ValueError(f"{path} holds a {name}, not a {cls.__name__}")
    return _from_dict(cls, raw, f"{path}/{CONFIG_FILE}")


def _from_dict(cls: type, raw: dict, where: str) -> Any:
    """`cls` from its `dataclasses.asdict` form; fields that are dataclasses themselves (the 4D
    model's `base`) are built the same way."""
    for key, old_default in getattr(cls, "DROPPED_FIELDS", {}).items():  # written by older versions
        if raw.get(key, old_default) == old_default:
            raw.pop(key, None)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = sorted(set(raw) - set(fields))
    if unknown:
        raise ValueError(f"{where} has fields {cls.__name__} does not know: {unknown}")
    hints = typing.get_type_hints(cls)
    nested = {k for k in raw if dataclasses.is_dataclass(hints.get(k)) and isinstance(raw[k], dict)}
    return cls(**{k: _from_dict(hints[k], v, where) if k in nested else tuple(v) if isinstance(v, list) else v
                  for k, v in raw.items()})


def restore_params(path: str | os.PathLike[str], abstract_params: dict, dtype=None,
                   shardings: dict | None = None) -> dict:
    """Restore a pure param dict shaped like `abstract_params` (ShapeDtypeStructs)."""
    path = os.path.abspath(os.path.join(os.fspath(path), PARAMS_DIR))

    def target(leaf, sharding=None):
        return jax.ShapeDtypeStruct(leaf.shape, dtype or leaf.dtype, sharding=sharding)

    if shardings is None:
        abstract = jax.tree.map(target, abstract_params)
    else:
        abstract = jax.tree.map(target, abstract_params, shardings)
    try:
        return ocp.StandardCheckpointer().restore(path, abstract)
    except (ValueError, KeyError, FileNotFoundError) as e:
        raise ValueError(f"checkpoint at {path} does not match the model: {e}") from e
