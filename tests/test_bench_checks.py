"""The benchmarks' output checks (bench/_harness.py) fail on wrong outputs, and a bench records them."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
from _harness import Checks, write_json  # noqa: E402
from tests._train_run import FAST_COMPILE  # noqa: E402


def _fast_compile_env() -> dict[str, str]:
    """Fast XLA:CPU compiles for a bench subprocess: on the toy models a bench's time is compiling, and
    its checks (FP8 vs bf16, merged vs sequential, vs float32) compare the same computations, at most
    rounded differently. Not for runtime-bound benches (bench_dit's 5B-width slice)."""
    return {**os.environ, "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} {FAST_COMPILE}"}


def test_checks_catch_wrong_outputs():
    c = Checks()
    want = np.linspace(-1, 1, 100)
    assert c.close("same", want + 1e-6, want, 1e-4) < 1e-4 and c.ok
    c.close("off by 10%", want * 1.1, want, 1e-2)
    assert not c.ok
    c2 = Checks()
    assert c2.finite("clean", want) and c2.ok
    assert not c2.finite("nan", np.array([1.0, np.nan])) and not c2.ok
    with pytest.raises(SystemExit, match="nan"):
        c2.exit_if_failed()


def test_results_hold_no_machine_paths(tmp_path):
    """Committed results name files relative to the repository, or by name alone outside it."""
    out = tmp_path / "r.json"
    write_json(str(out), {"argv": ["--out", str(tmp_path / "o" / "x.json"), "--tae", str(ROOT / "weights" / "w")],
                          "nested": {"dir": str(tmp_path) + "/"}, "ratio": 1.5, "text": "a/b"})
    got = json.loads(out.read_text())
    assert got == {"argv": ["--out", "x.json", "--tae", "weights/w"], "nested": {"dir": tmp_path.name},
                   "ratio": 1.5, "text": "a/b"}
    committed = [p.name for p in (ROOT / "bench" / "results").glob("*.json")
                 if any(m in p.read_text() for m in ('"/root/', '"/work/', '"/tmp/', '"/home/'))]
    assert committed == []


def test_vae_bench_checks_streaming_against_whole_clip(tmp_path):
    out = tmp_path / "vae.json"
    cmd = [sys.executable, "bench/bench_vae.py", "--tiny", "--height", "64", "--width", "64", "--latent-frames", "3",
           "--iters", "1", "--torch", "off", "--dtype", "float32", "--no-whole", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    checks = {r["check"]: r for r in json.loads(out.read_text())["checks"]}
    assert all(r["ok"] for r in checks.values()) and len(checks) == 4, checks
    errs = [r["value"] for name, r in checks.items() if "vs whole-clip" in name]
    assert len(errs) == 2 and max(errs) < 1e-4, errs
    ops = {r["op"]: r["median_ms"] for r in json.loads(out.read_text())["rows"] if r["impl"].startswith("jax")}
    decode = "stream decode (1 latent → 4 frames)"
    for suffix in ("", ", 8 calls queued", ", later-chunk program", ", later-chunk program, 8 calls queued"):
        assert ops[decode + suffix] > 0, ops


def test_vae_bench_image_encode_rows(tmp_path):
    """bench_vae --image-batch: the lone-frame encode and the every-tap program in one run, their
    latents checked equal (float32: to rounding), the lone frame's XLA FLOPs below the every-tap
    program's (two programs, not one timed twice), both timed, the ratio recorded."""
    out = tmp_path / "img.json"
    cmd = [sys.executable, "bench/bench_vae.py", "--image-batch", "2", "--tiny", "--height", "32", "--width", "48",
           "--iters", "1", "--dtype", "float32", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert [c["ok"] for c in result["checks"]] == [True, True, True], result["checks"]
    assert any("FLOPs" in c["check"] for c in result["checks"])
    every, lone = result["rows"]
    assert "every tap" in every["op"] and "lone frame" in lone["op"] and min(every["median_ms"], lone["median_ms"]) > 0
    assert lone["speedup_vs_every_tap"] == every["median_ms"] / lone["median_ms"]


def test_profile_ops_fp8_probes(tmp_path):
    """profile_ops --fp8-conv: the e4m3 conv variants run and land within FP8 rounding of the float32
    conv (per-tensor scales: 3 mantissa bits, so a few percent rel L2 — not zero, not large); --fp8
    profiles the quantized DiT next to the float one; the stream target times one chunk per block."""
    out = tmp_path / "conv.json"
    cmd = [sys.executable, "bench/profile_ops.py", "--targets", "conv", "dit", "stream", "policy", "--tiny", "--fp8-conv",
           "--fp8", "--unroll", "2", "--iters", "1", "--policy-layouts", "unrolled", "scan", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=_fast_compile_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    rows = json.loads(out.read_text())["conv"]
    fp8 = [r for r in rows if "fp8" in r["impl"]]
    assert {r["impl"] for r in fp8} == {"3d_fp8_prequant", "3d_fp8_quant", "fold2d_fp8_prequant", "fold2d_fp8_quant"}
    for r in fp8:
        assert 5e-3 < r["rel_l2_vs_f32"] < 6e-2 and r["ms"] > 0, r
        assert r["cudnn_fp8_graph"] is False, r  # CPU: no cuDNN
    # --fp8 on the DiT target: the quantized model's profile next to the float one, outputs close
    (stream,) = json.loads(out.read_text())["stream"].values()
    assert stream["clean_pass"] == "merged" and stream["blocks"] == len(stream["wall_ms_per_block"]) == 7
    assert stream["busy_ms"] > 0 and abs(stream["wall_ms"] * 7 - sum(stream["wall_ms_per_block"])) < 0.01
    dit = json.loads(out.read_text())["dit"]
    q = dit["dit 18 tokens, scan_unroll=2, fp8"]
    assert q["busy_ms"] > 0 and 1e-3 < q["rel_l2_vs_float"] < 1e-1, q
    policy = json.loads(out.read_text())["policy"]  # the control step, one profile per backbone layout
    assert sorted(k.rsplit(" ", 1)[-1] for k in policy) == ["scan", "unrolled"]
    assert all(r["wall_ms"] > 0 and r["compile_s"] > 0 for r in policy.values()), policy


def test_fp8_causal_and_streaming_benches(tmp_path):
    """bench_causal / bench_stream --fp8 on the tiny models: the quantized DiT streams (the stream
    bench with calibrated static activation scales and merged clean passes), the benches' output
    checks pass and the JSON says so; the derived columns agree with the timed ones."""
    causal_out, stream_out = tmp_path / "causal.json", tmp_path / "stream.json"
    runs = [["bench/bench_causal.py", "--tiny", "--layers", "1", "--fp8", "--chunks", "2", "--rolling-blocks", "2",
             "--out", str(causal_out)],
            ["bench/bench_stream.py", "--tiny", "--height", "64", "--width", "64", "--fp8", "--chunks", "3",
             "--fp8-activations", "static", "--ab", "merge", "--warm-chunks", "1", "--precompile",
             "--out", str(stream_out)]]
    for argv in runs:
        proc = subprocess.run([sys.executable, *argv], cwd=ROOT, env=_fast_compile_env(), capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    causal = json.loads(causal_out.read_text())
    assert causal["fp8"] and causal["checks"] and all(c["ok"] for c in causal["checks"])
    full = [r for r in causal["rows"] if r["policy"] == "full"]
    assert [r["block"] for r in full] == list(range(7))  # 21-frame cache / 3-frame blocks
    for r in causal["rows"]:
        assert abs(r["ms_per_video_frame"] * 4 * causal["frames_per_block"] - r["median_ms"]) < 1e-6 * r["median_ms"]
    merged = [c for c in causal["checks"] if c["check"].startswith("merged clean pass")]
    assert len(merged) == 1 and merged[0]["value"] < 1e-2
    assert min(causal[k] for k in ("clean_pass_ms", "next_pass_ms", "merged_pass_ms")) > 0
    stream = json.loads(stream_out.read_text())
    assert stream["fp8_dit"] and stream["checks"] and all(c["ok"] for c in stream["checks"])
    assert stream["fp8_activations"] == "static" and stream["ab"] == "merge"
    assert [r["variant"] for r in stream["results"]] == ["sequential clean pass", "merged clean pass"]
    same = [c for c in stream["checks"] if "merged clean pass vs sequential clean pass" in c["check"]]
    assert len(same) == 1 and same[0]["value"] < 1e-3, same  # float32 on CPU: equal up to rounding
    calib = stream["fp8_calibration"]
    assert len(calib["calibration_timesteps"]) == 5 and calib["calibration_timesteps"][-1] == 0.0
    for name, err in calib["rel_l2_vs_bf16"].items():  # FP8 rounding: a few percent, not zero
        assert 1e-3 < err < 1e-1, (name, err)
    for res in stream["results"]:
        assert res["batch"] == 1 and abs(res["steady_fps"] * res["steady_ms_per_frame"] - 1000.0) < 1e-6
        assert {r["chunk"] for r in res["rows"]} == {0, 1, 2} and res["time_to_first_frame_s"] > 0
        assert res["precompile_s"] > 0  # StreamingSession.compile() before start


def test_dit_bench_fp8_static_rows(tmp_path):
    """bench_dit --fp8 --fp8-static --round-robin on a 1-layer 5B-width slice (XLA attention on CPU):
    bf16, FP8 and static-FP8 rows, each holding its timed calls (taken in turn after all compiled),
    and the bench's own checks (FP8 outputs near bf16; bf16 near the float32 reference) pass."""
    out = tmp_path / "dit.json"
    cmd = [sys.executable, "bench/bench_dit.py", "--frames", "1", "--iters", "2", "--layers", "1", "--unroll", "1",
           "--attention", "xla", "--torch", "off", "--fp8", "--fp8-static", "--round-robin", "--out", str(out)]
    # full optimization here: at 5B width the unoptimized programs run ≈ 5× slower than they compile faster
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["checks"] and all(c["ok"] for c in result["checks"])
    rows = {r["impl"]: r for r in result["rows"]}
    assert set(rows) == {"jax (xla attn)", "jax (xla attn, fp8)", "jax (xla attn, fp8 static)"}
    for r in rows.values():
        assert len(r["times_ms"]) == 2 and r["median_ms"] > 0 and abs(r["min_ms"] - min(r["times_ms"])) < 1e-3
        assert "_times" not in r
    static = [c for c in result["checks"] if "fp8 static) vs bf16" in c["check"]]
    assert len(static) == 1 and 1e-3 < static[0]["value"] < 1e-1, static


def test_policy_bench_fp8_backbone_row(tmp_path):
    """bench_policy --fp8 --fp8-static --scanned on the toy 4D policy: rows with the backbone's block
    linears as FP8 GEMMs, per-token and with calibrated static activation scales, whose features stay
    within 15 % of the bf16 row's (and differ: the FP8 path runs); the stacked-scan twins of the bf16
    and last FP8 rows, whose features match the serving layout's."""
    out = tmp_path / "policy.json"
    cmd = [sys.executable, "bench/bench_policy.py", "--size", "tiny", "--fp8", "--fp8-static", "--scanned",
           "--iters", "2", "--out", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=_fast_compile_env())
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {r["size"]: r for r in result["rows"]}
    assert [r["size"] for r in result["rows"]] == ["tiny", "tiny/scan", "tiny+fp8", "tiny+fp8s", "tiny+fp8s/scan"]
    assert all(c["ok"] for c in result["checks"]) and len(result["checks"]) == 19, result["checks"]
    assert all(0 < rows[k]["features_rel_l2_vs_bf16"] <= 0.15 for k in ("tiny+fp8", "tiny+fp8s"))
    assert all(rows[k]["features_rel_l2_vs_bf16"] <= 0.02 for k in ("tiny/scan", "tiny+fp8s/scan"))
    # the encode is part of the vision pass; summed over the rows, as one toy row's 2-iteration median
    # on a loaded CPU can come out either way
    assert all(r["encode_ms"] > 0 for r in result["rows"])
    assert sum(r["encode_ms"] for r in result["rows"]) < sum(r["vision_ms"] for r in result["rows"])
