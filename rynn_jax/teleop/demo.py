"""The digital-teleoperation demo: operator stream + reference image → (video, 54-D action) episode.

Runs both halves of the engine on one recorded stream: the skeleton it implies is rendered from
the head camera and drives the world model from the reference image; the same stream is
retargeted by IK to the robot's joints. Output: synchronized frames and actions at 16 fps.

With no weights given it uses the bundled trained student and autoencoder of the synthetic world
(`weights/synthetic/{student,autoencoder}`, `serving.student`) at the resolution they were trained
for, streamed block by block as they were distilled; when they are absent, or with
`--random-weights`, tiny randomly initialised networks (the pipeline, shapes, timing and actions
are real, the pictures are not). Pass directories made by `python -m rynn_jax.convert` (a DiT with a
control branch and the VAE) or by `rynn_jax.distill.export` (a student) for other weights.

`--world sim` (demo v0 of the synthetic world, `rynn_jax.sim`): generates one MuJoCo episode
(scripted operator → stream → retarget → simulate → render), renders its skeleton video, and runs
the causal student (`serving.session.StreamingSession`) from the episode's first frame; writes
the generated, ground-truth and skeleton videos side by side and the 54-D actions, and reports the
generated frames' PSNR against the ground truth (next to a copy of the first frame's). Until a
student is bundled, the bundled teacher draws the clip there instead (bidirectional, all frames at
once: the same sampler as `eval.py --model teacher`), so the video shows what the trained world model
does rather than noise.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import sys
import time
from pathlib import Path

import jax
import numpy as np
from tqdm import tqdm

from rynn_jax import compile_cache, errors
from rynn_jax.atomic import staged_files
from rynn_jax.eval import metrics
from rynn_jax.kinematics import streams
from rynn_jax.kinematics.layout import ACTION_NAMES
from rynn_jax.kinematics.retarget import retarget_stream
from rynn_jax.render import RenderConfig, default_intrinsics, render_video
from rynn_jax.render.preview import save_png, save_video
from rynn_jax.serving import student as student_lib
from rynn_jax.serving.assemble import (DECODERS, TINY_SIM_RESOLUTION, Weights, build_world_model, check_model_flags,
                                       check_resolution, choose_weights, decoder_checkpoint, session_for)
from rynn_jax.serving.bidirectional import SamplingConfig
from rynn_jax.serving.clip import fit_image, rollout
from rynn_jax.serving.prompts import text_contexts
from rynn_jax.sim import recipe
from rynn_jax.teleop.camera_hands import hands_in_camera, synthetic_stream, video_times
from rynn_jax.teleop.inputs import IMAGE_FILE, SAMPLE_DIR, STREAM_FILE, read_reference
from rynn_jax.text import empty_context, load_text_context

TEACHER = "bundled teacher"  # run_sim's label for the bundled teacher standing in for a student
TEACHER_STEPS = 8  # --steps' default for a teacher (bidirectional sampler steps)


def reference_scene(height: int = 480, width: int = 832, seed: int = 0) -> np.ndarray:
    """A simple tabletop picture (wall, table, a few blocks and a lid) used as the bundled I_ref."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    img = np.empty((height, width, 3), np.float32)
    img[:] = np.array([200, 205, 210]) * (0.9 + 0.1 * y[..., None] / height)  # wall
    table = y > 0.38 * height
    img[table] = (np.array([150, 110, 75]) * (0.8 + 0.3 * (y[table, None] / height)))
    for _ in range(4):
        cx, cy = rng.uniform(0.2, 0.8) * width, rng.uniform(0.55, 0.85) * height
        w, h = rng.uniform(0.05, 0.1) * width, rng.uniform(0.06, 0.12) * height
        box = (np.abs(x - cx) < w / 2) & (np.abs(y - cy) < h / 2)
        img[box] = rng.uniform(40, 230, size=3)
    return np.clip(img, 0, 255).astype(np.uint8)


def write_bundled_sample(directory: Path = SAMPLE_DIR, num_frames: int = 81) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    streams.write(directory / STREAM_FILE, synthetic_stream(num_frames))
    save_png(directory / IMAGE_FILE, reference_scene())


