"""Controller replicas as real processes, their faults, and what a fault cost.

Theory of operation
-------------------
``Fleet`` starts N ``replica`` processes on one queue (each dying with this
process), reads their JSON lines as they come (``Log``), and does to them what
a machine does to a controller: ``kill`` (SIGKILL), ``pause`` (SIGSTOP past
the lease, then SIGCONT) and ``restart``. Before either fault it freezes the
replica with SIGSTOP, waits a moment for what it already sent to be applied,
and reads the queue's ``snapshot``: the keys that replica holds then are
exactly the keys the fault takes from the others (a stopped process claims
and settles nothing), each with its fencing token. So the record of a fault
(``Fault``) says which keys it held, and when.

``failover`` pairs every write the load made (the object, the
resourceVersion it wrote, when it was sent and answered) with the first
reconcile that ended after it was sent having seen that version or a later
one, and splits the writes: those a fault held up (to a key the faulted
replica held, written before the key was reconciled again, and reconciled
after the fault began), those to other keys sent while a fault's keys were
out (from the fault until the last of them was reconciled again), and all
the others. The longest write → reconcile gap of the first two is the figure:
how long a replica's death made its keys wait, against how long everyone
else's did meanwhile. ``recovery`` is, per held key, the time from the fault
to the end of the first reconcile by a later holder (a higher token).

A replica resumed after a SIGSTOP reconciles from a cache seconds old until
its informer has caught up on the events it missed: a key it takes meanwhile
is judged current at an old version, and the newer write waits for that
replica's own watch event. Those writes are in ``other_gap``, after the
pause's window.

``overlaps`` checks the queue's promise across the processes: per key, the
reconciles ordered by token never overlap in time, except where the earlier
one's replica was stopped while it ran (its lease ran out and the key went on
without it: that is what a lease is for); and ``fencing`` that the tokens a
key's status was written with never go down (a stale holder's write is refused
by the resourceVersion precondition, or it sees the later token and writes
nothing).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import math
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

from keyqueue.redis import AsyncRedisWorkQueue, RedisStats
from keyqueue.testing._processes import dying_with_parent

from .processes import Child
from .replica import ReplicaConfig

__all__ = [
    "Failover",
    "Fault",
    "Fleet",
    "Log",
    "Reconcile",
    "Write",
    "failover",
    "fencing",
    "overlaps",
    "serve_api",
]

READY_TIMEOUT = 60.0
"""Seconds a replica gets to sync its informer and start its workers."""
SETTLE = 0.05
"""Seconds between freezing a replica and reading the queue's holds: what it sent is applied."""
FREEZE_TRIES = 50
"""Times a fault tries to catch its replica holding keys before it strikes anyway."""
STOP_TIMEOUT = 10.0
"""Seconds a replica gets to stop after SIGTERM before SIGKILL."""


@dataclass(frozen=True, slots=True)
class Reconcile:
    """One reconcile a replica reported (``end`` is inf while it has not ended)."""

    replica: str
    key: str
    token: int
    start: float
    end: float = math.inf
    seen: int = 0
    outcome: str = ""
    wrote: int = 0


@dataclass(frozen=True, slots=True)
class Write:
    """One write of the load: ``key`` ("namespace/name") at resourceVersion ``rv``."""

    key: str
    rv: int
    sent: float
    answered: float


@dataclass(frozen=True, slots=True)
class Fault:
    """A replica killed or paused: when, and the keys (with tokens) it held then."""

    kind: str
    """``kill`` or ``pause``."""
    replica: str
    at: float
    """When the fault began (SIGSTOP's time: the replica did nothing after it)."""
    until: float
    """``kill``: the SIGKILL's time; ``pause``: the SIGCONT's."""
    held: dict[str, int] = field(default_factory=dict)


@contextlib.asynccontextmanager
async def serve_api(etcd_url: str) -> AsyncIterator[str]:
    """The lab's API server on ``etcd_url`` in a process of its own (``processes``); its URL.

    Its timing samples are read and dropped; it stops on every way out.
    """
    api = Child.start("apiserver")
    ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()

    def on_message(message: tuple[Any, ...]) -> None:
        if ready.done():
            return
        if message[0] == "ready":
            ready.set_result(message[1])
        elif message[0] in ("error", "eof"):
            ready.set_exception(RuntimeError(f"the API server did not start: {message}"))

    try:
        api.listen(asyncio.get_running_loop(), on_message)
        api.send("serve", etcd_url, 0, [], False)
        yield await asyncio.wait_for(ready, READY_TIMEOUT)
    finally:
        api.stop()  # blocks the loop a moment: it answers "stop" at once


