"""LeRobot v3 and RLDS export of robot-layout episodes, and our readers of both formats.

Oracles: the fixture episodes' known actions and frame-coded videos (`fixtures`), and `RobotSource`
reading the original episodes (the skeleton, intrinsics and prompt each importer must reproduce);
NumPy for the statistics; TFDS's own `builder_from_directory(...).as_data_source()` for RLDS.
LeRobot's own loader is checked by scripts/check_lerobot_dataset.py (data/README.md): installing
lerobot here means a separate multi-GB environment, too slow for CI.
"""

from __future__ import annotations

import json
import shutil
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from rynn_jax import errors
from rynn_jax.data import fixtures as fx
from rynn_jax.data import robot as robot_lib
from rynn_jax.data import video as video_lib
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.data.errors import DataError
from rynn_jax.data.formats import episode as ep_lib
from rynn_jax.data.formats import export as export_cli
from rynn_jax.data.formats import lerobot as lr
from rynn_jax.data.formats import rlds

W, H = 128, 72
LENGTHS = (20, 31, 26)  # different lengths, two LeRobot files of ≤ 2 episodes
TASKS = ("lift the lid with both hands", "push the block", "lift the lid with both hands")


def skeleton_codes(n: int) -> np.ndarray:
    """The skeleton video's frames carry codes 255 − i, so the two cameras cannot be mixed up."""
    return fx.frame_coded_video(256, W, H)[::-1][:n]


def write_episodes(root, lengths=LENGTHS, tasks=TASKS, first=0):
    for e, (n, task) in enumerate(zip(lengths, tasks), start=first):
        joints, elbows = fx.known_pose(n, e)
        valid = np.ones((n, 2, 22), bool)
        valid[::3, 1, 5:9] = False  # some untracked points: they must come back untracked
        d = fx.write_robot_episode(str(root), f"episode_{e:06d}", joints, elbows, fx.known_actions(n, e),
                                   valid=valid, task=task)
        video_lib.write_video(f"{d}/{ep_lib.SKELETON_VIDEO_FILE}", skeleton_codes(n), fx.SRC_FPS)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    base = tmp_path_factory.mktemp("export")
    write_episodes(base / "robot")
    lr.export(base / "robot", base / "lerobot", lr.LeRobotExportConfig(episodes_per_file=2))
    summary = rlds.export(base / "robot", base / "rlds")
    return base, summary


def whole(n: int) -> ClipConfig:
    """Whole episodes at the source rate and size: sample i is frame i."""
    return ClipConfig(num_frames=n, fps=fx.SRC_FPS, height=H, width=W)


def read_back(make_source, n: int) -> dict:
    return make_source(whole(n)).load(ClipRef(f"episode_{LENGTHS.index(n):06d}", 0))


SOURCES = {
    "lerobot": lambda base: lambda cfg, **kw: lr.LeRobotSource(base / "lerobot", cfg, strict=True, **kw),
    "rlds": lambda base: lambda cfg, **kw: rlds.RldsSource(rlds.version_dir(base / "rlds"), cfg, strict=True, **kw),
}


@pytest.mark.parametrize("fmt", SOURCES)
def test_round_trip_gives_the_episodes_back(exported, fmt):
    base, _ = exported
    make = SOURCES[fmt](base)
    assert make(whole(20)).episodes() == ["episode_000000", "episode_000001", "episode_000002"]
    for e, n in enumerate(LENGTHS):
        got = read_back(make, n)
        want = robot_lib.RobotSource(base / "robot", whole(n), strict=True).load(ClipRef(f"episode_{e:06d}", 0))
        np.testing.assert_array_equal(got["actions"], fx.known_actions(n, e))  # float32, bit for bit
        assert [fx.decode_frame_code(f) for f in got["video"]] == list(range(n))
        # codec tolerance: H.264 (crf 12) and JPEG (q 95) of flat grey fields
        assert np.abs(got["video"].astype(int) - fx.frame_coded_video(n, W, H)).mean() < 1.0
        assert str(got["text"]) == TASKS[e]
        for k in ("joints_cam", "elbows_cam", "valid", "uv", "depth", "intrinsics"):
            np.testing.assert_allclose(got[k], want[k], atol=1e-5, err_msg=k)
        assert not got["valid"][0, 1, 5] and got["valid"][1, 1, 5]
    # the clip index resamples like every source: 31 frames at 30 fps → 16 fps → 16 samples
    src = make(ClipConfig(num_frames=5, height=H, width=W))
    assert [r.start for r in src.index() if r.episode == "episode_000001"] == [0, 5, 10]


