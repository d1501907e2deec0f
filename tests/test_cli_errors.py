"""Every command-line entry point on bad input: the exit code (2 usage, 1 data), one `error:` line
that names the culprit (flag, field or file), no traceback, no files left behind, and — for what
can be checked up front — an answer in well under a second of work (bound: ELAPSED_S, generous for
a loaded CI machine; the slow failures these replace took 19–84 s). The commands run in-process
(`errors.run(main, argv)`), as their `__main__` blocks do, so nothing re-imports JAX."""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time

import numpy as np
import pytest

import distill
import serve
import train
from rynn_jax import convert, errors
from rynn_jax.data import fixtures as fx
from rynn_jax.data import preencode
from rynn_jax.kinematics import cli as kin_cli
from rynn_jax.kinematics import streams
from rynn_jax.render.preview import save_png
from rynn_jax.sim import cli as sim_cli
from rynn_jax.sim import episode  # noqa: F401 -- imported ahead (MuJoCo): timing excludes imports
from rynn_jax.teleop import calibrate_fp8, demo, generate  # noqa: F401 -- imported ahead: timing excludes imports
from rynn_jax.teleop.camera_hands import synthetic_stream
from rynn_jax.teleop.inputs import IMAGE_FILE, STREAM_FILE
from rynn_jax.training import export_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY, DISTILL_TINY = os.path.join(ROOT, "configs", "tiny.py"), os.path.join(ROOT, "configs", "distill_tiny.py")
ELAPSED_S = 5.0


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, str]:
    """Good and bad input files, made once (outside the directories the cases must leave clean)."""
    d = tmp_path_factory.mktemp("inputs")
    stream = synthetic_stream(9)
    good = d / "good"
    good.mkdir()
    streams.write(good / STREAM_FILE, stream)
    save_png(good / IMAGE_FILE, demo.reference_scene(32, 64))
    data = (good / STREAM_FILE).read_bytes()
    for name, content in (("cut", data[:300]), ("empty", b"")):
        (d / name).mkdir()
        (d / name / STREAM_FILE).write_bytes(content)
        (d / name / IMAGE_FILE).write_bytes((good / IMAGE_FILE).read_bytes())
    (d / "nan").mkdir()
    nan_hands = np.full_like(stream.hand_keypoints, np.nan)
    streams.write(d / "nan" / STREAM_FILE, dataclasses.replace(stream, hand_keypoints=nan_hands))
    (d / "nan" / IMAGE_FILE).write_bytes((good / IMAGE_FILE).read_bytes())
    (d / "noimage").mkdir()
    streams.write(d / "noimage" / STREAM_FILE, stream)
    (d / "no_streams").mkdir()
    (d / "a_file").write_text("not a directory")
    (d / "garbage.safetensors").write_bytes(b"\0garbage")
    (d / "empty_ckpt").mkdir()
    fx.make_dataset("robot", str(d / "robot"), 1, 20)
    (d / "texts").mkdir()
    paths = {k: str(d / k) for k in ("good", "cut", "empty", "nan", "noimage", "no_streams", "a_file", "empty_ckpt",
                                     "robot", "texts")}
    return {**paths, "garbage": str(d / "garbage.safetensors")}


