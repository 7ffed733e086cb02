"""The chaos test: worker processes and asyncio clients on a few hot
keys while workers are killed and stalled, connections cut and the server
crashed, then a check that no change was lost and no key held twice.

Theory of operation
-------------------
Two servers. The *chaos* server (this test's own, ``appendfsync always``)
holds the queue and the objects: each hot key's version, which producers bump
and then ``add`` the key, and which handlers read. The *ledger* (the
session's server, which no fault touches) holds the fenced store, which
refuses a write with a lower token than the highest that wrote the key, and
every report (tests/support/redis_processes.py: ``chaos_worker``,
``async_chaos_worker``, ``chaos_producer``). A handler works a little, reads
the version, writes it to the store with its token, then holds the key a
little longer; a refused write raises ``StaleToken``, an object it could not
read is ``Requeue()``. The asyncio clients restart their ``arun_workers``
every second or so, its stop landing while a get's script is in flight.

Faults, one after another on a seeded schedule (printed first;
``KEYQUEUE_CHAOS_SEED=<seed>`` replays it, though not the timing of what it
hits): ``kill -9`` of a worker process (a replacement starts at once),
``SIGSTOP`` of one until a newer holder has written every key it was about
to write (so past its lease, and the late write is refused while the new
holder still holds the key), ``CLIENT KILL TYPE
normal`` storms, and ``kill -9`` of valkey-server restarted from its
append-only file on the same port. Kills and stalls are ``SPACING`` apart, so
no key loses two leases in a row: with ``max_retries=2`` no key is then given
up by a correct queue. The producers stop; once the queue is idle, every
key is written once more, and the last fault is a server crash as soon as
every key is with a handler that has yet to write it. The workers drain
(bounded), stop, and the run is checked:

1. no overlapping valid holds: of two handler calls of one key whose
   intervals (start to write) overlap, the older token's write was refused;
2. every final version processed: the last version written of each key was
   written to the store by a handler that started after it was written;
3. nothing left queued: depth, delayed and processing are 0;
4. no key given up (``on_give_up``, or the runner's "giving up" warning) by a
   holder whose key had been handed to a newer holder;
5. no key stranded: no lease ran out on a hand-out that no handler started,
   but for one lost to a fault (a get cut off by a killed connection, a
   killed process, a crash). A key a cancelled get puts back at once is never
   reaped;
6. both paths ran: the workers of both fronts (threads, asyncio) on claims
   took every key through claims, fewer claims than keys, at least one of
   several keys (a burst of ``BURST`` cold keys after the warm-up, which
   handlers only mark started); the per-key clients (``batch=False``, and an
   asyncio proxy) sent no claim.

The figures go out in one line (``pytest -s`` shows it), with the violations.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import random
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as ProcessEvent
from pathlib import Path

import pytest
import redis

from keyqueue.redis import RedisStats, RedisWorkQueue
from tests.support.redis_processes import (
    CONTEXT,
    Call,
    Names,
    Processes,
    async_chaos_worker,
    chaos_producer,
    chaos_worker,
    processes,
    write,
)
from tests.support.valkey_server import ValkeyServer

pytestmark = pytest.mark.timeout(120)

LEASE = 1.5  # seconds; renewed every third of it
MAX_RETRIES = 2  # a stale holder's retry after a reap reaches it
KEYS = [f"hot{i}" for i in range(6)]
# The slots' kinds: both fronts on claims (batch=True), beside per-key clients,
# and each kind's workers per process (more on claims: they batch what they take).
KINDS = ["threads", "threads", "threads-per-key", "asyncio", "asyncio-per-key"]
WORKERS = {"threads": 6, "threads-per-key": 3, "asyncio": 12, "asyncio-per-key": 3}
THREAD_PROCESSES = sum(kind.startswith("threads") for kind in KINDS)
ASYNC_PROCESSES = len(KINDS) - THREAD_PROCESSES
PRODUCERS, PAUSE = 2, 0.02  # a write every 0 to 40 ms per producer
FAULTS = {"kill": 2, "stop": 3, "storm": 3, "restart": 2}
STORM = (0.2, 0.4)  # seconds of CLIENT KILL, every 10 to 30 ms: under a renewal interval
DOWN = (0.05, 0.25)  # seconds the server stays down: leases outlive it
LAST_DOWN = (0.15, 0.2)  # the final crash: longer than a handler takes to read
GAP = (0.3, 0.8)  # seconds between faults
BURST = 600  # cold keys added at once after the warm-up (claims of several keys)
SPACING = LEASE + 1.0  # seconds from a kill or stall to the next one
STALL = (LEASE + 0.5, 3 * LEASE)  # a SIGSTOP of a worker with nothing to write, at most
# Seconds a hand-out lost to a fault may precede or follow it. Generous: a
# hand-out's time is reconstructed from when the reaping client heard of the
# reap, which a loaded machine (two test runs at once) delays by tenths of a
# second, and a killed process's other workers may be handed keys a little
# before the kill without having started their handlers.
SLOP = 1.0
WARMUP, DRAIN, WAIT = 1.0, 15.0, 20.0


@dataclass(frozen=True)
class Fault:
    """One fault of the schedule: ``gap`` seconds after the previous one ends."""

    kind: str  # kill, stop, storm, restart
    gap: float
    slot: int  # the worker (kill, stop): an index into the worker slots
    length: float  # storm: seconds of kills; restart: seconds down
    every: float  # storm: seconds between kills

    def __str__(self) -> str:
        detail = {
            "kill": f"kill -9 a worker with a key to write (from worker {self.slot} on)",
            "stop": f"SIGSTOP a worker with a key to write (from worker {self.slot} on)",
            "storm": f"CLIENT KILL every {self.every * 1000:.0f} ms for {self.length:.2f} s",
            "restart": f"kill -9 valkey-server, {self.length:.2f} s down, restart",
        }[self.kind]
        return f"+{self.gap:.2f}s {detail}"


def plan(seed: int) -> tuple[list[Fault], Fault]:
    """The faults of a run, in order, and the final crash."""
    rng = random.Random(seed)
    kinds = [kind for kind, count in FAULTS.items() for _ in range(count)]
    rng.shuffle(kinds)
    slots = THREAD_PROCESSES + ASYNC_PROCESSES

    def fault(kind: str) -> Fault:
        return Fault(
            kind,
            gap=rng.uniform(*GAP),
            slot=rng.randrange(slots),
            length=rng.uniform(*(STORM if kind == "storm" else DOWN)),
            every=rng.uniform(0.01, 0.03),
        )

    faults = [fault(kind) for kind in kinds]
    return faults, dataclasses.replace(fault("restart"), gap=0.0, length=rng.uniform(*LAST_DOWN))


@dataclass(frozen=True)
class Injected:
    """A fault as it happened: monotonic times (one clock for every process)."""

    kind: str
    start: float
    end: float
    detail: str
    pid: int | None = None  # the worker process stopped or killed


@dataclass(frozen=True)
class Slot:
    """A worker process, its kind (threads, asyncio) and its stop event."""

    kind: str
    process: BaseProcess
    stop: ProcessEvent


@dataclass
class Chaos:
    """The run: the chaos server, the workers (by slot), the producers, and
    the faults injected so far. Every method runs in the main thread, which
    must start valkey-server (its death signal follows the starting thread)."""

    server: ValkeyServer
    ledger_url: str
    names: Names
    procs: Processes
    seeds: random.Random
    producing: ProcessEvent = field(default_factory=CONTEXT.Event)  # stops the producers
    slots: list[Slot] = field(default_factory=list)
    producers: list[BaseProcess] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)
    connections_killed: int = 0
    next_stall: float = 0.0  # no kill or stall before this time

    def __post_init__(self) -> None:
        self.ledger = redis.Redis.from_url(self.ledger_url)

    def worker(self, kind: str) -> Slot:
        """A worker process with a stop event of its own: a process killed while
        it waits on an event leaves that event's ``set()`` hanging for good."""
        threads = kind.startswith("threads")
        target = chaos_worker if threads else async_chaos_worker
        count = WORKERS[kind]
        stop = CONTEXT.Event()
        process = self.procs.start(
            target,
            self.server.url,
            self.ledger_url,
            self.names,
            stop,
            count,
            LEASE,
            MAX_RETRIES,
            self.seeds.randrange(2**32),
            not kind.endswith("per-key"),
        )
        return Slot(kind, process, stop)

    def start(self) -> None:
        self.slots = [self.worker(kind) for kind in KINDS]
        self.producers = [
            self.procs.start(
                chaos_producer,
                self.server.url,
                self.ledger_url,
                self.names,
                KEYS,
                self.producing,
                self.seeds.randrange(2**32),
                PAUSE,
            )
            for _ in range(PRODUCERS)
        ]

    def inject(self, fault: Fault) -> None:
        time.sleep(fault.gap)  # the schedule's pace, not a wait for a condition
        if fault.kind in ("kill", "stop"):
            time.sleep(max(0.0, self.next_stall - time.monotonic()))
        {"kill": self.kill, "stop": self.stall, "storm": self.storm, "restart": self.restart}[
            fault.kind
        ](fault)

    def pick(self, fault: Fault) -> int:
        """The slot of a worker with a key it has not written yet: the first from
        ``fault.slot`` on, within a second (else ``fault.slot``)."""
        order = [(fault.slot + i) % len(self.slots) for i in range(len(self.slots))]
        deadline = time.monotonic() + 1.0
        while time.monotonic() < deadline:
            for i in order:
                if self.ledger.hlen(self.names.inflight(self.slots[i].process.pid or 0)):
                    return i
            time.sleep(0.005)
        return fault.slot

    def kill(self, fault: Fault) -> None:
        i = self.pick(fault)
        victim = self.slots[i]
        start = time.monotonic()
        victim.process.kill()
        victim.process.join(WAIT)
        self.slots[i] = self.worker(victim.kind)
        self.next_stall = start + SPACING
        self.note("kill", start, f"{victim.kind} pid {victim.process.pid}", victim.process.pid)

    def stall(self, fault: Fault) -> None:
        """SIGSTOP until every key the worker was handling has been written by a
        newer holder (so its late write is refused), between STALL's bounds."""
        slot = self.slots[self.pick(fault)]
        pid = slot.process.pid
        assert pid is not None
        start = time.monotonic()
        holds = self.ledger.hlen(self.names.inflight(pid))
        os.kill(pid, signal.SIGSTOP)
        taken = False
        try:
            while not taken and time.monotonic() < start + STALL[1]:
                time.sleep(0.01)
                # A newer token means the lease was taken back: past its lease.
                taken = self.taken_over(pid) if holds else None
                if taken is None:  # nothing to write: a plain stall
                    taken = time.monotonic() > start + STALL[0]
        finally:
            os.kill(pid, signal.SIGCONT)
        self.next_stall = time.monotonic() + SPACING - LEASE
        self.note(
            "stop", start, f"{slot.kind} pid {pid}, {holds} to write, taken over {taken}", pid
        )

    def taken_over(self, pid: int) -> bool | None:
        """Every key the worker has yet to write was written by a newer token (None:
        it has none left to write)."""
        held = [line.decode().split() for line in self.ledger.hvals(self.names.inflight(pid))]
        if not held:  # it finished its last key between the count and the stop
            return None
        written = self.ledger.hmget(self.names.fence, [key for key, _ in held])
        return all(
            int(high or 0) > int(token) for (_, token), high in zip(held, written, strict=True)
        )

    def storm(self, fault: Fault) -> None:
        admin = redis.Redis.from_url(self.server.url)
        start = time.monotonic()
        try:
            while time.monotonic() < start + fault.length:
                self.connections_killed += int(
                    admin.client_kill_filter(_type="normal", skipme=True)
                )
                time.sleep(fault.every)  # the storm's pace
        finally:
            admin.close()
        self.note("storm", start, f"every {fault.every * 1000:.0f} ms")

    def restart(self, fault: Fault) -> None:
        start = time.monotonic()
        self.server.kill()
        time.sleep(fault.length)  # the outage
        self.server.start()  # the same port, from the append-only file
        self.note("restart", start, f"down {time.monotonic() - start:.2f} s")

    def last_writes(self) -> int:
        """Once the queue is idle, write every key once more, and wait (up to a
        second) until the most keys are with handlers that have yet to write
        them: the moment for the final crash. Returns how many are."""
        objects = redis.Redis.from_url(self.server.url)
        q = RedisWorkQueue(self.names.queue, url=self.server.url)
        try:
            wait(lambda: idle(q), WAIT)
            for key in KEYS:
                write(objects, self.ledger, q, self.names, key)
        finally:
            q.close()
            objects.close()
        best, deadline = 0, time.monotonic() + 1.0
        while time.monotonic() < deadline:
            held = len(self.to_write())
            if held == len(KEYS) or held < best:  # all, or past the most
                return max(held, best)
            best = held
        return best

    def to_write(self) -> set[str]:
        """The keys handlers hold and have yet to write, in every live worker."""
        keys = set()
        for slot in self.slots:
            for line in self.ledger.hvals(self.names.inflight(slot.process.pid or 0)):
                keys.add(line.decode().split()[0])
        return keys

    def note(self, kind: str, start: float, detail: str, pid: int | None = None) -> None:
        self.injected.append(Injected(kind, start, time.monotonic(), detail, pid))

    def stop_producers(self) -> int:
        """Stop the producers; returns their writes once each has made its last."""
        self.producing.set()
        writes = 0
        for _ in self.producers:
            reply = self.ledger.blpop([self.names.produced], timeout=WAIT)
            assert reply is not None, "a producer did not stop"
            writes += int(reply[1].split()[1])
        return writes


