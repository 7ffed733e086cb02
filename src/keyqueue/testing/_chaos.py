"""A failover chaos run: worker processes on a replicated topology, faults on the queue's primary.

Theory of operation
-------------------
``chaos_run`` takes a started ``ValkeySentinelSet`` or ``ValkeyCluster``
and runs one queue on it as a deployment would, while it fails the queue's
primary over, fault after fault; then it judges what happened offline.
``benchmarks/failover.py`` (figures per topology, fault and mode) and
``tests/redis/test_failover_chaos.py`` (the promises per mode) are its two
callers.

Who does what. A plain valkey-server of the run's own, which no fault
touches, is the *ledger*: it holds the fenced store (``ValkeyFence``: a
write with a lower token than the key's highest is refused) and every
report, so a report never dies with a connection. ``processes`` worker
processes (fresh interpreters, each dying with this one) run ``run_workers``
with ``threads`` threads through the client a user would pass
(``Sentinel(...).master_for(...)``, a ``RedisCluster``). Each handler call
reads its token, works 2 to 10 ms, writes the store with its token and
reports the hold (key, token, holder, start, end, whether the store took
it). A producer thread in this process adds ``keys`` hot keys at random
(~250 adds a second), recording every add that returned with the time it
was sent, and counting every one that raised, by exception. A watcher
thread records each change of the queue's primary, caused or not.

The faults, in the order given, each on the node that is the queue's
primary when it starts: ``kill`` (``kill -9``; the node is started again
``restart_after`` seconds after its failover is seen: on a Sentinel set as
a replica of the current primary, as an orchestrator that asks Sentinel
does, or with ``restart="as-configured"`` as it was, an old primary
returning empty; a Cluster node rejoins from its ``nodes.conf``),
``lag-kill`` (its replicas cut off for ``LAG`` seconds, then ``kill -9``: a
crash while they lag), ``stop`` (``SIGSTOP``), ``pause`` (``CLIENT PAUSE``)
and ``isolate`` (from the sentinels only; in a Cluster, from the other
nodes only). A ``stop``, ``pause`` or ``isolate`` lasts ``hold`` seconds,
and at least until the failover is seen; then the node is resumed or
rejoined. Each failover is confirmed from the servers (the sentinels or the
Cluster name another primary, which says so). A Sentinel set's failed-over
primary that comes back a primary (resumed, rejoined) is a split brain
until the sentinels demote it, which they do only when their next
``INFO`` to it (every 10 s) shows it; ``split`` seconds ends it sooner by
sending it the ``REPLICAOF`` they would (``ValkeySentinelSet.demote``).
With ``settle``, each fault waits until the topology is whole again (one
primary, every replica in sync; a primary that a cascaded failover left
behind demoted too, after ``split`` seconds): faults that do not overlap,
each a failover of its own, or more. Without it a fault comes every ``every`` seconds
whatever the state.

A sharded queue (``shards=N``, N > 1) runs the same way, every client
with the same ``shards``; the faults then hit the primary of its shard 0
(slot ``{queue}``), and the watcher follows that one: the other shards'
primaries are untouched, so the run shows what one primary's failover does
to a queue spread over several.

Then the producer stops, the queue drains (bounded), the workers stop and
``check_history`` judges the record; ``ChaosRun`` holds it all, roles before
and after included, so a caller proves the failovers it meant to cause.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import json
import os
import random
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue, client_from_url, close_client
from keyqueue.redis._shards import shard_name

from ._history import AddRecord, HistoryCheck, HoldRecord, ValkeyFence, check_history
from ._processes import spawn, stop
from ._replicated import ValkeyCluster, ValkeyNode, ValkeySentinelSet
from ._valkey import ValkeyError, local_valkey

__all__ = ["FAULTS", "LAG", "ChaosRun", "FaultRecord", "chaos_run"]

FAULTS = ("kill", "lag-kill", "stop", "pause", "isolate")
"""The faults ``chaos_run`` knows, as the module's docstring describes them."""
LAG = 0.5
"""Seconds a ``lag-kill`` keeps the replicas cut off before it kills their primary."""
SOCKET_TIMEOUT = 2.0
"""The clients' socket timeout, seconds: a frozen primary is an error within it."""
WORKERS_READY = 60.0
"""Seconds the worker processes have to start and make their queues, however
loaded the machine, before the producer and the faults begin."""

