"""Shared test setup: CPU only, deterministic, quiet."""

import os

os.environ.setdefault("JAX_PLATFORMS", "cpu")
# The TPU ahead-of-time tests describe a TPU slice through libtpu, which by default lets one process
# hold it (/tmp/libtpu_lockfile): pytest-xdist's workers all import test_aot.py at collection, and the
# one that lost the race skipped every AOT test. No TPU is opened here, so sharing is safe.
os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
# Headless MuJoCo rendering (Debian's libosmesa6, installed by .ci/run); read when mujoco is imported.
os.environ.setdefault("MUJOCO_GL", "osmesa")
# Hermetic defaults: without --dit/--vae the commands use tiny random networks, whether or not trained
# weights are bundled (tests that want bundled weights point RYNN_JAX_WEIGHTS at them).
os.environ.setdefault("RYNN_JAX_WEIGHTS", os.path.join(os.path.dirname(__file__), "no-bundled-weights"))

import pytest  # noqa: E402


@pytest.fixture
def fast_compile():
    """XLA's cheapest compile for this test (jax_disable_most_optimizations: LLVM -O0 and no
    expensive passes, what FAST_COMPILE gives the subprocess tests), for tests whose time is the
    compiling of many small programs rather than running them. Same programs, same checks: only
    the generated machine code is less optimised (float results equal up to rounding)."""
    import jax

    before = jax.config.read("jax_disable_most_optimizations")
    jax.config.update("jax_disable_most_optimizations", True)
    try:
        yield
    finally:
        jax.config.update("jax_disable_most_optimizations", before)


@pytest.fixture(scope="module", autouse=True)
def _programs_stay_in_their_module():
    """The optimisation setting is not part of JAX's jit cache key: a library function (e.g. the
    retargeting scan) compiled at -O0 by one module (fast_compile, or a module fixture that sets
    jax_disable_most_optimizations itself) would be reused by a later module on the same worker,
    whose exact comparisons then meet a differently rounded program. So the in-memory caches are
    dropped after every module; a module's own fixtures keep theirs while it runs."""
    yield
    import jax

    jax.clear_caches()
