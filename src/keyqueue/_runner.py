"""The worker runner: get → handle → forget/retry → done, right every time.

``settle`` holds the outcome rules; ``run_workers`` (threads) and
``arun_workers`` (asyncio) only differ in how they wait and call the handler.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ._errors import Empty, ShutDown
from ._threading import WorkQueue

__all__ = ["PermanentError", "Requeue", "run_workers", "settle"]

K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)

logger = logging.getLogger("keyqueue")

_POLL = 0.05  # wall seconds a worker waits in get before re-checking ``stop``


@dataclass(frozen=True, slots=True)
class Requeue:
    """Return this from a handler to check the key again ``after`` seconds.

    The key's failure history is forgotten first: this is a deliberate re-check
    (say, waiting for a resource to become ready), not a failure.
    """

    after: float = 0.0

    def __post_init__(self) -> None:
        if isinstance(self.after, bool) or not isinstance(self.after, int | float):
            raise TypeError(f"Requeue(after=...) must be seconds, got {self.after!r}")
        if math.isnan(self.after):
            raise ValueError("Requeue(after=...) must be a number of seconds, got nan")


class PermanentError(Exception):
    """Raise from a handler when retrying cannot help: the key is forgotten, not retried."""


class _Settleable(Protocol[K_contra]):
    def forget(self, key: K_contra) -> None: ...
    def add_after(self, key: K_contra, seconds: float) -> None: ...
    def retry(self, key: K_contra) -> bool: ...


def settle(
    queue: _Settleable[K], key: K, result: object, error: BaseException | None
) -> BaseException | None:
    """Apply a handler's outcome to ``key`` (still held); the error if it was given up.

    - returned ``None``: forget (success);
    - returned ``Requeue(after=s)``: forget, then ``add_after(key, s)``;
    - raised ``PermanentError``: forget, no retry, logged;
    - raised anything else (or returned anything else): ``retry(key)``; when that
      gives up, forget and return the error so the caller runs ``on_give_up``.
    """
    if error is None:
        if result is None:
            queue.forget(key)
            return None
        if isinstance(result, Requeue):
            queue.forget(key)
            queue.add_after(key, result.after)
            return None
        error = TypeError(f"handler returned {result!r} for {key!r}; expected None or Requeue")
    if isinstance(error, PermanentError):
        logger.warning("key %r failed permanently, not retrying: %s", key, error)
        queue.forget(key)
        return None
    if queue.retry(key):
        logger.debug("key %r failed, will retry: %r", key, error)
        return None
    logger.warning("key %r failed too often, giving up: %r", key, error)
    queue.forget(key)
    return error


def _give_up(
    on_give_up: Callable[[Any, BaseException], object] | None, key: Any, error: BaseException
) -> None:
    if on_give_up is None:
        return
    try:
        on_give_up(key, error)
    except Exception:
        logger.exception("on_give_up(%r) raised", key)


def run_workers(
    queue: WorkQueue[K],
    handler: Callable[[K], Requeue | None],
    workers: int = 1,
    stop: threading.Event | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
) -> None:
    """Run ``workers`` threads that process keys from ``queue`` with ``handler``.

    Blocks until the queue is shut down and drained (every worker saw
    ``ShutDown``), or until ``stop`` is set; then each worker finishes the key it
    holds and exits. Per key: ``None`` → forget; ``Requeue(after=s)`` → forget and
    ``add_after``; ``PermanentError`` → forget, logged; any other exception →
    ``retry``, and on give-up forget and ``on_give_up(key, exc)``. ``done`` is
    always called. The queue guarantees a handler never runs twice at once for
    one key. If the calling thread is interrupted (Ctrl-C), workers finish their
    keys and stop before the exception propagates.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {handler!r}")
    halt = threading.Event()
    crashed: list[BaseException] = []

    def stopping() -> bool:
        return halt.is_set() or (stop is not None and stop.is_set())

    def work() -> None:
        while not stopping():
            try:
                key = queue.get(timeout=_POLL)
            except Empty:
                continue
            except ShutDown:
                return
            try:
                result: object = None
                error: BaseException | None = None
                try:
                    result = handler(key)
                except Exception as exc:
                    error = exc
                gave_up = settle(queue, key, result, error)
                if gave_up is not None:
                    _give_up(on_give_up, key, gave_up)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit in a handler
                crashed.append(exc)
                halt.set()
                return
            finally:
                queue.done(key)

    threads = [
        threading.Thread(target=work, name=f"keyqueue-worker-{queue.name}-{i}", daemon=True)
        for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:
        halt.set()
        for thread in threads:
            thread.join()
        raise
    if crashed:
        raise crashed[0]
