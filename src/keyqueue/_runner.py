"""The worker runner: get → handle → forget/retry → done, right every time.

``settle`` holds the outcome rules and ``release`` the ``done``; ``run_workers``
(threads) and ``arun_workers`` (asyncio) only differ in how they wait and call
the handler. The rules are written once, as a generator that yields what each
queue call returned: ``settle`` runs it on a queue whose methods are plain,
``asettle`` on one whose methods are coroutines (the Redis backend's
``AsyncRedisWorkQueue``), awaiting each call. Only the handler's own outcome
decides what happens to a key: an exception while applying it (a limiter that
raises, a queue method that fails) is logged with the key and counted, and the
workers go on. Only ``KeyboardInterrupt``/``SystemExit`` (and, in asyncio,
cancellation), ``ShutDown`` or ``stop`` end them.

A queue on a server (``keyqueue.redis``) can lose its connection: a ``get``
that raises is logged and tried again after a pause that starts at
``_BACKOFF_FIRST`` and doubles up to ``_BACKOFF_MAX`` (reset once the queue
answers), so the workers reconnect and go on; a ``done`` that raises with its
outcome unknown is asked again the same way (a repeated ``done`` is safe: it
releases the key at most once) until it answers or the worker stops.
The outcome's own calls (``retry``, ``forget``, ``add_after``,
``add_rate_limited``) are asked again in the same way when they raise one of
the queue's ``connection_errors`` (a server queue's scripts apply each at most
once); if the workers stop first, the key is not released (``done`` is not
called): its lease runs out and it comes back.

Workers wait in ``get`` without a timeout. ``stop`` wakes them: a watcher
calls the queue's ``interrupt`` (every waiting ``get`` raises ``Empty``), and
``arun_workers`` cancels the waiting tasks. A queue without ``interrupt`` is
polled every ``_POLL`` as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import logging
import threading
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine, Generator, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from ._core import check_number, check_priority
from ._errors import Empty, LeaseLost, ShutDown
from ._queues import AsyncWorkQueue, WorkQueue

__all__ = [
    "PermanentError",
    "Requeue",
    "RunStats",
    "apause",
    "arelease",
    "arun_workers",
    "asettle",
    "get_failed",
    "release",
    "run_workers",
    "settle",
]

K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)

logger = logging.getLogger("keyqueue")

_POLL = 0.05  # wall seconds between interrupts while stopping (or polls of a queue without one)
_WATCH = 0.25  # wall seconds: how soon a watcher of ``stop`` notices its run has ended
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
    priority: int = 0

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
    """Failed, and ``retry`` put the key back with backoff (or, during shutdown,
    kept a key added again while it was held: it is handed out once more)."""
    gave_up: int = 0
    """Failed and not retried (``max_retries`` reached, or the queue was shutting
    down and nothing brought the key back): forgotten, ``on_give_up`` called."""
    permanent: int = 0
    """Raised ``PermanentError``: forgotten, not retried."""
    errors: int = 0
    """Applying the outcome raised (``retry``, the rate limiter, ``forget``,
    ``add_after``, ``done``): logged with the key, which is dropped."""
    lease_lost: int = 0
    """The holder's lease expired (``LeaseLost`` from the handler, the outcome or
    ``done``): logged, not retried (another holder may have the key)."""


# The outcomes, named after the RunStats field each one counts in.
_SUCCEEDED, _REQUEUED, _RETRIED, _GAVE_UP = "succeeded", "requeued", "retried", "gave_up"
_PERMANENT, _ERRORS, _LEASE_LOST = "permanent", "errors", "lease_lost"


def run_stats(tallies: Iterable[Counter[str]]) -> RunStats:
    """Sum per-worker tallies (keyed by RunStats field) into one snapshot."""
    total: Counter[str] = Counter()
    for tally in tallies:
        total.update(tally)
    return RunStats(**total)


class _Held(Protocol[K_contra]):
    """What the runner calls on a queue for a key it holds (``priority`` is
    passed only when a ``Requeue`` asks for one)."""

    @property
    def shutting_down(self) -> bool: ...
    def forget(self, key: K_contra) -> None: ...
    def add_after(self, key: K_contra, seconds: float, priority: int = ...) -> None: ...
    def add_rate_limited(self, key: K_contra, priority: int = ...) -> None: ...
    def retry(self, key: K_contra) -> bool: ...
    def done(self, key: K_contra) -> None: ...


class _AsyncHeld(Protocol[K_contra]):
    """``_Held`` whose calls are coroutines (``AsyncRedisWorkQueue``)."""

    @property
    def shutting_down(self) -> bool: ...
    def forget(self, key: K_contra) -> Awaitable[None]: ...
    def add_after(self, key: K_contra, seconds: float, priority: int = ...) -> Awaitable[None]: ...
    def add_rate_limited(self, key: K_contra, priority: int = ...) -> Awaitable[None]: ...
    def retry(self, key: K_contra) -> Awaitable[bool]: ...
    def done(self, key: K_contra) -> Awaitable[None]: ...


class _WorkerQueue(Protocol[K]):
    """What ``run_workers`` takes: a ``WorkQueue``, or a ``RedisWorkQueue``."""

    @property
    def name(self) -> str: ...
    @property
    def shutting_down(self) -> bool: ...
    def get(self, timeout: float | None = None) -> K: ...
    def forget(self, key: K) -> None: ...
    def add_after(self, key: K, seconds: float, priority: int = ...) -> None: ...
    def add_rate_limited(self, key: K, priority: int = ...) -> None: ...
    def retry(self, key: K) -> bool: ...
    def done(self, key: K) -> None: ...


class _Calls(Protocol[K_contra]):
    """``_Held`` or ``_AsyncHeld``: what ``_settle`` yields, a value or an awaitable."""

    @property
    def shutting_down(self) -> bool: ...
    def forget(self, key: K_contra) -> object: ...
    def add_after(self, key: K_contra, seconds: float, priority: int = ...) -> object: ...
    def add_rate_limited(self, key: K_contra, priority: int = ...) -> object: ...
    def retry(self, key: K_contra) -> object: ...


# The outcome rules, as a generator: each ``yield`` hands out a queue call to
# make (a function of no arguments) and gets back its value (the awaited value,
# for a coroutine). The drivers make each call, asking it again while it
# raises one of the queue's ``connection_errors``.
_Steps = Generator[Callable[[], object], object, tuple[str, "BaseException | None"]]
_ABANDONED = "abandoned"  # an outcome never answered before the workers stopped: no done


class _Abandon(Exception):
    """The workers stopped while an outcome call was still unanswered."""


def _unanswered(queue: object, exc: Exception) -> bool:
    """True if a call that raised ``exc`` may not have reached ``queue`` (a lost
    connection): asked again. A queue says which errors mean that."""
    errors = getattr(queue, "connection_errors", ())
    return isinstance(errors, tuple) and bool(errors) and isinstance(exc, errors)


def _call_failed(key: Any, call: Callable[[], object], exc: Exception, pause: float) -> None:
    name = getattr(call, "func", call)
    logger.warning(
        "key %r: %s raised %s; asking again in %.3g s",
        key,
        getattr(name, "__name__", "the outcome"),
        _say(exc),
        pause,
    )


def _run_steps(
    steps: _Steps, queue: object, key: Any, pause: Callable[[float], bool] | None
) -> tuple[str, BaseException | None]:
    try:
        call = next(steps)
        while True:
            delay = 0.0
            while True:
                try:
                    value = call()
                    break
                except Exception as exc:
                    if pause is None or not _unanswered(queue, exc):
                        raise
                    delay = backoff(delay)
                    _call_failed(key, call, exc, delay)
                    if not pause(delay):
                        raise _Abandon from exc
            call = steps.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        steps.close()


async def _await_steps(
    steps: _Steps,
    queue: object,
    key: Any,
    stopped: Callable[[], bool] | None,
    woken: asyncio.Event | None = None,
) -> tuple[str, BaseException | None]:
    try:
        call = next(steps)
        while True:
            delay = 0.0
            while True:
                try:
                    value = call()
                    if inspect.isawaitable(value):
                        value = await value
                    break
                except Exception as exc:
                    if stopped is None or not _unanswered(queue, exc):
                        raise
                    delay = backoff(delay)
                    _call_failed(key, call, exc, delay)
                    if not await apause(delay, stopped, woken):
                        raise _Abandon from exc
            call = steps.send(value)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]
    finally:
        steps.close()


def _abandoned(key: Any, exc: _Abandon) -> tuple[str, None]:
    logger.error(
        "key %r: applying the outcome raised %s and the worker is stopping; not "
        "releasing the key (a queue with leases hands it out again once its lease "
        "runs out)",
        key,
        _say(exc.__cause__ or exc),
    )
    return _ABANDONED, None


def settle(
    queue: _Held[K],
    key: K,
    result: object,
    error: BaseException | None,
    pause: Callable[[float], bool] | None = None,
) -> tuple[str, BaseException | None]:
    """Apply a handler's outcome to ``key`` (still held).

    Returns the outcome (a ``RunStats`` field name) and, when the key was given
    up, the error to pass to ``on_give_up``:

    - returned ``None``: forget (success);
    - returned ``Requeue()``: ``add_rate_limited`` (not a failure: no forget,
      not counted towards ``max_retries``);
    - returned ``Requeue(after=s)``: forget, then ``add_after(key, s)``;
    - either with ``priority=p``: the add passes ``priority=p``;
    - raised ``PermanentError``: forget, no retry, logged;
    - raised ``LeaseLost``: nothing (another holder may have the key), logged;
    - raised anything else (or returned anything else): ``retry(key)``; when
      that gives up (``max_retries`` reached, or the queue is shutting down and
      the key was not added again while held), forget, log a warning and
      return the error.

    A call that raises one of the queue's ``connection_errors`` is asked again
    after ``pause(seconds)`` (with a growing backoff) while ``pause`` returns
    True; once it returns False the outcome is ``"abandoned"``: the caller must
    not release the key. Without ``pause`` such a call is not asked again.

    Never raises an ``Exception``: if applying the outcome raises, that is
    logged with the key, the key is forgotten (best effort) and dropped, and
    the outcome is ``"errors"`` (``"lease_lost"`` for ``LeaseLost``: then
    nothing more is asked of the queue).
    """
    try:
        return _run_steps(_settle(queue, key, result, error), queue, key, pause)
    except LeaseLost as exc:
        return _lease_lost(key, exc)
    except _Abandon as exc:
        return _abandoned(key, exc)
    except Exception:
        logger.exception("key %r: applying the handler's outcome raised; dropping the key", key)
        try:
            queue.forget(key)
        except Exception:  # already logged: the same fault, most likely
            pass
        return _ERRORS, None


async def asettle(
    queue: _AsyncHeld[K],
    key: K,
    result: object,
    error: BaseException | None,
    stopped: Callable[[], bool] | None = None,
    woken: asyncio.Event | None = None,
) -> tuple[str, BaseException | None]:
    """``settle`` for a queue whose methods are coroutines; an unanswered call
    is asked again until ``stopped()`` (if given) holds (``woken``: see
    ``apause``)."""
    try:
        steps = _settle(queue, key, result, error)
        return await _await_steps(steps, queue, key, stopped, woken)
    except LeaseLost as exc:
        return _lease_lost(key, exc)
    except _Abandon as exc:
        return _abandoned(key, exc)
    except Exception:
        logger.exception("key %r: applying the handler's outcome raised; dropping the key", key)
        try:
            await queue.forget(key)
        except Exception:  # already logged: the same fault, most likely
            pass
        return _ERRORS, None


def _settle(queue: _Calls[K], key: K, result: object, error: BaseException | None) -> _Steps:
    call = functools.partial
    if error is None:
        if result is None:
            yield call(queue.forget, key)
            return _SUCCEEDED, None
        if isinstance(result, Requeue):
            priority = result.priority
            if result.after is None:
                if priority:
                    yield call(queue.add_rate_limited, key, priority=priority)
                else:
                    yield call(queue.add_rate_limited, key)
            else:
                yield call(queue.forget, key)
                if priority:
                    yield call(queue.add_after, key, result.after, priority=priority)
                else:
                    yield call(queue.add_after, key, result.after)
            return _REQUEUED, None
        if inspect.iscoroutine(result):  # say why, not "coroutine was never awaited"
            result.close()
            error = TypeError(f"handler returned a coroutine for {key!r}; use arun_workers")
        else:
            error = TypeError(f"handler returned {result!r} for {key!r}; expected None or Requeue")
    if isinstance(error, PermanentError):
        logger.warning("key %r failed permanently, not retrying: %s", key, error)
        yield call(queue.forget, key)
        return _PERMANENT, None
    if isinstance(error, LeaseLost):
        return _lease_lost(key, error)
    if (yield call(queue.retry, key)):
        logger.debug("key %r failed, will retry: %r", key, error)
        return _RETRIED, None
    if queue.shutting_down:
        logger.warning(
            "key %r failed while the queue is shutting down, cannot retry, giving up: %r",
            key,
            error,
        )
    else:
        logger.warning("key %r failed too often, giving up: %r", key, error)
    yield call(queue.forget, key)
    return _GAVE_UP, error


def backoff(previous: float) -> float:
    """The pause before trying a failed call again: ``_BACKOFF_FIRST`` after an
    answer (``previous`` 0), then doubling up to ``_BACKOFF_MAX``."""
    return _BACKOFF_FIRST if previous <= 0 else min(previous * 2, _BACKOFF_MAX)


def _say(exc: BaseException) -> str:
    """``ConnectionError: Connection closed by server.`` (redis-py's repr says
    only ``network:ConnectionError``)."""
    return f"{type(exc).__name__}: {exc}"


def get_failed(name: str, exc: Exception, previous: float) -> float:
    """Log a ``get`` that raised (a lost connection); returns the pause before the next."""
    pause = backoff(previous)
    logger.warning("keyqueue %r: get raised %s; trying again in %.3g s", name, _say(exc), pause)
    return pause


def _done_failed(key: Any, exc: Exception) -> bool:
    """True if a ``done`` that raised ``exc`` is to be asked again (its outcome is
    unknown); a ``ValueError``/``TypeError`` is an answer (a caller bug)."""
    if isinstance(exc, ValueError | TypeError):
        logger.exception("key %r: done raised; going on", key)
        return False
    return True


def _done_retry(key: Any, exc: Exception, pause: float) -> None:
    logger.warning("key %r: done raised %s; asking again in %.3g s", key, _say(exc), pause)


def _abandon(queue: object, key: Any) -> None:
    """A queue with leases lets go of the key without releasing it (its lease
    runs out and it comes back); other queues keep it held, as they must."""
    abandon = getattr(queue, "abandon", None)
    if abandon is None:
        return
    try:
        abandon(key)
    except Exception:  # not held any more: nothing to let go of
        logger.debug("key %r: abandon raised", key, exc_info=True)


def _done_given_up(key: Any, exc: Exception) -> str:
    logger.error(
        "key %r: done raised %s and the worker is stopping; not releasing the key (a "
        "queue with leases hands it out again once its lease runs out)",
        key,
        _say(exc),
    )
    return _ERRORS


def release(
    queue: _Held[K], key: K, outcome: str, pause: Callable[[float], bool] | None = None
) -> str:
    """``done(key)``; returns the outcome to count, which a raising ``done`` replaces.

    Never raises an ``Exception``: ``LeaseLost`` makes the outcome
    ``"lease_lost"`` (logged once); ``ValueError``/``TypeError`` ``"errors"``
    (logged). Anything else leaves the outcome unknown (a lost connection): with
    ``pause``, ``done`` is asked again after ``pause(seconds)`` (which waits and
    returns False once the worker is stopping: then ``"errors"``), with a
    growing backoff; without it, ``"errors"`` at once.
    """
    if outcome == _ABANDONED:
        _abandon(queue, key)
        return _ERRORS
    delay = 0.0
    while True:
        try:
            queue.done(key)
        except LeaseLost as exc:
            return outcome if outcome == _LEASE_LOST else _lease_lost(key, exc)[0]
        except Exception as exc:
            if not _done_failed(key, exc):
                return _ERRORS
            if pause is None:
                outcome = _done_given_up(key, exc)
                _abandon(queue, key)
                return outcome
            delay = backoff(delay)
            _done_retry(key, exc, delay)
            if not pause(delay):
                outcome = _done_given_up(key, exc)
                _abandon(queue, key)
                return outcome
            continue
        return outcome


async def arelease(
    queue: _AsyncHeld[K],
    key: K,
    outcome: str,
    stopped: Callable[[], bool] | None = None,
    woken: asyncio.Event | None = None,
) -> str:
    """``release`` for a queue whose methods are coroutines; ``done`` is asked
    again (see ``release``) until ``stopped()`` (if given) holds (``woken``:
    see ``apause``)."""
    if outcome == _ABANDONED:
        _abandon(queue, key)
        return _ERRORS
    delay = 0.0
    while True:
        try:
            await queue.done(key)
        except LeaseLost as exc:
            return outcome if outcome == _LEASE_LOST else _lease_lost(key, exc)[0]
        except Exception as exc:
            if not _done_failed(key, exc):
                return _ERRORS
            if stopped is None:
                outcome = _done_given_up(key, exc)
                _abandon(queue, key)
                return outcome
            delay = backoff(delay)
            _done_retry(key, exc, delay)
            if not await apause(delay, stopped, woken):
                outcome = _done_given_up(key, exc)
                _abandon(queue, key)
                return outcome
            continue
        return outcome


async def apause(
    seconds: float, stopped: Callable[[], bool], woken: asyncio.Event | None = None
) -> bool:
    """Sleep ``seconds``, or until ``stopped()``; True if the worker is to go on.

    With ``woken`` (an event set when the workers stop) the sleep ends when it
    is set; without, ``stopped()`` is looked at every ``_POLL``.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds
    while not stopped():
        remaining = deadline - loop.time()
        if remaining <= 0:
            return True
        if woken is None:
            await asyncio.sleep(min(remaining, _POLL))
            continue
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(remaining):
                await woken.wait()
    return False


