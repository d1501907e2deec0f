"""serve.py generate: many operator streams → robot episodes that the training reader takes as is.

Oracles: the IK actions and hand skeleton are recomputed independently from each stream
(`retarget_stream`, `hands_in_camera`) and must be what the episode stores and what
`RobotSource` loads back; bad streams are reported and skipped; a re-run resumes."""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pyarrow.parquet as pq
import pytest
from safetensors.numpy import save_file

from rynn_jax.data import robot as robot_data
from rynn_jax.data.clips import ClipConfig, ClipRef
from rynn_jax.errors import UsageError
from rynn_jax.kinematics import streams
from rynn_jax.kinematics.retarget import retarget_stream
from rynn_jax.render.preview import save_png
from rynn_jax.serving.assemble import streaming_session
from rynn_jax.serving.clip import rollout
from rynn_jax.teleop import generate as gen
from rynn_jax.teleop.camera_hands import hands_in_camera, synthetic_stream
from rynn_jax.teleop.demo import reference_scene
from rynn_jax.teleop.inputs import IMAGE_FILE, STREAM_FILE

H, W, FRAMES = 96, 160, 13  # the tiny student: a 5-frame first block, then 8-frame blocks → 13


@pytest.fixture(scope="module")
def generated(tmp_path_factory):
    root = tmp_path_factory.mktemp("streams")
    for i, name in enumerate(["a", "b", "task2/c"]):
        d = root / name
        d.mkdir(parents=True)
        streams.write(d / STREAM_FILE, synthetic_stream(33, seed=i))
        save_png(d / IMAGE_FILE, reference_scene(480, 832, seed=i))  # resized + cropped to 96×160
    (root / "bad").mkdir()
    (root / "bad" / STREAM_FILE).write_bytes(b"not a stream")
    (root / "short").mkdir()
    streams.write(root / "short" / STREAM_FILE, synthetic_stream(5))
    save_png(root / "short" / IMAGE_FILE, reference_scene(96, 160))
    out = tmp_path_factory.mktemp("episodes")
    session = streaming_session(None, None, 0)  # what generate builds by default; the re-run test reuses it compiled
    summary = gen.generate(root, out, batch=2, num_frames=FRAMES, seed=0, height=H, width=W, session=session)
    return root, out, summary, session


def test_bad_streams_are_reported_and_the_rest_written(generated):
    root, out, summary, _ = generated
    assert summary["written"] == {"a": FRAMES, "b": FRAMES, "task2/c": FRAMES}
    assert set(summary["failed"]) == {"bad", "short"}
    assert f"bad/{STREAM_FILE}: not a readable" in summary["failed"]["bad"]  # names the file
    assert "too short" in summary["failed"]["short"]
    assert json.loads((out / gen.FAILURES_FILE).read_text()) == summary["failed"]
    assert not list(out.rglob("*.tmp"))


@pytest.mark.parametrize("name", ["a", "task2/c"])  # c ran alone in a padded batch
def test_episode_matches_the_stream_and_loads_as_a_robot_source(generated, name):
    root, out, *_ = generated
    stream = streams.read(root / name / STREAM_FILE)
    want_actions = retarget_stream(stream, hz=streams.VIDEO_FPS)["actions"][:FRAMES]
    t = stream.span[0] + np.arange(FRAMES) / streams.VIDEO_FPS
    want_joints = hands_in_camera(stream, t)[0]

    table = pq.read_table(out / name / robot_data.TIMESERIES_FILE).to_pydict()
    actions = np.asarray(table[robot_data.ACTION_COLUMN], np.float32)
    state = np.asarray(table[robot_data.STATE_COLUMN], np.float32)
    np.testing.assert_allclose(actions, want_actions, atol=1e-6)
    np.testing.assert_array_equal(state[1:], actions[:-1])  # state = the command before
    with np.load(out / name / robot_data.SKELETON_FILE) as z:
        np.testing.assert_allclose(z["joints_cam"], want_joints, atol=1e-6, equal_nan=True)

    source = robot_data.RobotSource(out, ClipConfig(num_frames=FRAMES, height=H, width=W), strict=True,
                                    action_norm="meanstd")
    assert source.episodes() == ["a", "b", "task2/c"]
    sample = source.load(ClipRef(name, 0))
    assert sample["video"].shape == (FRAMES, H, W, 3)
    assert sample["video"].std() > 10  # decoded 8-bit pictures (std ≈ 29 here), not a blank or flat frame
    stats = json.loads((out / robot_data.STATS_FILE).read_text())
    norm = (want_actions - np.asarray(stats["mean"])) / np.maximum(np.asarray(stats["std"]), 1e-6)
    np.testing.assert_allclose(sample["actions"], norm, atol=1e-4)


