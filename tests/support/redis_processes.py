"""Worker and producer processes for the multi-process and fault tests of the Redis queue.

The entry points run in children of multiprocessing's forkserver, which has
``keyqueue.redis`` imported already, so a child starts in milliseconds (a fresh
interpreter needs ~0.3 s of CPU to import redis-py). Each child watches the
test process (a pidfd, Linux) and exits when it goes, so a test run that is
killed leaves no process behind. (``PR_SET_PDEATHSIG`` would not do: a child's
parent is the forkserver, which lives as long as any of its children.)
``Processes`` owns the children of one test and kills every one on every exit
path.

What the children did goes to the server, as lines in lists (``Names``), so
the test reads it whatever happened to the process afterwards: one line per
handler call, ``key token start end version pid`` (``time.monotonic()``, one
clock for every process on Linux); one per write of a producer,
``key version written``; one per key a handler holds on purpose,
``key token pid``; and each worker's ``RunStats``, as JSON. (``claiming_worker``
reports each handler's start too, in ``begins``, and stamps both with the
server's TIME, the clock of its leases.)

The chaos test's children (``chaos_worker``, ``async_chaos_worker``,
``chaos_producer``) run against two servers: the *chaos* server, which the
test kills, restarts and cuts off, holds the queue and the objects (each hot
key's version, which producers bump and handlers read); the *ledger*, which
no fault touches, holds the fenced store (``FENCE``: a write with a token
lower than the highest one that wrote the key is refused, as a real fenced
store would) and every report, so a report is never lost with a connection.
Reports there: one line per handler start (``begins``) and end (``calls``,
a ``Call``), per process the holds whose write is still to come
(``inflight``), every give-up (``on_give_up``, and the runner's warnings,
each with the token the warning thread held), every lease reaped (the
``LEASE_EXPIRED`` events of the client whose call reaped it), the asyncio
workers' shift ends, each producer's writes, and each worker's ``RunStats``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
import json
import logging
import multiprocessing
import os
import random
import select
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any

import redis
import redis.asyncio

import keyqueue
from keyqueue import Requeue, RunStats
from keyqueue._source import worker_source
from keyqueue.redis import AsyncRedisWorkQueue, RedisRateLimiter, RedisWorkQueue

__all__ = [
    "CONTEXT",
    "FENCE",
    "Call",
    "Names",
    "Processes",
    "Record",
    "StaleToken",
    "async_blocked_claimer",
    "async_chaos_worker",
    "chaos_producer",
    "chaos_worker",
    "claiming_worker",
    "producer",
    "server_time",
    "stall_worker",
    "stalled_claimant",
    "worker",
    "write",
]

CONTEXT = multiprocessing.get_context("forkserver")
# Children fork from a server that has this module (and so keyqueue.redis)
# imported. Takes effect if no test started the forkserver before.
CONTEXT.set_forkserver_preload([__name__])

STOP_TIMEOUT = 30.0  # generous bound, wall seconds, on a child finishing its part


@dataclass(frozen=True)
class Names:
    """The Redis keys through which the children of one test report."""

    queue: str

    @property
    def records(self) -> str:
        return f"test:{self.queue}:records"

    @property
    def writes(self) -> str:
        return f"test:{self.queue}:writes"

    @property
    def held(self) -> str:
        return f"test:{self.queue}:held"

    @property
    def go(self) -> str:
        return f"test:{self.queue}:go"

    @property
    def stats(self) -> str:
        return f"test:{self.queue}:stats"

    @property
    def ready(self) -> str:
        return f"test:{self.queue}:ready"

    def version(self, key: str) -> str:
        return f"test:{self.queue}:version:{key}"

    # The chaos test's reports (on the ledger) and its fenced store.

    @property
    def calls(self) -> str:
        return f"test:{self.queue}:calls"

    @property
    def begins(self) -> str:
        return f"test:{self.queue}:begins"

    def inflight(self, pid: int) -> str:
        return f"test:{self.queue}:inflight:{pid}"

    @property
    def fence(self) -> str:
        return f"test:{self.queue}:fence"

    @property
    def store(self) -> str:
        return f"test:{self.queue}:store"

    @property
    def gave_up(self) -> str:
        return f"test:{self.queue}:gave-up"

    @property
    def warnings(self) -> str:
        return f"test:{self.queue}:warnings"

    @property
    def shifts(self) -> str:
        return f"test:{self.queue}:shifts"

    @property
    def produced(self) -> str:
        return f"test:{self.queue}:produced"

    @property
    def claims(self) -> str:
        return f"test:{self.queue}:claims"

    @property
    def expired(self) -> str:
        return f"test:{self.queue}:expired"


@dataclass(frozen=True)
class Record:
    """One handler call: the key, its fencing token, when it ran, what it saw."""

    key: str
    token: int
    start: float
    end: float
    version: int
    pid: int

    @classmethod
    def parse(cls, line: bytes | str) -> Record:
        key, token, start, end, version, pid = (
            line.decode() if isinstance(line, bytes) else line
        ).split()
        return cls(key, int(token), float(start), float(end), int(version), int(pid))


def _child(test_pid: int, target: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Run ``target`` in a child that exits at once if the test process goes."""
    if hasattr(os, "pidfd_open"):  # Linux
        try:
            pidfd = os.pidfd_open(test_pid)
        except ProcessLookupError:
            os._exit(1)

        def watch() -> None:
            select.select([pidfd], [], [])  # readable once the process has exited
            os._exit(1)

        threading.Thread(target=watch, name="watch-test-process", daemon=True).start()
    target(*args, **kwargs)


