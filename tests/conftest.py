"""Shared test setup: CPU only, deterministic, quiet."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