Topology = ValkeySentinelSet | ValkeyCluster


@dataclass(frozen=True)
class FaultRecord:
    """One fault the run caused, and what the servers said about it."""

    fault: str
    """Which fault (``FAULTS``)."""
    old: str
    """The node that was the queue's primary when the fault began."""
    at: float
    """When it began (``time.monotonic()``)."""
    new: str | None = None
    """The node the servers named primary after it, or None (no failover seen)."""
    failover_s: float | None = None
    """Seconds from the fault to the failover seen."""
    old_role_after: str = "?"
    """``old``'s role once the fault was over and, with ``settle``, the topology whole."""
    lagging: tuple[str, ...] = ()
    """For ``lag-kill``: the replicas that were cut off."""
    error: str | None = None
    """Why no failover was seen, if none was."""
    over: float = 0.0
    """When the fault was over (``time.monotonic()``): the node restarted, resumed or
    rejoined, and with ``split`` demoted."""
    whole_at: float | None = None
    """With ``settle``: when the topology was whole again after it (one primary,
    every other node its replica in sync; a cascaded failover's stale primary
    demoted too), else None."""


@dataclass(frozen=True)
class ChaosRun:
    """What ``chaos_run`` recorded, and ``check_history``'s verdict on it."""

    check: HistoryCheck
    """The offline judgement of ``holds``, ``adds`` and ``left_held``."""
    holds: tuple[HoldRecord, ...]
    """Every handler call the workers reported."""
    adds: tuple[AddRecord, ...]
    """Every add that returned."""
    left_held: tuple[str, ...]
    """Keys still held once the drain was over."""
    left: Mapping[str, int]
    """The queue's last counts read by the drain (``depth``, ``processing``, ``delayed``)."""
    faults: tuple[FaultRecord, ...]
    """Each fault, in order."""
    primaries: tuple[str, ...]
    """The queue's primary, each change the watcher saw (the first is the one at the start)."""
    primaries_at: tuple[float, ...]
    """When the watcher saw each of ``primaries`` first (``time.monotonic()``)."""
    roles_before: Mapping[str, str]
    """Each node's role before the first fault."""
    roles_after: Mapping[str, str]
    """Each node's role at the end."""
    producer_errors: Mapping[str, int]
    """Adds that raised, by exception name."""
    add_latencies: tuple[float, ...]
    """Each returned add's seconds: ``adds[i]`` returned ``add_latencies[i]`` after it
    was sent."""
    run_stats: tuple[Mapping[str, Any], ...]
    """Each worker process's ``RunStats``, as a dict."""
    queue_stats: Mapping[str, int] = field(default_factory=dict)
    """The queue's counters at the end (``RedisStats``), as far as they could be read."""
    began: float = 0.0
    """When the producer started (``time.monotonic()``)."""

    @property
    def primary_changes(self) -> int:
        """How many times the queue's primary changed (caused or not)."""
        return max(0, len(self.primaries) - 1)

    @property
    def failovers_seen(self) -> int:
        """Faults after which the servers named another primary."""
        return sum(1 for f in self.faults if f.new is not None and f.new != f.old)


def client_for(spec: Mapping[str, Any]) -> redis.Redis | redis.RedisCluster:
    """The client a user would pass, from ``topology_spec``'s description: its URL
    read by ``client_from_url`` (``Sentinel(...).master_for(...)``, a ``RedisCluster``)."""
    client: redis.Redis | redis.RedisCluster = client_from_url(
        spec["url"], socket_timeout=SOCKET_TIMEOUT
    )
    return client


def topology_spec(topology: Topology) -> dict[str, Any]:
    """What a worker process needs to reach ``topology``, as JSON-ready data: its URL."""
    if isinstance(topology, ValkeySentinelSet):
        user, password = topology.credentials
        hosts = ",".join(f"{h}:{p}" for h, p in topology.sentinel_addresses)
        return {"url": f"redis+sentinel://{user}:{password}@{hosts}/{topology.service}"}
    return {"url": "redis+cluster://" + ",".join(f"{h}:{p}" for h, p in topology.addresses)}


