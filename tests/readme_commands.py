"""README's commands against the code: every `python …` command in README.md's shell code blocks
is checked to name an entry point that exists and to pass its argument parser (flags, choices,
required arguments) — in-process, without running it. `--run` also runs each at toy size.

    python -m tests.readme_commands          # parse check (what tests/test_readme_commands.py does)
    python -m tests.readme_commands --run    # and run each command at toy size, in a temporary folder

README.md is read when this runs, so edits to it are checked as they are. Commands that are not a
project entry point (`./setup.sh`, `pytest`) are listed as skipped; so, under `--run`, are those
whose input files (official weights) cannot exist here.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import re
import shlex
import sys
import tempfile
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = {"serve.py": "serve", "train.py": "train", "distill.py": "distill", "eval.py": "eval"}
# Extra arguments that make a command toy-sized (a later flag overrides an earlier one).
TOY = {
    "serve.py demo": ["--resolution", "32x64", "--frames", "5", "--episode-frames", "17", "--steps", "1"],
    "serve.py generate": ["--frames", "5", "--resolution", "32x64"],
    "train.py": ["--set", "total_steps=2", "--set", "log.progress=False"],
    "distill.py": ["--set", "total_steps=2", "--set", "log.progress=False"],
    "-m rynn_jax.sim.cli": ["--resolution", "tiny", "--frames", "17", "--workers", "0"],
}

# Commands that --run parses but does not run: they serve until stopped (their own tests run them).
NOT_RUN = {"serve.py live": "a server (tests/test_live.py runs it)"}


def shell_commands(readme: str) -> list[str]:
    """Each command line of the ```bash / ```sh / ```shell blocks: continuations joined, comments
    dropped, `&&` / `;` chains split."""
    out = []
    for block in re.findall(r"```(?:bash|sh|shell|console)\n(.*?)```", readme, flags=re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = re.sub(r"(^|\s)#.*$", "", line).strip().removeprefix("$ ")
            out += [" ".join(c.split()) for c in re.split(r"&&|;", line) if c.strip()]
    return out


def entry_point(argv: list[str]) -> tuple[str, Callable | None, list[str]]:
    """(label, main, its arguments) of a command; main is None for a command that is not ours."""
    if not argv or os.path.basename(argv[0]) not in ("python", "python3"):
        return argv[0] if argv else "", None, []
    if argv[1] == "-m":
        if not argv[2].startswith("rynn_jax"):
            return f"-m {argv[2]}", None, []
        return f"-m {argv[2]}", importlib.import_module(argv[2]).main, argv[3:]
    script = os.path.basename(argv[1])
    if script not in SCRIPTS:
        raise AssertionError(f"README runs {argv[1]}, which is not an entry point of this repository")
    module = importlib.import_module(SCRIPTS[script])
    label = f"{script} {argv[2]}" if script == "serve.py" and len(argv) > 2 and not argv[2].startswith("-") else script
    return label, module.main, argv[2:]


class _Parsed(Exception):
    pass


@contextlib.contextmanager
def _stop_after_parsing():
    """Every project parser raises `_Parsed` once it has accepted its arguments."""
    from rynn_jax import errors

    real = errors.ArgumentParser.parse_args

    def parse_args(self, args=None, namespace=None):
        raise _Parsed(real(self, args, namespace))

    errors.ArgumentParser.parse_args = parse_args
    try:
        yield
    finally:
        errors.ArgumentParser.parse_args = real


def parse_check(main: Callable, args: list[str]) -> argparse.Namespace:
    """The namespace the command's parser makes of `args`; raises its UsageError otherwise."""
    with _stop_after_parsing():
        try:
            main(list(args))
        except _Parsed as parsed:
            return parsed.args[0]
    raise AssertionError("the command finished without parsing its arguments through errors.ArgumentParser")


def missing_inputs(args: list[str]) -> list[str]:
    """Absolute paths among the arguments that do not exist (official weights, datasets)."""
    return [a for a in args if a.startswith("/") and not os.path.exists(a)]


def check(readme_path: str = os.path.join(ROOT, "README.md"), run: bool = False) -> list[tuple[str, str]]:
    """(command, outcome) for every README command; raises on the first that does not parse or
    (with `run`) fails."""
    from rynn_jax import errors

    results = []
    with open(readme_path) as f:
        commands = shell_commands(f.read())
    for command in commands:
        label, main, args = entry_point(shlex.split(command))
        if main is None:
            results.append((command, f"skipped ({label or 'empty'}: not a project entry point)"))
            continue
        parse_check(main, args)
        outcome = "parsed"
        if run and label in NOT_RUN:
            results.append((command, f"parsed; not run ({NOT_RUN[label]})"))
            continue
        if run:
            missing = missing_inputs(args)
            if missing:
                results.append((command, f"parsed; not run (needs {', '.join(missing)})"))
                continue
            t0 = time.perf_counter()
            code = errors.run(main, [*args, *TOY.get(label, [])])
            if code != 0:
                raise AssertionError(f"README command failed at toy size (exit {code}): {command}")
            outcome = f"parsed; ran at toy size in {time.perf_counter() - t0:.1f} s"
        results.append((command, outcome))
    return results


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", action="store_true", help="also run each command at toy size")
    p.add_argument("--readme", default=os.path.join(ROOT, "README.md"))
    a = p.parse_args(argv)
    readme = os.path.abspath(a.readme)
    with tempfile.TemporaryDirectory() as tmp:
        cwd = os.getcwd()
        os.chdir(tmp if a.run else cwd)  # relative outputs (outputs/demo, weights/…) land in the temporary folder
        try:
            results = check(readme, run=a.run)
        finally:
            os.chdir(cwd)
    for command, outcome in results:
        print(f"{outcome:60s}  {command}")
    return 0


if __name__ == "__main__":
    sys.path.insert(0, ROOT)
    sys.exit(main())
