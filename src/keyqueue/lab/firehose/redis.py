"""The firehose spread over processes on one ``RedisWorkQueue`` (``--backend redis``).

Theory of operation
-------------------
The same load as the in-memory firehose, on one ``RedisWorkQueue`` shared by
``processes`` processes. Unless given a server URL, the parent starts a
private valkey-server (``keyqueue.testing.local_valkey``) and stops it on the way out.
It names a fresh queue (``lab-firehose-<random>``) and starts the children
(multiprocessing, spawn). Child ``i`` opens its own client of that queue and
runs its share of the load: a producer thread firing ``rate / processes``
events a second with its own seed, one ``add_many`` per batch (a few
milliseconds of events, one round trip), and its share of the ``workers``
under ``run_workers`` with the in-memory firehose's simulated reconcile.

The parent drives the children over one pipe each: ``go`` (start firing),
``sample`` (events fired so far, and the GET and DONE durations this child's
client saw since the last sample), ``stop`` (shut this client down, wait for
its holds, final report). The counters come from the server, where
``stats()`` counts the whole queue, so each tick is the same ``FirehoseTick``
as in memory and the result the same ``FirehoseResult``.

Drain: a Redis client's shutdown only stops *that* client taking keys, so
after the last event the children keep working until the parent reads a
queue with nothing waiting or held; then each shuts down and waits for its
own holds. Retries still delayed then are dropped (counted as given up), as
the in-memory drain drops them.

Every exit path stops the children, deletes the queue's keys and stops the
private server: Ctrl-C included. The children ignore SIGINT (a terminal sends
it to the whole process group) and are stopped by the parent; a child whose
pipe closes (its parent died) stops by itself.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import signal
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from multiprocessing.connection import Connection
from typing import Any

import redis

from keyqueue.redis import RedisWorkQueue, client_from_url, close_client
from keyqueue.testing import local_valkey

from ..simulated import quiet_simulated_give_ups
from .common import (
    FirehoseConfig,
    FirehoseResult,
    FirehoseTick,
    Producer,
    Samples,
    Ticks,
    Workers,
    firehose_result,
)

__all__ = ["FirehoseError", "child_share", "queue_keys", "run_redis_firehose"]

START_TIMEOUT = 60.0
"""Seconds the children get to start and connect."""
STOP_TIMEOUT = 30.0
"""Seconds a child gets to finish its holds and report after ``stop``."""
IDLE_POLL = 0.02
"""Seconds between the drain's checks for an idle queue."""
DELAYED_GRACE = 1.0
"""Seconds the drain waits for delayed retries once nothing else is left."""


@dataclass(frozen=True, slots=True)
class _Report:
    """What a child says when sampled: totals so far, and new samples."""

    sent: int
    waits: list[float]
    works: list[float]
    failures: int
    gave_up: int
    started_at: float
    finished_at: float
    """0.0 while the producer is still firing."""


def child_share(total: int, processes: int, index: int) -> int:
    """Child ``index``'s share of ``total`` (workers): as even as can be."""
    return total // processes + (1 if index < total % processes else 0)


def queue_keys(client: redis.Redis, name: str) -> list[bytes]:
    """Every Redis key of the queue ``name`` (they share the hash tag ``{name}``)."""
    return list(client.scan_iter(match=f"keyqueue:{{{name}}}:*", count=1000))


# -- a child process -------------------------------------------------------------------