def _lease_lost(key: Any, exc: LeaseLost) -> tuple[str, None]:
    logger.warning("key %r: lease lost, another holder may have it; not retrying: %s", key, exc)
    return _LEASE_LOST, None


def check_handler(handler: object, runner: str, want_async: bool) -> None:
    """Raise TypeError unless ``handler`` is callable and of the kind ``runner`` needs.

    A handler is async if it is an ``async def`` function (also behind
    ``functools.partial``) or an object whose ``__call__`` is one.
    """
    if not callable(handler):
        raise TypeError(f"handler must be callable, got {handler!r}")
    is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
        getattr(handler, "__call__", None)  # noqa: B004 (an object with async __call__)
    )
    if is_async and not want_async:
        raise TypeError(
            f"{runner} needs a plain function, got the async handler {handler!r}; "
            "use arun_workers with an AsyncWorkQueue"
        )
    if want_async and not is_async:
        raise TypeError(
            f"{runner} needs an async handler (async def), got {handler!r}; "
            "wrap it in an async def, or use run_workers with a WorkQueue"
        )


async def _give_up(
    on_give_up: Callable[[Any, BaseException], object] | None, key: Any, error: BaseException
) -> None:
    """Tell ``on_give_up`` (if given) that ``key`` was given up after ``error``,
    awaiting what it returns if that is awaitable (an async callback, for
    ``arun_workers``). An exception from it is logged, never raised: a failing
    callback must not stop the workers. ``run_workers`` runs it with
    ``_run_now`` in its worker thread."""
    if on_give_up is None:
        return
    try:
        result = on_give_up(key, error)
        if inspect.isawaitable(result):
            await result
    except Exception:
        logger.exception("on_give_up(%r) raised", key)


