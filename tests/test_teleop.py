"""Digital-teleop glue: stream → camera-frame skeleton, world-model clip generation, the demo."""

from __future__ import annotations

import json
import os

import imageio.v3 as iio
import jax
import numpy as np
import pytest

from rynn_jax.errors import UsageError
from rynn_jax.kinematics import streams
from rynn_jax.models.dit import WanDiTConfig, init_dit
from rynn_jax.models.vae import WanVAEConfig, init_vae
from rynn_jax.render import synthetic_hand_motion
from rynn_jax.render.preview import save_png
from rynn_jax.serving.assemble import build_modules
from rynn_jax.serving.bidirectional import SamplingConfig, WorldModel
from rynn_jax.teleop import demo
from rynn_jax.teleop.camera_hands import hands_in_camera, synthetic_stream
from rynn_jax.teleop.inputs import IMAGE_FILE, STREAM_FILE

# Compiling-bound tests (tiny models): XLA's cheapest compile (tests/conftest.py).
pytestmark = pytest.mark.usefixtures("fast_compile")


def test_stream_round_trip_to_camera_frame():
    stream = synthetic_stream(9, seed=0)
    joints, elbows, valid = hands_in_camera(stream, np.arange(9) / 16.0)
    want_joints, want_elbows = synthetic_hand_motion(9, seed=0, fps=16)
    assert valid.all()
    # trackers run at 120 Hz and are interpolated back onto the 16 fps clock: sub-millimetre.
    assert np.abs(joints - want_joints).max() < 5e-4
    assert np.abs(elbows - want_elbows).max() < 5e-4


def test_lost_tracker_frames_are_invalid_not_garbage():
    stream = synthetic_stream(9, seed=0)
    lost = stream.tracker_valid.copy()
    lost[(stream.tracker_t > 0.2) & (stream.tracker_t < 0.45), 2] = False  # left wrist lost ~0.25 s
    stream = streams.Stream(stream.tracker_t, stream.tracker_pose, lost, stream.hand_t,
                            stream.hand_keypoints, stream.hand_valid, stream.meta)
    _, _, valid = hands_in_camera(stream, np.arange(9) / 16.0)
    assert not valid[5, 0, :21].any() and valid[5, 1].all()  # t=0.3125: left hand held, flagged
    with pytest.raises(ValueError, match="T_world_camera"):
        hands_in_camera(streams.Stream(stream.tracker_t, stream.tracker_pose, lost, stream.hand_t,
                                       stream.hand_keypoints, stream.hand_valid, {}), np.arange(3) / 16.0)


@pytest.fixture(scope="module")
def world_model():
    vae_cfg = WanVAEConfig.tiny()
    dit_cfg = WanDiTConfig.tiny(control="add-plus", in_channels=4, out_channels=4, control_channels=4)
    return WorldModel(init_dit(dit_cfg, 0), init_vae(vae_cfg, 0))


def test_generate_is_deterministic_and_shaped(world_model):
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 255, (32, 64, 3), dtype=np.uint8)
    skel = rng.integers(0, 255, (5, 32, 64, 3), dtype=np.uint8)
    ctx = np.zeros((16, 24), np.float32)
    sampling = SamplingConfig(num_steps=2)
    a = world_model.generate(jax.random.key(0), ref, skel, ctx, sampling)
    b = world_model.generate(jax.random.key(0), ref, skel, ctx, sampling)
    c = world_model.generate(jax.random.key(1), ref, skel, ctx, sampling)
    assert a.shape == (5, 32, 64, 3) and a.dtype == np.uint8
    np.testing.assert_array_equal(a, b)
    assert np.abs(a[1:].astype(int) - c[1:].astype(int)).max() > 0
    with pytest.raises(ValueError, match="differ in size"):
        world_model.generate(jax.random.key(0), ref[:16], skel, ctx, sampling)