class Log:
    """Every replica's lines, as they arrive (the parent's loop reads them)."""

    def __init__(self) -> None:
        self.started: dict[tuple[str, str, int], float] = {}  # (replica, key, token) -> start
        self.ended: list[Reconcile] = []
        self.lost: list[tuple[str, str, float]] = []  # (replica, key, t)
        self.logs: list[tuple[str, str, str]] = []  # (replica, level, message)
        self.stats: dict[str, dict[str, int]] = {}
        # With ReplicaConfig.trace: (replica, key, rv, received, add started, add ended),
        # and (replica, key, waited) per hand-out.
        self.events: list[tuple[str, str, int, float, float, float]] = []
        self.gets: list[tuple[str, str, float]] = []
        self.on_end: Callable[[Reconcile], None] | None = None
        """Called with every reconcile that ends, as its line arrives."""

    def line(self, replica: str, fields: list[Any]) -> None:
        kind = fields[0]
        if kind == "event":
            self.events.append((replica, *fields[1:]))
        elif kind == "get":
            self.gets.append((replica, fields[1], fields[2]))
        elif kind == "start":
            _, key, token, t = fields
            self.started[replica, key, token] = t
        elif kind == "end":
            _, key, token, start, end, seen, outcome, wrote = fields
            self.started.pop((replica, key, token), None)
            reconcile = Reconcile(replica, key, token, start, end, seen, outcome, wrote)
            self.ended.append(reconcile)
            if self.on_end is not None:
                self.on_end(reconcile)
        elif kind == "lost":
            self.lost.append((replica, fields[1], fields[2]))
        elif kind == "log":
            self.logs.append((replica, fields[1], fields[2]))
        elif kind == "stats":
            self.stats[replica] = fields[1]

    def reconciles(self) -> list[Reconcile]:
        """Every reconcile: the ended ones, and those started and never ended (killed)."""
        unfinished = [Reconcile(r, k, tok, t) for (r, k, tok), t in self.started.items()]
        return self.ended + unfinished


class Replica:
    """One replica process and the task reading its lines."""

    def __init__(self, name: str, process: asyncio.subprocess.Process, log: Log) -> None:
        self.name = name
        self.process = process
        self.ready: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self.reader = asyncio.create_task(self._read(log), name=f"replica-{name}")

    @property
    def pid(self) -> int:
        return self.process.pid

    async def _read(self, log: Log) -> None:
        stream = self.process.stdout
        assert stream is not None
        async for raw in stream:
            try:
                fields = json.loads(raw)
            except ValueError:  # a line cut short by a SIGKILL
                continue
            if fields[0] == "ready" and not self.ready.done():
                self.ready.set_result(fields[3])
            log.line(self.name, fields)
        if not self.ready.done():
            exited = RuntimeError(f"replica {self.name} exited before it was ready")
            self.ready.set_exception(exited)

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)

    async def stop(self) -> None:
        """SIGTERM (SIGCONT first: a stopped process keeps a SIGTERM pending), then SIGKILL."""
        if self.process.returncode is None:
            self.signal(signal.SIGTERM)
            self.signal(signal.SIGCONT)
            try:
                await asyncio.wait_for(self.process.wait(), STOP_TIMEOUT)
            except TimeoutError:
                self.signal(signal.SIGKILL)
                await self.process.wait()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(self.reader, STOP_TIMEOUT)


