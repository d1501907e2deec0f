"""Bad data: each corruption is skipped with a logged reason and a counter, or raised naming the
file when strict — never turned into a silently wrong sample."""

from __future__ import annotations

import os

import h5py
import numpy as np
import pytest

from rynn_jax.data import clips, shards
from rynn_jax.data import fixtures as fx
from rynn_jax.data import pipeline as pl
from rynn_jax.data import video as video_lib
from rynn_jax.data.egodex import EgoDexSource
from rynn_jax.data.errors import SKIPPED, DataError
from rynn_jax.data.robot import RobotSource
from rynn_jax.data.vitra import VitraSource

CFG = clips.ClipConfig(num_frames=9, height=32, width=64)
N = 40  # 30 Hz frames per episode → 22 ticks → 2 clips of 9


@pytest.fixture(autouse=True)
def _reset_counter():
    SKIPPED.reset()
    yield
    SKIPPED.reset()


def truncate(path, keep: float = 0.5):
    data = open(path, "rb").read()
    with open(path, "wb") as f:
        f.write(data[: int(len(data) * keep)])


def expect_bad(make_source, reason: str, path_part: str, *, at: str = "index"):
    """Non-strict: the bad episode/clip is skipped and counted under `reason`; strict: DataError
    whose message names the file."""
    src = make_source(strict=False)
    refs = src.index()
    if at == "index":
        good_eps = {r.episode for r in refs}
        assert all(path_part not in e for e in good_eps)
    else:
        loaded = [src.load_or_none(r) for r in refs if path_part in r.episode]
        assert any(s is None for s in loaded)  # the clip holding the bad frame is dropped
    assert SKIPPED.counts[reason] >= 1, dict(SKIPPED.counts)
    assert path_part in SKIPPED.last_path[reason]
    strict = make_source(strict=True)
    with pytest.raises(DataError, match=reason) as e:
        for r in strict.index():
            strict.load_or_none(r)
    assert path_part in str(e.value)
    return refs


# ---- EgoDex ----------------------------------------------------------------------------------------


def egodex(tmp_path, **bad):
    good_j, good_e = fx.known_pose(N, 0)
    fx.write_egodex_episode(str(tmp_path), "t", 0, good_j, good_e)
    j, e = fx.known_pose(N, 1)
    return fx.write_egodex_episode(str(tmp_path), "t", 1, j, e, **bad)


def ego_source(tmp_path):
    return lambda strict: EgoDexSource(tmp_path, CFG, strict=strict)


def test_egodex_truncated_video(tmp_path):
    _, mp4 = egodex(tmp_path)
    truncate(mp4)
    refs = expect_bad(ego_source(tmp_path), "unreadable video", "t/1.mp4")
    assert {r.episode for r in refs} == {"t/0"}


def test_egodex_corrupted_hdf5(tmp_path):
    h5, _ = egodex(tmp_path)
    truncate(h5, 0.3)
    expect_bad(ego_source(tmp_path), "unreadable hdf5", "t/1.hdf5")


def test_egodex_missing_joint(tmp_path):
    egodex(tmp_path, drop_joints=("rightThumbTip",))
    expect_bad(ego_source(tmp_path), "missing joint", "t/1.hdf5")


def test_egodex_nan_joint(tmp_path):
    h5, _ = egodex(tmp_path)
    with h5py.File(h5, "r+") as f:
        f["transforms/leftIndexFingerTip"][4, 0, 3] = np.nan  # frame 4 (sampled) → clip 0 only
    expect_bad(ego_source(tmp_path), "nan joints", "t/1", at="load")
    # the same NaN on a joint flagged untracked (confidence 0) is expected and harmless
    with h5py.File(h5, "r+") as f:
        f["confidences/leftIndexFingerTip"][4] = 0.0
    src = EgoDexSource(tmp_path, CFG, strict=True, min_confidence=0.5)
    s = src.load_or_none([r for r in src.index() if r.episode == "t/1"][0])
    assert np.isfinite(s["uv"]).all() and not s["valid"][:, 0, 8].all()


def test_egodex_too_short(tmp_path):
    j, e = fx.known_pose(12, 0)  # 12 frames at 30 Hz = 7 ticks < 9
    fx.write_egodex_episode(str(tmp_path), "t", 0, j, e)
    src = EgoDexSource(tmp_path, CFG)
    assert src.index() == [] and SKIPPED.counts["too short"] == 1
    with pytest.raises(DataError, match="too short"):
        EgoDexSource(tmp_path, CFG, strict=True).index()


