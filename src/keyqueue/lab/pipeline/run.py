"""``keyqueue lab pipeline``: a change's whole trip, with real parts, timed stage by stage.

Theory of operation
-------------------
Laid out as the seed's run (and any real controller) is: this process is the
controller and holds only an ``Informer`` on ``default`` ConfigMaps through
``kubernetes_asyncio`` (exactly as a controller would use it), an
``AsyncWorkQueue`` and ``arun_workers`` with a simulated reconcile. It starts
a private etcd (or uses ``--etcd URL``), the API server on it in a process of
its own, and the load generator, POSTing ``/trigger/obj-N`` with a fixed
concurrency, in another (``processes``: how they start, talk and stop). Each
stage is timed at its two ends with ``time.monotonic`` (see ``stages``): the
API server's process times the etcd writes, the load generator's the
triggers, this one the rest, and they send their samples here.

The informer's handler stamps the event, calls ``queue.add`` and learns from
the queue's event hook whether the add enqueued the key, coalesced into a
waiting one, or marked a held one for redelivery. A worker reads the object
from the informer's cache when it starts, so each reconcile knows which
version it saw. After the load, the run waits (bounded) until every
triggered object has been reconciled at the version of its last trigger, then
drains the queue; the result says whether that held for every object.

Under load only a sample of keys is traced (``trace_keys``); with no load
every key is. A ``[STATS]`` line comes every ``tick`` while the run lasts (when
a count changed; its /trigger percentiles cover that tick), and a ``final``
one when it ends, however it ends, with the whole run's percentiles. Ctrl-C
(or SIGTERM) ends the run: the summary covers what happened so far; the load
generator, the API server and etcd (if this run started it) are stopped, in
that order, on every way out. SIGINT does so even in a process started
with it ignored (a background job of a script or of a test run).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import random
import signal
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import aiohttp
from kubernetes_asyncio import client as k8s

from keyqueue import AsyncWorkQueue, EventKind, Stats, arun_workers
from keyqueue.informer import Change, Informer
from keyqueue.testing import local_etcd

from ..._console.options import ctrl_c_taken
from .apiserver import TriggerRecord
from .etcd import Etcd, EtcdError
from .processes import Child, new_event_loop
from .stages import STAGES, Percentiles, Timings, format_duration, percentiles

__all__ = ["PipelineConfig", "PipelineError", "PipelineResult", "StageResult", "run_pipeline"]

NAMESPACE = "default"
SYNC_TIMEOUT = 30.0
"""Seconds the informer gets for its first list, and then to open its watch."""
FIRST_ANSWER_TIMEOUT = 5.0
"""Seconds etcd (``--etcd`` or the private one) gets to answer the first request:
an endpoint that accepts connections and never answers is an error, not a hang."""

CLOCK = (
    "time.monotonic(): CLOCK_MONOTONIC on Linux, one clock for every process on the machine, "
    "so stages that start in one process and end in another subtract directly"
)

_GET, _ENQUEUE = EventKind.GET, EventKind.ENQUEUE
_ADD_KINDS = {
    EventKind.ENQUEUE: "",
    EventKind.COALESCE: " coalesced: already waiting",
    EventKind.MARK_WHILE_PROCESSING: " marked: a worker holds it, redelivered after done",
}


class PipelineError(RuntimeError):
    """The pipeline could not start (a port in use)."""


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    requests: int = 200
    concurrency: int = 10
    objects: int = 20
    reconcile: float = 0.005
    """Seconds each simulated reconcile takes."""
    workers: int = 8
    etcd: str | None = None
    """An etcd to use (``http://host:port``); None starts a private one."""
    load: bool = True
    """False: no load generator; serve until interrupted."""
    port: int = 0
    """The API server's port (0: a free one)."""
    seed: int = 0
    trace_keys: int = 2
    """Under load, trace objects obj-0 .. obj-(trace_keys - 1)."""
    tick: float = 1.0
    """Seconds between [STATS] lines."""
    settle_timeout: float = 30.0
    """Seconds to wait after the load for every object's last version to be reconciled."""
    replicas: int = 0
    """0: this process is the controller (an AsyncWorkQueue); N: N controller
    processes on one Redis queue (``replicated``)."""
    redis_url: str | None = None
    """With ``replicas``: the queue's server; None starts a private Valkey."""
    lease: float = 1.0
    """With ``replicas``: the queue's lease, in seconds."""
    durability: str = "primary"
    """With ``replicas``: the queue's ``durability=``."""
    kill_replica_at: float | None = None
    """With ``replicas`` >= 2: SIGKILL one replica this many seconds into the load."""

    def __post_init__(self) -> None:
        for name in ("requests", "concurrency", "objects", "workers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not (0 <= self.reconcile < math.inf):
            raise ValueError(f"reconcile must be a finite number >= 0, got {self.reconcile!r}")
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {self.port!r}")
        for name in ("tick", "settle_timeout"):
            if not (0 < getattr(self, name) < math.inf):
                raise ValueError(f"{name} must be a finite number > 0")
        if isinstance(self.replicas, bool) or not isinstance(self.replicas, int):
            raise ValueError(f"replicas must be an int >= 0, got {self.replicas!r}")
        if self.replicas < 0:
            raise ValueError(f"replicas must be an int >= 0, got {self.replicas!r}")
        if self.durability not in ("primary", "replicated"):
            raise ValueError(
                f"durability must be 'primary' or 'replicated', got {self.durability!r}"
            )
        if not self.replicas and (self.redis_url is not None or self.kill_replica_at is not None):
            raise ValueError("redis_url and kill_replica_at need replicas >= 1")
        if not self.replicas and self.durability != "primary":
            raise ValueError("durability needs replicas >= 1 (a Redis queue)")
        if self.kill_replica_at is not None:
            if self.replicas < 2:
                raise ValueError("kill_replica_at needs replicas >= 2: one must survive")
            if not (0 <= self.kill_replica_at < math.inf):
                raise ValueError("kill_replica_at must be a finite number >= 0")
        if self.replicas and not self.load:
            raise ValueError("replicas needs the load generator (not load=False)")
        if not (0 < self.lease < math.inf):
            raise ValueError(f"lease must be a finite number > 0, got {self.lease!r}")
        if self.etcd is not None and not self.etcd.startswith(("http://", "https://")):
            raise ValueError(f"etcd must be an http:// or https:// URL, got {self.etcd!r}")


@dataclass(frozen=True, slots=True)
class StageResult:
    name: str
    label: str
    what: str
    latency: Percentiles


@dataclass(frozen=True)
class PipelineResult:
    config: PipelineConfig
    url: str
    """The API server, ``http://127.0.0.1:PORT``."""
    etcd: str
    elapsed: float
    triggers: int
    """Triggers answered (load generator, or anyone with no load)."""
    created: int
    failed: int
    """Load-generator requests that failed."""
    watch_events: int
    stats: Stats
    stages: tuple[StageResult, ...]
    objects: int
    """Objects triggered."""
    stale: tuple[str, ...]
    """Objects whose last triggered version was never reconciled."""
    interrupted: bool = False
    ticks: tuple[str, ...] = field(default=())
    processes: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Which process held what: role -> {"pid", "holds"} (etcd's pid None with --etcd)."""
    replicas: dict[str, Any] | None = None
    """With ``config.replicas``: the queue's server, the lease, the faults (which
    replica, when, the keys it held), ``failover`` (``fleet.Failover.to_json``)
    and the reconciles per replica."""

    @property
    def verified(self) -> bool:
        """Every triggered object was reconciled at its final version."""
        return self.objects > 0 and not self.stale and not self.failed

    def stage(self, name: str) -> StageResult:
        return next(s for s in self.stages if s.name == name)

    @property
    def absorbed(self) -> float:
        """Percent of adds that did not become a hand-out of their own."""
        s = self.stats
        return 100.0 * (s.adds - s.gets) / s.adds if s.adds else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "url": self.url,
            "etcd": self.etcd,
            "elapsed": self.elapsed,
            "triggers": self.triggers,
            "created": self.created,
            "failed": self.failed,
            "watch_events": self.watch_events,
            "stats": asdict(self.stats),
            "absorbed": self.absorbed,
            "stages": {s.name: {"label": s.label, **asdict(s.latency)} for s in self.stages},
            "objects": self.objects,
            "stale": list(self.stale),
            "verified": self.verified,
            "interrupted": self.interrupted,
            "concurrency": self.config.concurrency,
            "processes": self.processes,
            "replicas": self.replicas,
            "clock": CLOCK,
        }


Line = Callable[[str, str], None]
"""``on_line(tag, text)``: one trace or status line (tag: TRIGGER, ENQUEUE, WORKER, STATS, INFO)."""


class _Hook:
    """The queue's ``metrics``: the run's ``on_queue_event`` as its observer."""

    def __init__(self, run: _Run) -> None:
        self.run = run

    def new_queue_metrics(self, name: str, gauges: Any) -> Any:
        return self.run.on_queue_event


class _Run:
    """The running parts' shared state; every callback runs on the loop."""

    def __init__(self, config: PipelineConfig, on_line: Line | None) -> None:
        self.config = config
        self.on_line = on_line
        self.timings = Timings()
        self.trace_all = not config.load
        self.traced = {f"obj-{i}" for i in range(config.trace_keys)}
        self.created = self.answered = self.failed = self.events = 0
        self.last_add: EventKind | None = None
        self.gets: dict[str, tuple[int, float]] = {}  # key -> (get seq, queue wait)
        self.get_seq = 0
        self.workers: dict[asyncio.Task[Any], int] = {}
        self.final: dict[str, int] = {}  # object name -> revision of its last answered trigger
        self.seen: dict[str, int] = {}  # key -> highest revision a finished reconcile saw
        self.settled = asyncio.Event()
        # The trace hook is a metrics observer, not an event subscriber: it gets
        # the same (kind, key, now, duration) without an Event built per call,
        # about a third of a subscriber's cost on every add (see the module doc).
        self.queue: AsyncWorkQueue[str] = AsyncWorkQueue("pipeline", metrics=_Hook(self))
        self.informer: Informer[Any] | None = None
        self.watches = 0  # watches open at the API server, as it last said
        self.watch_open = asyncio.Event()  # set once the API server said one is open
        loop = asyncio.get_running_loop()
        self.api_ready: asyncio.Future[str] = loop.create_future()
        self.load_done = asyncio.Event()

    def traces(self, key_or_name: str) -> bool:
        return self.on_line is not None and (
            self.trace_all or key_or_name.rpartition("/")[2] in self.traced
        )

    def line(self, tag: str, text: str) -> None:
        if self.on_line is not None:
            self.on_line(tag, text)

    # -- the API server's hooks ---------------------------------------------------

    def on_trigger(self, record: TriggerRecord) -> None:
        if record.action == "created":
            self.created += 1
        if not self.config.load:
            self.answered += 1
            self.final[record.name] = max(record.rv, self.final.get(record.name, 0))
        if self.traces(record.name):
            self.line(
                "TRIGGER",
                f"[TRIGGER] POST /trigger/{record.name} action={record.action} "
                f"rv={record.rv} took={format_duration(record.took)}",
            )

    def on_api_message(self, message: tuple[Any, ...]) -> None:
        """The API server process's messages (see ``processes``)."""
        kind = message[0]
        if kind == "batch":
            _, writes, triggers, self.watches = message
            if self.watches:
                self.watch_open.set()
            on_write = self.timings.on_write
            for revision, started, finished in writes:
                on_write(revision, started, finished)
            for fields in triggers:
                self.on_trigger(TriggerRecord(*fields))
        elif kind == "ready":
            if not self.api_ready.done():
                self.api_ready.set_result(message[1])
        elif kind == "error":
            if not self.api_ready.done():
                self.api_ready.set_exception(_ChildError(message[1], message[2]))
        elif kind == "eof" and not self.api_ready.done():
            self.api_ready.set_exception(_ChildError("exit", "the API server process exited"))

    def on_load_message(self, message: tuple[Any, ...]) -> None:
        """The load generator process's messages (see ``processes``)."""
        kind = message[0]
        if kind == "answered":
            _, answered, failed = message
            self.failed += failed
            final, trigger_answered = self.final, self.timings.trigger_answered
            for name, revision, sent, done in answered:
                trigger_answered(name, revision, sent, done)
                if revision > final.get(name, 0):
                    final[name] = revision
            self.answered += len(answered)
        elif kind in ("done", "eof") and not self.load_done.is_set():
            self.load_done.set()

    # -- the informer's handler and the queue's hook ---------------------------------

    def on_change(self, change: Change[Any]) -> None:
        timings = self.timings
        started = time.monotonic()
        self.last_add = None
        if self.queue.shutting_down:
            # The run is stopping (Ctrl-C, the load done): the add would be a
            # no-op, so the event is not counted either, and the summary's
            # "watch events → adds" and the stage samples count the same adds.
            return
        before = time.perf_counter()
        self.queue.add(change.key)
        took = time.perf_counter() - before
        if change.relisted:
            return  # from a list, not a watch event: nothing to pair with a write
        self.events += 1
        timings.add("event_to_add", started - change.received)
        timings.add("add_call", took)
        revision = int(change.resource_version)
        timings.event_at[revision] = change.received
        written = timings.write_done.get(revision)
        if self.traces(change.key):
            after = f" ← {format_duration(started - written)} after the write" if written else ""
            how = _ADD_KINDS.get(self.last_add, "") if self.last_add else ""
            self.line(
                "ENQUEUE",
                f"[ENQUEUE] key={change.key} (informer: {change.kind.value}){how}{after}",
            )

    def on_queue_event(self, kind: EventKind, key: str, now: float, duration: float | None) -> None:
        if kind is _GET:
            self.get_seq += 1
            wait = duration or 0.0
            self.gets[key] = (self.get_seq, wait)
            self.timings.add("add_to_get", wait)
        elif kind in _ADD_KINDS:
            self.last_add = kind

    # -- the workers -----------------------------------------------------------------

    async def reconcile(self, key: str) -> None:
        started = time.monotonic()
        task = asyncio.current_task()
        assert task is not None
        worker = self.workers.setdefault(task, len(self.workers) + 1)
        seq, wait = self.gets.pop(key, (0, 0.0))
        obj = self.informer.get(key) if self.informer is not None else None
        revision = int(obj.metadata.resource_version) if obj is not None else 0
        traced = self.traces(key)
        if traced:
            self.line(
                "WORKER",
                f"[WORKER-{worker}] key={key} Get seq={seq} ← {format_duration(wait)} after that",
            )
        if self.config.reconcile:
            await asyncio.sleep(self.config.reconcile)
        finished = time.monotonic()
        self.timings.add("reconcile", finished - started)
        self.timings.reconciled(key, revision, finished)
        if revision > self.seen.get(key, 0):
            self.seen[key] = revision
        if traced:
            self.line(
                "WORKER",
                f"[WORKER-{worker}] key={key} Done seq={seq} rv={revision} "
                f"reconcile={format_duration(finished - started)}",
            )
        self.check_settled()

    def stale(self) -> list[str]:
        return sorted(
            name
            for name, revision in self.final.items()
            if self.seen.get(f"{NAMESPACE}/{name}", 0) < revision
        )

    def check_settled(self) -> None:
        if self.final and not self.stale():
            self.settled.set()

    # -- [STATS] ---------------------------------------------------------------------

    def stats_line(self, t: float, since: int, *, final: bool = False) -> str:
        """Counts so far, and the /trigger round trips answered after the first ``since``
        (``final``: the closing line, ``since`` 0: the whole run's)."""
        s = self.queue.stats()
        trig = percentiles(self.timings.samples["trigger"][since:])
        absorbed = 100.0 * (s.adds - s.gets) / s.adds if s.adds else 0.0
        counts = (
            f"[STATS] t={t:.1f}s {'final ' if final else ''}triggers={self.answered:,} "
            f"watch-events={self.events:,} adds={s.adds:,} coalesced={s.coalesced:,} "
            f"marked={s.marked_while_processing:,} reconciles={s.dones:,} depth={s.depth} "
            f"absorbed={absorbed:.1f}%"
        )
        if not self.config.load:  # the triggers came from elsewhere: no round trip is timed
            return f"{counts} | /trigger round trips: not timed (--no-load)"
        return (
            f"{counts} | /trigger reqs={trig.count:,} "
            f"p50={format_duration(trig.p50)} p95={format_duration(trig.p95)} "
            f"p99={format_duration(trig.p99)}"
        )


class _ChildError(Exception):
    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


def _stop_all(children: list[Child]) -> None:
    for child in reversed(children):  # the load first, then the API server
        child.stop()


async def _pipeline(config: PipelineConfig, on_line: Line | None, on_url: Any) -> PipelineResult:
    run = _Run(config, on_line)
    started = time.monotonic()
    ticks: list[str] = []
    interrupted = False
    url = etcd_url = ""
    layout: dict[str, dict[str, Any]] = {
        "controller": {"pid": os.getpid(), "holds": ["informer", "queue", "workers"]}
    }
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, main.cancel)  # like Ctrl-C
    children: list[Child] = []
    async with contextlib.AsyncExitStack() as stack:
        try:
            # The children start first (their imports overlap etcd's start); they
            # stop before etcd does, and also if etcd never starts.
            stack.callback(_stop_all, children)
            api = Child.start("apiserver")
            children.append(api)
            api.listen(loop, run.on_api_message)
            layout["apiserver"] = {"pid": api.pid, "holds": ["API server"]}
            load: Child | None = None
            if config.load:
                load = Child.start("load")
                children.append(load)
                load.listen(loop, run.on_load_message)
                layout["load"] = {"pid": load.pid, "holds": ["load generator"]}
            if config.etcd is None:
                known = {child.pid for child in children}
                etcd_url = stack.enter_context(local_etcd())
                etcd_pids = [pid for pid in _children_of(os.getpid()) if pid not in known]
                layout["etcd"] = {"pid": etcd_pids[0] if etcd_pids else None, "holds": ["etcd"]}
            else:
                etcd_url = config.etcd.rstrip("/")
                layout["etcd"] = {"pid": None, "holds": ["etcd"], "url": etcd_url}
            stack.callback(_stop_all, children)
            await check_etcd(etcd_url)
            traced = sorted(run.traced)
            api.send("serve", etcd_url, config.port, traced, run.trace_all)
            try:
                async with asyncio.timeout(SYNC_TIMEOUT):
                    url = await run.api_ready
            except _ChildError as exc:
                if exc.kind == "listen":
                    raise PipelineError(
                        f"cannot listen on 127.0.0.1:{config.port}: {exc}"
                    ) from None
                raise PipelineError(str(exc)) from None
            except TimeoutError:
                raise PipelineError("the API server process did not start") from None
            api_config = k8s.Configuration()
            api_config.host = url
            api_client = k8s.ApiClient(api_config)
            stack.push_async_callback(api_client.close)
            v1 = k8s.CoreV1Api(api_client)
            informer: Informer[Any] = Informer(v1.list_namespaced_config_map, NAMESPACE)
            informer.add_handler(run.on_change)
            run.informer = informer
            informer_task = asyncio.create_task(informer.run(), name="pipeline-informer")
            stack.push_async_callback(_cancel, informer_task)
            await asyncio.wait_for(informer.wait_synced(), SYNC_TIMEOUT)
            # its watch is open: no catch-up burst
            await asyncio.wait_for(run.watch_open.wait(), SYNC_TIMEOUT)
            existing = len(informer)  # objects already there: reconciled once, not timed
            workers = asyncio.create_task(
                arun_workers(run.queue, run.reconcile, workers=config.workers),
                name="pipeline-workers",
            )
            stack.push_async_callback(_stop_workers, run.queue, workers)
            if on_url is not None:
                on_url(url, etcd_url, existing)

            async def stats() -> None:
                since, last = 0, ""
                while True:
                    await asyncio.sleep(config.tick)
                    line = run.stats_line(time.monotonic() - started, since)
                    since = len(run.timings.samples["trigger"])
                    counts = line.split(" ", 2)[2]  # without [STATS] t=...
                    if counts != last:  # quiet while nothing happens
                        ticks.append(line)
                        run.line("STATS", line)
                        last = counts

            stats_task = asyncio.create_task(stats(), name="pipeline-stats")
            stack.push_async_callback(_cancel, stats_task)
            if load is not None:
                rng = random.Random(config.seed)
                names = [f"obj-{rng.randrange(config.objects)}" for _ in range(config.requests)]
                load.send("go", url, names, config.concurrency)
                await run.load_done.wait()
                run.settled.clear()  # it may have been set between two answers
                run.check_settled()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(run.settled.wait(), config.settle_timeout)
                await run.queue.shutdown(drain=True, timeout=config.settle_timeout)
            else:
                await asyncio.Event().wait()  # serve until interrupted
        except asyncio.CancelledError:
            interrupted = True
            main.uncancel()
    elapsed = time.monotonic() - started
    # Every run ends with one (a run shorter than a tick has no other): the whole run's.
    final = run.stats_line(elapsed, 0, final=True)
    ticks.append(final)
    run.line("STATS", final)
    summary = run.timings.summary()
    stages = tuple(StageResult(s.name, s.label, s.what, summary[s.name]) for s in STAGES)
    return PipelineResult(
        config=config,
        url=url,
        etcd=etcd_url,
        elapsed=elapsed,
        triggers=run.answered,
        created=run.created,
        failed=run.failed,
        watch_events=run.events,
        stats=run.queue.stats(),
        stages=stages,
        objects=len(run.final),
        stale=tuple(run.stale()),
        interrupted=interrupted,
        ticks=tuple(ticks),
        processes=layout,
    )


def _children_of(pid: int) -> list[int]:
    """The pids of ``pid``'s children (Linux's /proc; empty elsewhere)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children") as f:
                found += [int(p) for p in f.read().split()]
    return found


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def _stop_workers(queue: AsyncWorkQueue[str], workers: asyncio.Task[Any]) -> None:
    await queue.shutdown()
    try:
        await asyncio.wait_for(workers, 5.0)
    except (TimeoutError, asyncio.CancelledError):
        await _cancel(workers)


def run_pipeline(
    config: PipelineConfig | None = None,
    on_line: Line | None = None,
    on_url: Callable[[str, str, int], None] | None = None,
) -> PipelineResult:
    """Run the pipeline; returns its result when the load is done (or on Ctrl-C).

    ``on_line(tag, text)`` gets every trace and [STATS] line as it happens;
    ``on_url(api_url, etcd_url, existing_objects)`` once everything is up.
    Raises ``EtcdError`` if etcd cannot be started or reached, ``PipelineError``
    if the API server cannot listen.
    """
    with ctrl_c_taken(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(_pipeline(config or PipelineConfig(), on_line, on_url))


async def check_etcd(etcd_url: str) -> None:
    """Fail early and plainly (``EtcdError``, one line) if etcd at ``etcd_url`` is
    not there, or does not answer within ``FIRST_ANSWER_TIMEOUT`` seconds."""
    etcd = Etcd(etcd_url)
    try:
        async with asyncio.timeout(FIRST_ANSWER_TIMEOUT):
            await etcd.revision()
    except TimeoutError:
        raise EtcdError(
            f"etcd at {etcd_url} did not answer within {FIRST_ANSWER_TIMEOUT:g} s "
            "(is that etcd's client URL?)"
        ) from None
    except (aiohttp.ClientError, OSError) as exc:
        raise EtcdError(f"cannot reach etcd at {etcd_url}: {exc}") from None
    finally:
        await etcd.close()