def test_second_camera_is_the_skeleton_video(exported):
    base, _ = exported
    src = lr.LeRobotSource(base / "lerobot", whole(31), strict=True, video_key=lr.SKELETON_KEY)
    frames = src.load(ClipRef("episode_000001", 0))["video"]
    assert [fx.decode_frame_code(f) for f in frames] == [255 - i for i in range(31)]
    ds = __import__("tensorflow_datasets").builder_from_directory(str(rlds.version_dir(base / "rlds")))
    step = ds.as_data_source("train")[2]["steps"][7]
    assert fx.decode_frame_code(step["observation"]["skeleton_image"]) == 255 - 7


def test_lerobot_layout_and_stats(exported):
    base, _ = exported
    out = base / "lerobot"
    info = json.loads((out / lr.INFO_FILE).read_text())
    assert (info["codebase_version"], info["fps"], info["total_episodes"], info["total_frames"],
            info["total_tasks"]) == ("v3.0", 30, 3, sum(LENGTHS), 2)
    assert info["features"][lr.HEAD_KEY]["shape"] == [H, W, 3]
    data = pq.read_table([out / "data/chunk-000/file-000.parquet", out / "data/chunk-000/file-001.parquet"])
    np.testing.assert_array_equal(data.column("index").to_numpy(), np.arange(sum(LENGTHS)))
    np.testing.assert_allclose(data.column("timestamp").to_numpy()[:20], np.arange(20) / 30, atol=1e-6)
    assert data.schema.field("action").type.list_size == 54
    eps = pq.read_table(out / "meta/episodes/chunk-000/file-001.parquet").to_pylist()
    assert [(e["episode_index"], e["dataset_from_index"], e["dataset_to_index"]) for e in eps] == [(2, 51, 77)]
    assert eps[0][f"videos/{lr.HEAD_KEY}/from_timestamp"] == 0.0  # first episode of its own file
    first = pq.read_table(out / "meta/episodes/chunk-000/file-000.parquet").to_pylist()
    assert first[1][f"videos/{lr.HEAD_KEY}/from_timestamp"] == pytest.approx(20 / 30)
    stats = json.loads((out / lr.STATS_FILE).read_text())
    actions = np.concatenate([fx.known_actions(n, e) for e, n in enumerate(LENGTHS)]).astype(np.float64)
    np.testing.assert_allclose(stats["action"]["mean"], actions.mean(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stats["action"]["std"], actions.std(0), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(stats["action"]["q01"], np.quantile(actions, 0.01, axis=0), rtol=1e-6)
    frames = np.concatenate([fx.frame_coded_video(n, W, H) for n in LENGTHS]) / 255.0
    assert np.asarray(stats[lr.HEAD_KEY]["mean"]).shape == (3, 1, 1)
    np.testing.assert_allclose(np.ravel(stats[lr.HEAD_KEY]["mean"]), frames.mean((0, 1, 2)), atol=2e-3)
    # action_norm reads these statistics
    norm = lr.LeRobotSource(out, whole(20), strict=True, action_norm="meanstd").load(ClipRef("episode_000000", 0))
    np.testing.assert_allclose(norm["actions"], (fx.known_actions(20, 0) - actions.mean(0)) / actions.std(0),
                               rtol=1e-4, atol=1e-4)


def test_tfds_reads_our_rlds_export_without_tensorflow(exported):
    base, summary = exported
    import tensorflow_datasets as tfds

    builder = tfds.builder_from_directory(str(rlds.version_dir(base / "rlds")))
    ds = builder.as_data_source(split="train")
    assert len(ds) == 3 and builder.info.metadata["fps"] == 30.0
    for e, n in enumerate(LENGTHS):
        episode = ds[e]
        assert episode["episode_metadata"]["file_path"] == f"episode_{e:06d}".encode()
        steps = list(episode["steps"])
        assert len(steps) == n
        assert [s["is_first"] for s in steps] == [True] + [False] * (n - 1)
        assert [s["is_last"] for s in steps] == [s["is_terminal"] for s in steps] == [False] * (n - 1) + [True]
        assert [float(s["reward"]) for s in steps] == [0.0] * (n - 1) + [1.0]
        assert steps[0]["language_instruction"] == TASKS[e].encode()
        np.testing.assert_array_equal(np.stack([s["action"] for s in steps]), fx.known_actions(n, e))
        np.testing.assert_array_equal(np.stack([s["observation"]["state"] for s in steps]), fx.known_actions(n, e))
        assert fx.decode_frame_code(steps[n - 1]["observation"]["image"]) == n - 1
    assert "tensorflow" not in sys.modules
    assert summary["written"] and not rlds.export(base / "robot", base / "rlds")["written"]  # up to date


def test_lerobot_export_resumes_and_updates_only_changed_files(exported, tmp_path, monkeypatch):
    base, _ = exported
    root, out = tmp_path / "robot", tmp_path / "lerobot"
    shutil.copytree(base / "robot", root)
    cfg = lr.LeRobotExportConfig(episodes_per_file=2)
    real = ep_lib.read_episode

    def cut(r, name):  # the run dies while writing the second file
        if name == "episode_000002":
            raise KeyboardInterrupt
        return real(r, name)

    monkeypatch.setattr(ep_lib, "read_episode", cut)
    with pytest.raises(KeyboardInterrupt):
        lr.export(root, out, cfg)
    assert not (out / lr.INFO_FILE).exists()  # not a dataset yet
    assert not [p for p in out.rglob("*") if ".tmp" in p.name]
    assert (out / "data/chunk-000/file-000.parquet").exists() and not (out / "data/chunk-000/file-001.parquet").exists()
    monkeypatch.setattr(ep_lib, "read_episode", real)
    stamp = (out / "videos" / lr.HEAD_KEY / "chunk-000/file-000.mp4").stat().st_mtime_ns
    assert lr.export(root, out, cfg)["files_written"] == 1  # only the cut file
    assert lr.export(root, out, cfg)["files_written"] == 0
    write_episodes(root, lengths=(9,), tasks=("open the drawer",), first=3)  # a fourth episode joins file 1
    again = lr.export(root, out, cfg)
    assert again["files_written"] == 1 and again["episodes"] == 4
    assert (out / "videos" / lr.HEAD_KEY / "chunk-000/file-000.mp4").stat().st_mtime_ns == stamp
    src = lr.LeRobotSource(out, ClipConfig(num_frames=9, fps=fx.SRC_FPS, height=H, width=W), strict=True)
    sample = src.load(ClipRef("episode_000003", 0))
    np.testing.assert_array_equal(sample["actions"], fx.known_actions(9, 3))
    assert str(sample["text"]) == "open the drawer"
    assert json.loads((out / lr.INFO_FILE).read_text())["total_frames"] == sum(LENGTHS) + 9


# ---- bad inputs ------------------------------------------------------------------------------------


def _copy(exported, tmp_path, fmt):
    base, _ = exported
    shutil.copytree(base / fmt, tmp_path / fmt)
    return tmp_path / fmt


def _truncate(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def _first_error(make_source) -> DataError:
    """The first DataError of building the source, indexing it or loading every clip."""
    with pytest.raises(DataError) as e:
        source = make_source()
        for ref in source.index():
            source.load(ref)
    return e.value


@pytest.mark.parametrize("damage, reason, culprit", [
    (lambda d: (d / lr.INFO_FILE).unlink(), "missing file", "meta/info.json"),
    (lambda d: shutil.rmtree(d / lr.EPISODES_DIR), "missing file", "meta/episodes"),
    (lambda d: _truncate(d / "data/chunk-000/file-001.parquet"), "unreadable parquet", "data/chunk-000/file-001.parquet"),
    (lambda d: _truncate(d / "videos" / lr.HEAD_KEY / "chunk-000/file-000.mp4"), "video",
     f"videos/{lr.HEAD_KEY}/chunk-000/file-000.mp4"),
    (lambda d: pq.write_table(pq.read_table(d / "data/chunk-000/file-001.parquet").slice(0, 20),
                              d / "data/chunk-000/file-001.parquet"), "length mismatch", "data/chunk-000/file-001.parquet"),
    (lambda d: (d / lr.INFO_FILE).write_text((d / lr.INFO_FILE).read_text().replace('"v3.0"', '"v2.1"')),
     "unsupported LeRobot version", "meta/info.json"),
])
def test_lerobot_bad_inputs_name_the_file(exported, tmp_path, damage, reason, culprit):
    d = _copy(exported, tmp_path, "lerobot")
    damage(d)
    err = _first_error(lambda: lr.LeRobotSource(d, ClipConfig(num_frames=9, height=H, width=W), strict=True))
    assert reason in err.reason and culprit in err.path, str(err)
    assert "\n" not in str(err)


def test_lerobot_bad_episode_is_skipped_when_not_strict(exported, tmp_path):
    d = _copy(exported, tmp_path, "lerobot")
    _truncate(d / "data/chunk-000/file-001.parquet")
    src = lr.LeRobotSource(d, ClipConfig(num_frames=9, height=H, width=W))
    assert {r.episode for r in src.index()} == {"episode_000000", "episode_000001"}


def _damage_shard_lengths(d, extra: int) -> None:
    info = json.loads((d / "dataset_info.json").read_text())
    info["splits"][0]["shardLengths"] = [str(int(info["splits"][0]["shardLengths"][0]) + extra)]
    (d / "dataset_info.json").write_text(json.dumps(info))


@pytest.mark.parametrize("damage, reason, culprit", [
    (lambda d: _truncate(next(d.glob("*.array_record-*"))), "shard", "array_record-00000"),  # unreadable or short
    (lambda d: _damage_shard_lengths(d, 2), "truncated or mismatched shard", "array_record-00000"),
    (lambda d: next(d.glob("*.array_record-*")).unlink(), "missing file", "array_record-00000"),
    (lambda d: (d / "dataset_info.json").unlink(), "missing file", "dataset_info.json"),
    (lambda d: (d / "features.json").write_text("{"), "unreadable TFDS dataset", "dataset_info.json"),
])
def test_rlds_bad_inputs_name_the_file(exported, tmp_path, damage, reason, culprit):
    d = rlds.version_dir(_copy(exported, tmp_path, "rlds"))
    damage(d)
    err = _first_error(lambda: rlds.RldsSource(d, ClipConfig(num_frames=9, height=H, width=W), strict=True))
    assert reason in err.reason and culprit in err.path, str(err)
    assert "\n" not in str(err)


def test_export_cli_errors_are_one_line(exported, tmp_path, capsys):
    base, _ = exported
    (tmp_path / "empty").mkdir()
    cases = [
        (["--format", "lerobot", "--episodes", str(tmp_path / "nope"), "--out", str(tmp_path / "o")], 1, "--episodes"),
        (["--format", "lerobot", "--episodes", str(tmp_path / "empty"), "--out", str(tmp_path / "o")], 1,
         "no episodes"),
        (["--format", "rlds", "--episodes", str(base / "robot"), "--out", str(base / "robot" / "x")], 2,
         "inside --episodes"),
        (["--format", "lerobot", "--episodes", str(base / "robot"), "--out", str(tmp_path / "o"),
          "--episodes-per-file", "0"], 2, "--episodes-per-file"),
    ]
    if "tensorflow" not in sys.modules and __import__("importlib").util.find_spec("tensorflow") is None:
        cases.append((["--format", "rlds", "--episodes", str(base / "robot"), "--out", str(tmp_path / "o"),
                       "--rlds-file-format", "tfrecord"], 2, "needs TensorFlow"))
    for argv, code, words in cases:
        assert errors.run(export_cli.main, argv) == code, argv
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: ") and words in err and "\n" not in err, err
    assert not (tmp_path / "o").exists()


def test_generate_format_exports_the_finished_episodes(tmp_path, monkeypatch):
    from rynn_jax.teleop import generate as gen

    def fake_generate(streams, out, **kw):  # stands in for the world model: episodes, then the summary
        write_episodes(out, lengths=(7, 8), tasks=TASKS[:2])
        return {"failed": {}, "episodes_in_out": 2}

    monkeypatch.setattr(gen, "generate", fake_generate)
    assert gen.main(["--streams", str(tmp_path), "--out", str(tmp_path / "g"), "--format", "lerobot"]) == 0
    src = lr.LeRobotSource(tmp_path / "g" / "lerobot", ClipConfig(num_frames=8, fps=fx.SRC_FPS, height=H, width=W))
    np.testing.assert_array_equal(src.load(ClipRef("episode_000001", 0))["actions"], fx.known_actions(8, 1))
    assert (tmp_path / "g" / "episodes" / "episode_000001" / robot_lib.METADATA_FILE).exists()
    from rynn_jax.data import preencode  # the pre-encoder takes the export as a source

    assert len(preencode.make_source("lerobot", str(tmp_path / "g" / "lerobot"),
                                     ClipConfig(num_frames=3, height=H, width=W), True).index()) == 2