def test_read_frames_past_the_end_is_truncation(tmp_path):
    path = str(tmp_path / "v.mp4")
    video_lib.write_video(path, fx.frame_coded_video(10, 64, 32), 30)
    with pytest.raises(DataError, match="truncated video") as e:
        video_lib.read_frames(path, [8, 9, 10, 11], 64, 32)
    assert "v.mp4" in str(e.value)


# ---- VITRA -----------------------------------------------------------------------------------------


def vitra(tmp_path):
    for i in range(2):
        j, _ = fx.known_pose(N, i)
        fx.write_vitra_episode(str(tmp_path), f"Ego4D_v{i}_ep_000000", f"v{i}", j)
    return str(tmp_path / "annotations" / "Ego4D_v1_ep_000000.npy")


def vitra_source(tmp_path):
    return lambda strict: VitraSource(tmp_path, CFG, strict=strict)


def test_vitra_truncated_npy(tmp_path):
    truncate(vitra(tmp_path), 0.4)
    expect_bad(vitra_source(tmp_path), "unreadable npy", "Ego4D_v1")


def test_vitra_missing_key(tmp_path):
    npy = vitra(tmp_path)
    ep = np.load(npy, allow_pickle=True).item()
    del ep["right"]["joints_camspace"]
    np.save(npy, np.asarray(ep, dtype=object), allow_pickle=True)
    expect_bad(vitra_source(tmp_path), "missing key", "Ego4D_v1")


def test_vitra_nan_joints(tmp_path):
    npy = vitra(tmp_path)
    ep = np.load(npy, allow_pickle=True).item()
    ep["right"]["joints_camspace"][4, 7] = np.nan  # row 4 is sampled at 16 fps
    np.save(npy, np.asarray(ep, dtype=object), allow_pickle=True)
    expect_bad(vitra_source(tmp_path), "nan joints", "Ego4D_v1", at="load")


def test_vitra_truncated_video(tmp_path):
    vitra(tmp_path)
    video_lib.write_video(tmp_path / "videos" / "v1.mp4", fx.frame_coded_video(20, 128, 72), 30)
    expect_bad(vitra_source(tmp_path), "truncated video", "v1.mp4")


# ---- robot -----------------------------------------------------------------------------------------


def robot(tmp_path):
    return fx.make_dataset("robot", str(tmp_path), 2, N)


def robot_source(tmp_path):
    return lambda strict: RobotSource(tmp_path, CFG, strict=strict)


def test_robot_corrupted_parquet(tmp_path):
    robot(tmp_path)
    truncate(tmp_path / "episode_000001" / "timeseries.parquet", 0.5)
    expect_bad(robot_source(tmp_path), "unreadable", "episode_000001")


def test_robot_nan_actions(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    robot(tmp_path)
    path = tmp_path / "episode_000001" / "timeseries.parquet"
    table = pq.read_table(path)
    acts = np.asarray(table.column("action").combine_chunks().flatten()).reshape(-1, 54).copy()
    acts[2, 10] = np.nan
    col = pa.FixedSizeListArray.from_arrays(pa.array(acts.ravel()), 54).cast(pa.list_(pa.float32(), 54))
    pq.write_table(table.set_column(table.schema.get_field_index("action"), "action", col), path)
    expect_bad(robot_source(tmp_path), "nan actions", "episode_000001", at="load")


def test_robot_missing_skeleton_and_truncated_video(tmp_path):
    robot(tmp_path)
    os.remove(tmp_path / "episode_000001" / "hand_skeleton.npz")
    expect_bad(robot_source(tmp_path), "missing skeleton", "episode_000001")
    SKIPPED.reset()
    video_lib.write_video(tmp_path / "episode_000000" / "observation.images.head.mp4",
                          fx.frame_coded_video(20, 128, 72), 30)
    expect_bad(robot_source(tmp_path), "truncated video", "episode_000000")


# ---- latent shards ---------------------------------------------------------------------------------


def test_corrupt_latent_record(tmp_path):
    good = shards.encode_record({"video_latents": np.zeros((2, 1, 1, 4), np.float16),
                                 "text_embedding": np.ones((3, 8), np.float32),
                                 "clip_id": np.asarray(0)})
    path = str(tmp_path / "x-00000-of-00001.array_record")
    shards.write_shard(path, [good, good[: len(good) // 2]])
    cfg = pl.LoaderConfig(batch_size=1, num_epochs=1, text_len=4)
    out = list(pl.latent_dataset([path], cfg))
    assert len(out) == 1 and out[0]["text_embedding"].shape == (1, 4, 8)
    assert SKIPPED.counts["corrupt record"] == 1
    with pytest.raises(DataError, match="corrupt record"):
        list(pl.latent_dataset([path], cfg, strict=True))