def _queue(
    spec: Mapping[str, Any], client: redis.Redis | redis.RedisCluster, **kwargs: Any
) -> RedisWorkQueue:
    """The run's queue on ``client``, in the run's durability mode (if it names one)."""
    mode = {} if spec.get("durability") is None else {"durability": spec["durability"]}
    shards = spec.get("shards", 1)
    return RedisWorkQueue(spec["queue"], client=client, shards=shards, **mode, **kwargs)


def _worker(spec: Mapping[str, Any]) -> None:
    """One worker process: ``run_workers`` until the ledger says stop (or is gone)."""
    ledger = redis.Redis.from_url(spec["ledger"])
    fence = ValkeyFence(ledger)
    holder = f"w{os.getpid()}"
    queue = _queue(spec, client_for(spec), lease=spec["lease"], holder=holder)
    ledger.rpush("ready", holder)
    stopping = threading.Event()

    def handler(key: str) -> None:
        start = time.monotonic()
        token = queue.token(key)
        time.sleep(random.uniform(0.002, 0.010))
        accepted = fence.write(key, token, holder)
        end = time.monotonic()
        ledger.rpush("holds", json.dumps([key, token, holder, start, end, accepted]))

    def watch() -> None:
        while not stopping.is_set():
            try:
                if ledger.get("stop"):
                    stopping.set()
            except redis.exceptions.ConnectionError:
                stopping.set()
            time.sleep(0.2)

    threading.Thread(target=watch, daemon=True).start()
    stats = run_workers(queue, handler, workers=spec["threads"], stop=stopping)
    ledger.rpush("stats", json.dumps(dataclasses.asdict(stats)))
    queue.close()


def _wait_ready(
    ledger: redis.Redis, workers: Sequence[subprocess.Popen[bytes]], directory: str | Path
) -> None:
    """Wait until every worker process has made its queue, so the faults find them
    all running however slowly a loaded machine starts them; ``ValkeyError``
    naming the worker's log if one exits first, or if they are not all ready within
    ``WORKERS_READY`` seconds."""
    deadline = time.monotonic() + WORKERS_READY
    ready = 0
    while ready < len(workers):
        if ledger.blpop(["ready"], timeout=1) is not None:  # a worker's, or a second on
            ready += 1
            continue
        for i, process in enumerate(workers):
            if process.poll() is not None:
                raise ValkeyError(
                    f"worker process {i} exited ({process.returncode}) before it was ready:"
                    f" see {Path(directory) / f'worker-{i}.log'}"
                )
        if time.monotonic() > deadline:
            raise ValkeyError(f"the worker processes were not ready within {WORKERS_READY} s")


def worker_main() -> None:
    """A worker process's entry point: its spec is ``sys.argv[1]``, as JSON."""
    _worker(json.loads(sys.argv[1]))


def primary_of(topology: Topology, queue: str) -> ValkeyNode | None:
    """The node that is ``queue``'s primary now, as the servers say, or None
    (a shard's, ``queue`` its name: ``name/i``)."""
    if isinstance(topology, ValkeySentinelSet):
        return topology.primary()
    return topology.primary_for("{" + queue + "}")


def _replicas_of(topology: Topology, primary: ValkeyNode) -> list[ValkeyNode]:
    """The nodes that replicate ``primary`` now (its ``INFO replication``)."""
    ports = {
        int(value.split("port=")[1].split(",")[0])
        for name, value in primary.info().items()
        if name.startswith("slave") and "port=" in value
    }
    return [node for node in topology.nodes if node.port in ports]