def worker(
    url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int = 4,
    lease: float = 10.0,
    hold: tuple[str, ...] = (),
    work: float = 0.0,
) -> None:
    """``run_workers`` on one client of ``names.queue`` until ``stop`` is set.

    Each handler call reads the key's version, spends ``work`` seconds, and
    records itself. A key in ``hold`` is reported to ``names.held`` and then
    kept until the test pushes to ``names.go`` (for the fault tests). At the
    end the ``RunStats`` go to ``names.stats``.
    """
    r = redis.Redis.from_url(url)
    q = RedisWorkQueue(names.queue, url=url, lease=lease)
    pid = os.getpid()

    def handle(key: str) -> None:
        start = time.monotonic()
        version = int(r.get(names.version(key)) or 0)
        if key in hold:
            r.rpush(names.held, f"{key} {q.token(key)} {pid}")
            r.blpop([names.go], timeout=60)
        elif work:
            time.sleep(work)
        r.rpush(names.records, f"{key} {q.token(key)} {start} {time.monotonic()} {version} {pid}")

    _run_until_stopped(q, r, names, handle, workers, stop)


def _run_until_stopped(
    q: RedisWorkQueue,
    r: redis.Redis,
    names: Names,
    handle: Callable[[str], None],
    workers: int,
    stop: ProcessEvent,
) -> None:
    """``run_workers`` until ``stop`` is set; its ``RunStats`` to ``names.stats``."""
    stopping = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), stopping.set()), daemon=True).start()
    stats = keyqueue.run_workers(q, handle, workers=workers, stop=stopping)
    r.rpush(names.stats, json.dumps(dataclasses.asdict(stats)))
    q.close()
    r.close()


def server_time(r: redis.Redis) -> float:
    """The server's TIME, in seconds: the clock its scripts stamp leases with."""
    seconds, micros = r.time()
    return seconds + micros / 1e6


def claiming_worker(
    url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int = 4,
    lease: float = 10.0,
    block: bool = False,
    shards: int = 1,
) -> None:
    """``run_workers`` with ``workers`` threads on one client of ``names.queue``
    (of ``shards`` shards; it takes keys in batches) until ``stop`` is set.

    Each handler call reports its start to ``names.begins`` (``key token start
    pid``) and, once it returns, itself to ``names.records`` (a ``Record``,
    version 0); both times are the server's (``server_time``: the clock of its
    leases), read inside the hold. With ``block``, each call waits for a push
    to ``names.go`` in between, so the process holds as many keys as it has
    workers. At the end the ``RunStats`` go to ``names.stats``.
    """
    r = redis.Redis.from_url(url)
    q = RedisWorkQueue(names.queue, url=url, lease=lease, shards=shards)
    pid = os.getpid()

    def handle(key: str) -> None:
        token = q.token(key)
        start = server_time(r)
        r.rpush(names.begins, f"{key} {token} {start!r} {pid}")
        if block:
            r.blpop([names.go], timeout=60)
        r.rpush(names.records, f"{key} {token} {start!r} {server_time(r)!r} 0 {pid}")

    _run_until_stopped(q, r, names, handle, workers, stop)