def check_clip_frames(num_frames: int) -> None:
    """A clip sampled at once (bidirectionally) is 1 + 4k frames: the VAE's temporal stride."""
    if num_frames < 1 or (num_frames - 1) % 4:
        raise errors.UsageError(f"--frames {num_frames}: must be 1 + 4k (the VAE's temporal stride)",
                                fix=f"e.g. --frames {1 + 4 * max(1, round((num_frames - 1) / 4))}")


def run(out: Path, *, num_frames: int = 17, steps: int | None = None, seed: int = 0, sample_dir: Path = SAMPLE_DIR,
        dit: str | None = None, vae: str | None = None, text: str | None = None, fp8: bool = False,
        fp8_scales: str | None = None, vae_fp8_scales: str | None = None,
        resolution: tuple[int, int] | None = None, random_weights: bool = False, tae: str | None = None) -> dict:
    """`resolution` (H, W): the reference picture is resized and centre-cropped to it (as
    `serve.py generate` does); default: the size a student was trained at, else the picture's own.
    A student (the bundled one, or `--dit` with a `student.json`) streams block by block through
    `StreamingSession`; other DiTs sample the clip bidirectionally (`WorldModel`). Every input is
    read and checked before a model is built; the outputs appear together at the end (nothing on a
    failure). `tae`: a tiny decoder for a student's rollout, as in `run_sim`."""
    check_clip_frames(num_frames)
    check_model_flags(dit=dit, vae=vae, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales, text=text,
                      tae=tae)
    errors.existing(sample_dir, "--sample", kind="directory")
    stream = streams.read(sample_dir / STREAM_FILE)
    streams.check(stream, str(sample_dir / STREAM_FILE))
    reference = read_reference(sample_dir / IMAGE_FILE)
    t_video = video_times(stream, num_frames)
    weights = choose_weights(dit, vae, random_weights).with_student_steps(steps)
    if tae is not None and weights.spec is None:
        raise errors.UsageError("--tae / --decoder tiny: decode a streamed student's rollout; these weights are "
                                "not a student")
    height, width = resolution or weights.resolution(reference.shape[:2])
    check_resolution(height, width, "--resolution" if resolution else f"{sample_dir / IMAGE_FILE}: size")
    errors.writable_dir(out, "--out")
    if (height, width) != reference.shape[:2]:
        reference = fit_image(reference, height, width)
    timings: dict[str, float] = {}
    bar = tqdm(total=5, desc="digital teleop", unit="stage")

    def stage(name: str):
        bar.set_postfix_str(name)
        timings[name] = time.perf_counter()

    def done(name: str):
        timings[name] = time.perf_counter() - timings[name]
        bar.update()

    stage("load")
    if weights.spec is not None:  # a student: streamed as served
        model = session_for(weights, seed, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales, tae=tae)
    else:
        model = build_world_model(weights.dit, weights.vae, seed, fp8=fp8, fp8_scales=fp8_scales,
                                  vae_fp8_scales=vae_fp8_scales)
    context = (load_text_context(text, model.dit_cfg.text_len, model.dit_cfg.text_dim) if text
               else empty_context(model.dit_cfg.text_len, model.dit_cfg.text_dim))
    done("load")

    stage("skeleton")
    render_cfg = RenderConfig(width=width, height=height)
    joints, elbows, valid = hands_in_camera(stream, t_video)
    skeleton = np.asarray(render_video(render_cfg, joints, elbows, default_intrinsics(render_cfg), valid))
    done("skeleton")

    stage("retarget")
    retargeted = retarget_stream(stream, hz=streams.VIDEO_FPS, where=str(sample_dir / STREAM_FILE))
    actions = retargeted["actions"][:num_frames]
    done("retarget")

    stage("world model")
    if weights.spec is not None:
        sampling = {"student": student_lib.StudentSpec.to_json(weights.spec)}
        video = rollout(model, reference[None], skeleton[None], np.asarray(context)[None], jax.random.key(seed))[0]
    else:
        sampling_cfg = SamplingConfig(num_steps=TEACHER_STEPS if steps is None else steps)
        sampling = dataclasses.asdict(sampling_cfg)
        video = model.generate(jax.random.key(seed), reference, skeleton, context, sampling_cfg)
    done("world model")

    stage("write")
    summary = {
        "frames": int(video.shape[0]), "resolution": [height, width], "actions_shape": list(actions.shape),
        "sampling": sampling, "weights": weights.label,
        "dit_fp8": fp8, "dit_fp8_activations": model.dit_cfg.fp8_activations if fp8 else None,
        "ik_pos_err_mm_median": float(np.median(retargeted["ik_pos_err"][:num_frames]) * 1e3),
        "hand_tip_err_mm_median": float(np.median(retargeted["hand_tip_err"][:num_frames]) * 1e3),
        "seconds": {k: round(v, 3) for k, v in timings.items()}, "backend": jax.default_backend(),
        "layout": "side_by_side.mp4 = generated | skeleton",
    }
    with staged_files(out) as tmp:
        save_video(tmp / "skeleton.mp4", skeleton, fps=int(streams.VIDEO_FPS))
        save_video(tmp / "generated.mp4", video, fps=int(streams.VIDEO_FPS))
        save_video(tmp / "side_by_side.mp4", np.concatenate([video, skeleton], axis=2), fps=int(streams.VIDEO_FPS))
        np.savez_compressed(tmp / "episode.npz", frames=video, actions=actions, t=t_video,
                            action_names=retargeted["action_names"], skeleton=skeleton)
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1))
    done("write")
    bar.close()
    return summary