def _child(url: str, name: str, config: FirehoseConfig, workers: int, conn: Connection) -> None:
    """One process: its client, its producer, its workers, commanded over ``conn``."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent stops us
    try:
        queue = RedisWorkQueue(name, url=url, durability=config.durability)
    except Exception as exc:
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return
    samples = Samples()
    queue.subscribe(samples.on_event)
    halt = threading.Event()
    runners = Workers(queue, config, workers)
    runner = runners.thread
    producer = Producer(config, halt, queue.add_many)

    def report() -> _Report:
        waits, works = samples.take()
        return _Report(
            producer.sent,
            waits,
            works,
            runners.reconcile.failures,
            runners.gave_up,
            producer.started_at,
            producer.finished_at,
        )

    with quiet_simulated_give_ups():
        try:
            if workers:
                runner.start()
            conn.send(("ready", None))
            while True:
                command = conn.recv()
                if command == "go":
                    producer.start()
                elif command == "sample":
                    conn.send(("sample", report()))
                else:  # "stop"
                    break
        except (EOFError, OSError):  # the parent is gone: stop quietly
            pass
        finally:
            halt.set()
            if producer.is_alive():
                producer.join()
            queue.shutdown(drain=True, timeout=STOP_TIMEOUT)
            if runner.is_alive():
                runner.join(STOP_TIMEOUT)
            with contextlib.suppress(OSError):
                conn.send(("stopped", report()))
            queue.close()


# -- the parent --------------------------------------------------------------------------


class FirehoseError(RuntimeError):
    """A child process could not start or reach the server."""


class _Children:
    """The child processes, their pipes, and what their reports add up to."""

    def __init__(self) -> None:
        self.processes: list[Any] = []
        self.pipes: list[Connection] = []
        self.reports: list[_Report | None] = []  # each child's latest
        self.waits: list[float] = []  # since the previous take()
        self.works: list[float] = []
        self.all_waits: list[float] = []
        self.all_works: list[float] = []
        self.stopped = False

    def start(self, url: str, name: str, config: FirehoseConfig) -> None:
        """Start one child per process, each with its share of the load."""
        context = multiprocessing.get_context("spawn")
        n = config.processes
        for i in range(n):
            workers = child_share(config.workers, n, i)
            share = replace(
                config, rate=config.rate / n, seed=config.seed + 1_000_003 * i, workers=1
            )
            parent_end, child_end = context.Pipe()
            process = context.Process(
                target=_child,
                args=(url, name, share, workers, child_end),
                name=f"keyqueue-lab-firehose-{i}",
                daemon=True,
            )
            self.processes.append(process)
            self.pipes.append(parent_end)
            self.reports.append(None)
            process.start()
            child_end.close()

    def wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT
        for i, pipe in enumerate(self.pipes):
            if not pipe.poll(max(0.0, deadline - time.monotonic())):
                raise FirehoseError(f"child process {i} did not start in {START_TIMEOUT:g}s")
            kind, detail = self._recv(i)
            if kind == "error":
                raise FirehoseError(f"child process {i} could not open the queue: {detail}")

    def _recv(self, i: int) -> tuple[str, Any]:
        try:
            message: tuple[str, Any] = self.pipes[i].recv()
        except (EOFError, OSError):
            code = self.processes[i].exitcode
            raise FirehoseError(f"child process {i} died (exit status {code})") from None
        return message

    def go(self) -> None:
        for pipe in self.pipes:
            pipe.send("go")

    def sample(self) -> None:
        """Ask every child for its report."""
        for pipe in self.pipes:
            pipe.send("sample")
        self._fold([self._recv(i)[1] for i in range(len(self.pipes))])

    def _fold(self, reports: list[_Report | None]) -> None:
        for i, report in enumerate(reports):
            if report is not None:
                self.reports[i] = report
                self.waits += report.waits
                self.works += report.works
                self.all_waits += report.waits
                self.all_works += report.works

    def take(self) -> tuple[list[float], list[float]]:
        """The queue waits and reconcile times reported since the previous take."""
        waits, works = self.waits, self.works
        self.waits, self.works = [], []
        return waits, works

    def _known(self) -> list[_Report]:
        return [r for r in self.reports if r is not None]

    @property
    def sent(self) -> int:
        return sum(r.sent for r in self._known())

    @property
    def failures(self) -> int:
        return sum(r.failures for r in self._known())

    @property
    def gave_up(self) -> int:
        return sum(r.gave_up for r in self._known())

    @property
    def started_at(self) -> float:
        """When the first producer started (0.0 before)."""
        return min((r.started_at for r in self._known() if r.started_at), default=0.0)

    @property
    def finished_at(self) -> float:
        """When the last producer stopped (0.0 while one still fires)."""
        known = self._known()
        if len(known) < len(self.reports) or not all(r.finished_at for r in known):
            return 0.0
        return max(r.finished_at for r in known)

    def stop(self) -> None:
        """Stop every child and take its final report; kill one that will not go.

        Safe to call again (a second Ctrl-C)."""
        if self.stopped:
            return
        self.stopped = True
        for pipe in self.pipes:
            with contextlib.suppress(OSError):
                pipe.send("stop")
        reports: list[_Report | None] = [None] * len(self.pipes)
        deadline = time.monotonic() + STOP_TIMEOUT
        for i, pipe in enumerate(self.pipes):
            with contextlib.suppress(EOFError, OSError):
                while pipe.poll(max(0.0, deadline - time.monotonic())):
                    kind, detail = pipe.recv()
                    if kind == "stopped":
                        reports[i] = detail
                        break
        for process in self.processes:
            process.join(max(0.1, deadline - time.monotonic()))
            if process.is_alive():
                process.kill()
                process.join()
        for pipe in self.pipes:
            pipe.close()
        self._fold(reports)


def run_redis_firehose(
    config: FirehoseConfig,
    on_tick: Callable[[FirehoseTick], None] | None = None,
    on_start: Callable[[Callable[[], float]], None] | None = None,
    redis_url: str | None = None,
) -> FirehoseResult:
    """``run_firehose`` for ``config.backend == "redis"``: the same contract.

    ``redis_url`` names the server; without it a private valkey-server runs
    for the call. The queue's keys are deleted from the server at the end.
    Raises ``redis.exceptions.ConnectionError`` if the server cannot be
    reached, ``FirehoseError`` if a child process cannot start.
    """
    with contextlib.ExitStack() as stack:
        url = redis_url if redis_url is not None else stack.enter_context(local_valkey())
        name = f"lab-firehose-{uuid.uuid4().hex[:12]}"
        monitor = RedisWorkQueue(name, url=url, durability=config.durability)
        stack.callback(monitor.close)
        cleaner = client_from_url(url)
        stack.callback(close_client, cleaner)
        stack.callback(lambda: _delete_queue(cleaner, name))
        return _run(config, url, name, monitor, on_tick, on_start)
    raise AssertionError("unreachable")  # pragma: no cover (ExitStack swallows nothing)


def _delete_queue(client: redis.Redis, name: str) -> None:
    keys = queue_keys(client, name)
    if keys:
        client.delete(*keys)


def _run(
    config: FirehoseConfig,
    url: str,
    name: str,
    monitor: RedisWorkQueue,
    on_tick: Callable[[FirehoseTick], None] | None,
    on_start: Callable[[Callable[[], float]], None] | None,
) -> FirehoseResult:
    ticks = Ticks(config, on_tick)
    children = _Children()

    def firing_time() -> float:
        if not children.started_at:
            return 0.0
        return (children.finished_at or time.monotonic()) - children.started_at

    def since_start() -> float:
        return time.monotonic() - children.started_at

    def sample(draining: bool = False, last: bool = False) -> None:
        children.sample()  # first: the server's counters then include every event counted
        s = monitor.stats()
        t, sent, firing = since_start(), children.sent, firing_time()
        ticks.take(s, t, sent, firing, *children.take(), draining=draining, last=last)

    interrupted = False
    drained_in = 0.0
    dropped = 0
    try:
        children.start(url, name, config)
        children.wait_ready()
        children.go()
        end = time.monotonic() + config.duration
        while not children.started_at:  # each child reports when its producer started
            children.sample()
        if on_start is not None:
            on_start(since_start)
        # Samples at tick, 2*tick, ... strictly before the end of firing; the
        # last one, when every producer has stopped, covers the rest.
        next_sample = config.tick
        while True:
            wake = min(children.started_at + next_sample, end)
            time.sleep(max(0.0, wake - time.monotonic()))
            if time.monotonic() < end:
                sample()
                next_sample += config.tick
                continue
            children.sample()
            if children.finished_at:
                break
            time.sleep(IDLE_POLL)
        sample(last=True)  # with the drain's estimate
        # Drain: the children keep working until nothing waits or is held.
        drain_start = time.monotonic()
        next_sample = drain_start + config.tick
        only_delayed_since = 0.0  # when nothing but delayed keys was left
        while True:
            s = monitor.stats()
            if s.depth == 0 and s.processing == 0:
                # Retries due soon are waited for (their backoff is short);
                # keys still delayed after DELAYED_GRACE are dropped, as the
                # in-memory drain drops them.
                now = time.monotonic()
                only_delayed_since = only_delayed_since or now
                if s.delayed == 0 or now - only_delayed_since >= DELAYED_GRACE:
                    break
            else:
                only_delayed_since = 0.0
            if time.monotonic() >= next_sample:
                sample(draining=True)
                next_sample += config.tick
            time.sleep(IDLE_POLL)
        drained_in = time.monotonic() - drain_start
        dropped = s.delayed
        children.stop()
    except KeyboardInterrupt:
        interrupted = True
        children.stop()
        if children.started_at and not ticks.covers(children.sent):
            # The caller prints a summary: no more live updates.
            s = monitor.stats()
            t, sent, firing = since_start(), children.sent, firing_time()
            draining = bool(ticks.taken and ticks.taken[-1].draining)
            ticks.take(s, t, sent, firing, *children.take(), draining=draining, notify=False)
    except BaseException:
        children.stop()
        raise
    return firehose_result(
        config,
        elapsed=firing_time(),
        events=children.sent,
        drained_in=drained_in,
        stats=monitor.stats(),
        failures=children.failures,
        gave_up=children.gave_up + dropped,
        waits=children.all_waits,
        works=children.all_works,
        ticks=ticks.taken,
        interrupted=interrupted,
    )