def async_blocked_claimer(url: str, names: Names, lease: float, shards: int = 1) -> None:
    """``arun_workers`` with four tasks on one client of ``names.queue`` (of
    ``shards`` shards, claiming in batches) whose handlers report their start
    to ``names.begins`` (``key token start pid``) and then wait until the
    process is killed."""

    async def main() -> None:
        r = redis.asyncio.Redis.from_url(url)
        q = AsyncRedisWorkQueue(names.queue, url=url, lease=lease, shards=shards)
        pid = os.getpid()

        async def handle(key: str) -> None:
            seconds, micros = await r.time()
            start = seconds + micros / 1e6
            await r.rpush(names.begins, f"{key} {q.token(key)} {start!r} {pid}")
            await asyncio.sleep(3600)  # until killed

        await keyqueue.arun_workers(q, handle, workers=4)

    asyncio.run(main())


def stalled_claimant(url: str, names: Names, workers: int = 4, lease: float = 10.0) -> None:
    """``run_workers`` whose claim that takes keys never hands them out.

    Once all ``workers`` wait for a key (the claimant for the doorbell), it
    pushes to ``names.ready``. Once a claim that took keys is answered (its
    holds recorded, so renewed from now on), the claimant reports them to
    ``names.held`` (one line of ``key token`` pairs) and waits for the test to
    kill the process. No handler ever starts (each would report to
    ``names.begins``).
    """
    r = redis.Redis.from_url(url)
    views: list[Any] = []

    def watched(queue: Any, batch: bool | None) -> Any:  # the runner's source, kept
        views.append(worker_source(queue, batch))
        return views[-1]

    keyqueue._runner.worker_source = watched  # type: ignore[attr-defined]
    q = RedisWorkQueue(names.queue, url=url, lease=lease)
    drive = q._drive

    def claimed_then_stall(op: Any) -> Any:
        result = drive(op)
        if op.gi_code.co_name == "claim" and result[0]:
            r.rpush(names.held, " ".join(f"{key} {hold.token}" for key, hold in result[0]))
            r.blpop([names.go], timeout=60)  # until killed
        return result

    q._drive = claimed_then_stall  # type: ignore[method-assign]

    def ready() -> None:
        deadline = time.monotonic() + STOP_TIMEOUT
        while not (views and views[0]._book.waiting == workers and views[0]._book.claimant_at_bell):
            if time.monotonic() > deadline:
                return
            time.sleep(0.005)
        r.rpush(names.ready, "1")

    threading.Thread(target=ready, daemon=True).start()

    def handle(key: str) -> None:
        r.rpush(names.begins, f"{key} {q.token(key)} {server_time(r)!r} {os.getpid()}")

    keyqueue.run_workers(q, handle, workers=workers)


def stall_worker(
    url: str,
    names: Names,
    stop: ProcessEvent,
    front: str = "threads",
    workers: int = 4,
    lease: float = 1.0,
    max_retries: int | None = 1,
    poison: str = "",
    work: float = 0.0,
) -> None:
    """``run_workers`` (``front`` "threads") or ``arun_workers`` ("asyncio") on
    one client of ``names.queue``, claiming in batches, until ``stop`` is set:
    the stall tests' worker (tests/redis/test_stalls_killed.py).

    Each handler call reports its start to ``names.begins`` (``key token
    pid``) before anything else, then works ``work`` seconds at most (a random
    part of it) and reports its end to ``names.records`` (``key token pid``).
    The handler of ``poison`` kills its own process (``SIGKILL``) as soon as it
    starts. Every give-up goes to ``names.gave_up`` (``key`` and the error's
    class name: on_give_up), and every lease this client's calls took back to
    ``names.expired`` (``kind key``: the LEASE_EXPIRED, STALL and POISON
    events). At the end the ``RunStats`` go to ``names.stats``.
    """
    r = redis.Redis.from_url(url)
    pid = os.getpid()
    rng = random.Random(pid)

    def begin(key: str, token: int) -> None:
        r.rpush(names.begins, f"{key} {token} {pid}")
        if key == poison:
            os.kill(pid, signal.SIGKILL)

    def given_up(key: str, error: BaseException) -> None:
        r.rpush(names.gave_up, f"{key} {type(error).__name__}")

    def taken_back(event: keyqueue.Event[str]) -> None:
        if event.kind.value in ("lease_expired", "stall", "poison"):
            r.rpush(names.expired, f"{event.kind.value} {event.key}")

    if front == "threads":
        q = RedisWorkQueue(names.queue, url=url, lease=lease, max_retries=max_retries)
        q.subscribe(taken_back)

        def handle(key: str) -> None:
            token = q.token(key)
            begin(key, token)
            if work:
                time.sleep(rng.uniform(0, work))
            r.rpush(names.records, f"{key} {token} {pid}")

        stopping = threading.Event()
        threading.Thread(target=lambda: (stop.wait(), stopping.set()), daemon=True).start()
        stats = keyqueue.run_workers(q, handle, workers, stopping, on_give_up=given_up)
        q.close()
    else:
        stats = asyncio.run(
            _async_stall_worker(url, names, stop, workers, lease, max_retries, poison, work)
        )
    r.rpush(names.stats, json.dumps(dataclasses.asdict(stats)))
    r.close()


