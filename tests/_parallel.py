"""Test helper: worker subprocesses run side by side (the sharding tests' workers spend their time
tracing and compiling, one core each; CI has two)."""

from __future__ import annotations

import subprocess


def run_workers(argvs: list[list[str]], *, env: dict, cwd: str, timeout: float) -> list[subprocess.CompletedProcess]:
    """Starts every command at once, waits for all; a timeout kills those still running and raises."""
    procs = [subprocess.Popen(argv, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for argv in argvs]
    done = []
    try:
        for argv, proc in zip(argvs, procs):
            stdout, stderr = proc.communicate(timeout=timeout)
            done.append(subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    return done
