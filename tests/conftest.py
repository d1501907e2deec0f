"""Shared test setup: CPU only, deterministic, quiet."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# Headless MuJoCo rendering (Debian's libosmesa6, installed by .ci/run); read when mujoco is imported.
os.environ.setdefault("MUJOCO_GL", "osmesa")