async def _async_stall_worker(
    url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int,
    lease: float,
    max_retries: int | None,
    poison: str,
    work: float,
) -> RunStats:
    # Pools with a connection for every task that may be in a call at once.
    r = redis.asyncio.Redis.from_url(url, max_connections=workers + 10)
    client = redis.asyncio.Redis.from_url(url, max_connections=workers + 10)
    q = AsyncRedisWorkQueue(names.queue, client=client, lease=lease, max_retries=max_retries)
    pid = os.getpid()
    rng = random.Random(pid)
    reports: list[str] = []  # events arrive in sync callbacks: pushed by the handlers

    def taken_back(event: keyqueue.Event[str]) -> None:
        if event.kind.value in ("lease_expired", "stall", "poison"):
            reports.append(f"{event.kind.value} {event.key}")

    q.subscribe(taken_back)

    async def flush() -> None:
        while reports:
            await r.rpush(names.expired, reports.pop(0))

    async def handle(key: str) -> None:
        token = q.token(key)
        await r.rpush(names.begins, f"{key} {token} {pid}")
        if key == poison:
            os.kill(pid, signal.SIGKILL)
        if work:
            await asyncio.sleep(rng.uniform(0, work))
        await r.rpush(names.records, f"{key} {token} {pid}")
        await flush()

    async def given_up(key: str, error: BaseException) -> None:
        await r.rpush(names.gave_up, f"{key} {type(error).__name__}")

    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    threading.Thread(
        target=lambda: (stop.wait(), loop.call_soon_threadsafe(stopping.set)), daemon=True
    ).start()
    try:
        stats = await keyqueue.arun_workers(q, handle, workers, stopping, on_give_up=given_up)
        await flush()
    finally:
        await q.aclose()
        await client.aclose()
        await r.aclose()
    return stats


def producer(url: str, names: Names, keys: list[str], rounds: int, seed: int) -> None:
    """``rounds`` times, for every key in a shuffled order: bump its version on
    the server, note when, then ``add`` it."""
    r = redis.Redis.from_url(url)
    q = RedisWorkQueue(names.queue, url=url)
    order = list(keys)
    shuffle = random.Random(seed).shuffle
    writes = []
    for _ in range(rounds):
        shuffle(order)
        for key in order:
            version = r.incr(names.version(key))
            writes.append(f"{key} {version} {time.monotonic()}")
            q.add(key)
    r.rpush(names.writes, *writes)
    q.close()
    r.close()


# -- the chaos test's children ----------------------------------------------------------

FENCE = """
-- The fenced store's write. KEYS: [1] fence HASH key -> highest token that
-- wrote it, [2] store HASH key -> the version it wrote. ARGV: [1] key,
-- [2] token, [3] version ('' if the handler could not read the object).
-- Returns 'stale' (a higher token has written the key: refused), 'unread'
-- (nothing to write) or 'ok' (written).
local high = tonumber(redis.call('HGET', KEYS[1], ARGV[1]) or '0')
if tonumber(ARGV[2]) < high then
  return 'stale'
end
if ARGV[3] == '' then
  return 'unread'
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 'ok'
"""