@pytest.fixture
def procs() -> Iterator[Processes]:
    with processes() as owned:
        yield owned


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyServer]:
    with ValkeyServer(tmp_path, config={"appendonly": "yes", "appendfsync": "always"}) as s:
        yield s


def idle(q: RedisWorkQueue) -> bool:
    s = q.stats()
    return s.depth == s.delayed == s.processing == 0


def wait(check: Callable[[], bool], timeout: float) -> bool:
    """Poll ``check`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


# -- the checks ---------------------------------------------------------------------


@dataclass(frozen=True)
class Begin:
    key: str
    token: int
    start: float
    pid: int


@dataclass(frozen=True)
class GiveUp:
    key: str
    token: int
    at: float
    pid: int
    how: str


def overlapping_valid_holds(
    calls: list[Call], expired: list[Expired], injected: list[Injected]
) -> list[str]:
    """Pairs of calls of one key whose intervals (start to the store's answer)
    overlap while the older token's write was not refused, and the older
    hold's lease was not taken back (a reap of it, handed out about when it
    started, or, for a call that started as its process resumed from a
    SIGSTOP, about when that stop began: the key was handed to the worker
    just before the stop, its handler started just after). A stalled holder
    whose lease was reaped may still write before the new holder does: the
    fence refuses only a token lower than one that wrote, and the new
    holder's write then wins. That is a lost lease, not two valid holds (seen
    beside two busy loops: the stalled write's reported time came after the
    new one's, the store's order was the other)."""
    found = []
    by_key: dict[str, list[Call]] = defaultdict(list)
    for call in calls:
        by_key[call.key].append(call)
    reaped: dict[str, list[float]] = defaultdict(list)
    for lease in expired:
        reaped[lease.key].append(lease.at - lease.held)
    stops: dict[int, list[Injected]] = defaultdict(list)
    for fault in injected:
        if fault.kind == "stop" and fault.pid is not None:
            stops[fault.pid].append(fault)

    def handed_out(call: Call) -> list[float]:
        """When ``call``'s key may have been handed out: as it started, or
        before a stop of its process that ended as it started."""
        stalls = stops[call.pid]
        return [call.start] + [s.start for s in stalls if s.end <= call.start <= s.end + SLOP]

    for runs in by_key.values():
        runs.sort(key=lambda call: call.start)
        for i, first in enumerate(runs):
            for second in itertools.islice(runs, i + 1, None):
                if second.start >= first.wrote:
                    break
                older = min(first, second, key=lambda call: call.token)
                if older.verdict == "stale":
                    continue
                if any(
                    abs(out - at) <= SLOP for out in reaped[older.key] for at in handed_out(older)
                ):
                    continue  # the older lease was taken back: a lost lease
                found.append(f"{first} and {second}")
    return found


def lost_final_versions(
    finals: dict[str, int],
    written: dict[tuple[str, int], float],
    calls: list[Call],
    store: dict[str, int],
) -> list[str]:
    found = []
    for key, final in finals.items():
        at = written.get((key, final))
        if at is None:
            found.append(f"{key}: version {final} on the server was never reported written")
            continue
        if not any(
            call.key == key and call.verdict == "ok" and call.version == final and call.start >= at
            for call in calls
        ):
            last = max((c for c in calls if c.key == key), key=lambda c: c.start, default=None)
            found.append(
                f"{key}: version {final} (written at {at:.3f}) never processed; last {last}"
            )
        elif store.get(key) != final:
            found.append(f"{key}: the store holds version {store.get(key)}, not {final}")
    return found


def left_queued(drained: bool, stats: RedisStats) -> list[str]:
    if drained:
        return []
    return [
        f"after {DRAIN:.0f} s: depth {stats.depth}, delayed {stats.delayed}, "
        f"processing {stats.processing}"
    ]


def given_up_while_held(give_ups: list[GiveUp], begins: list[Begin]) -> list[str]:
    """Give-ups by a holder whose key had been handed to a newer holder."""
    found, seen = [], set()
    for give_up in give_ups:
        newer = [
            begin
            for begin in begins
            if begin.key == give_up.key and begin.token > give_up.token and begin.start < give_up.at
        ]
        if give_up.token < 0:  # its thread held no token: another process's start within a lease
            newer = [b for b in begins if b.key == give_up.key and b.start < give_up.at]
            newer = [b for b in newer if b.pid != give_up.pid and b.start > give_up.at - LEASE]
        if newer and (give_up.key, give_up.token) not in seen:
            seen.add((give_up.key, give_up.token))
            found.append(
                f"{give_up.key} given up ({give_up.how}) by token {give_up.token} (pid "
                f"{give_up.pid}) at {give_up.at:.3f}, after token {newer[0].token} "
                f"(pid {newer[0].pid}) took it at {newer[0].start:.3f}"
            )
    return found


@dataclass(frozen=True)
class Expired:
    """A lease reaped: the key, when the reaping client heard of it, how long
    it had been held (so it was handed out ``held`` seconds before), by whom."""

    key: str
    at: float
    held: float
    pid: int


def stranded(expired: list[Expired], begins: list[Begin], injected: list[Injected]) -> list[str]:
    """Leases that ran out on a hand-out no handler ever started, where no fault
    can have lost the hand-out (a killed process, a get cut off, a crash). A key
    put back at once by a cancelled get is never reaped, so it is not here."""
    found = []
    starts: dict[str, list[float]] = defaultdict(list)
    for begin in begins:
        starts[begin.key].append(begin.start)
    for lease in expired:
        out = lease.at - lease.held
        if any(out - SLOP <= start <= out + SLOP for start in starts[lease.key]):
            continue
        if any(f.start - SLOP <= out <= f.end + SLOP for f in injected):
            continue
        found.append(
            f"{lease.key}: handed out at {out:.3f}, to no handler; its lease ran out at "
            f"{lease.at:.3f} (reaped by pid {lease.pid})"
        )
    return found


def parse_give_ups(ledger: redis.Redis, names: Names) -> list[GiveUp]:
    give_ups = []
    for line in ledger.lrange(names.gave_up, 0, -1):
        key, token, at, pid, error = line.decode().split()
        give_ups.append(GiveUp(key, int(token), float(at), int(pid), f"on_give_up {error}"))
    for line in ledger.lrange(names.warnings, 0, -1):
        warning = json.loads(line)
        if "giving up" in warning["message"] and warning["key"] is not None:
            give_ups.append(
                GiveUp(warning["key"], warning["token"], warning["at"], warning["pid"], "warning")
            )
    return give_ups


def burst(url: str, names: Names) -> None:
    """``BURST`` cold keys at once, which handlers only write (no work): the
    workers' claims take several each."""
    q = RedisWorkQueue(names.queue, url=url)
    try:
        q.add_many(f"cold{i}" for i in range(BURST))
    finally:
        q.close()