def test_fp8_world_model_close_to_float_and_compiled_with_fp8_options(monkeypatch):
    """`serve.py demo --fp8`: the quantized DiT generates frames close to the float model's, and its
    sampler is the program compiled with the FP8 XLA options (forced here: on CPU they are off): the
    float model runs `_sample`, the FP8 model `_sample_fp8`, compiled for it (JAX's public compile
    events)."""
    from rynn_jax.models import fp8
    from rynn_jax.serving import bidirectional

    dit8, vae = build_modules(None, None, 0, fp8=True)
    assert dit8.cfg.fp8
    monkeypatch.setattr(fp8, "compiler_options", lambda cfg: fp8.FP8_COMPILER_OPTIONS if cfg.fp8 else None)
    assert bidirectional._sample_fp8 is not bidirectional._sample
    ran: list[str] = []
    for name in ("_sample", "_sample_fp8"):
        program = getattr(bidirectional, name)
        monkeypatch.setattr(bidirectional, name, lambda *a, _p=program, _n=name: (ran.append(_n), _p(*a))[1])
    compiled: list[str] = []

    def listener(event: str, duration: float, fun_name: str = "?", **_) -> None:
        if event == "/jax/core/compile/backend_compile_duration":
            compiled.append(fun_name)

    rng = np.random.default_rng(0)
    ref = rng.integers(0, 255, (32, 64, 3), dtype=np.uint8)
    skel = rng.integers(0, 255, (5, 32, 64, 3), dtype=np.uint8)
    ctx = np.zeros((16, 24), np.float32)
    sampling = SamplingConfig(num_steps=2)
    dit_f, _ = build_modules(None, None, 0)
    frames = [WorldModel(dit_f, vae).generate(jax.random.key(0), ref, skel, ctx, sampling)]
    assert ran == ["_sample"]
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        frames.append(WorldModel(dit8, vae).generate(jax.random.key(0), ref, skel, ctx, sampling))
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert ran == ["_sample", "_sample_fp8"]  # the FP8 model ran the FP8-options program...
    assert compiled == ["jit(_sample_impl)"], compiled  # ...compiled for it (encode/decode: already)
    diff = np.abs(frames[0].astype(int) - frames[1].astype(int))
    assert frames[1].shape == (5, 32, 64, 3) and 0 < diff.max() and diff.mean() < 1.0, (diff.mean(), diff.max())


def test_world_model_rejects_uncontrolled_dit():
    with pytest.raises(ValueError, match="control branch"):
        WorldModel(init_dit(WanDiTConfig.tiny(in_channels=4, out_channels=4)), init_vae(WanVAEConfig.tiny()))


def test_demo_end_to_end_small(tmp_path):
    sample = tmp_path / "sample"
    sample.mkdir()
    streams.write(sample / STREAM_FILE, synthetic_stream(9))
    save_png(sample / IMAGE_FILE, demo.reference_scene(32, 64))
    summary = demo.run(tmp_path / "out", num_frames=5, steps=2, sample_dir=sample)
    episode = np.load(tmp_path / "out" / "episode.npz")
    assert episode["frames"].shape == (5, 32, 64, 3)
    assert episode["actions"].shape == (5, 54) and np.isfinite(episode["actions"]).all()
    assert len(episode["t"]) == len(episode["frames"])  # one action per generated frame
    assert list(episode["action_names"][:1]) == ["left_arm_joint1"] and len(episode["action_names"]) == 54
    assert summary["ik_pos_err_mm_median"] < 1.0
    assert summary["hand_tip_err_mm_median"] < 10.0  # wrist frames follow the retargeter's palm axes
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["frames"] == 5
    for name in ("skeleton.mp4", "generated.mp4", "side_by_side.mp4"):  # 5 frames of 32 rows each
        assert iio.imread(tmp_path / "out" / name, plugin="pyav").shape[:2] == (5, 32), name
    with pytest.raises(ValueError, match="1 \\+ 4k"):
        demo.run(tmp_path / "bad", num_frames=6, sample_dir=sample)
    with pytest.raises(ValueError, match="too short"):
        demo.run(tmp_path / "bad", num_frames=81, sample_dir=sample)


