"""grain input pipelines: pixel clips or pre-encoded latents → shuffled, sharded, mixed, batched,
prefetched, device-put, checkpointable.

Per source:   MapDataset.source(items)[process_index::process_count]   disjoint, complete shards
                .shuffle(seed).repeat(num_epochs)                          new order every epoch
                .map(load)  (None = bad item, dropped below)
                .to_iter_dataset().batch(batch_size)
Mixture:      IterDataset.mix({name: batched}, weights)                   weights are per *batch*
Prefetch:     .mp_prefetch(worker_count)                                   worker processes

Batches are homogeneous in source because EgoDex/robot clips (81 frames) and VITRA clips (25)
have different shapes; the EgoDex:VITRA ratio is the ratio of their batch weights (equal batch
sizes assumed). Everything is a pure function of (files, seed, process_index, process_count), so
two runs with the same arguments give the same batches, and the iterator state (a small JSON
dict: per-source positions) restores the exact next batch. Save it next to the model checkpoint
with `save_state`/`restore_state`, or hand the iterator to orbax as
`grain.checkpoint.CheckpointSave(iterator)` inside a `Composite` checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import zipfile
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import grain
import jax
import numpy as np
from absl import flags
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from rynn_jax.data import shards as shards_lib
from rynn_jax.data.errors import DataError, handle
from rynn_jax.data.source import ClipSource

Batch = dict[str, np.ndarray]


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoaderConfig:
    batch_size: int  # examples per batch on this process
    seed: int = 0  # shuffle seed (each source adds its position in the mixture)
    num_epochs: int | None = None  # passes over each source; None repeats forever (training)
    drop_remainder: bool = True  # keep batch shapes static for jit
    worker_count: int = 0  # grain worker processes decoding in parallel; 0 = in this process
    worker_buffer_size: int = 2  # batches each worker prepares ahead
    read_threads: int = 4  # threads loading elements in each process (PyAV/h5py release the GIL)
    read_buffer: int = 8  # elements loaded ahead per process; mind memory: a 81×480×832 clip is 97 MB
    text_len: int = 512  # latent path: text embedding slots after zero-padding


def process_shard(process_index: int | None = None, process_count: int | None = None
                  ) -> tuple[int, int]:
    pi = jax.process_index() if process_index is None else process_index
    pc = jax.process_count() if process_count is None else process_count
    if not 0 <= pi < pc:
        raise ValueError(f"process_index {pi} not in [0, {pc})")
    return pi, pc


def _per_source(items: Any, load: Callable[[Any], Any], cfg: LoaderConfig, seed: int,
                process_index: int | None, process_count: int | None) -> grain.IterDataset:
    pi, pc = process_shard(process_index, process_count)
    ds = grain.MapDataset.source(items)[pi::pc]
    if len(ds) == 0:
        raise ValueError(f"process {pi} of {pc} got no items (only {len(items)} in total)")
    ds = ds.shuffle(seed=seed % 2**32).repeat(cfg.num_epochs).map(load)
    # grain's default read-ahead (16 threads, 500 elements) would hold ~50 GB of decoded clips
    read = grain.ReadOptions(num_threads=cfg.read_threads, prefetch_buffer_size=cfg.read_buffer)
    return ds.to_iter_dataset(read).batch(cfg.batch_size, drop_remainder=cfg.drop_remainder)


# ---- pixel path ------------------------------------------------------------------------------------


class _LoadClip:
    """Picklable loader: source.load_or_none, then optional extra transforms."""

    def __init__(self, source: ClipSource, transforms: Sequence[Callable[[dict], dict]]):
        self.source, self.transforms = source, tuple(transforms)

    def __call__(self, ref):
        sample = self.source.load_or_none(ref)
        if sample is None:
            return None
        for t in self.transforms:
            sample = t(sample)
        return sample


def pixel_dataset(source: ClipSource, cfg: LoaderConfig, *, seed_offset: int = 0,
                  transforms: Sequence[Callable[[dict], dict]] = (),
                  process_index: int | None = None, process_count: int | None = None
                  ) -> grain.IterDataset:
    """Batches of decoded clips (see `clips` for the sample dict) from one source."""
    return _per_source(source.index(), _LoadClip(source, transforms), cfg, cfg.seed + seed_offset,
                       process_index, process_count)


# ---- latent path -----------------------------------------------------------------------------------


class DecodeLatentRecord:
    """Record bytes → training example: latents as stored, text embedding padded to text_len."""

    def __init__(self, text_len: int = 512, strict: bool = False, name: str = "latents"):
        self.text_len, self.strict, self.name = text_len, strict, name

    def __call__(self, data: bytes) -> dict[str, np.ndarray] | None:
        try:
            rec = shards_lib.decode_record(data)
            emb = rec.pop("text_embedding")
            if emb.ndim != 2 or not np.isfinite(emb).all():
                raise ValueError(f"text_embedding shape {emb.shape} or values not finite")
        except (ValueError, KeyError, OSError, EOFError, zipfile.BadZipFile) as e:
            # the record has no path of its own; name the dataset and the record's clip if known
            handle(DataError(self.name, "corrupt record", str(e)), self.strict)
            return None
        out = np.zeros((self.text_len, emb.shape[1]), np.float32)
        n = min(self.text_len, emb.shape[0])
        out[:n] = emb[:n]
        rec["text_embedding"] = out
        return rec


def latent_dataset(shard_paths: Sequence[str], cfg: LoaderConfig, *, seed_offset: int = 0,
                   strict: bool = False, process_index: int | None = None,
                   process_count: int | None = None) -> grain.IterDataset:
    """Batches of pre-encoded clips from ArrayRecord shards (what training reads)."""
    if not shard_paths:
        raise ValueError("no latent shards given")
    source = grain.sources.ArrayRecordDataSource(list(shard_paths))
    return _per_source(source, DecodeLatentRecord(cfg.text_len, strict, shard_paths[0]), cfg,
                       cfg.seed + seed_offset, process_index, process_count)


# ---- mixing, prefetch, devices, state --------------------------------------------------------------


def mixture(datasets: Mapping[str, grain.IterDataset], weights: Mapping[str, float] | None = None,
            cfg: LoaderConfig | None = None) -> grain.IterDataset:
    """Weighted mixture of per-source batch streams (e.g. {"egodex": 0.5, "vitra": 0.5}),
    prefetched by `cfg.worker_count` worker processes when given."""
    names = sorted(datasets)
    if weights is not None and set(weights) != set(names):
        raise ValueError(f"weights {sorted(weights)} do not match datasets {names}")
    ds = grain.IterDataset.mix({n: datasets[n] for n in names},
                               None if weights is None else {n: float(weights[n]) for n in names})
    return prefetch(ds, cfg)


def prefetch(ds: grain.IterDataset, cfg: LoaderConfig | None) -> grain.IterDataset:
    if cfg is None or cfg.worker_count <= 0:
        return ds
    # grain's worker start reads absl flags (grain 0.2.x); a program that never ran absl.app has
    # unparsed flags and grain raises UnparsedFlagAccessError. Defaults are what we want.
    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return ds.mp_prefetch(grain.MultiprocessingOptions(num_workers=cfg.worker_count,
                                                       per_worker_buffer_size=cfg.worker_buffer_size),
                          worker_init_fn=_ignore_sigint)


def _ignore_sigint(worker_index: int, worker_count: int) -> None:
    """Workers leave SIGINT to the trainer. Ctrl-C in a terminal and `timeout --signal=INT` signal
    the whole process group: a worker that died of it took the batches in flight with it, and the
    trainer, which stops cleanly on SIGINT, then failed to read the next batch and to checkpoint
    the iterator. The workers end when the trainer closes the iterator or exits."""
    del worker_index, worker_count
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def batch_sharding(mesh: Mesh, batch_axes: tuple[str, ...] = ("data", "fsdp")) -> NamedSharding:
    axes = tuple(a for a in batch_axes if a in mesh.axis_names)
    return NamedSharding(mesh, PartitionSpec(axes or None))


def to_device(batch: Batch, sharding: NamedSharding) -> dict[str, jax.Array]:
    """Host batch (this process's rows) → global jax.Arrays sharded on the batch dimension.
    Strings (text, ids) stay on the host and are dropped here."""
    out = {}
    for k, v in batch.items():
        v = np.asarray(v)
        if v.dtype.kind in "biuf":
            out[k] = jax.make_array_from_process_local_data(sharding, v)
    return out


def device_iterator(it: Iterator[Batch], sharding: NamedSharding) -> Iterator[dict[str, jax.Array]]:
    for batch in it:
        yield to_device(batch, sharding)


def save_state(it: grain.DatasetIterator) -> bytes:
    """The iterator's position as JSON bytes (store beside the model checkpoint)."""
    return json.dumps(it.get_state(), sort_keys=True).encode()


def restore_state(it: grain.DatasetIterator, state: bytes) -> grain.DatasetIterator:
    it.set_state(json.loads(state.decode()))
    return it
