"""Read a PyTorch checkpoint (`torch.save` of a state dict) into numpy arrays, without torch.

Original Wan checkpoints (e.g. `Wan2.2_VAE.pth`) are torch pickles. Unpickling arbitrary pickles
executes arbitrary code, so the unpickler here resolves only the handful of globals a state dict
needs (tensor rebuild functions, storage classes, OrderedDict) and refuses everything else.

Both on-disk formats are handled: the zip archive of torch >= 1.6 (`<root>/data.pkl` plus one file
per storage under `<root>/data/`) and the legacy sequential format (`_use_new_zipfile_serialization
=False`). Storages of uncompressed zip entries are memory-mapped, so a multi-GB file is not read
into memory twice. bfloat16 arrives as `ml_dtypes.bfloat16`, as from safetensors' numpy reader.
"""

from __future__ import annotations

import collections
import os
import pickle
import struct
import zipfile
from collections.abc import Callable, Mapping
from typing import Any

import ml_dtypes
import numpy as np

# torch storage class name → numpy dtype of its elements
_STORAGE_DTYPES: dict[str, np.dtype] = {
    "DoubleStorage": np.dtype(np.float64),
    "FloatStorage": np.dtype(np.float32),
    "HalfStorage": np.dtype(np.float16),
    "BFloat16Storage": np.dtype(ml_dtypes.bfloat16),
    "LongStorage": np.dtype(np.int64),
    "IntStorage": np.dtype(np.int32),
    "ShortStorage": np.dtype(np.int16),
    "CharStorage": np.dtype(np.int8),
    "ByteStorage": np.dtype(np.uint8),
    "BoolStorage": np.dtype(np.bool_),
}

_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


class TorchCheckpointError(ValueError):
    """The file is not a torch state-dict checkpoint this reader can safely load."""


