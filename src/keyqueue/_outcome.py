"""What a worker does with a key it holds, once its handler has run: the rules, no I/O.

A handler's outcome becomes queue calls (``forget``, ``retry``, ``add_after``,
``add_rate_limited``, then ``done``), and what those calls answer decides
the next one. The rules are written once, as generators in httpx's auth-flow
manner: ``outcome_flow`` (the outcome) and ``done_flow`` (the ``done``)
each ``yield`` a call to make (a function of no arguments) and are sent back
its value, or thrown the exception it raised (``_flow``). A driver makes
the calls: ``drive`` here and now in a worker thread, ``adrive`` awaiting
what is awaitable (every call of ``AsyncRedisWorkQueue``). So one rule
serves the four queues and both runners, and a driver only calls and waits.

Waiting is a call too. A call that may not have reached the queue (one of
its ``connection_errors``: a lost connection) is asked again after a backoff
(``_BACKOFF_FIRST`` doubling to ``_BACKOFF_MAX``): the flow yields the
driver's ``pause(seconds)``, which waits on the workers' stop signal and
answers True if they go on. Once it answers False the key is not released:
``abandon(key)`` lets a queue with leases stop renewing it, and it comes back
when its lease runs out. A ``done`` that raises (its outcome unknown) is asked
again the same way. Without a ``pause`` nothing is asked again.

Only the handler's own outcome decides what happens to a key: an exception
while applying it is logged with the key and counted, never raised.
``LeaseLost`` (another holder may have the key) is counted once, with one
WARNING, whichever call raised it.
"""

from __future__ import annotations

import functools
import inspect
import logging
import random
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ._checks import check_number, check_priority
from ._dead import PERMANENT as DEAD_PERMANENT
from ._dead import RETRIES as DEAD_RETRIES
from ._dead import SHUTDOWN as DEAD_SHUTDOWN
from ._errors import LeaseLost
from ._flow import Flow, Pause

__all__ = [
    "Outcomes",
    "PermanentError",
    "Queue",
    "Requeue",
    "RunStats",
    "Taking",
    "abandon_flow",
    "backoff",
    "done_flow",
    "jitter",
    "outcome_flow",
    "run_stats",
    "said",
    "say",
]

K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)
G_co = TypeVar("G_co", covariant=True)
T = TypeVar("T")

logger = logging.getLogger("keyqueue")

_BACKOFF_FIRST = 0.05  # wall seconds before a failed get or done is tried again
_BACKOFF_MAX = 2.0  # the pause doubles up to this while the call keeps failing


@dataclass(frozen=True, slots=True)
class Requeue:
    """Return this from a handler to look at the key again later; not a failure.

    ``Requeue()``: a rate-limited requeue, as controller-runtime's
    ``Result{Requeue: true}``: ``add_rate_limited(key)``, so the backoff grows
    with each one; it does not count towards ``max_retries``, and the backoff is
    reset when the handler next returns ``None``.

    ``Requeue(after=s)``: the key's failure history is forgotten, then
    ``add_after(key, s)`` (a deliberate re-check, say waiting for a resource to
    become ready); ``s <= 0`` adds it now, as ``add_after`` does.

    ``priority=p`` (an int, 32-bit) is passed on: the key comes back with
    priority ``p`` (``add_rate_limited(key, priority=p)`` or
    ``add_after(key, s, priority=p)``). A failed key comes back at 0.
    """

    after: float | None = None
    """Seconds until the key is added again (``add_after``), or None for a
    rate-limited requeue (``add_rate_limited``)."""
    priority: int = 0
    """The priority the key comes back with."""

    def __post_init__(self) -> None:
        check_priority(self.priority)  # TypeError/ValueError naming it
        after = self.after
        if after is not None:
            check_number(after, "Requeue(after=...) must be None or a number of seconds")


class PermanentError(Exception):
    """Raise from a handler when retrying cannot help: the key is forgotten, not retried."""


