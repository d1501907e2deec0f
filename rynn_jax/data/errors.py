"""Bad-data policy: a bad episode or clip is skipped with a logged reason and a counter, or — in
strict mode — raised as a `DataError` naming the file. A reader never returns a silently wrong
sample: every check that fails raises `DataError`, and only the pipeline decides skip vs raise.

Counters are per process (grain worker processes keep their own); the index scan, which finds
most problems (unreadable files, missing joints, NaNs, too-short episodes), runs in the main
process, so its counts are the ones a training log reports.
"""

from __future__ import annotations

import collections
import logging
import threading

from rynn_jax.errors import InputError

log = logging.getLogger("rynn_jax.data")


class DataError(InputError):
    """A file that cannot produce a correct sample. `path` names it, `reason` is a short tag.
    (A user input error: entry points print it as one line, exit 1; also a ValueError.)"""

    def __init__(self, path: str, reason: str, detail: str = ""):
        self.path, self.reason, self.detail = str(path), reason, detail
        super().__init__(f"{self.path}: {reason}" + (f" ({detail})" if detail else ""))


class SkipCounter:
    """Thread-safe counts of skipped items by reason, with the last path seen for each."""

    def __init__(self):
        self._lock = threading.Lock()
        self.counts: collections.Counter[str] = collections.Counter()
        self.last_path: dict[str, str] = {}

    def record(self, err: DataError) -> None:
        with self._lock:
            self.counts[err.reason] += 1
            self.last_path[err.reason] = err.path
        log.warning("skipping bad data: %s", err)

    def total(self) -> int:
        return sum(self.counts.values())

    def reset(self) -> None:
        with self._lock:
            self.counts.clear()
            self.last_path.clear()


SKIPPED = SkipCounter()  # the process-wide counter every reader reports to


def handle(err: DataError, strict: bool, counter: SkipCounter = SKIPPED) -> None:
    """Raise `err` in strict mode, else count and log it."""
    if strict:
        raise err
    counter.record(err)