CHAOS_LIMITER = RedisRateLimiter(base_delay=0.005, max_delay=0.2, qps=None)
"""The chaos workers' backoff: short, so a run settles in seconds."""
BEFORE_READ = (0.02, 0.05)  # seconds a handler works before it reads the object
AFTER_WRITE = (0.06, 0.10)  # seconds it still holds the key after its write
SHIFT = (0.4, 1.5)  # seconds an asyncio worker's arun_workers runs before it is restarted


class StaleToken(Exception):
    """The fenced store refused a write: a holder with a higher token wrote the key."""


@dataclass(frozen=True)
class Call:
    """One handler call of a chaos worker: its hold (key, token, pid), when it
    started, wrote (the fenced store's answer) and ended, the version it read
    (-1: the object could not be read) and the store's verdict: ``ok``,
    ``stale`` (refused) or ``unread``."""

    key: str
    token: int
    pid: int
    start: float
    wrote: float
    end: float
    version: int
    verdict: str

    def line(self) -> str:
        return " ".join(str(value) for value in dataclasses.astuple(self))

    @classmethod
    def parse(cls, line: bytes | str) -> Call:
        key, token, pid, start, wrote, end, version, verdict = (
            line.decode() if isinstance(line, bytes) else line
        ).split()
        return cls(
            key, int(token), int(pid), float(start), float(wrote), float(end), int(version), verdict
        )


def _persist(call: Callable[[], Any], timeout: float = STOP_TIMEOUT) -> Any:
    """``call()`` again after a pause (5 ms doubling to 0.1 s) while it raises a
    ``RedisError`` (a killed connection, the server down), for up to ``timeout``."""
    deadline, pause = time.monotonic() + timeout, 0.005
    while True:
        try:
            return call()
        except redis.RedisError:
            if time.monotonic() > deadline:
                raise
            time.sleep(pause)
            pause = min(pause * 2, 0.1)


class _Warnings(logging.Handler):
    """keyqueue's warnings to the ledger, each with the token of the key it names
    as the logging thread or task holds it (-1 if it holds none)."""

    def __init__(self, ledger: redis.Redis, names: Names, token: Callable[[str], int]) -> None:
        super().__init__(logging.WARNING)
        self.ledger, self.names, self.token = ledger, names, token

    def emit(self, record: logging.LogRecord) -> None:
        try:
            key = None
            if str(record.msg).startswith("key %r") and record.args:
                key = record.args[0] if isinstance(record.args, tuple) else None
            token = -1
            if isinstance(key, str):
                with contextlib.suppress(ValueError):
                    token = self.token(key)
            line = {
                "at": time.monotonic(),
                "pid": os.getpid(),
                "key": key,
                "token": token,
                "message": record.getMessage()[:300],
            }
            self.ledger.rpush(self.names.warnings, json.dumps(line))
        except Exception:  # a report must not change what the worker does
            pass


def _report(ledger: redis.Redis, names: Names, q: RedisWorkQueue | AsyncRedisWorkQueue) -> None:
    """Send keyqueue's warnings, and the leases this client's calls reaped
    (``key when how-long-held pid``), to the ledger."""
    log = logging.getLogger("keyqueue")
    log.addHandler(_Warnings(ledger, names, q.token))
    log.setLevel(logging.WARNING)

    def expired(event: keyqueue.Event[str]) -> None:
        if event.kind is keyqueue.EventKind.LEASE_EXPIRED:
            line = f"{event.key} {time.monotonic()} {event.duration} {os.getpid()}"
            with contextlib.suppress(redis.RedisError):
                ledger.rpush(names.expired, line)

    q.subscribe(expired)