def settle(
    topology: Topology, queue: str, timeout: float = 20.0, *, demote_after: float | None = None
) -> ValkeyNode:
    """Wait until the topology is whole: ``queue`` has a primary and every running
    data node but the primaries replicates it with its link up; return the primary.
    ``demote_after`` (a Sentinel set): a node that has said it is a primary for that
    many seconds while the sentinels name another (one a cascaded failover left
    behind) is demoted (``ValkeySentinelSet.demote``), as the sentinels do up to
    10 s later. ``ValkeyError`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    stale_since: dict[str, float] = {}  # node name -> when first seen a stale primary
    while True:
        with contextlib.suppress(Exception):
            if isinstance(topology, ValkeyCluster):
                topology.wait_until_ok(max(0.1, deadline - time.monotonic()))
            primary = primary_of(topology, queue)
            if primary is not None and _whole(topology, primary):
                return primary
            if primary is not None and demote_after is not None:
                _demote_stale(topology, primary, stale_since, demote_after)
        if time.monotonic() > deadline:
            raise ValkeyError(f"the topology was not whole within {timeout} s: {topology.roles()}")
        time.sleep(0.1)


def _demote_stale(
    topology: Topology, primary: ValkeyNode, since: dict[str, float], after: float
) -> None:
    """Demote each node of a Sentinel set that has said it is a primary for ``after``
    seconds while the sentinels name ``primary``."""
    if not isinstance(topology, ValkeySentinelSet):
        return
    now = time.monotonic()
    for node in topology.nodes:
        if node is primary or not node.running or node.role(timeout=0.5) != "master":
            since.pop(node.name, None)
            continue
        if now - since.setdefault(node.name, now) >= after:
            topology.demote(node)
            since.pop(node.name)


def _whole(topology: Topology, primary: ValkeyNode) -> bool:
    if isinstance(topology, ValkeyCluster):
        return True  # wait_until_ok: every replica's link up, every slot served
    for node in topology.nodes:
        if node is primary or not node.running:
            continue
        info = node.info()
        if info.get("role") != "slave" or info.get("master_link_status") != "up":
            return False
        if info.get("master_port") != str(primary.port):
            return False
    return True


class _Faults:
    """The fault injector: one fault at a time on the queue's primary."""

    def __init__(
        self,
        topology: Topology,
        queue: str,
        *,
        hold: float,
        restart_after: float,
        restart: str,
        split: float | None,
    ) -> None:
        self.topology = topology
        self.queue = queue
        self.hold = hold
        self.restart_after = restart_after
        self.restart = restart
        self.split = split

    def _failover(self, old: ValkeyNode) -> ValkeyNode:
        if isinstance(self.topology, ValkeySentinelSet):
            return self.topology.wait_for_failover(old, timeout=20)
        return self.topology.wait_for_failover("{" + self.queue + "}", old, timeout=20)

    def inject(self, fault: str, settled: bool) -> FaultRecord:
        """One fault on the queue's primary; waits for its failover and restores the node."""
        topology = self.topology
        old = None
        deadline = time.monotonic() + 10
        while old is None and time.monotonic() < deadline:
            old = primary_of(topology, self.queue)
            if old is None:
                time.sleep(0.1)
        if old is None:
            return FaultRecord(fault, "?", time.monotonic(), error="no primary to fault")
        began = time.monotonic()
        lagging: list[ValkeyNode] = []
        if fault == "kill":
            old.kill()
        elif fault == "lag-kill":
            lagging = _replicas_of(topology, old)
            if isinstance(topology, ValkeySentinelSet):
                topology.cut_replication(old)
                time.sleep(LAG)
            else:  # no users on a Cluster: drop the links as often as they come back
                cut_until = time.monotonic() + LAG
                while time.monotonic() < cut_until:
                    old.drop_replicas()
                    time.sleep(0.05)
            old.kill()
        elif fault == "stop":
            old.freeze()
        elif fault == "pause":
            old.pause_clients(max(self.hold, 1.0))
        elif fault == "isolate":
            if isinstance(topology, ValkeySentinelSet):
                topology.isolate_from_sentinels(old)
            else:
                topology.isolate(old)
        else:
            raise ValueError(f"no fault {fault!r}: one of {', '.join(FAULTS)}")
        new: ValkeyNode | None = None
        error = None
        try:
            new = self._failover(old)
        except Exception as exc:  # recorded; the run goes on
            error = str(exc).splitlines()[0]
        failover_s = round(time.monotonic() - began, 2) if new is not None else None
        if fault in ("kill", "lag-kill"):
            time.sleep(self.restart_after)
            if isinstance(topology, ValkeySentinelSet) and self.restart == "replica":
                topology.restart_as_replica(old)
            else:
                old.start()
        elif fault in ("stop", "isolate"):
            time.sleep(max(0.0, began + self.hold - time.monotonic()))
            if fault == "stop":
                old.thaw()
            elif isinstance(topology, ValkeySentinelSet):
                topology.rejoin_sentinels(old)
            else:
                topology.rejoin(old)
            if self.split is not None and isinstance(topology, ValkeySentinelSet) and new:
                time.sleep(self.split)
                with contextlib.suppress(Exception):  # the sentinels may have done it
                    topology.demote(old)
        over = time.monotonic()
        whole_at = None
        if settled:
            with contextlib.suppress(ValkeyError):  # judged by the caller: roles after
                settle(topology, self.queue, demote_after=self.split)
                whole_at = time.monotonic()
        return FaultRecord(
            fault,
            old.name,
            began,
            new=None if new is None else new.name,
            failover_s=failover_s,
            old_role_after=old.role(timeout=1.0),
            lagging=tuple(r.name for r in lagging),
            error=error,
            over=over,
            whole_at=whole_at,
        )


