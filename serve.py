"""Serving entry point.

    python serve.py demo [--out outputs/demo]   # digital-teleoperation demo (bundled sample)
"""

import sys

from rynn_jax.teleop import demo


def main() -> None:
    commands = {"demo": demo.main}
    if len(sys.argv) < 2 or sys.argv[1] not in commands:
        print(f"usage: python serve.py {{{','.join(commands)}}} [options]  (-h for a command's options)")
        raise SystemExit(2)
    commands[sys.argv[1]](sys.argv[2:])


if __name__ == "__main__":
    main()