@pytest.mark.parametrize("bundled", ["student", "teacher"])
def test_demo_sim_world_end_to_end(bundled, tmp_path, capsys, monkeypatch):
    """`python serve.py demo --world sim` (demo v0) with its defaults' weights at their 128×224 on a
    short held-out episode: the bundled student streamed block by block, and (a checkout whose
    weights hold no student) the bundled teacher sampling the clip at once. All outputs written and
    consistent, and the generated frames closer to the truth than a copy of the first frame
    (scikit-image's PSNR of the written frames; held-out margins: docs/FIDELITY.md)."""

    from skimage.metrics import peak_signal_noise_ratio

    from rynn_jax.kinematics import layout, mjcf_model
    from rynn_jax.serving import student as student_lib

    root = student_lib.BUNDLED_ROOT  # the committed weights
    if bundled == "teacher":  # the same weights without the student
        root = tmp_path / "weights"
        root.mkdir()
        for part in ("teacher", "autoencoder"):
            (root / part).symlink_to(student_lib.BUNDLED_ROOT / part, target_is_directory=True)
    monkeypatch.setenv(student_lib.WEIGHTS_ENV, str(root))
    out = tmp_path / "demo_sim"
    demo.main(["--world", "sim", "--out", str(out), "--task", "dual_pick", "--frames", "33",
               "--episode-frames", "49", "--steps", "4"])
    printed = capsys.readouterr()
    assert f"outputs in {os.path.abspath(out)}:" in printed.out and "side_by_side.mp4" in printed.out
    assert ("no bundled student yet: the bundled teacher" in printed.err) == (bundled == "teacher")
    summary = json.loads((out / "summary.json").read_text())
    n, h, w = 33, 128, 224
    assert summary["world"] == "sim" and summary["task"] == "dual_pick" and summary["seed"] == 1_000_000
    assert summary["frames"] == n and summary["resolution"] == [h, w] and summary["actions_shape"] == [n, 54]
    assert summary["weights"] == f"bundled {bundled}"
    if bundled == "teacher":
        assert summary["sampling"]["teacher"]["num_steps"] == 4
    else:  # streamed as served: the spec it was distilled for
        assert summary["sampling"]["student"]["steps"]["num_steps"] == 4
    assert summary["episode_success"] is (summary["episode_failures"] == [])
    ep = np.load(out / "episode.npz")
    for name in ("frames", "ground_truth", "skeleton"):
        assert ep[name].shape == (n, h, w, 3) and ep[name].dtype == np.uint8, name
    assert ep["actions"].shape == ep["states"].shape == (n, 54)
    assert np.isfinite(ep["actions"]).all() and np.isfinite(ep["states"]).all()
    emb = mjcf_model.embodiment()
    assert np.all((ep["actions"] >= emb.tree.lower_q - 1e-6) & (ep["actions"] <= emb.tree.upper_q + 1e-6))
    np.testing.assert_allclose(ep["t"], np.arange(n) / 16.0)
    assert tuple(ep["action_names"]) == layout.ACTION_NAMES
    assert ep["ground_truth"].reshape(n, -1).std(axis=1).min() > 5.0    # a rendered scene, every frame
    assert (ep["skeleton"] > 0).any(axis=(1, 2, 3)).mean() > 0.5        # hands drawn in most frames
    # The videos hold those frames: generated | ground truth | skeleton, side by side.
    videos = {name: iio.imread(out / f"{name}.mp4") for name in ("generated", "ground_truth", "skeleton", "side_by_side")}
    for name, v in videos.items():
        assert v.shape == ((n, h, 3 * w, 3) if name == "side_by_side" else (n, h, w, 3)), name
    middle = videos["side_by_side"][:, :, w:2 * w].astype(float)
    assert np.abs(middle - ep["ground_truth"]).mean() < 0.5 * np.abs(middle - ep["frames"]).mean()
    truth = ep["ground_truth"]
    psnr = lambda pred: np.mean([peak_signal_noise_ratio(truth[i], pred[i], data_range=255)  # noqa: E731
                                 for i in range(1, n)])
    model, copy = psnr(ep["frames"]), psnr(np.repeat(truth[:1], n, 0))
    assert summary["psnr_vs_truth_db"] == pytest.approx(model, abs=2e-3)
    assert model > copy + 1.0, f"generated {model:.2f} dB vs copy-first-frame {copy:.2f} dB"
    with pytest.raises(ValueError, match="multiples of 32"):
        demo.run_sim(tmp_path / "bad", height=48, width=64)


def test_demo_rejects_a_malformed_resolution():
    with pytest.raises(UsageError, match="expected HxW such as 96x160, got '32by64'"):
        demo.main(["--world", "sim", "--resolution", "32by64"])
