"""Serving entry point.

    python serve.py demo [--out outputs/demo]   # digital-teleoperation demo (bundled sample)
    python serve.py generate --streams DIR --out DIR [--batch B]   # many streams → robot episodes (training data)
    python serve.py calibrate-fp8 --latents SHARDS --out scales.safetensors   # FP8 static activation scales
    python serve.py calibrate-vae-fp8 --latents SHARDS --vae DIR --out vae_scales.safetensors   # the VAE's
"""

import sys

from rynn_jax.teleop import calibrate_fp8, demo, generate


def main() -> None:
    commands = {"demo": demo.main, "generate": generate.main, "calibrate-fp8": calibrate_fp8.main,
                "calibrate-vae-fp8": calibrate_fp8.main_vae}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python serve.py {{{','.join(commands)}}} [options]  (-h for a command's options)")
        raise SystemExit(2)
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
