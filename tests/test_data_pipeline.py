"""grain pipelines: per-process sharding, seeded shuffle, weighted mixture, exact resume, device put."""

from __future__ import annotations

import collections

import jax
import numpy as np
import pytest

from rynn_jax.data import clips
from rynn_jax.data import fixtures as fx
from rynn_jax.data import pipeline as pl
from rynn_jax.data.clips import ClipRef
from rynn_jax.data.egodex import EgoDexSource
from rynn_jax.data.source import ClipSource
from rynn_jax.data.vitra import VitraSource


class CountingSource(ClipSource):
    """A source of `n` tiny clips (no files): keeps pipeline tests about the pipeline."""

    def __init__(self, n: int, name: str = "fake", frames: int = 3):
        super().__init__("/nonexistent", clips.ClipConfig(num_frames=frames))
        self.n, self.name = n, name

    def episodes(self):
        return [f"ep{i}" for i in range(self.n)]

    def num_samples(self, episode):
        return self.cfg.num_frames

    def load(self, ref: ClipRef):
        i = int(ref.episode[2:])
        return {"x": np.full((self.cfg.num_frames, 2), i, np.float32),
                "text": clips.text_array(f"clip {i}")}


def ids(batches) -> list[int]:
    return [int(i) for b in batches for i in b["clip_id"]]


def one_epoch(source, process_index, process_count, batch_size=1, seed=0):
    cfg = pl.LoaderConfig(batch_size=batch_size, seed=seed, num_epochs=1, drop_remainder=False)
    return ids(pl.pixel_dataset(source, cfg, process_index=process_index, process_count=process_count))


@pytest.mark.parametrize("n", [10, 11])
def test_two_processes_disjoint_and_complete(n):
    src = CountingSource(n)
    p0, p1 = one_epoch(src, 0, 2), one_epoch(src, 1, 2)
    assert set(p0).isdisjoint(p1)
    assert sorted(p0 + p1) == list(range(n))
    assert abs(len(p0) - len(p1)) <= 1
    assert sorted(one_epoch(src, None, None)) == list(range(n))  # jax.process_* default: 1 process


def test_shuffle_is_seeded_and_reshuffles_each_epoch():
    src = CountingSource(20)
    a, b, c = one_epoch(src, 0, 1, seed=1), one_epoch(src, 0, 1, seed=1), one_epoch(src, 0, 1, seed=2)
    assert a == b and a != c and a != sorted(a)
    cfg = pl.LoaderConfig(batch_size=20, seed=1, num_epochs=2)
    e1, e2 = list(pl.pixel_dataset(src, cfg))
    assert sorted(ids([e1])) == sorted(ids([e2])) and ids([e1]) != ids([e2])


def test_resume_at_exact_next_batch():
    src = {"a": CountingSource(13, "a"), "b": CountingSource(7, "b", frames=5)}
    cfg = pl.LoaderConfig(batch_size=2, seed=4)
    ds = pl.mixture({k: pl.pixel_dataset(s, cfg, seed_offset=i) for i, (k, s) in enumerate(src.items())},
                    {"a": 0.7, "b": 0.3}, cfg)
    it = iter(ds)
    for _ in range(3):
        next(it)
    state = pl.save_state(it)
    expected = [next(it) for _ in range(4)]
    resumed = pl.restore_state(iter(ds), state)
    for want in expected:
        got = next(resumed)
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])


def test_mixture_weights_are_respected():
    cfg = pl.LoaderConfig(batch_size=1, seed=0)
    ds = pl.mixture({"egodex": pl.pixel_dataset(CountingSource(5, frames=3), cfg),
                     "vitra": pl.pixel_dataset(CountingSource(5, frames=2), cfg, seed_offset=1)},
                    {"egodex": 3.0, "vitra": 1.0})
    it = iter(ds)
    kinds = collections.Counter(next(it)["x"].shape[1] for _ in range(100))
    assert abs(kinds[3] / 100 - 0.75) <= 0.02  # grain mixes on a deterministic schedule


