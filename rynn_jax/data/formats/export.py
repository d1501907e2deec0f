"""Robot-layout episode folders → a LeRobot v3 or an RLDS (TFDS) dataset.

    python -m rynn_jax.data.formats.export --format lerobot --episodes data/robot_generated --out data/lerobot
    python -m rynn_jax.data.formats.export --format rlds --episodes data/robot_generated --out data/rlds

`--episodes` is a robot-layout root (data/README.md; what `serve.py generate` and `rynn_jax.sim`
write). LeRobot: the dataset is `--out` itself; RLDS: `--out/rynn_robot/1.0.0`. Re-running brings
an export up to date: LeRobot rewrites only the files whose episodes changed, RLDS rebuilds when
anything changed and does nothing otherwise. A failed or interrupted run leaves the previous
complete dataset (RLDS) or an incomplete one without meta/info.json that the next run finishes
(LeRobot).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence

from rynn_jax import errors

FORMATS = ("lerobot", "rlds")
CODECS = ("libx264", "libsvtav1")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The export settings (shared by this command and `serve.py generate --format`)."""
    p.add_argument("--episodes-per-file", type=int, default=100, help="LeRobot: episodes per data/video file")
    p.add_argument("--codec", default="libx264", choices=CODECS, help="LeRobot: video codec")
    p.add_argument("--crf", type=int, default=12, help="LeRobot: video quality (lower = closer frames, larger files)")
    p.add_argument("--jpeg-quality", type=int, default=95, help="RLDS: JPEG quality of the frames")
    p.add_argument("--rlds-file-format", default="array_record", choices=("array_record", "tfrecord"),
                   help="RLDS: shard format (tfrecord needs TensorFlow)")


def check_arguments(a: argparse.Namespace) -> None:
    if a.episodes_per_file < 1:
        raise errors.UsageError(f"--episodes-per-file {a.episodes_per_file}: must be ≥ 1")
    if not 0 <= a.crf <= 63:
        raise errors.UsageError(f"--crf {a.crf}: must be in [0, 63]")
    if not 1 <= a.jpeg_quality <= 100:
        raise errors.UsageError(f"--jpeg-quality {a.jpeg_quality}: must be in [1, 100]")
    if a.format == "rlds":
        from rynn_jax.data.formats import rlds

        rlds.check_file_format(a.rlds_file_format)


def export(fmt: str, episodes: str, out: str, a: argparse.Namespace) -> dict:
    """Export with the settings parsed by `add_arguments`."""
    if fmt == "lerobot":
        from rynn_jax.data.formats import lerobot

        return lerobot.export(episodes, out, lerobot.LeRobotExportConfig(
            episodes_per_file=a.episodes_per_file, codec=a.codec, crf=a.crf))
    from rynn_jax.data.formats import rlds

    return rlds.export(episodes, out, rlds.RldsExportConfig(jpeg_quality=a.jpeg_quality,
                                                            file_format=a.rlds_file_format))


def main(argv: Sequence[str] | None = None) -> dict:
    p = errors.ArgumentParser(prog="python -m rynn_jax.data.formats.export", description=__doc__)
    p.add_argument("--format", required=True, choices=FORMATS)
    p.add_argument("--episodes", required=True, help="robot-layout root (data/README.md)")
    p.add_argument("--out", required=True, help="dataset directory (created; re-run to update)")
    add_arguments(p)
    a = p.parse_args(argv)
    check_arguments(a)
    errors.existing(a.episodes, "--episodes", kind="directory")
    errors.writable_dir(a.out, "--out")
    if os.path.abspath(a.out).startswith(os.path.join(os.path.abspath(a.episodes), "")):
        raise errors.UsageError(f"--out {a.out}: inside --episodes {a.episodes}",
                                fix="write the dataset beside the episodes, not among them")
    summary = export(a.format, a.episodes, a.out, a)
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    sys.exit(errors.run(main))