def claims_by_kind(ledger: redis.Redis, names: Names) -> dict[str, Counter[str]]:
    """Per slot kind, over its worker processes (a killed one: what it had
    reported, its handler calls uncounted): claim scripts sent, those that took
    keys, keys they took, the most one took, handler calls, processes."""
    kinds: dict[str, Counter[str]] = defaultdict(Counter)
    for line in ledger.hvals(names.claims):
        report = json.loads(line)
        kind = report["front"] + ("" if report["batch"] else "-per-key")
        kinds[kind].update(
            claims=report["claims"],
            taking=report["taking"],
            claimed=report["claimed"],
            got=report["got"],
            calls=report["calls"],
            processes=1,
        )
        kinds[kind]["most"] = max(kinds[kind]["most"], report["most"])
    return kinds


def paths_not_proven(kinds: dict[str, Counter[str]]) -> list[str]:
    """Each kind's path ran: a batched front took keys only through claims
    (no get script handed one out, and its handler calls were no more than
    the keys claimed), fewer claims than the keys they took, one of several
    (the burst's first claim in a process takes one key per idle worker);
    a per-key client took keys through get, and sent no claim. (Among hot
    keys each claim mostly takes one key: keys arrive one at a time, and
    every process's claimant wakes for each.)"""
    found = []
    for kind in dict.fromkeys(KINDS):
        count = kinds.get(kind, Counter())
        if kind.endswith("per-key"):
            if count["claims"] or not count["got"]:
                found.append(f"{kind}: {count['claims']} claims, {count['got']} keys got")
        elif count["got"] or not (
            count["calls"] <= count["claimed"]
            and 0 < count["taking"] < count["claimed"]
            and count["most"] >= 2
        ):
            found.append(
                f"{kind}: {count['taking']} claims took {count['claimed']} keys (at most "
                f"{count['most']} in one), {count['got']} by get, for {count['calls']} "
                "handler calls"
            )
    return found


