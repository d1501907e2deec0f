"""`eval.py --model world4d` end to end on a tiny random 4D model and one sim episode (the bundled
test episode with a smooth depth and flow field added; evaluated at a smaller size, so the
fields go through the evaluation's crop): every variant scored on RGB, depth (AbsRel, δ1 after
median scaling), flow (EPE in pixels), the depth/flow videos (PSNR; the flow video's colour-space
AEPE, the paper's), against float64 closed forms of the saved predictions; bad inputs."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from rynn_jax import errors
from rynn_jax.eval import episodes
from tests.test_eval import _assert_picture

H, W, T = 64, 96, 9


EPISODE = "tests/data/synthetic_heldout/lid_placement/episode_000000"  # 113 frames, 128×224


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory):
    root = tmp_path_factory.mktemp("sim")
    shutil.copytree(EPISODE, root / "lid_placement/episode_000000")
    n, h, w = 113, 128, 224
    t, y, x = np.meshgrid(np.arange(n), np.linspace(0, 1, h), np.linspace(0, 1, w), indexing="ij")
    depth_mm = (1000 * (0.6 + 1.5 * y + 0.3 * x + 0.01 * t)).astype(np.uint16)  # a tilted plane, receding
    depth_mm[:, :8] = 0  # "nothing hit": left out of the depth scores
    angle = 0.02 * t[:-1]
    flow = np.stack([3 + 4 * np.cos(angle) * (y[:-1] - 0.5), -2 + 6 * np.sin(angle) * x[:-1]], -1)
    np.savez_compressed(root / "lid_placement/episode_000000/depth.npz", depth_mm=depth_mm)
    np.savez_compressed(root / "lid_placement/episode_000000/flow.npz", flow=flow.astype(np.float16))
    return root


def _run(argv):
    import eval as eval_cli

    return eval_cli.main(argv)


def _absrel_delta1(pred: np.ndarray, true: np.ndarray) -> tuple[float, float]:
    """Mean over frames 1.. of the per-frame AbsRel and δ1 after median scaling (float64)."""
    absrel, delta1 = [], []
    for p, t in zip(pred[1:].astype(np.float64), true[1:].astype(np.float64)):
        v = t > 0
        s = np.median(t[v]) / np.median(p[v])
        absrel.append(np.mean(np.abs(s * p[v] - t[v]) / t[v]))
        delta1.append(np.mean(np.maximum(s * p[v] / t[v], t[v] / (s * p[v])) < 1.25))
    return float(np.mean(absrel)), float(np.mean(delta1))


def test_eval_world4d_scores_rgb_depth_and_flow(sim_root, tmp_path, fast_compile):
    out = tmp_path / "w4d"
    s = _run(["--model", "world4d", "--episodes", str(sim_root), "--out", str(out), "--frames", str(T),
              "--steps", "1", "--no-fvd", "--resolution", f"{H}x{W}"])
    assert set(s["variants"]) == {"model", "autoencoder", "copy_first_frame", "shifted"}
    for v in s["variants"].values():
        assert set(v) >= {"psnr", "ssim", "lpips", "depth_absrel", "depth_delta1", "flow_epe", "depth_video_psnr",
                          "flow_video_psnr", "flow_video_aepe"}
    (name,) = episodes.list_episodes(sim_root)
    rec = json.loads((out / "episodes" / f"{name.replace('/', '__')}.json").read_text())
    truth = episodes.load_truth(sim_root, name, T, H, W)
    gen = episodes.load_generated(out / "generated", name, T)  # what the model made, from the saved files
    assert gen.depth.shape == (T, H, W) and gen.flow.shape == (T - 1, H, W, 2)
    model = rec["variants"]["model"]["video"]
    absrel, delta1 = _absrel_delta1(gen.depth, truth.depth)  # saved in mm: 0.5 mm rounding
    assert model["depth_absrel"] == pytest.approx(absrel, rel=2e-3, abs=1e-3)
    assert model["depth_delta1"] == pytest.approx(delta1, abs=2e-2)
    epe = np.linalg.norm(gen.flow.astype(np.float64) - truth.flow, axis=-1).mean()
    assert model["flow_epe"] == pytest.approx(epe, rel=1e-3)
    # copy-first-frame: zero flow, so its EPE is the truth's mean flow length; frame 0's depth held
    cff = rec["variants"]["copy_first_frame"]["video"]
    assert cff["flow_epe"] == pytest.approx(np.linalg.norm(truth.flow.astype(np.float64), axis=-1).mean(), rel=1e-5)
    assert cff["depth_absrel"] == pytest.approx(_absrel_delta1(np.repeat(truth.depth[:1], T, 0), truth.depth)[0],
                                                rel=1e-4)
    assert np.isfinite([s["variants"]["autoencoder"][m]["mean"] for m in ("depth_absrel", "flow_epe")]).all()
    # colour-space AEPE of copy-first-frame: its flow video is white (zero flow), the truth's the
    # colour wheel of the true flow; float64 distance in [0, 1] RGB, frames 1..
    true_fv = episodes.with_encodings(truth).flow_video.astype(np.float64) / 255.0
    want = np.sqrt(np.square(1.0 - true_fv[1:]).sum(-1)).mean()
    assert want > 1e-3 and cff["flow_video_aepe"] == pytest.approx(want, rel=1e-5)
    assert 0 < model["flow_video_aepe"] < np.sqrt(3)
    report = (out / "report.md").read_text()
    assert "depth_video_psnr" in report and "flow_video_aepe" in report
    assert s["geometry_over_time"] and "![depth and flow per frame](geometry_over_time.png)" in report
    _assert_picture(out / "geometry_over_time.png")
    # the saved generation scores the same as --model generated (the sim's depth/flow files)
    again = _run(["--model", "generated", "--generated", str(out / "generated"), "--episodes", str(sim_root),
                  "--out", str(tmp_path / "gen"), "--frames", str(T), "--no-fvd", "--resolution", f"{H}x{W}"])
    assert again["variants"]["model"]["flow_epe"]["mean"] == pytest.approx(model["flow_epe"], rel=1e-3)  # float16 file
    assert again["variants"]["model"]["depth_absrel"]["mean"] == pytest.approx(model["depth_absrel"], rel=2e-3)


def test_eval_autoencoder_scores_the_round_trip_alone(sim_root, tmp_path, fast_compile):
    """`--model autoencoder`: no generator, its "model" is the VAE round trip of the RGB, depth and
    flow videos: the scores of a 4D model's "autoencoder" variant with the same VAE, and the saved
    depth / flow score as their float64 closed forms. An episode without depth and flow: RGB only."""
    args = ["--episodes", str(sim_root), "--frames", "5", "--no-fvd", "--resolution", f"{H}x{W}"]
    s = _run(["--model", "autoencoder", "--out", str(tmp_path / "ae"), *args])
    assert set(s["variants"]) == {"model", "copy_first_frame", "shifted"}
    w = _run(["--model", "world4d", "--steps", "1", "--out", str(tmp_path / "w4d"), *args])  # the same tiny VAE
    for m in ("psnr", "ssim", "robot_psnr", "depth_absrel", "flow_epe", "depth_video_psnr", "flow_video_psnr"):
        assert s["variants"]["model"][m]["mean"] == pytest.approx(w["variants"]["autoencoder"][m]["mean"], rel=1e-6)
    (name,) = episodes.list_episodes(sim_root)
    truth = episodes.load_truth(sim_root, name, 5, H, W)
    gen = episodes.load_generated(tmp_path / "ae" / "generated", name, 5)
    assert s["variants"]["model"]["depth_absrel"]["mean"] == pytest.approx(_absrel_delta1(gen.depth, truth.depth)[0],
                                                                           rel=2e-3, abs=1e-3)
    epe = np.linalg.norm(gen.flow.astype(np.float64) - truth.flow, axis=-1).mean()
    assert s["variants"]["model"]["flow_epe"]["mean"] == pytest.approx(epe, rel=1e-3)
    assert "round trip" in (tmp_path / "ae" / "report.md").read_text()
    rgb = _run(["--model", "autoencoder", "--episodes", "tests/data/synthetic_heldout", "--max-episodes", "1",
                "--frames", "5", "--no-fvd", "--resolution", f"{H}x{W}", "--out", str(tmp_path / "rgb")])
    assert np.isfinite(rgb["variants"]["model"]["psnr"]["mean"]) and "depth_absrel" not in rgb["variants"]["model"]


def test_eval_world4d_bad_inputs(tmp_path):
    with pytest.raises(errors.UsageError, match="round trip alone: no --dit, no --swap"):
        _run(["--model", "autoencoder", "--episodes", "tests/data/synthetic_heldout", "--out", str(tmp_path / "c"),
              "--swap"])
    with pytest.raises(errors.UsageError, match="no control branch"):
        _run(["--model", "world4d", "--episodes", "tests/data/synthetic_heldout", "--out", str(tmp_path / "a"),
              "--swap"])
    with pytest.raises(FileNotFoundError, match="1 of 1 episodes have no depth.npz"):  # copies without depth
        _run(["--model", "world4d", "--episodes", "tests/data/synthetic_heldout", "--out", str(tmp_path / "b"),
              "--frames", "5", "--steps", "1", "--no-fvd", "--max-episodes", "1"])


def test_eval_world4d_control_variant_swaps_the_skeleton(sim_root, tmp_path, fast_compile):
    """A 4D model with a control branch (the synthetic recipe's `control` variant, exported as a
    training run exports it) reads each episode's skeleton: `--swap` runs it with the next
    episode's, and that changes all three generated modalities."""
    import jax
    from flax import nnx

    from rynn_jax import converted_weights
    from rynn_jax.models.dit import WanDiTConfig
    from rynn_jax.models.dit4d import WanDiT4DConfig, init_dit4d
    from rynn_jax.models.vae import WanVAEConfig, init_vae
    from rynn_jax.training.export_weights import write_dit_dir

    root = tmp_path / "two"
    shutil.copytree(sim_root / "lid_placement/episode_000000", root / "lid_placement/episode_000000")
    second = root / "lid_placement/episode_000001"
    shutil.copytree(sim_root / "lid_placement/episode_000000", second)
    hands = dict(np.load(second / "hand_skeleton.npz"))  # the same scene, another operator: the hands' path reversed
    np.savez(second / "hand_skeleton.npz", **{k: v[::-1] if k != "intrinsics" else v for k, v in hands.items()})
    z = WanVAEConfig.tiny().z_dim
    base = WanDiTConfig.tiny(num_layers=3, eps=1e-5, in_channels=z, out_channels=z, control="add", control_channels=z,
                             control_gate_init=1.0)
    model = init_dit4d(WanDiT4DConfig.tiny(base=base), 0)
    _, params, stats = nnx.split(model, nnx.Param, ...)
    rng = np.random.default_rng(0)  # every weight off its init (zero output heads would hide the control)
    pure = jax.tree.map(lambda a: a + 0.2 * rng.standard_normal(a.shape).astype(np.float32), nnx.to_pure_dict(params))
    write_dit_dir(str(tmp_path / "dit"), pure, model.cfg, stats)
    vae = init_vae(WanVAEConfig.tiny(), 0)
    converted_weights.save_params(tmp_path / "vae", nnx.to_pure_dict(nnx.state(vae, nnx.Param)), vae.cfg)
    out = tmp_path / "swap"
    s = _run(["--model", "world4d", "--dit", str(tmp_path / "dit"), "--vae", str(tmp_path / "vae"), "--episodes",
              str(root), "--out", str(out), "--frames", "5", "--steps", "1", "--no-fvd", "--resolution", f"{H}x{W}",
              "--swap"])
    assert {"model", "model_swapped"} <= set(s["variants"])
    own = episodes.load_generated(out / "generated", "lid_placement/episode_000000", 5)
    swapped = episodes.load_generated(out / "generated_swapped", "lid_placement/episode_000000", 5)
    for a, b in ((own.frames, swapped.frames), (own.depth, swapped.depth), (own.flow, swapped.flow)):
        assert np.abs(a[1:].astype(np.float64) - b[1:]).max() > 0  # frame 0 is the given condition
    np.testing.assert_array_equal(own.frames[0], swapped.frames[0])
    rec = json.loads((out / "episodes" / "lid_placement__episode_000000.json").read_text())
    assert rec["strip_rows"][:3] == ["skeleton", "generated", "swapped skeleton"] and len(rec["strip_rows"]) == 8