class _StorageType:
    """Stands in for `torch.FloatStorage` etc.: only its element dtype matters."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]


def _rebuild_tensor(storage: np.ndarray, offset: int, size: tuple[int, ...],
                    stride: tuple[int, ...], *_: Any) -> np.ndarray:
    """`torch._utils._rebuild_tensor_v2`: a strided view into a flat storage (copied at the end)."""
    return np.lib.stride_tricks.as_strided(
        storage[offset:], shape=tuple(size), strides=tuple(s * storage.itemsize for s in stride))


def _rebuild_parameter(data: np.ndarray, *_: Any) -> np.ndarray:
    """`torch._utils._rebuild_parameter(_with_state)`: a Parameter is its data."""
    return data


def _rebuild_from_type_v2(func: Callable, _new_type: Any, args: tuple, _state: Any) -> Any:
    """`torch._tensor._rebuild_from_type_v2`: tensor subclasses; we keep the plain array."""
    return func(*args)


_ALLOWED_GLOBALS: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_tensor"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    ("torch._tensor", "_rebuild_from_type_v2"): _rebuild_from_type_v2,
    ("torch", "Tensor"): None,
    ("torch.nn.parameter", "Parameter"): None,
    # Plain containers a DeepSpeed `*_model_states.pt` keeps beside the weights (param_shapes,
    # sparse_tensor_module_names); read as their Python equivalents, then dropped.
    ("torch", "Size"): tuple,
    ("builtins", "set"): set,
    ("__builtin__", "set"): set,  # pickle protocol 2 (torch.save's default) names it so
}


class _RestrictedUnpickler(pickle.Unpickler):
    def __init__(self, file: Any, load_storage: Callable[[_StorageType, str, int], np.ndarray]):
        super().__init__(file)
        self._load_storage = load_storage
        self._storages: dict[str, np.ndarray] = {}

    def find_class(self, module: str, name: str) -> Any:
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        if (module, name) in _ALLOWED_GLOBALS:
            return _ALLOWED_GLOBALS[(module, name)]
        raise TorchCheckpointError(
            f"checkpoint pickle references {module}.{name}, which a state-dict reader does not "
            "allow (only tensors, storages and OrderedDict are loaded)")

    def persistent_load(self, pid: Any) -> np.ndarray:
        if not (isinstance(pid, tuple) and pid and pid[0] == "storage"):
            raise TorchCheckpointError(f"unsupported persistent id in checkpoint: {pid!r}")
        storage_type, key, numel = pid[1], str(pid[2]), int(pid[4])
        if not isinstance(storage_type, _StorageType):
            raise TorchCheckpointError(f"unsupported storage type {storage_type!r}")
        if key not in self._storages:
            self._storages[key] = self._load_storage(storage_type, key, numel)
        return self._storages[key]


# --------------------------------------------------------------------------------------------------
# Zip format
# --------------------------------------------------------------------------------------------------


def _zip_entry_array(path: str, zf: zipfile.ZipFile, info: zipfile.ZipInfo, dtype: np.dtype,
                     count: int) -> np.ndarray:
    if info.compress_type != zipfile.ZIP_STORED:
        return np.frombuffer(zf.read(info), dtype=dtype, count=count)
    with open(path, "rb") as f:  # data begins after the local header, its name and extra field
        f.seek(info.header_offset)
        header = f.read(30)
        name_len, extra_len = struct.unpack("<HH", header[26:30])
    start = info.header_offset + 30 + name_len + extra_len
    if count == 0:
        return np.zeros((0,), dtype)
    return np.memmap(path, dtype=dtype, mode="r", offset=start, shape=(count,))


def _read_zip(path: str) -> Any:
    with zipfile.ZipFile(path) as zf:
        pkls = [n for n in zf.namelist() if n.endswith("/data.pkl") or n == "data.pkl"]
        if len(pkls) != 1:
            raise TorchCheckpointError(f"{path}: expected one data.pkl in the zip, found {pkls}")
        root = pkls[0][: -len("data.pkl")]
        byteorder = "little"
        if f"{root}byteorder" in zf.namelist():
            byteorder = zf.read(f"{root}byteorder").decode().strip()
        infos = {i.filename: i for i in zf.infolist()}

        def load_storage(st: _StorageType, key: str, numel: int) -> np.ndarray:
            name = f"{root}data/{key}"
            if name not in infos:
                raise TorchCheckpointError(f"{path}: storage {name} is missing from the archive")
            dtype = st.dtype.newbyteorder("<" if byteorder == "little" else ">")
            arr = _zip_entry_array(path, zf, infos[name], dtype, numel)
            return arr if byteorder == "little" else arr.astype(st.dtype)

        with zf.open(pkls[0]) as f:
            return _RestrictedUnpickler(f, load_storage).load()


# --------------------------------------------------------------------------------------------------
# Legacy format: magic, protocol, sys_info, object pickle, storage keys, then raw storages
# --------------------------------------------------------------------------------------------------


def _read_legacy(path: str) -> Any:
    with open(path, "rb") as f:
        def safe_load() -> Any:  # a fresh unpickler per record: one keeps a read-ahead buffer
            return _NoGlobalsUnpickler(f).load()

        if safe_load() != _LEGACY_MAGIC:
            raise TorchCheckpointError(f"{path} is neither a torch zip nor a legacy checkpoint")
        safe_load()  # protocol version
        sys_info = safe_load()
        if isinstance(sys_info, dict) and not sys_info.get("little_endian", True):
            raise TorchCheckpointError(f"{path}: big-endian legacy checkpoints are not supported")
        pending: dict[str, tuple[_StorageType, int]] = {}
        placeholders: dict[str, np.ndarray] = {}

        def defer(st: _StorageType, key: str, numel: int) -> np.ndarray:
            pending[key] = (st, numel)
            placeholders[key] = np.empty((numel,), st.dtype)  # filled in below, views stay valid
            return placeholders[key]

        obj = _RestrictedUnpickler(f, defer).load()
        keys = safe_load()
        for key in keys:
            (numel,) = struct.unpack("<q", f.read(8))
            st, _ = pending[key]
            data = f.read(numel * st.dtype.itemsize)
            placeholders[key][...] = np.frombuffer(data, dtype=st.dtype, count=numel)
    return obj


class _NoGlobalsUnpickler(pickle.Unpickler):
    """For the legacy header and storage-key list: plain data only."""

    def find_class(self, module: str, name: str) -> Any:
        raise TorchCheckpointError(f"unexpected global {module}.{name} in checkpoint header")


# --------------------------------------------------------------------------------------------------
# Public
# --------------------------------------------------------------------------------------------------


def read_torch_checkpoint(path: str | os.PathLike[str]) -> dict[str, np.ndarray]:
    """`torch.load(path)` of a state dict, as {name: numpy array}, without importing torch.

    A top-level `{"state_dict": {...}}`, `{"model": {...}}` or (DeepSpeed) `{"module": {...}}` wrapper
    is unwrapped. Non-tensor
    entries (e.g. an int step counter next to the weights) are dropped.
    """
    path = os.fspath(path)
    if not os.path.exists(path):
        raise TorchCheckpointError(f"checkpoint not found: {path}")
    try:
        obj = _read_zip(path) if zipfile.is_zipfile(path) else _read_legacy(path)
    except (pickle.UnpicklingError, EOFError, KeyError, struct.error, zipfile.BadZipFile) as e:
        raise TorchCheckpointError(f"{path} is not a readable torch checkpoint: {e!r}") from e
    for wrapper in ("state_dict", "model", "module"):
        if isinstance(obj, Mapping) and wrapper in obj and isinstance(obj[wrapper], Mapping):
            obj = obj[wrapper]
    if not isinstance(obj, Mapping):
        raise TorchCheckpointError(f"{path} holds a {type(obj).__name__}, not a state dict")
    return {str(k): v if v.flags.c_contiguous else v.copy()  # ascontiguousarray would make 0-d 1-d
            for k, v in obj.items() if isinstance(v, np.ndarray)}
