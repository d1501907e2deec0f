"""Evaluate a world model against ground-truth episodes: PSNR, SSIM, LPIPS, robot-region PSNR, depth
and flow errors, FVD, baselines, plots and a report (rynn_jax/eval/, docs/eval.md).

    python eval.py --model teacher --dit DIR --vae DIR --episodes data/sim_heldout --out eval/teacher
    python eval.py --model student --dit DIR --vae DIR --episodes data/sim_heldout --out eval/student
    python eval.py --model student --dit weights/synthetic/student --vae weights/synthetic/autoencoder \
        --episodes data/synthetic/heldout_long --frames 481 --out eval/drift   # PSNR per 80-frame chunk
    python eval.py --model generated --generated data/robot_generated --episodes data/robot --out eval/gen
    python eval.py --model world4d --dit DIR --vae weights/synthetic/autoencoder --episodes data/synthetic/heldout \
        --text-embeddings data/synthetic/text_embeddings --out eval/world4d    # RGB + depth + flow
    python eval.py --model autoencoder --vae weights/synthetic/autoencoder --episodes data/synthetic/heldout \
        --out eval/autoencoder    # the round trip alone, scored like a model (depth, flow where present)

Re-running the same command resumes (finished episodes are kept); the report is rewritten.
"""

from __future__ import annotations

import sys

from rynn_jax import compile_cache, errors
from rynn_jax.errors import height_width
from rynn_jax.eval.report import CHUNK_FRAMES, summary_lines
from rynn_jax.eval.run import MODELS, EvalConfig, evaluate


def main(argv: list[str] | None = None) -> dict:
    p = errors.ArgumentParser(prog="python eval.py", description=__doc__)
    p.add_argument("--model", required=True, choices=MODELS,
                   help="teacher (bidirectional sampler), student (causal StreamingSession), world4d (RynnWorld-4D: "
                        "RGB, depth, flow from the first frame and its depth), generated (score the videos under "
                        "--generated), or autoencoder (the --vae round trip alone: the ceiling of any model in its "
                        "latent space; depth and flow too where the episodes have them)")
    p.add_argument("--episodes", required=True, help="ground-truth episodes (robot layout, e.g. sim held-out)")
    p.add_argument("--out", required=True, help="output directory (re-run to resume)")
    p.add_argument("--generated", default=None, help="--model generated: root of episodes named as under --episodes")
    p.add_argument("--dit", default=None, help="converted DiT directory (load_dit; world4d: load_dit4d); neither "
                   "--dit nor --vae: tiny random")
    p.add_argument("--vae", default=None, help="converted VAE directory (load_vae)")
    p.add_argument("--frames", type=int, default=33,
                   help="frames compared per episode (teacher, world4d: 1 + 4k, rounded down)")
    p.add_argument("--resolution", type=height_width, default=None,
                   help="HxW to evaluate at (default: the generated / ground-truth video's own)")
    p.add_argument("--steps", type=int, default=8, help="teacher / world4d sampler steps")
    p.add_argument("--max-episodes", type=int, default=None, help="only the first K episodes (sorted by name)")
    p.add_argument("--seed", type=int, default=0, help="noise seed (each episode's key folds in its name)")
    p.add_argument("--swap", action="store_true",
                   help="also generate each episode with the next episode's skeleton (control-following check)")
    p.add_argument("--shift-frames", type=int, default=4, help="delay of the shifted-truth baseline, frames")
    p.add_argument("--chunk-frames", type=int, default=CHUNK_FRAMES,
                   help="drift: PSNR per chunk of this many frames (80: one re-anchored student chunk)")
    p.add_argument("--no-fvd", action="store_true", help="skip I3D features and FVD")
    p.add_argument("--text", default=None, help="one umT5 embedding (.safetensors) for every prompt")
    p.add_argument("--text-embeddings", default=None, metavar="DIR", help="DIR/<sha256(task description)>.safetensors")
    p.add_argument("--batch", type=int, default=1,
                   help="teacher / student: episodes generated per model call (GPU; scores equal up to rounding)")
    p.add_argument("--compile-cache", default=None, metavar="DIR", help="persistent XLA compilation cache")
    a = p.parse_args(argv)
    try:
        cfg = EvalConfig(model=a.model, episodes=a.episodes, out=a.out, generated=a.generated, dit=a.dit, vae=a.vae,
                         frames=a.frames, resolution=a.resolution, steps=a.steps, max_episodes=a.max_episodes,
                         seed=a.seed, swap=a.swap, shift_frames=a.shift_frames, fvd=not a.no_fvd, text=a.text,
                         chunk_frames=a.chunk_frames, text_embeddings=a.text_embeddings, batch=a.batch)
    except ValueError as e:
        raise errors.UsageError(str(e)) from None
    # Every input and the output directory checked before a model is built or compiled.
    errors.existing(a.episodes, "--episodes", kind="directory")
    for flag, path, kind in (("--generated", a.generated, "directory"), ("--dit", a.dit, "file or directory"),
                             ("--vae", a.vae, "file or directory"), ("--text", a.text, "file"),
                             ("--text-embeddings", a.text_embeddings, "directory")):
        if path is not None:
            errors.existing(path, flag, kind=kind)
    errors.writable_dir(a.out, "--out")
    if a.compile_cache:
        compile_cache.enable(a.compile_cache)
    summary = evaluate(cfg)
    print("\n".join(summary_lines(summary)))
    print(f"{summary['episodes']} episodes; all numbers in {a.out}/metrics.json, report: {a.out}/report.md")
    return summary


if __name__ == "__main__":
    sys.exit(errors.run(main))
