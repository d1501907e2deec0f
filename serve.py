"""Serving entry point.

    python serve.py demo [--out outputs/demo]   # digital-teleoperation demo (bundled sample)
    python serve.py generate --streams DIR --out DIR [--batch B]   # many streams → robot episodes (training data)
    python serve.py encode-prompts --checkpoint CKPT --prompts FILE --out DIR   # prompts → umT5 embeddings
    python serve.py live [--port 8765] [--max-sessions B]   # live sessions over WebSocket, page at http://127.0.0.1:8765/
    python serve.py calibrate-fp8 --latents SHARDS --out scales.safetensors   # FP8 static activation scales
    python serve.py calibrate-vae-fp8 --latents SHARDS --vae DIR --out vae_scales.safetensors   # the VAE's
    python serve.py policy --task T --episodes N (--policy DIR | --scripted)   # closed-loop success table

`python serve.py COMMAND --help` lists a command's options with their defaults. Mistakes in flags
or files end in one `error: …` line (exit 2 for flags, 1 for files); `--debug` shows the traceback.
"""

import sys

from rynn_jax import errors

COMMANDS = {"demo": "rynn_jax.teleop.demo:main", "generate": "rynn_jax.teleop.generate:main",
            "encode-prompts": "rynn_jax.text_encoder:main", "live": "rynn_jax.live.server:main",
            "calibrate-fp8": "rynn_jax.teleop.calibrate_fp8:main",
            "calibrate-vae-fp8": "rynn_jax.teleop.calibrate_fp8:main_vae",
            "policy": "rynn_jax.policy.rollout:main"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        raise errors.UsageError(f"serve.py: unknown command {argv[0]!r}", fix=f"choose from {', '.join(COMMANDS)}")
    import importlib  # a command's modules (JAX, MuJoCo) load only once it is chosen

    module, _, fn = COMMANDS[argv[0]].partition(":")
    return getattr(importlib.import_module(module), fn)(argv[1:])


if __name__ == "__main__":
    sys.exit(errors.run(main))