class _Claims:
    """Counts the claim scripts a client sends (its ``_drive`` wrapped on the
    instance, a private hook both paths go through), the keys they take, and
    the get scripts that hand out a key, and reports them to the ledger after
    each that took one (so a process killed later has reported them) and at
    the end, with the handler calls (``names.claims``: one JSON field per
    worker process)."""

    def __init__(
        self,
        q: RedisWorkQueue | AsyncRedisWorkQueue,
        ledger: redis.Redis,
        names: Names,
        front: str,
        batch: bool,
    ) -> None:
        self.ledger, self.names, self.front, self.batch = ledger, names, front, batch
        self.claims = self.claimed = self.taking = self.most = self.got = 0
        self.report(0)
        drive = q._drive

        def count(op: Any) -> None:
            if op.gi_code.co_name == "claim":
                self.claims += 1

        if isinstance(q, AsyncRedisWorkQueue):

            async def adrive(op: Any) -> Any:
                count(op)
                result = await drive(op)  # type: ignore[misc]
                self.took(op, result)
                return result

            q._drive = adrive  # type: ignore[method-assign, assignment]
            take = q._take  # the asyncio get's script, outside _drive

            async def got() -> Any:
                key, due = await take()
                if key is not None:
                    self.got += 1
                    self.report(0)
                return key, due

            q._take = got  # type: ignore[method-assign]
        else:

            def sdrive(op: Any) -> Any:
                count(op)
                result = drive(op)
                self.took(op, result)
                return result

            q._drive = sdrive  # type: ignore[method-assign]

    def took(self, op: Any, result: Any) -> None:
        if op.gi_code.co_name == "claim" and result[0]:
            self.taking += 1
            self.claimed += len(result[0])
            self.most = max(self.most, len(result[0]))
            self.report(0)
        elif op.gi_code.co_name == "get" and result[0] is not None:
            self.got += 1  # a get script that handed out a key (the per-key path)
            self.report(0)

    def report(self, calls: int) -> None:
        line = {
            "front": self.front,
            "batch": self.batch,
            "claims": self.claims,
            "taking": self.taking,
            "claimed": self.claimed,
            "most": self.most,
            "got": self.got,
            "calls": calls,
        }
        with contextlib.suppress(redis.RedisError):
            self.ledger.hset(self.names.claims, str(os.getpid()), json.dumps(line))


def _given_up(names: Names, key: str, token: int, error: BaseException) -> tuple[str, str]:
    return names.gave_up, f"{key} {token} {time.monotonic()} {os.getpid()} {type(error).__name__}"


@dataclass(frozen=True)
class _Handler:
    """The chaos workers' handler, written once as steps (``steps``): each
    ``yield`` hands out what a client call or ``sleep`` returned, a value from
    the sync clients (``run``), an awaitable from the asyncio ones (``arun``,
    which throws an error the await raised back in at the ``yield``)."""

    names: Names
    ledger: Any  # redis.Redis or redis.asyncio.Redis, and the same kind below
    objects: Any
    fence: Any  # FENCE registered on the ledger
    sleep: Callable[[float], Any]
    rng: random.Random

    def steps(self, key: str, token: int, slot: int) -> Generator[Any, Any, Requeue | None]:
        names, pid = self.names, os.getpid()
        start = time.monotonic()
        if key.startswith("cold"):  # the burst's keys: started, nothing to write
            yield self.ledger.rpush(names.begins, f"{key} {token} {start} {pid}")
            return None
        pipe = self.ledger.pipeline(transaction=False)
        pipe.rpush(names.begins, f"{key} {token} {start} {pid}")
        pipe.hset(names.inflight(pid), str(slot), f"{key} {token}")
        yield pipe.execute()
        yield self.sleep(self.rng.uniform(*BEFORE_READ))
        try:
            version = str(int((yield self.objects.get(names.version(key))) or 0))
        except redis.RedisError:
            version = ""
        verdict = yield self.fence(keys=[names.fence, names.store], args=[key, token, version])
        wrote = time.monotonic()
        yield self.ledger.hdel(names.inflight(pid), str(slot))
        if verdict == b"ok":
            yield self.sleep(self.rng.uniform(*AFTER_WRITE))
        call = Call(
            key, token, pid, start, wrote, time.monotonic(), int(version or -1), verdict.decode()
        )
        yield self.ledger.rpush(names.calls, call.line())
        if verdict == b"stale":
            raise StaleToken(f"{key}: token {token} refused")
        return Requeue() if verdict == b"unread" else None

    def run(self, key: str, token: int, slot: int) -> Requeue | None:
        steps = self.steps(key, token, slot)
        value = None
        while True:
            try:
                value = steps.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]

    async def arun(self, key: str, token: int, slot: int) -> Requeue | None:
        steps = self.steps(key, token, slot)
        value: Any = None
        error: Exception | None = None
        while True:
            try:
                step = steps.throw(error) if error is not None else steps.send(value)
            except StopIteration as stop:
                return stop.value  # type: ignore[no-any-return]
            value, error = None, None
            try:
                value = await step if inspect.isawaitable(step) else step
            except Exception as exc:  # back into the steps, as the sync call would raise
                error = exc