def _cases():
    # Placeholders are the inputs fixture's paths; {out} is the case's own (to stay empty) folder.
    stream = f"{{good}}/{STREAM_FILE}"
    # (name, main, argv, exit code, text the error line must contain)
    return [
        # serve.py
        ("serve-unknown", serve.main, ["bogus"], 2, "unknown command 'bogus'"),
        # serve.py demo: the bundled-sample world and the sim world
        ("demo-cut-stream", serve.main, ["demo", "--sample", "{cut}", "--out", "{out}/d"], 1,
         f"cut/{STREAM_FILE}: not a readable"),
        ("demo-empty-stream", serve.main, ["demo", "--sample", "{empty}", "--out", "{out}/d"], 1, "(empty file)"),
        ("demo-missing-sample", serve.main, ["demo", "--sample", "{out}/nope", "--out", "{out}/d"], 1,
         "--sample {out}/nope: no such directory"),
        ("demo-missing-image", serve.main, ["demo", "--sample", "{noimage}", "--out", "{out}/d"], 1,
         f"noimage/{IMAGE_FILE}: no such file"),
        ("demo-nan-hands", serve.main, ["demo", "--sample", "{nan}", "--out", "{out}/d"], 1,
         "frames have no valid hand pose"),
        ("demo-missing-dit", serve.main, ["demo", "--sample", "{good}", "--dit", "/nonexistent", "--vae",
                                          "/nonexistent", "--out", "{out}/d"], 1, "--dit /nonexistent: no such"),
        ("demo-dit-without-vae", serve.main, ["demo", "--dit", "{good}", "--out", "{out}/d"], 2,
         "--dit / --vae: give both"),
        ("demo-frames", serve.main, ["demo", "--sample", "{good}", "--frames", "6", "--out", "{out}/d"], 2,
         "--frames 6: must be 1 + 4k"),
        ("demo-frames-too-long", serve.main, ["demo", "--sample", "{good}", "--frames", "81", "--out", "{out}/d"],
         2, "--frames 81: the stream covers"),
        ("demo-resolution", serve.main, ["demo", "--sample", "{good}", "--frames", "5", "--resolution", "100x100",
                                         "--out", "{out}/d"], 2, "--resolution 100x100: height and width must be multiples of 32"),
        ("demo-resolution-syntax", serve.main, ["demo", "--resolution", "32by64"], 2, "32by64"),
        ("demo-out-is-a-file", serve.main, ["demo", "--sample", "{good}", "--frames", "5", "--out", "{a_file}"], 2,
         "--out {a_file}: exists and is not a directory"),
        ("demo-sim-task", serve.main, ["demo", "--world", "sim", "--task", "juggle", "--out", "{out}/d"], 2,
         "--task juggle: unknown"),
        ("demo-sim-resolution", serve.main, ["demo", "--world", "sim", "--resolution", "48x64", "--out", "{out}/d"],
         2, "--resolution 48x64"),
        # serve.py generate / calibrate
        ("generate-resolution", serve.main, ["generate", "--streams", "{good}", "--out", "{out}/g", "--resolution",
                                             "100x100"], 2, "--resolution 100x100"),
        ("generate-missing-streams", serve.main, ["generate", "--streams", "{out}/nope", "--out", "{out}/g"], 1,
         "--streams {out}/nope: no such directory"),
        ("generate-no-streams", serve.main, ["generate", "--streams", "{no_streams}", "--out", "{out}/g"], 1,
         f"no {STREAM_FILE} at or under it"),
        ("generate-batch", serve.main, ["generate", "--streams", "{good}", "--out", "{out}/g", "--batch", "0"], 2,
         "--batch 0"),
        ("generate-text-twice", serve.main, ["generate", "--streams", "{good}", "--out", "{out}/g", "--text",
                                             "{garbage}", "--text-embeddings", "{texts}"], 2,
         "--text / --text-embeddings: give one"),
        ("generate-missing-image", serve.main, ["generate", "--streams", "{good}", "--out", "{out}/g", "--image",
                                                "{out}/nope.png"], 1, "{out}/nope.png: no such file"),
        ("calibrate-missing-latents", serve.main, ["calibrate-fp8", "--latents", "{out}/nope", "--out",
                                                   "{out}/s.safetensors"], 1, "--latents {out}/nope: no such"),
        ("calibrate-clips", serve.main, ["calibrate-fp8", "--latents", "{texts}", "--out", "{out}/s.safetensors",
                                         "--clips", "0"], 2, "--clips 0"),
        ("calibrate-no-shards", serve.main, ["calibrate-fp8", "--latents", "{texts}", "--out", "{out}/s.safetensors"],
         1, "no latent shards"),
        ("calibrate-vae-missing", serve.main, ["calibrate-vae-fp8", "--latents", "{texts}", "--vae", "{out}/nope",
                                               "--out", "{out}/s.safetensors"], 1, "--vae {out}/nope: no such"),
        # serve.py live
        ("live-public-without-token", serve.main, ["live", "--host", "0.0.0.0", "--record-dir", "{out}/r"], 2,
         "--host 0.0.0.0: binding beyond localhost needs a token"),
        ("live-resolution", serve.main, ["live", "--resolution", "100x100", "--record-dir", "{out}/r"], 2,
         "--resolution 100x100"),
        ("live-missing-dit", serve.main, ["live", "--dit", "/nonexistent", "--vae", "/nonexistent", "--record-dir",
                                          "{out}/r"], 1, "--dit /nonexistent: no such"),
        # python -m rynn_jax.kinematics.cli retarget
        ("retarget-cut", kin_cli.main, ["retarget", f"{{cut}}/{STREAM_FILE}", "{out}/a.npz"], 1,
         "not a readable rynn-teleop-stream/1 file (truncated"),
        ("retarget-empty", kin_cli.main, ["retarget", f"{{empty}}/{STREAM_FILE}", "{out}/a.npz"], 1,
         "(empty file)"),
        ("retarget-missing", kin_cli.main, ["retarget", "{out}/nope.npz", "{out}/a.npz"], 1,
         "{out}/nope.npz: no such operator stream file"),
        ("retarget-nan-hands", kin_cli.main, ["retarget", f"{{nan}}/{STREAM_FILE}", "{out}/a.npz"], 1,
         "frames have no valid hand pose"),
        ("retarget-out-suffix", kin_cli.main, ["retarget", stream, "{out}/a.txt"], 2, "must end in .npz"),
        ("retarget-out-under-a-file", kin_cli.main, ["retarget", stream, "{a_file}/a.npz"], 2,
         "out {a_file}: exists and is not a directory"),
        ("retarget-hz", kin_cli.main, ["retarget", stream, "{out}/a.npz", "--hz", "0"], 2, "--hz 0"),
        ("retarget-flag", kin_cli.main, ["retarget", stream, "{out}/a.npz", "--bogus"], 2,
         "unrecognized arguments: --bogus"),
        # python -m rynn_jax.sim.cli generate
        ("sim-task", sim_cli.main, ["generate", "--task", "juggle", "--n", "1", "--out", "{out}/s"], 2,
         "--task juggle: unknown"),
        ("sim-n", sim_cli.main, ["generate", "--task", "dual_pick", "--n", "0", "--out", "{out}/s"], 2, "--n 0"),
        ("sim-missing-n", sim_cli.main, ["generate", "--out", "{out}/s"], 2, "--n"),
        # python -m rynn_jax.data.preencode
        ("preencode-no-text", preencode.main, ["--source", "robot", "--root", "{robot}", "--out", "{out}/l"], 2,
         "--text-embeddings: not given"),
        ("preencode-missing-prompt", preencode.main, ["--source", "robot", "--root", "{robot}", "--out", "{out}/l",
                                                      "--text-embeddings", "{texts}", "--frames", "9", "--height",
                                                      "32", "--width", "64"], 1, "--text-embeddings {texts}: no embedding for 1 of 1 prompts"),
        ("preencode-missing-root", preencode.main, ["--source", "robot", "--root", "{out}/nope", "--out", "{out}/l",
                                                    "--allow-missing-text"], 1, "--root {out}/nope: no such directory"),
        ("preencode-frames", preencode.main, ["--source", "robot", "--root", "{robot}", "--out", "{out}/l",
                                              "--allow-missing-text", "--frames", "8"], 2, "--frames 8: must be 1 + 4k"),
        ("preencode-size", preencode.main, ["--source", "robot", "--root", "{robot}", "--out", "{out}/l",
                                            "--allow-missing-text", "--height", "100"], 2, "--height 100"),
        ("preencode-vae", preencode.main, ["--source", "robot", "--root", "{robot}", "--out", "{out}/l",
                                           "--allow-missing-text", "--vae", "{out}/nope"], 1, "--vae {out}/nope: no such"),
        ("preencode-source", preencode.main, ["--source", "kinect", "--root", "{robot}", "--out", "{out}/l"], 2,
         "--source: invalid choice: 'kinect'"),
        # python -m rynn_jax.convert
        ("convert-missing-src", convert.main, ["dit", "/nonexistent", "{out}/w"], 1, "src /nonexistent: no such"),
        ("convert-garbage", convert.main, ["dit", "{garbage}", "{out}/w", "--config", "tiny"], 1,
         "garbage.safetensors"),
        ("convert-preset", convert.main, ["vae", "{garbage}", "{out}/w", "--config", "ti2v_5b"], 2,
         "--config ti2v_5b: not a vae preset"),
        ("convert-dtype", convert.main, ["dit", "{garbage}", "{out}/w", "--dtype", "fp4"], 2,
         "--dtype: invalid choice"),
        # python -m rynn_jax.training.export_weights
        ("export-no-ckpt-dir", export_weights.main, ["--config", TINY, "--out", "{out}/w"], 2, "ckpt.dir: not set"),
        ("export-missing-ckpt", export_weights.main, ["--config", TINY, "--set", "ckpt.dir={out}/nope", "--out",
                                                      "{out}/w"], 1, "ckpt.dir {out}/nope: no such directory"),
        ("export-empty-ckpt", export_weights.main, ["--config", TINY, "--set", "ckpt.dir={empty_ckpt}", "--out",
                                                    "{out}/w"], 1, "no finished checkpoint step"),
        # train.py
        ("train-missing-config", train.main, ["--config", "{out}/nope.py"], 2, "--config {out}/nope.py: no such"),
        ("train-unknown-field", train.main, ["--config", TINY, "--set", "optim.learning_rate=1"], 2,
         "--set 'optim.learning_rate=1': unknown config field 'learning_rate'"),
        ("train-bad-value", train.main, ["--config", TINY, "--set", "total_steps=many"], 2,
         "--set 'total_steps=many'"),
        ("train-init-from", train.main, ["--config", TINY, "--set", "ckpt.init_from=/nonexistent"], 1,
         "ckpt.init_from /nonexistent: no such directory"),
        ("train-init-from-not-converted", train.main, ["--config", TINY, "--set", "ckpt.init_from={empty_ckpt}"], 1,
         "ckpt.init_from {empty_ckpt}: not a converted model directory"),
        ("train-steps", train.main, ["--config", TINY, "--set", "total_steps=0"], 2, "total_steps=0"),
        ("train-no-sources", train.main, ["--config", TINY, "--set", "data.kind=latents"], 2, "data.sources is empty"),
        ("train-ckpt-dir-is-a-file", train.main, ["--config", TINY, "--set", "ckpt.dir={a_file}"], 2,
         "ckpt.dir {a_file}: exists and is not a directory"),
        ("train-flag", train.main, ["--config", TINY, "--steps", "3"], 2, "unrecognized arguments: --steps 3"),
        # distill.py
        ("distill-student-from", distill.main, ["--config", DISTILL_TINY, "--set", "phase=dmd", "--set",
                                                "student_from=/nonexistent"], 1, "student_from /nonexistent: no such"),
        ("distill-wrong-recipe", distill.main, ["--config", TINY], 2, "not DistillConfig"),
        ("distill-phase", distill.main, ["--config", DISTILL_TINY, "--set", "phase=dmdd"], 2, "must be one of"),
    ]