def test_rerun_skips_finished_episodes_and_redoes_missing_ones(generated, tmp_path):
    root, out, _, session = generated
    stamp = (out / "a" / robot_data.METADATA_FILE).stat().st_mtime_ns
    again = gen.generate(root, out, batch=2, num_frames=FRAMES, seed=0, height=H, width=W)
    assert again["skipped_done"] == 3 and again["written"] == {} and set(again["failed"]) == {"bad", "short"}
    assert (out / "a" / robot_data.METADATA_FILE).stat().st_mtime_ns == stamp
    # An episode cut mid-write leaves only its .tmp: the next run redoes it and nothing else.
    source = lambda: robot_data.RobotSource(out, ClipConfig(num_frames=FRAMES, height=H, width=W))  # noqa: E731
    first_b = source().load(ClipRef("b", 0))["video"]
    (out / "b").rename(out / "b.tmp")
    third = gen.generate(root, out, batch=2, num_frames=FRAMES, seed=0, height=H, width=W, pipeline=False,
                         session=session)
    assert third["written"] == {"b": FRAMES} and third["skipped_done"] == 2
    assert not (out / "b.tmp").exists() and (out / "b" / robot_data.METADATA_FILE).is_file()
    # The redo drew the same noise: b ran second beside a at first (threads preparing and writing),
    # now first beside its padding copy (one step after the other).
    np.testing.assert_array_equal(source().load(ClipRef("b", 0))["video"], first_b)


def test_an_output_inside_the_input_is_not_read_back_as_input(generated):
    root, out, *_ = generated
    inside = root / "generated"
    inside.mkdir()
    for name in ("a", "b"):  # finished episodes carry a copy of their operator stream
        (inside / name).mkdir()
        (inside / name / STREAM_FILE).write_bytes((out / name / STREAM_FILE).read_bytes())
    assert len(gen.find_streams(inside)) == 2  # they look like inputs
    with pytest.raises(FileNotFoundError):  # --streams = --out: nothing of its own to read
        gen.generate(inside, inside)


def test_cli_refuses_a_bad_batch_and_a_missing_root(tmp_path):
    with pytest.raises(UsageError, match="--batch 0"):
        gen.main(["--streams", str(tmp_path), "--out", str(tmp_path / "o"), "--batch", "0"])
    with pytest.raises(FileNotFoundError, match="no operator_stream.npz"):
        gen.generate(tmp_path, tmp_path / "o")


def _two_streams(root, prompts):
    for i, (name, prompt) in enumerate(prompts.items()):
        stream = synthetic_stream(17, seed=i)
        stream.meta["task_description"] = prompt
        (root / name).mkdir(parents=True)
        streams.write(root / name / STREAM_FILE, stream)
        save_png(root / name / IMAGE_FILE, reference_scene(96, 160, seed=i))


def test_a_failed_write_on_the_writer_thread_raises_and_loses_nothing(tmp_path, monkeypatch):
    root, out = tmp_path / "streams", tmp_path / "out"
    _two_streams(root, {"p": "", "q": ""})
    real = gen.write_episode

    def full_disk(ep, video, directory, meta):
        if ep.name == "q":
            with gen.atomic_dir(directory) as tmp:
                (tmp / "partial").write_bytes(b"x")
                raise OSError(28, "No space left on device")
        return real(ep, video, directory, meta)

    monkeypatch.setattr(gen, "write_episode", full_disk)
    session = streaming_session(None, None, 0)  # one session (compiled once) for both runs
    with pytest.raises(OSError, match="No space left"):
        gen.generate(root, out, batch=1, num_frames=7, height=H, width=W, session=session)
    assert gen._done(out / "p") and not gen._done(out / "q")  # p whole, q not taken for finished
    monkeypatch.setattr(gen, "write_episode", real)
    # 7 frames: a 5-frame block and an 8-frame one whose last 6 frames are dropped (exactly --frames)
    again = gen.generate(root, out, batch=1, num_frames=7, height=H, width=W, session=session)
    assert again["written"] == {"q": 7} and again["skipped_done"] == 1
    source = robot_data.RobotSource(out, ClipConfig(num_frames=7, height=H, width=W))
    assert source.load(ClipRef("q", 0))["video"].shape == (7, H, W, 3)
    assert len(pq.read_table(out / "q" / robot_data.TIMESERIES_FILE)) == 7
    assert set(again["waited_seconds"]) == {"prepare", "world_model", "write"} and again["pipeline"]


def test_each_stream_gets_its_prompts_text_context(tmp_path, monkeypatch):
    root = tmp_path / "streams"
    prompts = {"p": "pick up the red block", "q": "open the lid"}
    _two_streams(root, prompts)
    emb_dir = tmp_path / "emb"
    emb_dir.mkdir()
    emb = np.random.default_rng(0).normal(size=(3, 24)).astype(np.float32)  # the tiny DiT: text_dim 24, len 16
    save_file({"context": emb}, str(emb_dir / (hashlib.sha256(prompts["p"].encode()).hexdigest() + ".safetensors")))
    seen = []
    real = rollout
    monkeypatch.setattr(gen, "rollout", lambda s, img, skel, ctx, key: (seen.append(np.asarray(ctx)),
                                                                       real(s, img, skel, ctx, key))[1])
    out = tmp_path / "out"
    summary = gen.generate(root, out, batch=1, num_frames=5, height=H, width=W, text_embeddings=str(emb_dir))
    assert list(summary["written"]) == ["p"]
    assert "no text embedding" in summary["failed"]["q"]  # q's prompt has no file: reported, not zeros
    (ctx,) = seen
    assert ctx.shape == (1, 16, 24)
    np.testing.assert_array_equal(ctx[0, :3], emb)
    assert not ctx[0, 3:].any()
    assert json.loads((out / "p" / robot_data.METADATA_FILE).read_text())["task_description"] == prompts["p"]