@dataclass(frozen=True, slots=True)
class RunStats:
    """What one ``run_workers``/``arun_workers`` call did: a frozen snapshot.

    Every handler call ends in exactly one outcome, so ``processed`` equals the
    sum of the other seven.
    """

    processed: int = 0
    """Handler calls."""
    succeeded: int = 0
    """Returned ``None``: forgotten."""
    requeued: int = 0
    """Returned a ``Requeue``."""
    retried: int = 0
    """Failed, and ``retry`` put the key back with backoff (also during a drain,
    which waits for it; or, during a shutdown without a drain, kept a key added
    again while it was held: it is handed out once more)."""
    gave_up: int = 0
    """Failed and not retried (``max_retries`` reached, or the queue was shut
    down without a drain and nothing brought the key back): forgotten,
    ``on_give_up`` called. A drain never gives a key up."""
    permanent: int = 0
    """Raised ``PermanentError``: forgotten, not retried."""
    errors: int = 0
    """Applying the outcome raised (``retry``, the rate limiter, ``forget``,
    ``add_after``, ``done``): logged with the key, which is dropped."""
    lease_lost: int = 0
    """The holder's lease expired (``LeaseLost`` from the handler, the outcome or
    ``done``): logged, not retried (another holder may have the key)."""


# The outcomes, named after the RunStats field each one counts in.
SUCCEEDED, REQUEUED, RETRIED, GAVE_UP = "succeeded", "requeued", "retried", "gave_up"
PERMANENT, ERRORS, LEASE_LOST = "permanent", "errors", "lease_lost"
ABANDONED = "abandoned"  # an outcome unanswered when the workers stopped: abandon, no done


def run_stats(tallies: Iterable[Counter[str]]) -> RunStats:
    """Sum per-worker tallies (keyed by RunStats field) into one snapshot."""
    total: Counter[str] = Counter()
    for tally in tallies:
        total.update(tally)
    return RunStats(**total)


class Outcomes(Protocol[K_contra]):
    """The calls ``outcome_flow`` makes on a held key.

    Each call returns its value, or an awaitable of it (``AsyncRedisWorkQueue``:
    ``adrive`` awaits it). A queue may also have ``connection_errors`` (a
    tuple of exception types: a call that raised one may not have reached it)
    and ``abandon(key)`` (let go of a hold without releasing it); the rules
    look for both.
    """

    @property
    def shutting_down(self) -> bool: ...
    def forget(self, key: K_contra) -> object: ...
    def add_after(self, key: K_contra, seconds: float, priority: int = ...) -> object: ...
    def add_rate_limited(self, key: K_contra, priority: int = ...) -> object: ...
    def retry(self, key: K_contra) -> object: ...
    def give_up(self, key: K_contra, reason: str, error: BaseException | None = ...) -> object: ...


class Taking(Outcomes[K_contra], Protocol[K_contra, G_co]):
    """What a runner's workers call (``_source.WorkerSource.queue``): ``get``
    returns ``G_co``, the key for ``run_workers``, an awaitable of it for
    ``arun_workers``; ``interrupt`` wakes the workers waiting in ``get``."""

    @property
    def name(self) -> str: ...
    def get(self) -> G_co: ...
    def add(self, key: K_contra) -> object: ...
    def interrupt(self) -> object: ...


class Queue(Taking[K_contra, G_co], Protocol[K_contra, G_co]):
    """A queue a runner drives: ``WorkQueue``, ``AsyncWorkQueue`` or a Redis queue."""

    def done(self, key: K_contra) -> object: ...


Settled = tuple[str, "BaseException | None"]
"""An outcome (a ``RunStats`` field) and, for a key given up, the error."""


def backoff(previous: float) -> float:
    """The backoff before trying a failed call again: ``_BACKOFF_FIRST`` after
    an answer (``previous`` 0), then doubling up to ``_BACKOFF_MAX``. The
    pause itself is ``jitter`` of it."""
    return _BACKOFF_FIRST if previous <= 0 else min(previous * 2, _BACKOFF_MAX)


def jitter(seconds: float) -> float:
    """A pause drawn between half and all of ``seconds`` ("equal jitter"), so
    workers that failed together do not all ask again together."""
    return seconds * (0.5 + random.random() / 2)


def said(queue: object, exc: BaseException) -> bool:
    """Whether ``queue`` has logged ``exc``'s kind itself (its ``said_errors``,
    say a Redis pool without a free connection: a configuration error said
    once): the runners then ask again without a warning each time."""
    errors = getattr(queue, "said_errors", ())
    return isinstance(errors, tuple) and bool(errors) and isinstance(exc, errors)


def say(exc: BaseException) -> str:
    """``ConnectionError: Connection closed by server.`` (redis-py's repr says
    only ``network:ConnectionError``)."""
    return f"{type(exc).__name__}: {exc}"


class _Abandon(Exception):
    """The workers stopped while an outcome call was still unanswered."""