class Fleet:
    """N replicas of one controller on one queue; ``async with`` stops them all."""

    def __init__(self, config: ReplicaConfig, replicas: int) -> None:
        self.config = config
        self.size = replicas
        self.log = Log()
        self.replicas: list[Replica] = []
        self.faults: list[Fault] = []
        self.restarts = 0
        self._queue: AsyncRedisWorkQueue | None = None

    async def __aenter__(self) -> Fleet:
        try:
            await self.start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def start(self) -> None:
        self.replicas = [await self._spawn(f"r{i}") for i in range(self.size)]
        await self.ready()

    async def ready(self) -> None:
        """Wait until every live replica's informer has synced (bounded)."""
        await asyncio.wait_for(asyncio.gather(*(r.ready for r in self.replicas)), READY_TIMEOUT)

    async def _spawn(self, name: str) -> Replica:
        config = ReplicaConfig(**{**asdict(self.config), "holder": name})
        args = [sys.executable, "-m", "keyqueue.lab.pipeline.replica", json.dumps(asdict(config))]
        process = await asyncio.create_subprocess_exec(
            *dying_with_parent(args),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            start_new_session=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        return Replica(name, process, self.log)

    def _client(self) -> AsyncRedisWorkQueue:
        """The fleet's own client of the replicas' queue (it takes no key)."""
        if self._queue is None:
            self._queue = AsyncRedisWorkQueue(
                self.config.queue,
                url=self.config.redis,
                holder="fleet",
                durability=self.config.durability,
            )
        return self._queue

    async def stats(self) -> RedisStats:
        """The queue's counters, all replicas together (``leases_expired``, ``stalls``...)."""
        return await self._client().stats()

    async def held(self, replica: Replica) -> dict[str, int]:
        """The keys ``replica`` holds now, with their tokens (it should be frozen)."""
        snapshot = await self._client().snapshot(limit=1_000_000)
        return {
            h.key: h.token
            for h in snapshot.processing
            if h.holder == replica.name and h.token is not None
        }

    async def _freeze(self, index: int) -> tuple[Replica, float, dict[str, int]]:
        """SIGSTOP replica ``index`` at a moment it holds keys (up to ``FREEZE_TRIES``
        tries, SIGCONT between them); the time of the SIGSTOP and its holds."""
        replica = self.replicas[index]
        for attempt in range(1, FREEZE_TRIES + 1):
            at = time.monotonic()
            replica.signal(signal.SIGSTOP)
            await asyncio.sleep(SETTLE)
            held = await self.held(replica)
            if held or attempt == FREEZE_TRIES:
                return replica, at, held
            replica.signal(signal.SIGCONT)
            await asyncio.sleep(SETTLE)
        raise AssertionError("unreachable")

    async def kill(self, index: int) -> Fault:
        """Freeze replica ``index``, read its holds, SIGKILL it."""
        replica, at, held = await self._freeze(index)
        replica.signal(signal.SIGKILL)
        until = time.monotonic()
        await replica.process.wait()
        fault = Fault("kill", replica.name, at, until, held)
        self.faults.append(fault)
        return fault

    async def freeze(self, index: int) -> Fault:
        """SIGSTOP replica ``index`` (at a moment it holds keys); ``thaw`` resumes it."""
        replica, at, held = await self._freeze(index)
        return Fault("pause", replica.name, at, at, held)

    def thaw(self, fault: Fault) -> Fault:
        """SIGCONT the replica ``freeze`` stopped; the fault, with its end, recorded."""
        replica = next(r for r in self.replicas if r.name == fault.replica)
        replica.signal(signal.SIGCONT)
        fault = dataclasses.replace(fault, until=time.monotonic())
        self.faults.append(fault)
        return fault

    async def pause(self, index: int, seconds: float) -> Fault:
        """SIGSTOP replica ``index`` for ``seconds`` (past its lease), then SIGCONT."""
        fault = await self.freeze(index)
        await asyncio.sleep(max(0.0, fault.at + seconds - time.monotonic()))
        return self.thaw(fault)

    async def restart(self, index: int) -> Replica:
        """A new process in place of replica ``index`` (dead or not), ready."""
        old = self.replicas[index]
        await old.stop()
        self.restarts += 1
        new = await self._spawn(f"{old.name.split('.')[0]}.{self.restarts}")
        self.replicas[index] = new
        await asyncio.wait_for(new.ready, READY_TIMEOUT)
        return new

    async def close(self) -> None:
        await asyncio.gather(*(r.stop() for r in self.replicas), return_exceptions=True)
        if self._queue is not None:
            await self._queue.aclose()


# -- what the run shows ------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Failover:
    """The write → reconcile gaps, split by whether a fault held the key up."""

    held_writes: int
    """Writes to keys a faulted replica held, waiting when the fault began."""
    held_gap: float
    """The longest of their write → reconcile gaps (seconds)."""
    during_writes: int
    """Writes to keys no fault held, sent while a fault's keys were out (from the
    fault to the last of its held keys' next reconcile)."""
    during_gap: float
    """The longest write → reconcile gap of those: did the others pause meanwhile?"""
    other_writes: int
    other_gap: float
    """The longest write → reconcile gap of every write no fault held up, all run long."""
    recovery: float
    """The longest time from a fault to a held key's next reconcile by a later holder."""
    held_keys: int
    """Keys the faults held, all faults together."""
    unrecovered: tuple[str, ...]
    """Held keys never reconciled again by a later holder."""
    unreconciled: tuple[Write, ...]
    """Writes no reconcile covered."""

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["unreconciled"] = [asdict(w) for w in self.unreconciled]
        out["unrecovered"] = list(self.unrecovered)
        return out


def _covering(reconciles: list[Reconcile], write: Write) -> float | None:
    """The end of the first reconcile that ended after ``write`` was sent, having seen it."""
    ends = [r.end for r in reconciles if r.seen >= write.rv and r.end >= write.sent]
    return min(ends) if ends else None


def failover(
    reconciles: Iterable[Reconcile], writes: Iterable[Write], faults: list[Fault]
) -> Failover:
    """Pair every write with its reconcile; split the gaps by the faults (see the module)."""
    by_key: dict[str, list[Reconcile]] = {}
    for r in reconciles:
        if r.end < math.inf:
            by_key.setdefault(r.key, []).append(r)
    # Per fault and held key: when a later holder next finished reconciling it.
    recovered: dict[tuple[int, str], float] = {}
    unrecovered: list[str] = []
    recovery = 0.0
    windows: list[tuple[float, float]] = []  # per fault: until its last held key came back
    for i, fault in enumerate(faults):
        back = fault.at
        for key, token in fault.held.items():
            later = [r.end for r in by_key.get(key, ()) if r.token > token and r.end > fault.at]
            if not later:
                unrecovered.append(key)
                back = math.inf
                continue
            recovered[i, key] = min(later)
            back = max(back, min(later))
            recovery = max(recovery, min(later) - fault.at)
        windows.append((fault.at, back))
    held_gaps: list[float] = []
    during_gaps: list[float] = []
    other_gaps: list[float] = []
    unreconciled: list[Write] = []
    for write in writes:
        end = _covering(by_key.get(write.key, []), write)
        if end is None:
            unreconciled.append(write)
            continue
        gap = max(0.0, end - write.answered)
        hit = any(
            write.key in fault.held
            and end > fault.at
            and write.sent < recovered.get((i, write.key), math.inf)
            for i, fault in enumerate(faults)
        )
        (held_gaps if hit else other_gaps).append(gap)
        if not hit and any(at <= write.sent <= back for at, back in windows):
            during_gaps.append(gap)
    return Failover(
        held_writes=len(held_gaps),
        held_gap=max(held_gaps, default=0.0),
        during_writes=len(during_gaps),
        during_gap=max(during_gaps, default=0.0),
        other_writes=len(other_gaps),
        other_gap=max(other_gaps, default=0.0),
        recovery=recovery,
        held_keys=sum(len(f.held) for f in faults),
        unrecovered=tuple(sorted(unrecovered)),
        unreconciled=tuple(unreconciled),
    )


def overlaps(
    reconciles: Iterable[Reconcile], faults: list[Fault]
) -> tuple[list[tuple[Reconcile, Reconcile]], list[tuple[Reconcile, Reconcile]]]:
    """Pairs of reconciles of one key that overlapped in time: ``(excused, violations)``.

    Per key, in token order, each reconcile must end before the next one starts.
    Excused: the earlier one's replica was paused while it ran, past its lease
    (the key went on without it); its writes are ``fencing``'s to check. Not
    excused: one that started after the pause (a key handed out on a lease
    already taken back). A
    killed replica's unfinished reconcile ends at the kill. Everything else,
    and a later token starting first, is a violation.
    """
    killed = {f.replica: f.until for f in faults if f.kind == "kill"}
    paused = [f for f in faults if f.kind == "pause"]
    by_key: dict[str, list[Reconcile]] = {}
    for run in reconciles:
        if run.end == math.inf and run.replica in killed:  # it died with the replica
            run = dataclasses.replace(run, end=killed[run.replica])  # noqa: PLW2901
        by_key.setdefault(run.key, []).append(run)
    excused: list[tuple[Reconcile, Reconcile]] = []
    violations: list[tuple[Reconcile, Reconcile]] = []
    for runs in by_key.values():
        runs.sort(key=lambda r: r.token)
        for a, b in itertools.pairwise(runs):
            if a.end <= b.start:
                continue
            stopped = any(  # its process was stopped while it ran (SIGSTOP lands async)
                f.replica == a.replica and a.start <= f.until and f.at <= a.end for f in paused
            )
            (excused if stopped and a.start <= b.start else violations).append((a, b))
    return excused, violations


def fencing(reconciles: Iterable[Reconcile]) -> list[tuple[Reconcile, Reconcile]]:
    """Pairs of writes of one key's status whose tokens went down (the later write
    by resourceVersion carried the lower token): none, if fencing holds."""
    by_key: dict[str, list[Reconcile]] = {}
    for r in reconciles:
        if r.outcome == "wrote":
            by_key.setdefault(r.key, []).append(r)
    wrong = []
    for writes in by_key.values():
        writes.sort(key=lambda r: r.wrote)
        wrong += [(a, b) for a, b in itertools.pairwise(writes) if b.token < a.token]
    return wrong