def chaos_worker(
    chaos_url: str,
    ledger_url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int,
    lease: float,
    max_retries: int,
    seed: int,
    batch: bool = True,
) -> None:
    """``run_workers`` (``workers`` threads) on one client of ``names.queue``
    until ``stop`` is set. Each handler call: report its start, work a little,
    read the key's version from the chaos server, write it to the fenced store
    with its token, hold the key a little longer, report the call. A refused
    write raises ``StaleToken``; an object it could not read is ``Requeue()``.
    ``batch``: the queue's (claims, or a get and a done per key); the claims
    it sent go to ``names.claims``.
    """
    ledger = redis.Redis.from_url(ledger_url)
    objects = redis.Redis.from_url(chaos_url)
    fence = ledger.register_script(FENCE)
    pid = os.getpid()
    # A replacement may start while the server is down: wait for it.
    q = _persist(
        lambda: RedisWorkQueue(
            names.queue,
            url=chaos_url,
            lease=lease,
            rate_limiter=CHAOS_LIMITER,
            max_retries=max_retries,
            batch=batch,
        )
    )
    _report(ledger, names, q)
    claims = _Claims(q, ledger, names, "threads", batch)

    handler = _Handler(names, ledger, objects, fence, time.sleep, random.Random(seed))

    def handle(key: str) -> Requeue | None:
        return handler.run(key, q.token(key), threading.get_ident())

    def on_give_up(key: str, error: BaseException) -> None:
        token = -1
        with contextlib.suppress(ValueError):
            token = q.token(key)
        ledger.rpush(*_given_up(names, key, token, error))

    stopping = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), stopping.set()), daemon=True).start()
    stats = keyqueue.run_workers(q, handle, workers=workers, stop=stopping, on_give_up=on_give_up)
    ledger.rpush(names.stats, json.dumps({"pid": pid, **dataclasses.asdict(stats)}))
    claims.report(stats.processed)
    q.close()
    objects.close()
    ledger.close()


def async_chaos_worker(
    chaos_url: str,
    ledger_url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int,
    lease: float,
    max_retries: int,
    seed: int,
    batch: bool = True,
) -> None:
    """``chaos_worker``'s handler on one ``AsyncRedisWorkQueue``, run by
    ``arun_workers`` (``workers`` tasks) in shifts: after ``SHIFT`` seconds its
    stop is set and it is started again (workers restarted on a reload, say).
    Batched, the stop lands wherever the shift ends (a claim in flight, a
    handler running); with ``batch=False`` it lands while a get's script is
    in flight (``_ShiftEnds``)."""
    asyncio.run(
        _async_chaos_worker(
            chaos_url, ledger_url, names, stop, workers, lease, max_retries, seed, batch
        )
    )


class _ShiftEnds:
    """``arun_workers``' view of the client: the queue itself, but the first
    ``get`` once the shift is due sets the shift's stop just after its script
    is sent, so that get is cancelled while the server hands it a key."""

    def __init__(self, q: AsyncRedisWorkQueue) -> None:
        self.q = q
        self.due = 0.0
        self.shift = asyncio.Event()

    def begin(self, seconds: float) -> asyncio.Event:
        self.due, self.shift = time.monotonic() + seconds, asyncio.Event()
        return self.shift

    def __getattr__(self, name: str) -> Any:
        return getattr(self.q, name)

    async def get(self) -> str:
        if time.monotonic() >= self.due and not self.shift.is_set():
            asyncio.get_running_loop().call_soon(self.shift.set)  # runs once the script is out
        return await self.q.get()