def _unanswered(queue: object, exc: Exception) -> bool:
    """True if a call that raised ``exc`` may not have reached ``queue`` (a lost
    connection): asked again. A queue says which errors mean that."""
    errors = getattr(queue, "connection_errors", ())
    return isinstance(errors, tuple) and bool(errors) and isinstance(exc, errors)


def _ask(
    queue: object, key: object, call: functools.partial[Any], pause: Pause | None
) -> Flow[Any]:
    """``call``'s value, asking it again after a backoff while it raises one of
    the queue's ``connection_errors`` and ``pause`` says go on (``_Abandon``
    once it says stop; without ``pause``, the error is raised at once)."""
    delay = 0.0
    while True:
        try:
            return (yield call)
        except Exception as exc:
            if pause is None or not _unanswered(queue, exc):
                raise
            delay = backoff(delay)
            wait = jitter(delay)
            name = getattr(call.func, "__name__", "the outcome")
            logger.log(
                logging.DEBUG if said(queue, exc) else logging.WARNING,
                "key %r: %s raised %s; asking again in %.3g s",
                key,
                name,
                say(exc),
                wait,
            )
            if not (yield functools.partial(pause, wait)):
                raise _Abandon from exc


def outcome_flow(
    queue: Outcomes[K],
    key: K,
    result: object,
    error: BaseException | None,
    pause: Pause | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
) -> Flow[Settled]:
    """Apply a handler's outcome to ``key`` (still held).

    Returns the outcome (a ``RunStats`` field name) and, when the key was given
    up, the error passed to ``on_give_up`` (called, if given, before returning):

    - returned ``None``: forget (success);
    - returned ``Requeue()``: ``add_rate_limited`` (not a failure: no forget,
      not counted towards ``max_retries``);
    - returned ``Requeue(after=s)``: forget, then ``add_after(key, s)``;
    - either with ``priority=p``: the add passes ``priority=p``;
    - raised ``PermanentError``: ``give_up`` (forget, kept as a dead key), no
      retry, logged;
    - raised ``LeaseLost``: nothing (another holder may have the key), logged;
    - raised anything else (or returned anything else): ``retry(key)``; when
      that gives up (``max_retries`` reached, or the queue is shut down without
      a drain and the key was not added again while held), ``give_up`` (forget,
      kept as a dead key), log a warning and return the error. A key retried
      during shutdown (a drain's retry, a Redis client's) is logged at INFO:
      it stays queued.

    A call that raises one of the queue's ``connection_errors`` is asked again
    after ``pause(seconds)`` (with a growing backoff) while ``pause`` answers
    True; once it answers False the outcome is ``"abandoned"``: ``done_flow``
    then abandons the key instead of releasing it. Without ``pause`` such a
    call is not asked again.

    Raises no ``Exception``: if applying the outcome raises, that is logged
    with the key, the key is forgotten (best effort) and dropped, and the
    outcome is ``"errors"`` (``"lease_lost"`` for ``LeaseLost``: then nothing
    more is asked of the queue). An exception from ``on_give_up`` is logged.
    """
    try:
        outcome, gave_up = yield from _outcome(queue, key, result, error, pause)
    except LeaseLost as exc:
        return _lease_lost(key, exc)
    except _Abandon as exc:
        _not_released(key, "applying the outcome", exc.__cause__ or exc)
        return ABANDONED, None
    except Exception:
        logger.exception("key %r: applying the handler's outcome raised; dropping the key", key)
        try:
            yield functools.partial(queue.forget, key)
        except Exception:  # already logged: the same fault, most likely
            pass
        return ERRORS, None
    if gave_up is not None and on_give_up is not None:
        try:
            yield functools.partial(on_give_up, key, gave_up)
        except Exception:  # a failing callback must not stop the workers
            logger.exception("on_give_up(%r) raised", key)
    return outcome, gave_up


