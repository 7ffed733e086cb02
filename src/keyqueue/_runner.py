"""The worker runners: get → handle → outcome → done, in threads or on a loop.

``run_workers`` (threads) and ``arun_workers`` (asyncio) only take keys, call
the handler and wait. Where the keys come from and where their dones go is a
``_source.WorkerSource`` (the queue itself one key at a time, or a Redis
queue's batched claims); what a key's outcome means is ``_outcome``'s. Both
write their rules as flows that yield the queue calls to make: ``drive``
makes them here and now (a worker thread), ``adrive`` awaits each that
returns an awaitable (every call of ``AsyncRedisWorkQueue``;
``AsyncWorkQueue``'s plain ones are not awaited).
Only ``KeyboardInterrupt``/``SystemExit`` (and, in asyncio, cancellation),
``ShutDown`` or ``stop`` end the workers.

A queue on a server (``keyqueue.redis``) can lose its connection: a ``get``
that raises is logged and tried again after the outcome rules' backoff (reset
once the queue answers), so the workers reconnect and go on; the outcome's
calls and ``done`` are asked again by the rules themselves, each pause waiting
on the stop signal (``halt`` in threads, ``woken`` on the loop) so that stop
ends it at once.

Nothing polls. Workers wait in ``get`` without a timeout; ``stop`` wakes them:
in threads a watcher sets ``halt`` and calls the queue's ``interrupt`` (every
waiting ``get`` raises ``Empty``), on the loop ``arun_workers`` cancels the
tasks waiting in ``get`` (the queues' gets lose no key when cancelled).
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import sys
import threading
from collections import Counter
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, cast

from ._errors import Empty, ShutDown, Stalled
from ._flow import adrive, begin, drive
from ._outcome import (
    ERRORS,
    Outcomes,
    Queue,
    Requeue,
    RunStats,
    backoff,
    jitter,
    outcome_flow,
    run_stats,
    said,
    say,
)
from ._queues import AsyncWorkQueue, WorkQueue
from ._source import worker_source

__all__ = [
    "adrive",
    "apply_outcome",
    "arun_workers",
    "check_handler",
    "drive",
    "get_failed",
    "run_workers",
]

K = TypeVar("K")
T = TypeVar("T")

logger = logging.getLogger("keyqueue")

_POLL = 0.05  # wall seconds between interrupts (cancels) while workers are stopping
_WATCH = 0.25  # wall seconds: how soon a watcher of ``stop`` notices its run has ended,
# and how soon run_workers' wait for its workers takes a Ctrl-C that did not end it


def apply_outcome(
    queue: Outcomes[K],
    key: K,
    result: object,
    error: BaseException | None,
    pause: Callable[[float], bool] | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
) -> tuple[str, BaseException | None]:
    """Apply a handler's outcome to ``key`` (still held) here and now: the
    outcome and, for a key given up, its error (``_outcome.outcome_flow``)."""
    return drive(outcome_flow(queue, key, result, error, pause, on_give_up))


def get_failed(queue: Any, exc: Exception, previous: float) -> tuple[float, float]:
    """Log a ``get`` that raised (a lost connection; at DEBUG what the queue
    said itself, ``_outcome.said``). Returns the backoff after ``previous``
    and the pause before the next ``get`` (``jitter`` of it)."""
    delay = backoff(previous)
    pause = jitter(delay)
    level = logging.DEBUG if said(queue, exc) else logging.WARNING
    logger.log(
        level, "keyqueue %r: get raised %s; trying again in %.3g s", queue.name, say(exc), pause
    )
    return delay, pause


def check_workers(workers: object) -> None:
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")


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


def check_queue(queue: object, runner: str, want_async: bool) -> None:
    """Raise TypeError unless ``queue`` is of the kind ``runner`` drives.

    ``AsyncWorkQueue`` and ``AsyncRedisWorkQueue`` (whose ``get`` is a
    coroutine) for ``arun_workers``; ``WorkQueue`` and ``RedisWorkQueue`` for
    ``run_workers``. Another object is refused only when sure: by
    ``run_workers`` if its ``get`` is an ``async def``; if it has no ``get``.
    """
    is_async: bool | None
    if isinstance(queue, AsyncWorkQueue):
        is_async = True
    elif isinstance(queue, WorkQueue):
        is_async = False
    else:
        redis_queues = sys.modules.get("keyqueue.redis")  # never imported here
        if redis_queues is not None and isinstance(queue, redis_queues.AsyncRedisWorkQueue):
            is_async = True
        elif redis_queues is not None and isinstance(queue, redis_queues.RedisWorkQueue):
            is_async = False
        else:
            get = getattr(queue, "get", None)
            if not callable(get):
                raise TypeError(f"{runner} needs a work queue, got {type(queue).__name__}")
            is_async = True if inspect.iscoroutinefunction(get) else None
    if is_async and not want_async:
        raise TypeError(
            f"{runner} drives a WorkQueue or a RedisWorkQueue, got the asyncio "
            f"{type(queue).__name__}; use arun_workers"
        )
    if want_async and is_async is False:
        raise TypeError(
            f"{runner} drives an AsyncWorkQueue or an AsyncRedisWorkQueue, got the blocking "
            f"{type(queue).__name__}; use run_workers"
        )


def _in_a_thread(
    on_give_up: Callable[[K, BaseException], object] | None,
) -> Callable[[K, BaseException], None] | None:
    """``on_give_up`` for a worker thread, which has no event loop: an async
    callback runs until it first waits, then is closed and logged."""
    if on_give_up is None:
        return None

    def give_up(key: K, error: BaseException) -> None:
        returned = on_give_up(key, error)
        if not inspect.isawaitable(returned):
            return
        steps = returned.__await__()
        try:
            steps.send(None)
        except StopIteration:
            return
        steps.close()
        logger.error(
            "on_give_up waited for an event loop in a run_workers thread; use arun_workers"
        )

    return give_up


def _watch_poison(
    queue: object, give_up: Callable[[Any, BaseException], object] | None
) -> Callable[[], None] | None:
    """Pass each key a Redis queue's client gives up as poison (it stalled
    more than ``max_stalls`` times in a row) to ``give_up`` with ``Stalled``;
    the unwatch, or None (no ``give_up``, or a queue with no stalls)."""
    watch = getattr(queue, "_watch_poison", None)
    if give_up is None or not callable(watch):
        return None
    limit = getattr(queue, "max_stalls", None)

    def poisoned(key: Any) -> None:
        give_up(
            key,
            Stalled(
                f"key {key!r} stalled its holder more than max_stalls ({limit}) times in a "
                "row: given up as a poison key"
            ),
        )

    return watch(poisoned)  # type: ignore[no-any-return]


def run_workers(
    queue: WorkQueue[K] | Queue[K, K],
    handler: Callable[[K], Requeue | None],
    workers: int = 1,
    stop: threading.Event | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
    batch: bool | None = None,
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

    ``batch``: whether the workers take keys in batches. ``None`` (the
    default): the queue's choice, which is batched on a ``RedisWorkQueue``
    made with ``batch=True`` (its default) and one at a time on any other
    queue. Batched, one script sends the dones of every key the workers
    finished (``forget`` and ``done`` together) and claims as many keys as
    workers wait, each with its own lease and fencing token; keys claimed and
    not started when the run ends are put back without a failure, in one
    script. On a sharded queue (``shards=N``) each shard is claimed from
    with its own scripts, the shards with work in turn. ``batch=False``
    (and a proxy object, which is never batched): each worker calls
    ``get``, ``forget`` and ``done`` itself, once per key.
    ``batch=True`` on a queue that cannot batch raises ``TypeError``. The
    batched workers call neither ``get`` nor ``done``: a batched queue whose
    ``get`` or ``done`` was replaced (a subclass, or an attribute set on the
    instance) raises ``TypeError`` here at once, so pass ``batch=False`` to
    have them called; a replaced ``forget`` is called, not folded into the
    claim.

    Ctrl-C stops the workers as ``stop`` does (each finishes its key); a
    second Ctrl-C meanwhile stops waiting for the handlers: on a batched
    Redis queue the keys they hold are put back with the claimed ones (no
    key stays held), and ``KeyboardInterrupt`` is raised. Further Ctrl-Cs
    during those last one or two scripts wait for them.

    A key this queue client gives up as poison (it stalled its holder more
    than ``max_stalls`` times in a row: its process died with the handler
    running) goes to ``on_give_up(key, Stalled(...))`` too, in the thread whose
    call took its lease back.

    Raises ``TypeError`` at once, before taking a key, if ``handler`` is an
    ``async def`` (use ``arun_workers``). A handler raising ``KeyboardInterrupt``
    or ``SystemExit`` stops every worker (each finishes its key) and it is
    re-raised here; so is Ctrl-C in the calling thread.
    """
    check_workers(workers)
    check_queue(queue, "run_workers", want_async=False)
    check_handler(handler, "run_workers", want_async=False)
    source = worker_source(queue, batch)
    taking = source.queue  # what the workers call: get and the outcome's calls
    give_up = _in_a_thread(on_give_up)
    unwatch = _watch_poison(queue, give_up)  # a Redis queue's poison keys: given up too
    interrupt = taking.interrupt  # what wakes the workers' gets once they stop
    halt = threading.Event()  # set once the workers stop: their pauses end
    crashed: list[BaseException] = []
    tallies: list[Counter[str]] = []  # one per worker: no lock needed to count

    def stopping() -> bool:
        return halt.is_set() or (stop is not None and stop.is_set())

    def pause(seconds: float) -> bool:
        """Wait ``seconds`` or until the workers stop; True if they go on."""
        if not stopping():
            halt.wait(seconds)  # the watcher sets halt once stop is set
        return not stopping()

    def work() -> None:
        try:
            take_keys()
        finally:
            drive(source.leave())

    def take_keys() -> None:
        tally: Counter[str] = Counter()
        tallies.append(tally)
        delay = wait = 0.0  # the backoff and pause before the next get: > 0 after one raised
        while not stopping():
            if wait and not pause(wait):
                return
            try:
                key = taking.get()
            except Empty:  # interrupted: stopping
                delay = wait = 0.0
                continue
            except ShutDown:
                return
            except Exception as exc:  # a lost connection: reconnect, go on
                delay, wait = get_failed(taking, exc, delay)
                continue
            delay = wait = 0.0
            tally["processed"] += 1
            outcome = ERRORS
            try:
                result: object = None
                error: BaseException | None = None
                try:
                    result = handler(key)
                except Exception as exc:
                    error = exc
                outcome, _ = apply_outcome(taking, key, result, error, pause, give_up)
            except BaseException as exc:  # KeyboardInterrupt, SystemExit
                crashed.append(exc)
                halt.set()
                return
            finally:
                tally[drive(source.report(key, outcome, pause))] += 1

    threads = [
        threading.Thread(target=work, name=f"keyqueue-worker-{queue.name}-{i}", daemon=True)
        for i in range(workers)
    ]
    finished = threading.Event()
    watcher = threading.Thread(
        target=_watch_stop,
        args=(stop, halt, finished, interrupt, threads),
        name=f"keyqueue-stop-{queue.name}",
        daemon=True,
    )
    watcher.start()  # first: a Ctrl-C while the workers start finds it running
    aborted = False  # Ctrl-C again while the handlers finished: not waited for
    try:
        for thread in threads:
            thread.start()
        _join_started(threads)
    except BaseException:
        aborted = True  # until every worker has left: a Ctrl-C meanwhile leaves them
        halt.set()
        _join_started(threads)  # a Ctrl-C may come before the last has started
        aborted = False
        raise
    finally:
        finished.set()
        halt.set()  # wakes a watcher without stop at once

        def wind_down() -> None:
            watcher.join()
            tallies.append(drive(source.close(aborted)))
            if unwatch is not None:
                unwatch()

        _to_the_end(wind_down)
    if crashed:
        raise crashed[0]
    return run_stats(tallies)