def _run_now(step: Coroutine[Any, Any, None]) -> None:
    """Run ``step`` to its end here, in a thread without an event loop. With a
    plain ``on_give_up`` it never waits; one that waits (an async callback
    given to ``run_workers``) is closed and logged."""
    try:
        step.send(None)
    except StopIteration:
        return
    step.close()
    logger.error("on_give_up waited for an event loop in a run_workers thread; use arun_workers")


def run_workers(
    queue: WorkQueue[K] | _WorkerQueue[K],
    handler: Callable[[K], Requeue | None],
    workers: int = 1,
    stop: threading.Event | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
) -> RunStats:
    """Run ``workers`` threads that process keys from ``queue`` with ``handler``.

    Blocks until the queue is shut down and drained (every worker saw
    ``ShutDown``), or until ``stop`` is set; then each worker finishes the key it
    holds and exits. Returns what was done, as ``RunStats``.

    Per key: ``None`` → forget; ``Requeue()`` → ``add_rate_limited`` (backoff
    grows, not a failure); ``Requeue(after=s)`` → forget and ``add_after``;
    ``PermanentError`` → forget, logged; any other exception → ``retry``, and on
    give-up (``max_retries`` reached, or the queue shutting down) forget,
    a warning and ``on_give_up(key, exc)``. ``done`` is always called. An
    exception while applying that (a rate limiter raising, say) is logged with
    the key and counted in ``RunStats.errors``; the workers go on. The queue
    guarantees a handler never runs twice at once for one key.

    A ``get`` that raises (a server queue that lost its connection) is logged
    and tried again after a backoff (0.05 s doubling to 2 s, reset when the
    queue answers); a ``done`` that raises with its outcome unknown is asked
    again likewise until it answers or the workers stop. ``LeaseLost`` from
    ``done`` (the key was handed to another holder) is counted in
    ``RunStats.lease_lost``.

    Raises ``TypeError`` at once, before taking a key, if ``handler`` is an
    ``async def`` (use ``arun_workers``). A handler raising ``KeyboardInterrupt``
    or ``SystemExit`` stops every worker (each finishes its key) and it is
    re-raised here; so is Ctrl-C in the calling thread.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    check_handler(handler, "run_workers", want_async=False)
    halt = threading.Event()
    crashed: list[BaseException] = []
    tallies: list[Counter[str]] = []  # one per worker: no lock needed to count

    def stopping() -> bool:
        return halt.is_set() or (stop is not None and stop.is_set())

    def pause(seconds: float) -> bool:
        """Wait ``seconds`` or until the workers stop; True if they go on."""
        deadline = time.monotonic() + seconds
        while not stopping():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            # The watcher sets halt once stop is set: no need to look sooner.
            halt.wait(remaining if interrupt is not None else min(remaining, _POLL))
        return False

    interrupt = getattr(queue, "interrupt", None)
    poll = _POLL if interrupt is None else None  # a queue that cannot be interrupted is polled

    def work() -> None:
        tally: Counter[str] = Counter()
        tallies.append(tally)
        delay = 0.0  # the pause before the next get: > 0 after a get raised
        while not stopping():
            if delay and not pause(delay):
                return
            try:
                key = queue.get(timeout=poll)
            except Empty:  # interrupted (stopping), or the poll's timeout
                delay = 0.0
                continue
            except ShutDown:
                return
            except Exception as exc:  # a lost connection: reconnect, go on
                delay = get_failed(queue.name, exc, delay)
                continue
            delay = 0.0
            tally["processed"] += 1
            outcome = _ERRORS
            try:
                result: object = None
                error: BaseException | None = None
                try:
                    result = handler(key)
                except Exception as exc:
                    error = exc
                outcome, gave_up = settle(queue, key, result, error, pause)
                if gave_up is not None:
                    _run_now(_give_up(on_give_up, key, gave_up))
            except BaseException as exc:  # KeyboardInterrupt, SystemExit
                crashed.append(exc)
                halt.set()
                return
            finally:
                tally[release(queue, key, outcome, pause)] += 1

    threads = [
        threading.Thread(target=work, name=f"keyqueue-worker-{queue.name}-{i}", daemon=True)
        for i in range(workers)
    ]
    for thread in threads:
        thread.start()
    finished = threading.Event()
    watcher = None
    if interrupt is not None:
        watcher = threading.Thread(
            target=_watch_stop,
            args=(stop, halt, finished, interrupt, threads),
            name=f"keyqueue-stop-{queue.name}",
            daemon=True,
        )
        watcher.start()
    try:
        for thread in threads:
            thread.join()
    except BaseException:
        halt.set()
        for thread in threads:
            thread.join()
        raise
    finally:
        finished.set()
        if watcher is not None:
            halt.set()  # wakes a watcher without stop at once
            watcher.join()
    if crashed:
        raise crashed[0]
    return run_stats(tallies)


def _watch_stop(
    stop: threading.Event | None,
    halt: threading.Event,
    finished: threading.Event,
    interrupt: Callable[[], object],
    threads: list[threading.Thread],
) -> None:
    """``run_workers``' watcher: once ``stop`` (or ``halt``: a crash) is set,
    interrupt the workers' gets until every worker has left (again every
    ``_POLL``: a worker may enter ``get`` just after an interrupt). Ends within
    ``_WATCH`` of the run's end otherwise (an Event cannot be waited on with
    another, so it looks that often; the workers themselves never poll); the
    run joins it, so no thread outlives ``run_workers``."""
    while not finished.is_set():
        if stop is None:
            halt.wait()
        elif stop.wait(_WATCH):
            halt.set()  # the workers' backoff pauses wait on it
            break
        if halt.is_set():
            break
    if finished.is_set():
        return
    while any(thread.is_alive() for thread in threads):
        try:
            interrupt()
        except Exception:  # a server queue that lost its connection: try again
            logger.debug("interrupting the workers' gets failed", exc_info=True)
        for thread in threads:
            thread.join(_POLL)
            if thread.is_alive():
                break


class _AsyncWorkerQueue(Protocol[K]):
    """A queue whose calls are coroutines, as ``arun_workers`` takes it
    (``AsyncRedisWorkQueue``)."""

    @property
    def name(self) -> str: ...
    @property
    def shutting_down(self) -> bool: ...
    def get(self) -> Awaitable[K]: ...
    def add(self, key: K) -> Awaitable[None]: ...
    def forget(self, key: K) -> Awaitable[None]: ...
    def add_after(self, key: K, seconds: float, priority: int = ...) -> Awaitable[None]: ...
    def add_rate_limited(self, key: K, priority: int = ...) -> Awaitable[None]: ...
    def retry(self, key: K) -> Awaitable[bool]: ...
    def done(self, key: K) -> Awaitable[None]: ...


async def arun_workers(
    queue: AsyncWorkQueue[K] | _AsyncWorkerQueue[K],
    handler: Callable[[K], Awaitable[Requeue | None]],
    workers: int = 1,
    stop: asyncio.Event | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
) -> RunStats:
    """Process keys from ``queue`` with the async ``handler``, at most ``workers`` at once.

    Returns what was done, as ``RunStats``, when the queue is shut down and
    drained, or once ``stop`` is set and every in-flight handler has finished.
    Outcome rules as ``run_workers``: ``None`` → forget; ``Requeue()`` →
    ``add_rate_limited`` (not a failure); ``Requeue(after=s)`` → forget and
    ``add_after``; ``PermanentError`` → forget; other exceptions → ``retry``, and
    on give-up forget and ``on_give_up(key, exc)`` (sync or async). ``done`` is
    always called; an exception while applying the outcome is logged with the
    key and counted in ``RunStats.errors``, and the workers go on.

    Raises ``TypeError`` at once, before taking a key, if ``handler`` is not an
    ``async def`` (or an object whose ``__call__`` is one); a handler that
    returns something not awaitable fails that key with a ``TypeError``. If
    ``arun_workers`` is cancelled, each in-flight handler is cancelled, its key
    re-added (the change it was handling was not finished; a no-op after
    shutdown) and released with ``done``.

    Also runs an ``AsyncRedisWorkQueue``, whose methods are coroutines: each
    call is then awaited. A ``get`` that raises (a lost connection) is logged
    and tried again after a backoff, a ``done`` whose outcome is unknown asked
    again, as in ``run_workers``.
    """
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    check_handler(handler, "arun_workers", want_async=True)
    awaits = inspect.iscoroutinefunction(queue.done)  # a queue whose calls are coroutines
    aqueue: Any = queue
    idle: set[asyncio.Task[None]] = set()  # workers waiting in get: safe to cancel
    tally: Counter[str] = Counter()  # shared by the workers: they run on one loop
    stopping = False
    woken = asyncio.Event()  # set once the workers stop: their pauses end

    def stopped() -> bool:
        return stopping or (stop is not None and stop.is_set())

    async def work() -> None:
        me = asyncio.current_task()
        assert me is not None
        delay = 0.0  # the pause before the next get: > 0 after a get raised
        while not stopped():
            if delay and not await apause(delay, stopped, woken):
                return
            idle.add(me)
            try:
                key = await queue.get()
            except ShutDown:
                return
            except asyncio.CancelledError:
                if stopped():
                    return
                raise
            except Exception as exc:  # a lost connection: reconnect, go on
                delay = get_failed(queue.name, exc, delay)
                continue
            finally:
                idle.discard(me)
            delay = 0.0
            tally["processed"] += 1
            outcome = "errors"
            try:
                result: object = None
                error: BaseException | None = None
                try:
                    pending = handler(key)
                    if inspect.isawaitable(pending):
                        result = await pending
                    else:
                        error = TypeError(
                            f"handler returned {pending!r} for {key!r}, not an awaitable"
                        )
                except asyncio.CancelledError:
                    added = aqueue.add(key)  # unfinished: hand it out again after done
                    if awaits:
                        await added
                    raise
                except Exception as exc:
                    error = exc
                if awaits:
                    outcome, gave_up = await asettle(aqueue, key, result, error, stopped, woken)
                else:
                    outcome, gave_up = settle(aqueue, key, result, error)
                if gave_up is not None:
                    await _give_up(on_give_up, key, gave_up)
            finally:
                if awaits:
                    outcome = await arelease(aqueue, key, outcome, stopped, woken)
                else:
                    outcome = release(aqueue, key, outcome)
                tally[outcome] += 1

    async def watch_stop(event: asyncio.Event) -> None:
        nonlocal stopping
        await event.wait()
        stopping = True
        woken.set()  # ends the workers' backoff pauses
        # Cancel the workers waiting in get, again every _POLL while any still
        # waits: a cancellation can be lost inside a client library (Python
        # 3.11's asyncio.wait_for swallows one that races its inner task's end,
        # and redis.asyncio sends each command through it).
        while idle:
            for task in list(idle):
                task.cancel()
            await asyncio.sleep(_POLL)

    tasks = [
        asyncio.create_task(work(), name=f"keyqueue-worker-{queue.name}-{i}")
        for i in range(workers)
    ]
    watcher = asyncio.create_task(watch_stop(stop)) if stop is not None else None
    try:
        await asyncio.gather(*tasks)
    except BaseException:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    finally:
        if watcher is not None:
            watcher.cancel()
    return run_stats([tally])