# -- the test -----------------------------------------------------------------------


def test_chaos_kills_stalls_cut_connections_and_crashes_lose_no_change_and_hold_no_key_twice(
    server: ValkeyServer, valkey_url: str, procs: Processes
) -> None:
    seed = int(os.environ.get("KEYQUEUE_CHAOS_SEED") or random.SystemRandom().randrange(10**6))
    faults, final = plan(seed)
    print(
        f"\n[CHAOS] seed {seed} (KEYQUEUE_CHAOS_SEED={seed} replays it): "
        + "; ".join(map(str, faults))
        + f"; producers stop; every key written once more; {final}"
    )
    names = Names(f"chaos-{os.getpid()}-{time.monotonic_ns()}")
    ledger = redis.Redis.from_url(valkey_url)
    began = time.monotonic()
    run = Chaos(server, valkey_url, names, procs, random.Random(seed))
    q: RedisWorkQueue | None = None
    try:
        run.start()
        assert wait(lambda: ledger.llen(names.calls) >= 20, WAIT), "the workers never got going"
        time.sleep(WARMUP)  # a steady state before the first fault
        burst(server.url, names)
        for fault in faults:
            run.inject(fault)
        writes = run.stop_producers() + len(KEYS)
        in_flight = run.last_writes()
        run.restart(final)
        q = RedisWorkQueue(names.queue, url=server.url)
        drained = wait(lambda: idle(q), DRAIN)
        stats = q.stats()
        for slot in run.slots:
            slot.stop.set()
        procs.join([slot.process for slot in run.slots])
        elapsed = time.monotonic() - began

        calls = [Call.parse(line) for line in ledger.lrange(names.calls, 0, -1)]
        begins = []
        for line in ledger.lrange(names.begins, 0, -1):
            key, token, start, pid = line.decode().split()
            begins.append(Begin(key, int(token), float(start), int(pid)))
        expired = []
        for line in ledger.lrange(names.expired, 0, -1):
            key, at, held, pid = line.decode().split()
            expired.append(Expired(key, float(at), float(held), int(pid)))
        written: dict[tuple[str, int], float] = {}
        for line in ledger.lrange(names.writes, 0, -1):
            key, version, at = line.decode().split()
            written[key, int(version)] = float(at)
        objects = redis.Redis.from_url(server.url)
        finals = {key: int(objects.get(names.version(key)) or 0) for key in KEYS}
        objects.close()
        store = {k.decode(): int(v) for k, v in ledger.hgetall(names.store).items()}
        outcomes: Counter[str] = Counter()
        for line in ledger.lrange(names.stats, 0, -1):
            outcomes.update({k: v for k, v in json.loads(line).items() if k != "pid"})
        warnings = [json.loads(line)["message"] for line in ledger.lrange(names.warnings, 0, -1)]
        violations = {
            "overlapping valid holds": overlapping_valid_holds(calls, expired, run.injected),
            "final versions lost": lost_final_versions(finals, written, calls, store),
            "left queued": left_queued(drained, stats),
            "given up while held": given_up_while_held(parse_give_ups(ledger, names), begins),
            "stranded": stranded(expired, begins, run.injected),
            "paths not proven": paths_not_proven(by_kind := claims_by_kind(ledger, names)),
        }
        verdicts = Counter(call.verdict for call in calls)
        kinds = Counter(fault.kind for fault in run.injected)
        dropped = sum("dropping the key" in m for m in warnings)  # the runner's words
        print(
            f"[CHAOS] seed {seed}, {elapsed:.1f} s: {len(KEYS)} hot keys, "
            f"{THREAD_PROCESSES} thread and {ASYNC_PROCESSES} asyncio worker processes "
            f"({', '.join(f'{WORKERS[kind]} {kind}' for kind in KINDS)} workers) "
            f"({ledger.llen(names.shifts)} asyncio restarts); {writes} writes, {stats.adds} adds, "
            f"{stats.gets} gets, {len(calls)} handler calls ({verdicts['stale']} stale writes "
            f"refused, {verdicts['unread']} unread), {stats.gets - len(begins)} hand-outs no "
            f"handler saw; faults: {kinds['kill']} kill -9, {kinds['stop']} SIGSTOP past the "
            f"lease, {kinds['storm']} CLIENT KILL storms ({run.connections_killed} connections), "
            f"{kinds['restart']} server crashes (the last with {in_flight} keys in flight); "
            f"{stats.leases_expired} leases expired ({len(expired)} reported), "
            f"{outcomes['lease_lost']} lease lost, {outcomes['gave_up']} gave up, "
            f"{outcomes['errors']} outcome errors ({dropped} keys dropped); "
            + "; ".join(
                f"{kind}: {c['claims']} claims ({c['taking']} took keys), {c['claimed']} keys "
                f"claimed (at most {c['most']} in one), {c['got']} by get, {c['calls']} "
                f"handler calls ({c['processes']} processes reported)"
                for kind, c in sorted(by_kind.items())
            )
            + "; violations: "
            + ", ".join(f"{len(found)} {kind}" for kind, found in violations.items())
        )
        failed = {kind: found for kind, found in violations.items() if found}
        assert not failed, f"seed {seed}: " + "; ".join(
            f"{kind} ({len(found)}): " + " | ".join(found[:3]) for kind, found in failed.items()
        )
    finally:
        if q is not None:
            q.close()
        run.ledger.close()
        for key in ledger.scan_iter(match=f"test:{names.queue}:*"):
            ledger.delete(key)
        ledger.close()


def test_overlapping_holds_excuse_a_handler_that_started_as_its_stop_ended_after_its_reap() -> None:
    """A key handed to a worker just before its process was stopped: the lease
    is reaped during the stop and handed to a newer holder; the handler
    starts as the process resumes and writes before the newer holder does
    (both writes taken). A lost lease, not two valid holds; the same pair
    with no stop (or a stop long before) is still one."""
    newer = Call("hot1", 954, 2, 105.986, 106.029, 106.126, 126, "ok")
    older = Call("hot1", 905, 1, 105.997, 106.024, 106.099, 126, "ok")
    reap = [Expired("hot1", at=105.95, held=1.55, pid=2)]  # handed out at 104.40
    stop = Injected("stop", 104.41, 105.99, "threads pid 1", pid=1)
    earlier = dataclasses.replace(stop, start=100.0, end=102.0)
    assert overlapping_valid_holds([newer, older], reap, [stop]) == []
    for faults in ([], [earlier], [dataclasses.replace(stop, pid=3)]):
        assert len(overlapping_valid_holds([newer, older], reap, faults)) == 1
