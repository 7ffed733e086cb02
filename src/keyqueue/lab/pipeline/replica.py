"""One replica of a replicated controller: an informer feeding a shared Redis queue, and workers.

Theory of operation
-------------------
``python -m keyqueue.lab.pipeline.replica CONFIG`` (``CONFIG``: the JSON of a
``ReplicaConfig``) is what docs/controller.md's "Many processes" tells a user
to run, N times: an ``Informer`` on the ``default`` (or ``namespace``)
ConfigMaps of an API server feeds one Redis queue shared by every replica, and
workers reconcile the keys. Two shapes: ``mode="async"``, an
``AsyncRedisWorkQueue`` and ``arun_workers`` on one event loop; and
``mode="threads"``, a ``RedisWorkQueue`` and ``run_workers`` in threads, the
informer on an event loop of its own thread (the docs' "With threads").

The object's spec is its ``data["counter"]`` (what ``/trigger`` bumps and the
load writes); its status is ``data["observed"]`` and ``data["token"]``. A
reconcile makes the status say the spec it observed: it reads the object from
the informer's cache, and if ``observed`` differs from ``counter`` it writes
``observed = counter`` and its fencing token with a PUT carrying the object's
``metadata.resourceVersion`` (the API's optimistic concurrency); a 409 Conflict
means someone wrote meanwhile: it reads the object afresh and tries again.
The token is the queue's (``queue.token(key)``): a status that already carries
a higher token was written by a later holder of the key, so this one's lease
was taken back and it writes nothing (``fenced``). Read, compare, and PUT
with the resourceVersion it read make that check atomic: a holder whose lease
ran out while it was stopped can never overwrite its successor's status.

Every reconcile is reported on stdout as JSON lines, one ``os.write`` each
(so a SIGKILL loses no finished line), times ``time.monotonic()``
(CLOCK_MONOTONIC, one clock for every process of the machine):

- ``["ready", holder, pid, t]`` once the informer has synced and the workers run;
- ``["start", key, token, t]`` as a reconcile starts;
- ``["end", key, token, started, ended, seen_rv, outcome, wrote_rv]``:
  ``seen_rv`` is the resourceVersion whose spec the status now says
  (0 when fenced or gone), ``outcome`` one of ``wrote``, ``current`` (the
  status already said it), ``fenced``, ``gone``; ``wrote_rv`` the version its
  PUT made (0 if none);
- ``["lost", key, t]``: this replica learned that its lease on ``key`` was
  taken back (the queue's ``LEASE_LOST``);
- ``["log", level, message]``: a warning or error the library logged;
- ``["stats", runstats]`` when the workers return (SIGTERM stops them);
- with ``trace``: ``["event", key, rv, received, add_started, add_ended]`` per
  watch event (when it reached the informer, and the ``add`` it caused), and
  ``["get", key, waited]`` per key handed to this replica (seconds since the
  add that made it dirty, the queue's GET event).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from kubernetes_asyncio import client as k8s
from kubernetes_asyncio.client.exceptions import ApiException

from keyqueue import Event, EventKind, RunStats, arun_workers, run_workers
from keyqueue.informer import Change, Informer
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue

from .processes import new_event_loop

__all__ = ["CONFLICT_RETRIES", "ReplicaConfig", "Reconciler", "main"]

CONFLICT_RETRIES = 50
"""Conflicts a reconcile takes (re-reading each time) before it fails and is retried."""
SYNC_TIMEOUT = 30.0
"""Seconds the informer gets for its first list."""
WRITE_TIMEOUT = 30.0
"""Seconds a threaded worker waits for its API call on the informer's loop."""
STOP_TIMEOUT = 5.0
"""Seconds a threaded replica waits for its informer to stop before it closes the queue."""

Emit = Callable[..., None]


@dataclass(frozen=True, slots=True)
class ReplicaConfig:
    api: str
    """The API server, ``http://host:port``."""
    redis: str
    """The queue's server, ``redis://host:port/db``."""
    queue: str = "controller"
    holder: str = "replica"
    """The queue client's ``holder`` (what a snapshot shows holding a key)."""
    lease: float = 1.0
    durability: str = "primary"
    """The queue's ``durability=``."""
    workers: int = 8
    mode: str = "async"
    """``async`` (AsyncRedisWorkQueue, arun_workers) or ``threads`` (RedisWorkQueue,
    run_workers)."""
    namespace: str = "default"
    work: float = 0.0
    """Seconds of simulated work in a reconcile that has something to change, before its write."""
    trace: bool = False
    """``mode="async"`` only: also report every watch event's add and every hand-out
    (``event`` and ``get`` lines), for the lab's stage table."""

    def __post_init__(self) -> None:
        if self.mode not in ("async", "threads"):
            raise ValueError(f"mode must be 'async' or 'threads', got {self.mode!r}")
        if not (self.lease > 0 and self.work >= 0 and self.workers >= 1):
            raise ValueError("lease must be > 0, work >= 0 and workers >= 1")