def sim_weights(dit: str | None, vae: str | None, random_weights: bool = False) -> Weights:
    """`choose_weights`, except that with no bundled student yet the bundled teacher (when present)
    stands in for the tiny random networks: the synthetic world's demo then shows a trained model."""
    if dit is None and vae is None and not random_weights and student_lib.find_bundled() is None:
        bundled = student_lib.find_bundled_teacher()
        if bundled is not None:
            print(f"no bundled student yet: the bundled teacher ({bundled.teacher}) samples the clip "
                  "bidirectionally instead of streaming it", file=sys.stderr)
            return Weights(bundled.teacher, bundled.autoencoder, None, TEACHER, bundled=True)
    return choose_weights(dit, vae, random_weights)


def run_sim(out: Path, *, task: str = "dual_pick", num_frames: int = 49, seed: int = 0,
            height: int | None = None, width: int | None = None, episode_frames: int | None = None,
            dit: str | None = None, vae: str | None = None, fp8: bool = False, tae: str | None = None,
            fp8_scales: str | None = None, vae_fp8_scales: str | None = None, random_weights: bool = False,
            steps: int | None = None) -> dict:
    """Demo v0 on the synthetic world: one generated episode → causal rollout from its first frame
    (a teacher: `steps` sampler steps over 1 + 4k frames, default 8; a student streams `steps`
    denoising passes per block, default its own).
    `height`/`width` default to the bundled weights' training size (the tiny networks: 96×160).
    `episode_frames` (default: the sim's 113) shortens the episode (its script is time-compressed,
    so it may fail its goal check; the demo reports that and carries on). `tae`: a tiny autoencoder
    that decodes the rollout instead of the VAE (an official taew2_2 .pth/.safetensors, or a trained
    tiny decoder's directory: `assemble.decoder_checkpoint`).
    Bundled weights were trained with the task's hashed prompt (`rynn_jax.text`) and get it here."""
    check_model_flags(dit=dit, vae=vae, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales, tae=tae)
    weights = sim_weights(dit, vae, random_weights).with_student_steps(steps)
    teacher = weights.label == TEACHER
    if teacher and tae is not None:
        raise errors.UsageError("--tae: decodes a streamed student's rollout; the bundled teacher has none",
                                fix="give --dit/--vae (with 48-channel latents) as well")
    if height is None or width is None:
        height, width = recipe.RESOLUTION if teacher else weights.resolution(TINY_SIM_RESOLUTION)
    check_resolution(height, width)
    if teacher:
        check_clip_frames(num_frames)
    from rynn_jax.sim import episode as sim_episode
    from rynn_jax.sim import scenes

    if task not in scenes.TASKS:
        raise errors.UsageError(f"--task {task}: unknown", fix=f"choose from {', '.join(scenes.TASKS)}")
    if num_frames < 1 or (episode_frames is not None and episode_frames < 1):
        raise errors.UsageError(f"--frames {num_frames} / --episode-frames {episode_frames}: must be ≥ 1")
    errors.writable_dir(out, "--out")
    timings: dict[str, float] = {}

    def context_for(dit_cfg) -> np.ndarray:
        return text_contexts(None, None, dit_cfg.text_len, dit_cfg.text_dim,
                             hashed=weights.bundled)(scenes.DESCRIPTIONS[task])

    def world_model():
        """Build the causal student and compile all its programs (`StreamingSession.compile`);
        the teacher compiles on its first call."""
        t0 = time.perf_counter()
        if teacher:
            model = build_world_model(weights.dit, weights.vae, seed)
            timings["world_model_build"] = time.perf_counter() - t0
            return model, context_for(model.dit_cfg)
        sess = session_for(weights, seed, fp8=fp8, fp8_scales=fp8_scales, vae_fp8_scales=vae_fp8_scales, tae=tae)
        context = context_for(sess.dit_cfg)[None]
        sess.compile((1, height, width, 3), context.shape)
        timings["world_model_build_compile"] = time.perf_counter() - t0
        return sess, context

    # The simulator (MuJoCo, retargeting compiles) and the world model's compiles are independent:
    # overlap them (XLA compiles and MuJoCo release the GIL), which nearly halves a cold demo run.
    bar = tqdm(total=3, desc="demo v0", unit="stage")
    bar.set_postfix_str(f"simulate {task} (world model compiling alongside)")
    t = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        pending = pool.submit(world_model)
        ep = sim_episode.generate(task, seed, resolution=(height, width),
                                  num_frames=episode_frames or sim_episode.DEFAULT_FRAMES)
        timings["simulate_and_render"] = time.perf_counter() - t
        bar.update()
        bar.set_postfix_str("compile world model")
        session, ctx = pending.result()
    bar.update()
    t = time.perf_counter()
    if teacher:
        steps = TEACHER_STEPS if steps is None else steps
        bar.set_postfix_str(f"teacher: {steps} sampler steps")
        n = 1 + 4 * ((min(num_frames, len(ep.rgb)) - 1) // 4)
        video = session.generate(jax.random.key(seed), ep.rgb[0], ep.skeleton_rgb[:n], ctx,
                                 SamplingConfig(num_steps=steps))
        timings["teacher_sample_with_compile"] = time.perf_counter() - t
    else:
        bar.set_postfix_str("causal rollout")
        to_unit = lambda x: np.asarray(x, np.float32)[None] / 127.5 - 1.0  # noqa: E731
        session.start(to_unit(ep.rgb[0]), ctx, jax.random.key(seed))
        generated, used = [], 0
        while used < min(num_frames, len(ep.rgb)):
            n = session.frames_needed
            if used + n > len(ep.skeleton_rgb):
                break
            rgb = session.step(to_unit(ep.skeleton_rgb[used:used + n]))
            generated.append(np.asarray(rgb[0]))
            used += n
        video = np.clip((np.concatenate(generated) + 1.0) * 127.5, 0, 255).round().astype(np.uint8)
        timings["causal_rollout"] = time.perf_counter() - t
    bar.update()
    bar.close()
    n = len(video)
    truth, skeleton, actions = ep.rgb[:n], ep.skeleton_rgb[:n], ep.actions[:n]
    fps = int(streams.VIDEO_FPS)
    summary = {"world": "sim", "task": task, "seed": seed, "episode_success": ep.success,
               "episode_failures": ep.failures, "frames": n, "resolution": [height, width],
               "actions_shape": list(actions.shape), "weights": weights.label,
               **psnr_vs_truth(video, truth),
               "sampling": ({"teacher": dataclasses.asdict(SamplingConfig(num_steps=steps))} if teacher
                            else {"student": student_lib.StudentSpec.to_json(weights.spec)} if weights.spec
                            else {"causal": "tiny rolling cache"}),
               "dit_fp8": fp8, "dit_fp8_activations": session.dit_cfg.fp8_activations if fp8 else None,
               "decoder": "tiny autoencoder" if tae else "vae",
               "ik_pos_err_mm_median": ep.info["ik_pos_err_mm_median"],
               "seconds": {k: round(v, 3) for k, v in timings.items()}, "backend": jax.default_backend(),
               "layout": "side_by_side.mp4 = generated | ground truth | skeleton"}
    with staged_files(out) as tmp:
        save_video(tmp / "generated.mp4", video, fps=fps)
        save_video(tmp / "ground_truth.mp4", truth, fps=fps)
        save_video(tmp / "skeleton.mp4", skeleton, fps=fps)
        save_video(tmp / "side_by_side.mp4", np.concatenate([video, truth, skeleton], axis=2), fps=fps)
        np.savez_compressed(tmp / "episode.npz", frames=video, ground_truth=truth, skeleton=skeleton,
                            actions=actions, states=ep.states[:n], t=ep.t[:n], action_names=np.asarray(ACTION_NAMES))
        (tmp / "summary.json").write_text(json.dumps(summary, indent=1))
    return summary


def psnr_vs_truth(video: np.ndarray, truth: np.ndarray) -> dict[str, float]:
    """Mean PSNR (dB) of frames 1.. (frame 0 is the given reference) against the ground truth, and
    of the copy-first-frame baseline (a world model that never moves), by the evaluation's metric."""
    if len(video) < 2:
        return {}
    mean = lambda pred: round(metrics.video_mean(metrics.psnr(pred, truth), skip_first=True), 3)  # noqa: E731
    return {"psnr_vs_truth_db": mean(video), "copy_first_frame_psnr_db": mean(np.repeat(truth[:1], len(truth), 0))}


def main(argv: list[str] | None = None) -> None:
    p = errors.ArgumentParser(prog="python serve.py demo", description=__doc__, epilog="""examples:
  python serve.py demo --world sim --out outputs/demo     # one MuJoCo episode → causal world model
  python serve.py demo --resolution 96x160                # the bundled sample, small and fast
  python serve.py demo --dit weights/dit --vae weights/vae --frames 81   # converted weights""")
    p.add_argument("--out", default="outputs/demo", help="output directory (created)")
    p.add_argument("--frames", type=int, default=None,
                   help="video frames, 1 + 4k (81 = one paper chunk; default 17, --world sim 49)")
    p.add_argument("--steps", type=int, default=None,
                   help=f"a teacher's sampler steps (default {TEACHER_STEPS}; the reference uses 50), or a streamed "
                        "student's denoising passes per block (default: its own, 4 for the bundled one; 2 streams "
                        "faster at the same held-out PSNR, docs/PERFORMANCE.md)")
    p.add_argument("--seed", type=int, default=None,
                   help="noise and tiny-model init; --world sim: also the episode's (default "
                        f"{recipe.HELDOUT_SEED}, the synthetic recipes' first held-out seed; else 0)")
    p.add_argument("--sample", default=str(SAMPLE_DIR), help="directory with operator_stream.npz + reference.png")
    p.add_argument("--dit", default=None, help="converted DiT or exported student directory (default: the "
                   "bundled student, weights/synthetic/student, when present)")
    p.add_argument("--vae", default=None, help="converted VAE directory (default: the bundled autoencoder)")
    p.add_argument("--random-weights", action="store_true",
                   help="tiny random networks instead of the bundled weights (shape and timing work)")
    p.add_argument("--text", default=None, help="precomputed umT5 embedding (.safetensors)")
    p.add_argument("--world", default="sample", choices=["sample", "sim"],
                   help="sample: the bundled stream + image; sim: generate a MuJoCo episode (rynn_jax.sim)")
    p.add_argument("--task", default="dual_pick", help="--world sim: dual_pick, push_block, bimanual_lift, lid_placement")
    p.add_argument("--resolution", default=None, type=errors.height_width,
                   help="HxW, multiples of 32 (default: the bundled student's 128x224; with tiny random "
                        "networks 96x160 for --world sim, the reference picture's size (480x832) for the sample)")
    p.add_argument("--episode-frames", type=int, default=None,
                   help="--world sim: episode length (default 113 = 7 s); shorter runs faster, e.g. in CI")
    p.add_argument("--fp8", action="store_true",
                   help="serve the DiT with FP8 block linears (H200: 32 → 36 FPS streaming; docs/PERFORMANCE.md)")
    p.add_argument("--fp8-scales", default=None, metavar="FILE",
                   help="with --fp8: static activation scales from `serve.py calibrate-fp8` (faster than "
                        "per-token scales: H200 streaming 80.4–84.6 vs 80.1–80.2 FPS)")
    p.add_argument("--vae-fp8-scales", default=None, metavar="FILE",
                   help="with --vae: decode with FP8 convs and these static scales (`serve.py calibrate-vae-fp8`; "
                        "Hopper GPUs, emulated elsewhere): H200 36.0 vs ≈ 49–50 ms per 480×832 decode chunk")
    p.add_argument("--tae", default=None, metavar="CKPT",
                   help="decode with this tiny autoencoder: an official taew2_2 checkpoint (.pth or .safetensors; "
                        "needs --dit/--vae with 48-channel latents; ≈ 0.5 instead of 12.7 ms per 480×832 frame on "
                        "an H200, lower fidelity) or a trained tiny decoder's directory")
    p.add_argument("--decoder", default="vae", choices=DECODERS,
                   help="tiny: the bundled autoencoder's trained tiny decoder (weights/synthetic/tiny_decoder, "
                        "configs/synthetic_decoder.py:tae) instead of its own decoder, for real-time CPU streaming")
    p.add_argument("--compile-cache", default=None, metavar="DIR",
                   help="persistent XLA compilation cache: later runs skip compiling (rynn_jax.compile_cache)")
    a = p.parse_args(argv)
    a.tae = decoder_checkpoint(a.decoder, a.tae, dit=a.dit, vae=a.vae, random_weights=a.random_weights)
    if a.compile_cache:
        compile_cache.enable(a.compile_cache)
    if a.world == "sim":
        height, width = a.resolution or (None, None)
        summary = run_sim(Path(a.out), task=a.task, num_frames=49 if a.frames is None else a.frames,
                          seed=recipe.HELDOUT_SEED if a.seed is None else a.seed, height=height, width=width,
                          episode_frames=a.episode_frames, dit=a.dit, vae=a.vae, fp8=a.fp8, tae=a.tae,
                          fp8_scales=a.fp8_scales, vae_fp8_scales=a.vae_fp8_scales,
                          random_weights=a.random_weights, steps=a.steps)
        print(json.dumps(summary, indent=1))
        print(f"outputs in {os.path.abspath(a.out)}:\n"
              "  side_by_side.mp4  generated | ground truth | skeleton\n"
              "  generated.mp4, ground_truth.mp4, skeleton.mp4\n"
              f"  episode.npz       frames + {summary['actions_shape']} actions (54-D joint commands at 16 fps)\n"
              "  summary.json")
        return
    summary = run(Path(a.out), num_frames=17 if a.frames is None else a.frames, steps=a.steps, seed=a.seed or 0,
                  sample_dir=Path(a.sample),
                  dit=a.dit, vae=a.vae, text=a.text, fp8=a.fp8, fp8_scales=a.fp8_scales,
                  vae_fp8_scales=a.vae_fp8_scales, resolution=a.resolution, random_weights=a.random_weights,
                  tae=a.tae)
    print(json.dumps(summary, indent=1))
    print(f"outputs in {os.path.abspath(a.out)}:\n"
          "  side_by_side.mp4  generated | skeleton\n"
          "  generated.mp4, skeleton.mp4\n"
          f"  episode.npz       frames + {summary['actions_shape']} actions (54-D joint commands at 16 fps)\n"
          "  summary.json")


if __name__ == "__main__":
    sys.exit(errors.run(main))
