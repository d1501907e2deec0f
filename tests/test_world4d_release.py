"""Readers of the released RynnWorld-4D sample layout (`data/world4d_release.py`) on tiny files
written here in that layout. Oracles: the arrays written (latents, transposed to channels-last) and
the depth (metres) and flow (pixels) encoded into the videos; H.264 costs a few grey levels, hence
the tolerances (depth: 3 grey levels = 6 cm, flow: 0.6 px of a 32 px radius; measured 3.9 cm, 0.42 px)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from rynn_jax.data import world4d_release as rel
from rynn_jax.data.errors import DataError
from rynn_jax.data.geometry_video import FLOW_MAX_PX, depth_to_rgb, flow_to_rgb
from rynn_jax.data.video import write_video

T, H, W = 6, 16, 24
C, TL, HL, WL, S, D = 8, 2, 2, 3, 226, 16


def _latent_files(tmp_path, prompt_len=5):
    rng = np.random.default_rng(0)
    lat = {k: rng.standard_normal((C, TL, HL, WL)).astype(np.float32) for k in ("video", "depth", "flow")}
    text = np.zeros((1, S, D), np.float32)
    text[0, :prompt_len] = rng.standard_normal((prompt_len, D))
    (tmp_path / "data" / "sample_latents").mkdir(parents=True)
    save_file({"video_latents": lat["video"], "text_embeds": text}, tmp_path / "data/sample_latents/a_rgb.safetensors")
    save_file({"flow_latents": lat["flow"], "depth_latents": lat["depth"]},
              tmp_path / "data/sample_latents/a_flow_depth.safetensors")
    manifest = [{"rgb_latents": "data/sample_latents/a_rgb.safetensors", "prompt": "pick up the apple",
                 "flow_depth_latents": "data/sample_latents/a_flow_depth.safetensors"},
                {"rgb_latents": "data/sample_latents/a_rgb.safetensors", "prompt": "rgb only"}]
    (tmp_path / "data" / "sample.json").write_text(json.dumps(manifest))
    return lat, text


def test_manifest_and_latents_read_into_the_pre_encoded_record_layout(tmp_path):
    lat, text = _latent_files(tmp_path)
    entries = rel.read_manifest(tmp_path / "data" / "sample.json", root=tmp_path)
    assert [e.prompt for e in entries] == ["pick up the apple", "rgb only"]
    rec = rel.read_latents(entries[0])
    for key in ("video", "depth", "flow"):
        want = lat[key].transpose(1, 2, 3, 0)  # (C, T', h, w) → (T', h, w, C)
        np.testing.assert_array_equal(rec[f"{key}_latents"], want)
        np.testing.assert_array_equal(rec["img_latent" if key == "video" else f"{key}_img_latent"], want[:1])
    np.testing.assert_array_equal(rec["text_embedding"], text[0, :5])  # the zero padding dropped
    assert str(rec["text"]) == "pick up the apple"
    rgb_only = rel.read_latents(entries[1])
    assert "depth_latents" not in rgb_only and rgb_only["video_latents"].shape == (TL, HL, WL, C)


def test_bad_manifests_and_latents_are_one_line_errors(tmp_path):
    lat, text = _latent_files(tmp_path)
    bad = tmp_path / "bad.json"
    for content, reason in (("{not json", "unreadable manifest"), ('{"a": 1}', "bad manifest"),
                            ('[{"prompt": "x"}]', "bad manifest"), ('[{"rgb_latents": 3}]', "bad manifest")):
        bad.write_text(content)
        with pytest.raises(DataError, match=reason) as e:
            rel.read_manifest(bad)
        assert "\n" not in str(e.value) and str(bad) in str(e.value)
    entry = rel.read_manifest(tmp_path / "data" / "sample.json", root=tmp_path)[0]
    fd = entry.flow_depth_latents
    cases = {
        "missing latents": lambda: fd.unlink(),
        "unreadable latents": lambda: fd.write_bytes(b"\x00" * 40),
        "no depth_latents": lambda: save_file({"flow_latents": lat["flow"]}, fd),
        "depth_latents .* but video_latents": lambda: save_file(
            {"flow_latents": lat["flow"], "depth_latents": lat["depth"][:, :1]}, fd),
        "NaN": lambda: save_file({"flow_latents": lat["flow"] * np.nan, "depth_latents": lat["depth"]}, fd),
    }
    for match, damage in cases.items():
        damage()
        with pytest.raises(DataError, match=match) as e:
            rel.read_latents(entry)
        assert "\n" not in str(e.value) and str(fd) in str(e.value), str(e.value)


def _geometry():
    """Depth: a smooth ramp moving per frame (metres); flow: one vector per frame, all different."""
    y, x = np.mgrid[0:H, 0:W]
    depth = np.stack([0.4 + 3.5 * (x + 2 * y) / (W + 2 * H) + 0.1 * t for t in range(T)]).astype(np.float32)
    angles = np.linspace(0.3, 5.9, T - 1)
    radii = np.linspace(4.0, 28.0, T - 1)
    vec = np.stack([radii * np.cos(angles), radii * np.sin(angles)], -1)
    flow = np.broadcast_to(vec[:, None, None], (T - 1, H, W, 2)).astype(np.float32)
    colours = np.random.default_rng(1).integers(20, 236, (T, 3))  # one per frame (H.264 keeps flat colours)
    rgb = np.broadcast_to(colours[:, None, None], (T, H, W, 3)).astype(np.uint8)
    return rgb, depth, flow


def _write(videos: rel.Videos, rgb, depth, flow, clip_layout: bool) -> None:
    for p in (videos.rgb, videos.depth, videos.flow):
        p.parent.mkdir(parents=True, exist_ok=True)
    colours = flow_to_rgb(flow)
    if clip_layout:
        colours = np.concatenate([np.full((1, H, W, 3), 255, np.uint8), colours])
    write_video(videos.rgb, rgb, 30, crf=0)
    write_video(videos.depth, depth_to_rgb(depth), 30, crf=0)
    write_video(videos.flow, colours, 25, crf=0)


@pytest.mark.parametrize("layout", ["source", "generated"])
def test_the_three_videos_decode_to_metres_and_pixels(tmp_path, layout):
    rgb, depth, flow = _geometry()
    if layout == "source":  # pre-processing's inputs: depth N frames, flow N − 1 frames (i → i + 1)
        videos = rel.source_videos(tmp_path / "RDT-1B" / "ep7" / "cam.mp4", tmp_path / "depth", tmp_path / "flow",
                                   keyword="RDT-1B/")
        assert videos.depth == tmp_path / "depth" / "ep7" / "cam" / "exports" / "mini_npz" / "depth.mp4"
        assert videos.flow == tmp_path / "flow" / "ep7" / "cam" / "flow.mp4"
    else:  # inference's outputs: three N-frame videos, the flow's frame 0 white
        videos = rel.generated_videos(tmp_path / "out", "agibot_0")
        assert videos.flow == tmp_path / "out" / "agibot_0_flow.mp4"
    _write(videos, rgb, depth, flow, clip_layout=layout == "generated")
    got = rel.read_videos(videos)
    assert got["video"].shape == (T, H, W, 3) and np.abs(got["video"].astype(int) - rgb).max() <= 3
    assert np.abs(got["depth"] - depth).max() <= 3 * 5.0 / 255
    epe = np.linalg.norm(got["flow"] - flow, axis=-1)
    assert got["flow"].shape == (T - 1, H, W, 2) and epe.max() < 0.6, epe.max()
    assert (got["flow_video"][0] == 255).all()
    assert np.abs(got["flow_video"][1:].astype(int) - flow_to_rgb(flow)).max() <= 3
    # A window: frames [2, 5), its flow 2 → 3 and 3 → 4; frame 0 of its flow video white (a clip).
    part = rel.read_videos(videos, start=2, num_frames=3)
    np.testing.assert_array_equal(part["depth"], got["depth"][2:5])
    np.testing.assert_array_equal(part["flow"], got["flow"][2:4])
    assert (part["flow_video"][0] == 255).all()


def test_resizing_scales_the_flow_with_the_frames(tmp_path):
    rgb, depth, flow = _geometry()
    videos = rel.generated_videos(tmp_path, "s")
    _write(videos, rgb, depth, flow, clip_layout=True)
    half = rel.read_videos(videos, height=H // 2, width=W // 2)
    assert half["video"].shape == (T, H // 2, W // 2, 3)
    np.testing.assert_allclose(half["flow"], flow[:, ::2, ::2] / 2, atol=0.4)  # half the pixels, half the motion
    assert np.abs(half["depth"] - depth[:, ::2, ::2]).mean() < 0.1


def test_bad_videos_are_one_line_errors(tmp_path):
    rgb, depth, flow = _geometry()
    videos = rel.generated_videos(tmp_path, "s")
    _write(videos, rgb, depth, flow, clip_layout=True)
    cases = [
        (lambda: write_video(videos.depth, depth_to_rgb(depth[:-2]), 30, crf=0), videos.depth, "frame count"),
        (lambda: write_video(videos.flow, flow_to_rgb(flow[:-2]), 25, crf=0), videos.flow, "frame count"),
        (lambda: write_video(videos.flow, np.zeros((T, H + 2, W, 3), np.uint8), 25, crf=0), videos.rgb, "size"),
        (lambda: videos.flow.write_bytes(b"not a video at all"), videos.flow, "unreadable video"),
        (lambda: videos.depth.unlink(), videos.depth, "missing video"),
    ]
    for damage, path, match in cases:
        _write(videos, rgb, depth, flow, clip_layout=True)
        damage()
        with pytest.raises(DataError, match=match) as e:
            rel.read_videos(videos)
        assert "\n" not in str(e.value) and str(path) in str(e.value), str(e.value)
    _write(videos, rgb, depth, flow, clip_layout=True)
    with pytest.raises(DataError, match=r"clip out of range .*\[4, 8\) of 6"):
        rel.read_videos(videos, start=4, num_frames=4)
    with pytest.raises(DataError, match="keyword"):
        rel.source_videos(tmp_path / "x.mp4", tmp_path, tmp_path, keyword="RDT-1B/")