def _outcome(
    queue: Outcomes[K],
    key: K,
    result: object,
    error: BaseException | None,
    pause: Pause | None,
) -> Flow[Settled]:
    """``outcome_flow``'s rules, raising what applying them raised."""

    def ask(method: Callable[..., object], *args: Any, **kwargs: Any) -> Flow[Any]:
        return _ask(queue, key, functools.partial(method, key, *args, **kwargs), pause)

    if error is None:
        if result is None:
            yield from ask(queue.forget)
            return SUCCEEDED, None
        if isinstance(result, Requeue):
            priority = {"priority": result.priority} if result.priority else {}
            if result.after is None:
                yield from ask(queue.add_rate_limited, **priority)
            else:
                yield from ask(queue.forget)
                yield from ask(queue.add_after, result.after, **priority)
            return REQUEUED, None
        if inspect.iscoroutine(result):  # say why, not "coroutine was never awaited"
            result.close()
            error = TypeError(f"handler returned a coroutine for {key!r}; use arun_workers")
        else:
            error = TypeError(f"handler returned {result!r} for {key!r}; expected None or Requeue")
    if isinstance(error, PermanentError):
        logger.warning("key %r failed permanently, not retrying: %s", key, error)
        yield from ask(queue.give_up, DEAD_PERMANENT, error)
        return PERMANENT, None
    if isinstance(error, LeaseLost):
        return _lease_lost(key, error)
    if (yield from ask(queue.retry)):
        if queue.shutting_down:  # a drain's retry, or a Redis client's: said, not given up
            logger.info(
                "key %r failed during shutdown; not given up: it stays queued and comes "
                "back after its backoff (a draining queue waits for it; on Redis it stays "
                "on the server for the other clients or the next start): %r",
                key,
                error,
            )
        else:
            logger.debug("key %r failed, will retry: %r", key, error)
        return RETRIED, None
    reason = DEAD_RETRIES
    if queue.shutting_down:
        reason = DEAD_SHUTDOWN
        logger.warning(
            "key %r failed while the queue is shutting down without a drain, cannot "
            "retry, giving up: %r",
            key,
            error,
        )
    else:
        logger.warning("key %r failed too often, giving up: %r", key, error)
    yield from ask(queue.give_up, reason, error)
    return GAVE_UP, error


def done_flow(
    queue: Queue[K, object], key: K, outcome: str, pause: Pause | None = None
) -> Flow[str]:
    """``done(key)``; returns the outcome to count, which a raising ``done`` replaces.

    After ``"abandoned"``, no ``done``: ``abandon(key)`` if the queue has it
    (other queues keep the key held, as they must), and ``"errors"``.

    Raises no ``Exception``: ``LeaseLost`` makes the outcome ``"lease_lost"``
    (logged once); ``ValueError``/``TypeError`` ``"errors"`` (logged: an
    answer, a caller bug). Anything else leaves the outcome unknown (a lost
    connection): with ``pause``, ``done`` is asked again after
    ``pause(seconds)`` (with a growing backoff) while it answers True; once it
    answers False, or at once without ``pause``, the key is abandoned and the
    outcome is ``"errors"``.
    """
    if outcome == ABANDONED:
        return (yield from abandon_flow(queue, key))
    delay = 0.0
    while True:
        try:
            yield functools.partial(queue.done, key)
            return outcome
        except LeaseLost as exc:
            return outcome if outcome == LEASE_LOST else _lease_lost(key, exc)[0]
        except (ValueError, TypeError):
            logger.exception("key %r: done raised; going on", key)
            return ERRORS
        except Exception as exc:
            unknown = exc
        if pause is None:
            break
        delay = backoff(delay)
        wait = jitter(delay)
        logger.log(
            logging.DEBUG if said(queue, unknown) else logging.WARNING,
            "key %r: done raised %s; asking again in %.3g s",
            key,
            say(unknown),
            wait,
        )
        if not (yield functools.partial(pause, wait)):
            break
    _not_released(key, "done", unknown)
    return (yield from abandon_flow(queue, key))


def abandon_flow(queue: object, key: object) -> Flow[str]:
    """No ``done`` for ``key`` (its outcome went unanswered, or its ``done``
    did): a queue with leases lets go of it without releasing it (its lease
    runs out and it comes back); other queues keep it held, as they must.
    The outcome to count: ``"errors"``."""
    abandon = getattr(queue, "abandon", None)
    if abandon is not None:
        try:
            yield functools.partial(abandon, key)
        except Exception:  # not held any more: nothing to let go of
            logger.debug("key %r: abandon raised", key, exc_info=True)
    return ERRORS


def _not_released(key: object, what: str, exc: BaseException) -> None:
    logger.error(
        "key %r: %s raised %s and the worker is stopping; not releasing the key (a "
        "queue with leases hands it out again once its lease runs out)",
        key,
        what,
        say(exc),
    )


def _lease_lost(key: object, exc: LeaseLost) -> tuple[str, None]:
    logger.warning("key %r: lease lost, another holder may have it; not retrying: %s", key, exc)
    return LEASE_LOST, None
