"""The error convention of every command-line entry point.

A user's mistake — a flag, a config field, a missing or unreadable file — raises a `UserError`
whose message names the culprit (the flag or the file) and, where there is one, the fix. The
entry point (`run`) prints it as one line and exits with its code: 2 for usage (flags, config
fields), 1 for data (a file's content). Everything else is a bug in this project and keeps its
traceback; `--debug` shows the traceback of user errors too.

    def main(argv=None):
        p = errors.ArgumentParser(prog="python -m rynn_jax.x", description=__doc__)
        ...
        if not os.path.exists(a.src):
            raise errors.InputError(f"{a.src}: no such file", fix="give the converted DiT directory")

    if __name__ == "__main__":
        sys.exit(errors.run(main))

`UserError` subclasses `ValueError`, so library callers that catch `ValueError` keep working.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from typing import Any

EXIT_DATA, EXIT_USAGE, EXIT_INTERRUPTED = 1, 2, 130


class UserError(ValueError):
    """A mistake in what the user gave; printed as one line, no traceback."""

    exit_code = EXIT_DATA

    def __init__(self, message: str, *, fix: str = ""):
        self.fix = fix
        super().__init__(message + (f"; {fix}" if fix else ""))


class UsageError(UserError):
    """A flag, argument or config field that is wrong or inconsistent with another (exit 2)."""

    exit_code = EXIT_USAGE


class InputError(UserError):
    """A file that is missing, unreadable or holds the wrong content (exit 1)."""

    exit_code = EXIT_DATA


class MissingFileError(InputError, FileNotFoundError):
    """A file or directory that does not exist (also a `FileNotFoundError`)."""


def one_line(message: str) -> str:
    return "; ".join(part.strip() for part in str(message).splitlines() if part.strip())


def run(main: Callable[[list[str]], Any], argv: Sequence[str] | None = None) -> int:
    """Call `main(argv)` and turn its outcome into an exit code: 0 (or main's int), a user
    error's code with one `error: …` line on stderr, 130 on Ctrl-C. `--debug` in argv re-raises
    user errors with their traceback. Real bugs propagate (Python prints them and exits 1)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    try:
        result = main(argv)
    except UserError as e:
        if debug:
            traceback.print_exc()
        print(f"error: {one_line(str(e))}", file=sys.stderr)
        return e.exit_code
    except KeyboardInterrupt:
        if debug:
            traceback.print_exc()
        print("interrupted (nothing half-written is left behind)", file=sys.stderr)
        return EXIT_INTERRUPTED
    except SystemExit as e:  # --help, or a command that decided its own code
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    return result if isinstance(result, int) and not isinstance(result, bool) else 0


class HelpFormatter(argparse.RawDescriptionHelpFormatter, argparse.ArgumentDefaultsHelpFormatter):
    """The module docstring as written (examples stay examples), and every option's default."""


class ArgumentParser(argparse.ArgumentParser):
    """argparse with the project's conventions: defaults in --help, a `--debug` flag, and usage
    errors raised as `UsageError` (one line, exit 2) instead of argparse's usage dump."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", HelpFormatter)
        super().__init__(*args, **kwargs)
        self.add_argument("--debug", action="store_true",
                          help="show the full traceback of an error (else one line)")

    def error(self, message: str):  # argparse's hook for bad flags
        raise UsageError(f"{self.prog}: {message}", fix="see --help")


def height_width(text: str) -> tuple[int, int]:
    """argparse type for --resolution: "HxW" → (H, W)."""
    parts = text.lower().split("x")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        raise argparse.ArgumentTypeError(f"expected HxW such as 96x160, got {text!r}")
    return int(parts[0]), int(parts[1])


def existing(path: str | os.PathLike[str], flag: str, *, kind: str = "file or directory") -> str:
    """`path` unchanged, or a MissingFileError naming `flag` when nothing is there."""
    path = os.fspath(path)
    if not os.path.exists(path):
        raise MissingFileError(f"{flag} {path}: no such {kind}")
    if kind == "file" and not os.path.isfile(path):
        raise InputError(f"{flag} {path}: not a file")
    if kind == "directory" and not os.path.isdir(path):
        raise InputError(f"{flag} {path}: not a directory")
    return path


def writable_dir(path: str | os.PathLike[str], flag: str) -> str:
    """Check, before any work starts, that the output directory `path` can be created (or
    written, if it exists); a UsageError naming `flag` otherwise. Creates nothing: a run that
    fails later on another check leaves no empty directory behind."""
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UsageError(f"{flag} {path}: exists and is not a directory", fix="give a directory")
    parent = os.path.abspath(path)
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise UsageError(f"{flag} {path}: {parent} is a file, not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {path}: {parent} is not writable", fix="choose a directory you can write")
    return path