async def _async_chaos_worker(
    chaos_url: str,
    ledger_url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int,
    lease: float,
    max_retries: int,
    seed: int,
    batch: bool,
) -> None:
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    threading.Thread(
        target=lambda: (stop.wait(), loop.call_soon_threadsafe(done.set)), daemon=True
    ).start()
    ledger = redis.asyncio.Redis.from_url(ledger_url)
    reports = redis.Redis.from_url(ledger_url)  # for the logging handler, which cannot await
    objects = redis.asyncio.Redis.from_url(chaos_url)
    fence = ledger.register_script(FENCE)
    pid, rng = os.getpid(), random.Random(seed)
    q = AsyncRedisWorkQueue(
        names.queue,
        url=chaos_url,
        lease=lease,
        rate_limiter=CHAOS_LIMITER,
        max_retries=max_retries,
        batch=batch,
    )
    _report(reports, names, q)
    claims = _Claims(q, reports, names, "asyncio", batch)

    handler = _Handler(names, ledger, objects, fence, asyncio.sleep, rng)

    async def handle(key: str) -> Requeue | None:
        return await handler.arun(key, q.token(key), id(asyncio.current_task()))

    async def on_give_up(key: str, error: BaseException) -> None:
        token = -1
        with contextlib.suppress(ValueError):
            token = q.token(key)
        await ledger.rpush(*_given_up(names, key, token, error))

    total: Counter[str] = Counter()
    shifts = _ShiftEnds(q)
    while not done.is_set():
        shift = shifts.begin(rng.uniform(*SHIFT))
        if batch:  # the shift ends at its time, wherever the workers are
            loop.call_at(loop.time() + shifts.due - time.monotonic(), shift.set)
        runner = asyncio.create_task(
            keyqueue.arun_workers(
                q if batch else shifts, handle, workers=workers, stop=shift, on_give_up=on_give_up
            )
        )
        ends = [asyncio.create_task(done.wait()), asyncio.create_task(shift.wait())]
        # ... or, if no get comes meanwhile, a little later anyway.
        await asyncio.wait(
            ends, timeout=shifts.due + SHIFT[0] - time.monotonic(), return_when="FIRST_COMPLETED"
        )
        for end in ends:
            end.cancel()
        shift.set()
        total.update(dataclasses.asdict(await runner))
        await ledger.rpush(names.shifts, f"{pid} {time.monotonic()}")
    stats = RunStats(**total)
    await ledger.rpush(names.stats, json.dumps({"pid": pid, **dataclasses.asdict(stats)}))
    claims.report(stats.processed)
    await q.aclose()
    await objects.aclose()
    await ledger.aclose()
    reports.close()


def write(
    objects: redis.Redis, ledger: redis.Redis, q: RedisWorkQueue, names: Names, key: str
) -> None:
    """A producer's write: bump the key's version, note it on the ledger (key,
    version, when), then ``add`` the key; each step is tried again until the
    server takes it, so every write is added after it."""
    version = _persist(lambda: objects.incr(names.version(key)))
    ledger.rpush(names.writes, f"{key} {version} {time.monotonic()}")
    _persist(lambda: q.add(key))


def chaos_producer(
    chaos_url: str,
    ledger_url: str,
    names: Names,
    keys: list[str],
    stop: ProcessEvent,
    seed: int,
    pause: float,
) -> None:
    """Until ``stop`` is set: ``write`` a random key, then pause up to
    ``2 * pause``. At the end, reports its number of writes to
    ``names.produced``."""
    ledger = redis.Redis.from_url(ledger_url)
    objects = redis.Redis.from_url(chaos_url)
    q = _persist(lambda: RedisWorkQueue(names.queue, url=chaos_url))
    rng = random.Random(seed)
    writes = 0
    while not stop.is_set():
        key = rng.choice(keys)
        write(objects, ledger, q, names, key)
        writes += 1
        stop.wait(rng.uniform(0, 2 * pause))
    ledger.rpush(names.produced, f"{os.getpid()} {writes}")
    q.close()
    objects.close()
    ledger.close()


class Processes:
    """The child processes of one test, and the event that stops the workers."""

    def __init__(self) -> None:
        self.stop = CONTEXT.Event()
        self.children: list[BaseProcess] = []

    def start(self, target: Callable[..., None], *args: Any, **kwargs: Any) -> BaseProcess:
        child = CONTEXT.Process(
            target=_child, args=(os.getpid(), target, *args), kwargs=kwargs, daemon=True
        )
        child.start()
        self.children.append(child)
        return child

    def join(self, children: list[BaseProcess], timeout: float = STOP_TIMEOUT) -> None:
        """Wait for ``children`` to exit; each must have exited cleanly."""
        deadline = time.monotonic() + timeout
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            assert child.exitcode == 0, f"{child.name} (pid {child.pid}): exit {child.exitcode}"

    def kill_all(self) -> None:
        for child in self.children:
            if child.is_alive():
                child.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        for child in self.children:
            child.join(5)


@contextmanager
def processes() -> Iterator[Processes]:
    """A ``Processes`` whose children are all killed on leaving, however it is left."""
    owned = Processes()
    try:
        yield owned
    finally:
        owned.kill_all()