def _watch_primaries(
    topology: Topology,
    queue: str,
    stopping: threading.Event,
    seen: list[str],
    seen_at: list[float],
) -> None:
    """Record each change of the queue's primary (every failover, caused or not)."""
    while not stopping.is_set():
        try:
            node = primary_of(topology, queue)
        except Exception:  # a node frozen or gone: look again
            node = None
        if node is not None and (not seen or seen[-1] != node.name):
            seen.append(node.name)
            seen_at.append(time.monotonic())
        stopping.wait(0.2)


class _Producer:
    """Adds ``keys`` hot keys at random until stopped, recording what returned."""

    def __init__(
        self, queue: RedisWorkQueue, keys: int, seed: int, stopping: threading.Event
    ) -> None:
        self.queue = queue
        self.keys = keys
        self.random = random.Random(seed)
        self.stopping = stopping
        self.adds: list[AddRecord] = []
        self.errors: collections.Counter[str] = collections.Counter()
        self.latencies: list[float] = []

    def run(self) -> None:
        while not self.stopping.is_set():
            key = f"k{self.random.randrange(self.keys)}"
            sent = time.monotonic()
            try:
                self.queue.add(key)
            except Exception as exc:  # counted: what a producer sees
                self.errors[type(exc).__name__] += 1
                time.sleep(0.05)
                continue
            self.latencies.append(time.monotonic() - sent)
            self.adds.append(AddRecord(key, sent))
            self.stopping.wait(0.004)


def _drain(
    spec: Mapping[str, Any], client: redis.Redis | redis.RedisCluster, timeout: float
) -> tuple[dict[str, int], list[str], dict[str, int]]:
    """Wait until nothing waits or is held (or ``timeout``): the last counts read, the
    keys still held then, and the queue's counters."""
    deadline = time.monotonic() + timeout
    last: dict[str, int] = {}
    held: list[str] = []
    counters: dict[str, int] = {}
    while time.monotonic() < deadline:
        try:
            with _queue(spec, client) as q:
                snap = q.snapshot(1000)
            stats = snap.stats
            last = {
                "depth": stats.depth,
                "processing": stats.processing,
                "delayed": stats.delayed,
            }
            held = [h.key for h in snap.processing]
            counters = {
                k: v
                for k, v in dataclasses.asdict(stats).items()
                if isinstance(v, int) and not isinstance(v, bool)
            }
            if not stats.depth and not stats.processing and not stats.delayed:
                return last, held, counters
        except Exception:  # the topology may still settle
            last = {"error": 1, "depth": -1, "processing": -1, "delayed": -1}
        time.sleep(0.3)
    return last, held, counters