def emitter() -> Emit:
    """``emit(*fields)``: one JSON line on stdout, written whole (thread-safe)."""

    def emit(*fields: Any) -> None:
        os.write(1, json.dumps(fields, separators=(",", ":")).encode() + b"\n")

    return emit


class _Forward(logging.Handler):
    """The library's warnings and errors as ``["log", level, message]`` lines."""

    def __init__(self, emit: Emit) -> None:
        super().__init__(logging.WARNING)
        self.emit_line = emit

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            error = record.exc_info[1]
            message += f": {type(error).__module__}.{type(error).__qualname__}: {error}"
        self.emit_line("log", record.levelname, message)


class Reconciler:
    """Status := spec, fenced by the queue's token and the object's resourceVersion."""

    def __init__(
        self, v1: k8s.CoreV1Api, informer: Informer[Any], emit: Emit, work: float = 0.0
    ) -> None:
        self.v1 = v1
        self.informer = informer
        self.emit = emit
        self.work = work

    def start(self, key: str, token: int) -> float:
        """Report that the handler of ``key`` started, now; when."""
        started = time.monotonic()
        self.emit("start", key, token, started)
        return started

    async def reconcile(self, key: str, token: int, started: float | None = None) -> None:
        """Make ``key``'s status say its spec; report start (unless the handler
        did, at ``started``) and end."""
        emit = self.emit
        if started is None:
            started = self.start(key, token)
        namespace, _, name = key.rpartition("/")
        obj = self.informer.get(key)
        outcome, seen, wrote = "gone", 0, 0
        worked = False
        for _ in range(CONFLICT_RETRIES):
            if obj is None:
                break
            data = dict(obj.data or {})
            rv = int(obj.metadata.resource_version)
            if int(data.get("token", "0")) > token:
                outcome = "fenced"  # a later holder wrote: this lease was taken back
                break
            spec = data.get("counter")
            if data.get("observed") == spec:
                outcome, seen = "current", rv
                break
            if self.work and not worked:  # the work of making the world match, once
                worked = True
                await asyncio.sleep(self.work)
            data["observed"], data["token"] = spec, str(token)
            obj.data = data  # obj.metadata.resource_version: the precondition
            try:
                written = await self.v1.replace_namespaced_config_map(name, namespace, obj)
            except ApiException as exc:
                if exc.status == 404:
                    break
                if exc.status != 409:
                    raise
                try:  # someone wrote meanwhile: read it afresh, try again
                    obj = await self.v1.read_namespaced_config_map(name, namespace)
                except ApiException as again:
                    if again.status != 404:
                        raise
                    obj = None
                continue
            outcome, seen, wrote = "wrote", rv, int(written.metadata.resource_version)
            break
        else:
            raise RuntimeError(f"{key}: {CONFLICT_RETRIES} conflicts in a row")
        emit("end", key, token, started, time.monotonic(), seen, outcome, wrote)


def _on_event(emit: Emit, trace: bool = False) -> Callable[[Event[str]], None]:
    def on_event(event: Event[str]) -> None:
        if event.kind is EventKind.LEASE_LOST:
            emit("lost", event.key, time.monotonic())
        elif trace and event.kind is EventKind.GET:
            emit("get", event.key, event.duration or 0.0)

    return on_event


def _api(url: str) -> k8s.ApiClient:
    configuration = k8s.Configuration()
    configuration.host = url
    return k8s.ApiClient(configuration)


def _informer(
    v1: k8s.CoreV1Api, config: ReplicaConfig, queue: AsyncRedisWorkQueue, emit: Emit
) -> Informer[Any]:
    """The informer feeding ``queue``: ``queue=`` as the docs say; with ``trace``,
    an async handler that times each ``add`` it awaits (the informer awaits it
    the same way: one key's changes in order, a bounded number in flight)."""
    if not config.trace:
        return Informer(v1.list_namespaced_config_map, config.namespace, queue=queue)
    informer: Informer[Any] = Informer(v1.list_namespaced_config_map, config.namespace)

    async def add(change: Change[Any]) -> None:
        started = time.monotonic()
        await queue.add(change.key)
        if not change.relisted:
            rv = int(change.resource_version)
            emit("event", change.key, rv, change.received, started, time.monotonic())

    informer.add_handler(add)
    return informer


