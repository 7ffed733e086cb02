"""The lab's stand-in for a failed reconcile, and keeping its give-ups off the log.

A queue that is shutting down takes no retries, so the runner gives up a key
whose reconcile fails then, with a WARNING naming the key. For the lab's own
simulated failures that is expected, and the lab counts those keys itself;
``quiet_simulated_give_ups`` drops just those lines while a run lasts. Any
other error is still logged.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["SimulatedFailure", "quiet_simulated_give_ups"]


class SimulatedFailure(Exception):
    """The lab's stand-in for a reconcile that failed (the API server said no)."""


class _DropSimulated(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args if isinstance(record.args, tuple) else ()
        return not any(isinstance(arg, SimulatedFailure) for arg in args)


@contextmanager
def quiet_simulated_give_ups() -> Iterator[None]:
    """Within: the ``keyqueue`` logger drops records about a ``SimulatedFailure``."""
    logger = logging.getLogger("keyqueue")
    drop = _DropSimulated()
    logger.addFilter(drop)
    try:
        yield
    finally:
        logger.removeFilter(drop)