def chaos_run(
    topology: Topology,
    faults: Sequence[str],
    *,
    queue: str = "chaos",
    durability: str | None = None,
    shards: int = 1,
    processes: int = 2,
    threads: int = 4,
    keys: int = 40,
    lease: float = 3.0,
    warmup: float = 3.0,
    every: float = 10.0,
    hold: float = 6.0,
    restart_after: float = 2.0,
    restart: str = "replica",
    split: float | None = None,
    settled: bool = False,
    cooldown: float = 1.0,
    drain_timeout: float = 30.0,
    seed: int = 1,
) -> ChaosRun:
    """Run ``queue`` on the started ``topology`` through ``faults``, in order; see the
    module's docstring. Returns what was recorded and judged.

    ``durability``: passed to every queue of the run as ``durability=`` (None: the
    argument is not passed). ``shards``: passed to every queue of the run; with
    more than one, the faults are on shard 0's primary. ``processes`` worker
    processes of ``threads`` threads each, leases of ``lease`` seconds; the
    producer adds ``keys`` hot keys, from when every worker process has made its
    queue (``WORKERS_READY``). The first fault comes ``warmup`` seconds
    after the producer starts; the next ones ``every`` seconds after the one
    before began (with
    ``settled``: once the topology is whole again, and at least ``every``
    seconds apart). ``hold``, ``restart_after``, ``restart`` and ``split``
    shape the faults (module docstring). ``cooldown`` seconds after the last
    fault the producer stops; the drain then waits up to ``drain_timeout``
    seconds for the queue to empty. Worker processes write their output to
    ``worker-N.log`` in the topology's directory; every one is killed on the
    way out, however the run ends.
    """
    for fault in faults:
        if fault not in FAULTS:
            raise ValueError(f"no fault {fault!r}: one of {', '.join(FAULTS)}")
    rng = random.Random(seed)
    faulted = queue if shards == 1 else shard_name(queue, 0)  # whose primary the faults hit
    workers: list[Any] = []
    logs: list[Any] = []
    stopping = threading.Event()  # the producer's and the watcher's
    threads_started: list[threading.Thread] = []
    with local_valkey() as ledger_url:
        spec: dict[str, Any] = {
            **topology_spec(topology),
            "queue": queue,
            "durability": durability,
            "shards": shards,
            "ledger": ledger_url,
            "threads": threads,
            "lease": lease,
        }
        ledger = redis.Redis.from_url(ledger_url)
        client = client_for(spec)
        producing = None
        try:
            for i in range(processes):
                log = open(Path(topology.directory) / f"worker-{i}.log", "ab")  # noqa: SIM115
                logs.append(log)
                command = [
                    sys.executable,
                    "-c",
                    "from keyqueue.testing._chaos import worker_main; worker_main()",
                    json.dumps(spec),
                ]
                workers.append(spawn(command, output=log))
            _wait_ready(ledger, workers, topology.directory)
            producing = _queue(spec, client)
            producer = _Producer(producing, keys, rng.randrange(2**32), stopping)
            primaries: list[str] = []
            primaries_at: list[float] = []
            roles_before = topology.roles()
            began = time.monotonic()
            for target, args in (
                (producer.run, ()),
                (_watch_primaries, (topology, faulted, stopping, primaries, primaries_at)),
            ):
                thread = threading.Thread(target=target, args=args, daemon=True)
                thread.start()
                threads_started.append(thread)
            injector = _Faults(
                topology,
                faulted,
                hold=hold,
                restart_after=restart_after,
                restart=restart,
                split=split,
            )
            done: list[FaultRecord] = []
            time.sleep(warmup)
            for i, fault in enumerate(faults):
                round_began = time.monotonic()
                done.append(injector.inject(fault, settled))
                if i < len(faults) - 1:
                    time.sleep(max(0.0, round_began + every - time.monotonic()))
            time.sleep(cooldown)
            stopping.set()
            for thread in threads_started:
                thread.join(timeout=30)
            if settled:
                with contextlib.suppress(ValkeyError):
                    settle(topology, faulted, demote_after=split)
            left, held, counters = _drain(spec, client, drain_timeout)
            ledger.set("stop", "1")
            for process in workers:  # each stops once its workers have finished
                try:
                    process.wait(20.0)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
            holds = tuple(
                HoldRecord(k, t, h, s, e, accepted=bool(a))
                for k, t, h, s, e, a in (json.loads(x) for x in ledger.lrange("holds", 0, -1))
            )
            run_stats = tuple(json.loads(x) for x in ledger.lrange("stats", 0, -1))
            adds = tuple(producer.adds)
            return ChaosRun(
                check=check_history(holds, adds, left_held=held),
                holds=holds,
                adds=adds,
                left_held=tuple(held),
                left=left,
                faults=tuple(done),
                primaries=tuple(primaries),
                primaries_at=tuple(primaries_at),
                roles_before=roles_before,
                roles_after=topology.roles(),
                producer_errors=dict(producer.errors),
                add_latencies=tuple(producer.latencies),
                run_stats=run_stats,
                queue_stats=counters,
                began=began,
            )
        finally:
            stopping.set()
            with contextlib.suppress(redis.exceptions.RedisError):
                ledger.set("stop", "1")
            for process in workers:
                stop(process, 5.0)
            for log in logs:
                log.close()
            for thread in threads_started:
                thread.join(timeout=30)
            if producing is not None:
                producing.close()
            close_client(client)
            ledger.close()