def test_pixel_mixture_of_real_sources_with_worker_processes(tmp_path):
    fx.make_dataset("egodex", str(tmp_path / "egodex"), 2, 70)
    fx.make_dataset("vitra", str(tmp_path / "vitra"), 2, 70)
    ego = EgoDexSource(tmp_path / "egodex", clips.ClipConfig(num_frames=9, height=32, width=64))
    vit = VitraSource(tmp_path / "vitra", clips.ClipConfig(num_frames=5, height=32, width=64))
    cfg = pl.LoaderConfig(batch_size=2, seed=0, worker_count=1, worker_buffer_size=1)
    ds = pl.mixture({"egodex": pl.pixel_dataset(ego, cfg),
                     "vitra": pl.pixel_dataset(vit, cfg, seed_offset=1)},
                    {"egodex": 1.0, "vitra": 1.0}, cfg)
    it = iter(ds)
    first = [next(it) for _ in range(3)]
    state = pl.save_state(it)
    want = next(it)
    got = next(pl.restore_state(iter(ds), state))
    np.testing.assert_array_equal(got["video"], want["video"])
    np.testing.assert_array_equal(got["clip_id"], want["clip_id"])
    assert {b["video"].shape[1] for b in first + [want]} <= {9, 5}
    assert all(b["video"].dtype == np.uint8 and b["uv"].shape[-1] == 2 for b in first)


def test_worker_processes_survive_sigint_to_the_process_group():
    """Ctrl-C in a terminal (and `timeout --signal=INT`) signals the trainer and its data workers
    together; the trainer stops cleanly after its step, so the workers must outlive the signal and
    keep serving the batches the trainer reads before checkpointing."""
    import os
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import os, signal, sys
        sys.path.insert(0, {os.path.dirname(__file__)!r})
        from test_data_pipeline import CountingSource, ids
        from rynn_jax.data import pipeline as pl
        cfg = pl.LoaderConfig(batch_size=1, seed=0, worker_count=2, worker_buffer_size=1)
        plain = ids(b for b, _ in zip(pl.pixel_dataset(CountingSource(6), cfg), range(8)))
        it = iter(pl.prefetch(pl.pixel_dataset(CountingSource(6), cfg), cfg))
        got = ids(next(it) for _ in range(2))
        signal.signal(signal.SIGINT, lambda *_: None)   # the trainer's own handler
        os.killpg(0, signal.SIGINT)                     # the whole group, as a terminal's Ctrl-C
        got += ids(next(it) for _ in range(6))
        print("IDS", plain, got)
        assert got == plain, (got, plain)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                          start_new_session=True)  # its own process group, so the signal stays in it
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "IDS" in proc.stdout


def test_to_device_shards_batch_over_mesh():
    devices = np.array(jax.devices())
    mesh = jax.sharding.Mesh(devices.reshape(-1, 1, 1, 1), ("data", "fsdp", "tensor", "context"))
    sharding = pl.batch_sharding(mesh)
    n = len(devices) * 2
    batch = {"x": np.arange(n * 3, dtype=np.float32).reshape(n, 3),
             "clip_id": np.arange(n), "text": np.array(["a"] * n)}
    out = pl.to_device(batch, sharding)
    assert set(out) == {"x", "clip_id"}  # strings stay on the host
    assert out["x"].sharding == sharding and out["x"].shape == (n, 3)
    np.testing.assert_array_equal(np.asarray(out["x"]), batch["x"])


def test_iterator_state_in_orbax_checkpoint_beside_params(tmp_path):
    import grain
    import orbax.checkpoint as ocp

    ds = pl.pixel_dataset(CountingSource(9), pl.LoaderConfig(batch_size=2, seed=0))
    it = iter(ds)
    next(it), next(it)
    params = {"w": np.arange(3.0)}
    with ocp.CheckpointManager(tmp_path) as mngr:
        mngr.save(7, args=ocp.args.Composite(params=ocp.args.StandardSave(params),
                                             data=grain.checkpoint.CheckpointSave(it)))
        mngr.wait_until_finished()
    want = next(it)
    fresh = iter(ds)
    with ocp.CheckpointManager(tmp_path) as mngr:
        got = mngr.restore(7, args=ocp.args.Composite(params=ocp.args.StandardRestore(params),
                                                      data=grain.checkpoint.CheckpointRestore(fresh)))
    np.testing.assert_array_equal(got["params"]["w"], params["w"])
    np.testing.assert_array_equal(next(fresh)["clip_id"], want["clip_id"])