CASES = _cases()


def _tree(root: str) -> set[str]:
    return {os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs}


@pytest.mark.parametrize("name,main,argv,code,message", CASES, ids=[c[0] for c in CASES])
def test_bad_input_fails_early_in_one_line(name, main, argv, code, message, inputs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "work"
    out.mkdir()
    monkeypatch.chdir(out)  # default run directories (runs/...) would land here
    fill = {**inputs, "out": str(out)}
    argv = [a.format(**fill) for a in argv]
    before = {k: _tree(v) for k, v in inputs.items() if os.path.isdir(v)}
    t0 = time.perf_counter()
    got = errors.run(main, argv)
    elapsed = time.perf_counter() - t0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("error: ")]
    assert got == code, (got, err[-3000:])
    assert len(lines) == 1 and "Traceback" not in err, err[-3000:]
    assert message.format(**fill) in lines[0], lines[0]
    assert elapsed < ELAPSED_S, elapsed
    assert not os.listdir(out), os.listdir(out)  # nothing written, not even an empty folder
    assert {k: _tree(v) for k, v in inputs.items() if os.path.isdir(v)} == before


def test_debug_shows_the_traceback(inputs, tmp_path, capsys):
    argv = ["retarget", f"{inputs['cut']}/{STREAM_FILE}", str(tmp_path / "a.npz")]
    assert errors.run(kin_cli.main, [*argv, "--debug"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and err.rstrip().splitlines()[-1].startswith("error: ")


@pytest.mark.parametrize("main,argv,want", [
    (serve.main, ["--help"], "python serve.py COMMAND --help"),
    (serve.main, ["generate", "--help"], "(default: 33)"),  # --frames
    (serve.main, ["demo", "--help"], "examples:"),
    (train.main, ["--help"], "saved step N"),
    (kin_cli.main, ["retarget", "--help"], "(default: 1.5)"),  # --scale
    (preencode.main, ["--help"], "(default: 480)"),  # --height
    (sim_cli.main, ["generate", "--help"], "(default: tiny)"),
    (convert.main, ["--help"], "examples:"),
])
def test_help_lists_defaults_and_examples(main, argv, want, capsys):
    assert errors.run(main, argv) == 0
    assert want in capsys.readouterr().out


def test_lost_and_implausible_frames_are_counted_then_refused(caplog):
    """`streams.check`: per-frame validity after resampling, a warning with the counts below the
    threshold, an error above it. Hands 0.5 m from their wrist are implausible (not rendered)."""
    s = synthetic_stream(33)
    hands = s.hand_keypoints.copy()
    m = len(s.hand_t)
    hands[: int(0.3 * m)] = np.nan  # the first 30% of both hands' samples lost
    far = hands.copy()
    far[:, :, 8] += 0.5  # every sample's index fingertip 0.5 m off: implausible
    with caplog.at_level(logging.WARNING, "rynn_jax.kinematics"):
        counts = streams.check(dataclasses.replace(s, hand_keypoints=hands), "s.npz")
    frames = counts["frames"]
    assert 0.25 * frames < counts["hand_frames_lost"] < 0.35 * frames and counts["tracker_frames_lost"] == 0
    assert counts["hand_samples_unusable"] == 2 * int(0.3 * m)
    assert f"s.npz: 0 of {frames} frames with a tracker lost, {counts['hand_frames_lost']} with both hands" \
        in caplog.text
    rs = streams.resample(dataclasses.replace(s, hand_keypoints=hands), np.asarray([s.hand_t[-1]]))
    assert rs["hands_fresh"].all()  # the mask is per frame: late frames are fine
    with pytest.raises(errors.InputError, match=f"far.npz: {frames} of {frames} frames have no valid hand pose"):
        streams.check(dataclasses.replace(s, hand_keypoints=far), "far.npz")


def test_prompts_are_checked_before_encoding(inputs, tmp_path):
    """The robot source names its prompts from metadata: with the embedding present, the check passes
    (and the encoder is still not built: `lazy`)."""
    from rynn_jax.data.clips import ClipConfig

    source = preencode.make_source("robot", inputs["robot"], ClipConfig(num_frames=9, height=32, width=64), False)
    (prompt,) = {source.prompt(r) for r in source.index()}
    store = preencode.TextEmbeddingStore(str(tmp_path))
    with pytest.raises(errors.MissingFileError, match=hashlib.sha256(prompt.encode()).hexdigest()):
        preencode.check_prompts(source, source.index(), store)
    from safetensors.numpy import save_file

    save_file({"prompt_embedding": np.ones((2, 4096), np.float32)}, store.path(prompt))
    preencode.check_prompts(source, source.index(), store)
    built = []
    encode = preencode.lazy(lambda: built.append(1) or (lambda v: v))
    assert not built and encode(3) == 3 and encode(4) == 4 and built == [1]