def _join_started(threads: list[threading.Thread]) -> None:
    """Wait until every started thread of ``threads`` has ended, in waits of
    ``_WATCH`` so that a Ctrl-C is raised here within that: CPython runs a
    signal's handler when the main thread's wait on a lock returns, and a
    signal that lands as the wait begins (or in another thread) does not end
    the wait."""
    for thread in threads:
        while thread.is_alive():
            thread.join(_WATCH)


def _to_the_end(work: Callable[[], None]) -> None:
    """Run ``work`` to its end in a thread of its own, however often Ctrl-C
    is pressed meanwhile (the dones and put-backs of a run's end are one
    or two scripts, bounded by the client's socket timeout); then raise what
    ``work`` raised, or else the first ``KeyboardInterrupt`` (or other
    exception) the wait took."""
    failed: list[BaseException] = []

    def run() -> None:
        try:
            work()
        except BaseException as exc:
            failed.append(exc)

    thread = threading.Thread(target=run, name="keyqueue-wind-down", daemon=True)
    thread.start()
    interrupted: BaseException | None = None
    while thread.is_alive():
        try:
            thread.join()
        except BaseException as exc:  # Ctrl-C again: the keys are being put back
            interrupted = interrupted or exc
    if failed:
        raise failed[0]
    if interrupted is not None:
        raise interrupted


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
    # Until every worker has left, or the run ends without them (Ctrl-C again).
    # A worker not started yet is not waited for: it sees the stop before its
    # first get (and join would raise).
    while not finished.is_set() and any(thread.is_alive() for thread in threads):
        try:
            interrupt()
        except Exception:  # a server queue that lost its connection: try again
            logger.debug("interrupting the workers' gets failed", exc_info=True)
        for thread in threads:
            if thread.is_alive():
                thread.join(_POLL)
            if thread.is_alive():
                break


