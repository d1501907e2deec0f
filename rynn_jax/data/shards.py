"""Latent shards on disk: ArrayRecord files of self-describing records, written atomically.

Why plain ArrayRecord rather than a TFDS ArrayRecord dataset: we checked that tensorflow-datasets
4.9.10 builders do work without TensorFlow (a GeneratorBasedBuilder with
`file_format="array_record"`, Tensor and Text features, read back with `as_data_source`; TF never
imported; it needed the extra `importlib_resources` package). We still write the files ourselves
because TFDS generation is all-or-nothing per split in one process (distributed generation needs
Apache Beam), while pre-encoding must be split over many machines and resume shard by shard after a
crash; and grain reads both kinds through the same `ArrayRecordDataSource`, so TFDS would add a
dependency chain and a shuffle-on-write pass without helping the reader.

A record is one clip: a `.npz` archive (numpy's own format, `allow_pickle=False`) of named
arrays — readable without this code. Latents are stored channels-last as our VAE emits them,
(T', H', W', C), in float16 by default (normalized latents are O(1); halves the disk), the text
embedding trimmed to its true length (zero-padded to 512 slots at read time).

Atomicity: a shard is written to `<name>.tmp` and renamed when complete, so a crashed or killed
run never leaves a shard that looks finished; re-running skips every shard whose final file exists.
"""

from __future__ import annotations

import glob
import io
import os
from collections.abc import Iterable

import numpy as np
from array_record.python.array_record_module import ArrayRecordReader, ArrayRecordWriter

SHARD_SUFFIX = ".array_record"
WRITER_OPTIONS = "group_size:1"  # one record per chunk: true random access for shuffling


def encode_record(arrays: dict[str, np.ndarray]) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def decode_record(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def shard_name(prefix: str, index: int, total: int) -> str:
    return f"{prefix}-{index:05d}-of-{total:05d}{SHARD_SUFFIX}"


def list_shards(directory: str | os.PathLike[str], prefix: str = "*") -> list[str]:
    """Finished shards (never the `.tmp` of an interrupted write), sorted."""
    return sorted(glob.glob(os.path.join(os.fspath(directory), f"{prefix}-*-of-*{SHARD_SUFFIX}")))


def write_shard(path: str | os.PathLike[str], records: Iterable[bytes]) -> int:
    """Write records to `path` atomically; returns how many were written."""
    path = os.fspath(path)
    tmp = path + ".tmp"
    writer = ArrayRecordWriter(tmp, WRITER_OPTIONS)
    n = 0
    try:
        for r in records:
            writer.write(r)
            n += 1
    except BaseException:  # Ctrl-C included: no half-written .tmp left for a re-run to trip over
        writer.close()
        os.remove(tmp)
        raise
    writer.close()
    os.replace(tmp, path)
    return n


def num_records(path: str | os.PathLike[str]) -> int:
    reader = ArrayRecordReader(os.fspath(path))
    try:
        return reader.num_records()
    finally:
        reader.close()


def read_shard(path: str | os.PathLike[str]) -> list[dict[str, np.ndarray]]:
    """Every record of one shard (inspection and tests; training goes through grain)."""
    reader = ArrayRecordReader(os.fspath(path))
    try:
        return [decode_record(r) for r in reader.read_all()]
    finally:
        reader.close()


def first_record(path: str | os.PathLike[str]) -> dict[str, np.ndarray] | None:
    """The shard's first record (None if it has none): what a reader checks before training."""
    reader = ArrayRecordReader(os.fspath(path))
    try:
        return decode_record(reader.read([0])[0]) if reader.num_records() else None
    finally:
        reader.close()
