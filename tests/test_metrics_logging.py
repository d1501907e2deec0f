"""training.metrics.setup_logging: run entry points called in-process (tests, notebooks) log to the
stderr of the moment, and leave other handlers on the root logger alone."""

import io
import logging
import sys

from rynn_jax.training import metrics


def test_setup_logging_follows_stderr_and_keeps_other_handlers(monkeypatch, caplog):
    first = io.StringIO()
    monkeypatch.setattr(sys, "stderr", first)
    metrics.setup_logging()
    metrics.setup_logging()  # idempotent: one stderr handler, not two
    logging.getLogger("rynn_jax.test").info("first line")
    assert first.getvalue().count("first line") == 1
    first.close()  # a captured stream the run outlives
    second = io.StringIO()
    monkeypatch.setattr(sys, "stderr", second)
    logging.getLogger("rynn_jax.test").info("second line")
    assert "second line" in second.getvalue() and "Logging error" not in second.getvalue()
    # pytest's capture handler was not removed, and libraries' INFO chatter stays off
    assert [r.getMessage() for r in caplog.records] == ["first line", "second line"]
    assert logging.getLogger("orbax").getEffectiveLevel() == logging.WARNING