async def run_async(config: ReplicaConfig, emit: Emit) -> RunStats:
    """``mode="async"``: one loop runs the informer, the queue and the workers."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    async with _api(config.api) as api:
        v1 = k8s.CoreV1Api(api)
        queue = AsyncRedisWorkQueue(
            config.queue,
            url=config.redis,
            lease=config.lease,
            holder=config.holder,
            durability=config.durability,
        )
        queue.subscribe(_on_event(emit, config.trace))
        informer = _informer(v1, config, queue, emit)
        watching = asyncio.create_task(informer.run(), name="replica-informer")
        await asyncio.wait_for(informer.wait_synced(), SYNC_TIMEOUT)
        reconciler = Reconciler(v1, informer, emit, config.work)

        async def handler(key: str) -> None:
            await reconciler.reconcile(key, queue.token(key))

        emit("ready", config.holder, os.getpid(), time.monotonic())
        try:
            return await arun_workers(queue, handler, workers=config.workers, stop=stop)
        finally:
            watching.cancel()
            await asyncio.gather(watching, return_exceptions=True)
            await queue.aclose()


def run_threads(config: ReplicaConfig, emit: Emit) -> RunStats:
    """``mode="threads"``: ``run_workers`` threads; the informer on its own loop's thread.

    The workers' API calls run on a second loop's thread (as a blocking client
    would run in each worker): the informer's loop makes a blocking ``add``
    per event, and a worker must not wait behind a backlog of them (a replica
    resumed after a SIGSTOP has seconds of events to catch up on).
    """
    queue = RedisWorkQueue(
        config.queue,
        url=config.redis,
        lease=config.lease,
        holder=config.holder,
        durability=config.durability,
    )
    queue.subscribe(_on_event(emit))
    watcher, writer = new_event_loop(), new_event_loop()
    synced = threading.Event()
    informers: list[Informer[Any]] = []

    async def watch() -> None:
        async with _api(config.api) as api:
            v1 = k8s.CoreV1Api(api)
            informer: Informer[Any] = Informer(
                v1.list_namespaced_config_map, config.namespace, queue=queue
            )
            informers.append(informer)
            watching = asyncio.create_task(informer.run())
            await informer.wait_synced()
            synced.set()
            await watching

    informing = watcher.create_task(watch())

    def inform() -> None:
        with contextlib.suppress(asyncio.CancelledError):
            watcher.run_until_complete(informing)

    informer_thread = threading.Thread(target=inform, daemon=True)
    informer_thread.start()
    threading.Thread(target=writer.run_forever, daemon=True).start()
    if not synced.wait(SYNC_TIMEOUT):
        raise RuntimeError(f"the informer did not sync within {SYNC_TIMEOUT:g} s")

    async def make_reconciler() -> Reconciler:
        return Reconciler(k8s.CoreV1Api(_api(config.api)), informers[0], emit, config.work)

    reconciler = asyncio.run_coroutine_threadsafe(make_reconciler(), writer).result()

    def handler(key: str) -> None:
        token = queue.token(key)
        started = reconciler.start(key, token)  # here, not when the writer's loop gets to it
        future = asyncio.run_coroutine_threadsafe(reconciler.reconcile(key, token, started), writer)
        future.result(WRITE_TIMEOUT)

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    emit("ready", config.holder, os.getpid(), time.monotonic())
    try:
        return run_workers(queue, handler, workers=config.workers, stop=stop)
    finally:
        # The informer first: an add it is making when the queue closes its
        # connections fails on a closed socket (logged as the handler's error).
        watcher.call_soon_threadsafe(informing.cancel)
        informer_thread.join(STOP_TIMEOUT)
        queue.close()


def main(argv: list[str]) -> None:
    """``python -m keyqueue.lab.pipeline.replica CONFIG_JSON``."""
    config = ReplicaConfig(**json.loads(argv[0]))
    # The parent stops this process (SIGTERM, or SIGKILL in a fault test): Ctrl-C is its.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    emit = emitter()
    logging.getLogger("keyqueue").addHandler(_Forward(emit))
    if config.mode == "async":
        with asyncio.Runner(loop_factory=new_event_loop) as runner:
            stats = runner.run(run_async(config, emit))
    else:
        stats = run_threads(config, emit)
    emit("stats", asdict(stats))
    sys.stdout.flush()
    os._exit(0)  # the informer's thread and the interpreter's teardown: nothing to wait for


if __name__ == "__main__":
    main(sys.argv[1:])