async def arun_workers(
    queue: AsyncWorkQueue[K] | Queue[K, Awaitable[K]],
    handler: Callable[[K], Awaitable[Requeue | None]],
    workers: int = 1,
    stop: asyncio.Event | None = None,
    on_give_up: Callable[[K, BaseException], object] | None = None,
    batch: bool | None = None,
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
    shutdown) and released with ``done``; on a batched Redis queue both in
    one ``put_back`` script with the run's end, so no second cancellation
    (asyncio.run's second Ctrl-C) can come between them.

    Also runs an ``AsyncRedisWorkQueue``, whose methods are coroutines: each
    call is then awaited, and keys are claimed and their dones sent in
    batches as ``run_workers`` does on a ``RedisWorkQueue`` (``batch`` as
    there). A ``get`` that raises (a lost
    connection) is logged and tried again after a backoff, a ``done`` whose
    outcome is unknown asked again, as in ``run_workers``; a key given up as
    poison goes to ``on_give_up(key, Stalled(...))`` (an async one runs as a
    task, awaited before ``arun_workers`` returns).
    """
    check_workers(workers)
    check_queue(queue, "arun_workers", want_async=True)
    check_handler(handler, "arun_workers", want_async=True)
    source = worker_source(queue, batch)
    aqueue = source.queue  # what the workers call: get and the outcome's calls
    idle: set[asyncio.Task[None]] = set()  # workers waiting in get: safe to cancel
    tally: Counter[str] = Counter()  # shared by the workers: they run on one loop
    stopping = False
    woken = asyncio.Event()  # set once the workers stop: their pauses end
    give_ups: set[asyncio.Task[Any]] = set()  # async on_give_up calls for poison keys

    def given_up(task: asyncio.Task[Any]) -> None:
        give_ups.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("on_give_up raised", exc_info=task.exception())

    def poisoned(key: K, error: BaseException) -> None:
        assert on_give_up is not None
        returned = on_give_up(key, error)
        if inspect.isawaitable(returned):
            task = asyncio.ensure_future(returned)
            give_ups.add(task)
            task.add_done_callback(given_up)

    unwatch = _watch_poison(queue, poisoned if on_give_up is not None else None)

    def stopped() -> bool:
        return stopping or (stop is not None and stop.is_set())

    async def pause(seconds: float) -> bool:
        """Sleep ``seconds`` or until the workers stop; True if they go on."""
        if not stopped():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(seconds):
                    await woken.wait()
        return not stopped()

    async def handle(key: K) -> tuple[object, BaseException | None]:
        """The handler's result and error; a cancelled one's key is added again."""
        try:
            pending = handler(key)
            if not inspect.isawaitable(pending):
                wrong = f"handler returned {pending!r} for {key!r}, not an awaitable"
                return None, TypeError(wrong)
            return await pending, None
        except asyncio.CancelledError:
            await adrive(source.requeue(key))  # unfinished: handed out again
            raise
        except Exception as exc:
            return None, exc

    async def work() -> None:
        try:
            await take_keys()
        finally:
            await adrive(source.leave())

    async def take_keys() -> None:
        me = asyncio.current_task()
        assert me is not None
        delay = wait = 0.0  # the backoff and pause before the next get: > 0 after one raised
        while not stopped():
            if wait and not await pause(wait):
                return
            idle.add(me)
            try:
                key = await aqueue.get()
            except ShutDown:
                return
            except asyncio.CancelledError:
                if stopped():
                    return
                raise
            except Exception as exc:  # a lost connection: reconnect, go on
                delay, wait = get_failed(queue, exc, delay)
                continue
            finally:
                idle.discard(me)
            delay = wait = 0.0
            tally["processed"] += 1
            outcome = ERRORS
            try:
                result, error = await handle(key)
                flow = outcome_flow(aqueue, key, result, error, pause, on_give_up)
                outcome, _ = await adrive(flow)
            finally:
                report = source.report(key, outcome, pause)
                call, counted = begin(report)  # a batched done is queued: no call
                tally[await adrive(report, call) if call is not None else cast(str, counted)] += 1

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
        tally.update(await adrive(source.close(False)))
        if unwatch is not None:
            unwatch()
        if give_ups:
            await asyncio.gather(*give_ups, return_exceptions=True)
    return run_stats([tally])
