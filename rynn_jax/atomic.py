"""Atomic outputs: a file or a set of files appears whole or not at all.

Writers fill a temporary name beside the final one (same directory, so the rename is atomic on
POSIX file systems; same extension, for writers that pick the format from it), then rename it.
An error, Ctrl-C included, removes the temporary: a failed run leaves nothing a re-run trips over.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield a temporary path to write; it becomes `path` when the block ends without an error.
    The folder is created."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


TMP_DIR_SUFFIX = ".tmp"


def is_partial_dir(path: str | os.PathLike[str]) -> bool:
    """A directory `atomic_dir` is still filling (or left behind by a killed writer)."""
    return os.fspath(path).rstrip("/").endswith(TMP_DIR_SUFFIX)


@contextlib.contextmanager
def atomic_dir(final: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty `<final>.tmp` to fill; when the block ends without an error it replaces
    `final`, so a directory without the suffix is always whole (on an error the `.tmp` stays for
    inspection; the next `atomic_dir` of the same name clears it)."""
    final = Path(final)
    tmp = final.with_name(final.name + TMP_DIR_SUFFIX)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    yield tmp
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)


@contextlib.contextmanager
def staged_files(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty staging folder inside `out`; when the block ends without an error each file
    written there replaces its namesake in `out` (other files in `out` are kept)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    stage = out / f".staging-{os.getpid()}"
    shutil.rmtree(stage, ignore_errors=True)
    stage.mkdir()
    try:
        yield stage
        for f in sorted(stage.iterdir()):
            os.replace(f, out / f.name)
    finally:
        shutil.rmtree(stage, ignore_errors=True)
