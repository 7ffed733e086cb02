"""The replicated controller, end to end: what docs/controller.md's "Many processes" runs.

Real etcd, the lab's API server in a process of its own, three controller
replicas (real processes, ``keyqueue.lab.pipeline.replica``), each an
``Informer`` feeding one Redis queue on a real Valkey, reconciling every
ConfigMap by writing the spec it observed (``data.counter``) into its status
(``data.observed``, ``data.token``) with a resourceVersion precondition. A
load writes specs through the official client (kubernetes_asyncio). During the
load one replica is SIGKILLed and, once its keys are back, restarted; then
another is SIGSTOPped past its lease and resumed. Then: every object's status
says its final spec; no two reconciles of one key overlapped (the paused
replica's, whose lease ran out, excused, their writes fenced); the keys each
fault held were reconciled again within the lease plus ``RECOVERY_BOUND``, and
the writes to other keys meanwhile never paused (their longest write →
reconcile gap is under ``OTHERS_BOUND``). The test
counts what it meant to cause: the killed and the paused replica held keys,
the pause outlasted the lease, the paused replica learned its leases were lost.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
import random
import time
import uuid
from typing import Any

import pytest
from kubernetes_asyncio import client as k8s

from keyqueue.lab.pipeline.fleet import (
    Fault,
    Fleet,
    Write,
    failover,
    fencing,
    overlaps,
    serve_api,
)
from keyqueue.lab.pipeline.replica import ReplicaConfig
from tests.support.etcd_server import api, etcd_url

__all__ = ["etcd_url"]  # the fixture, imported for pytest

LEASE = 2.0
OBJECTS = 200
WRITERS = 4
RATE = 50.0  # writes a second, all writers together
WORK = 0.02  # seconds of simulated work per reconcile: replicas hold keys most of the time
LOAD = 11.5  # seconds the load writes for
KILL_AT, RESTART_AT, PAUSE_AT = 1.5, 4.5, 6.5  # seconds into the load
PAUSE = 1.6 * LEASE  # past the lease: its keys are taken back
RECOVERY_BOUND = LEASE + 1.5
"""A held key is reconciled again within LEASE + this: its lease runs out at most
LEASE after the fault (renewed every third of it); another client's claim or
get reaps it, an idle one within one more lease (its BLPOP slice); then a
backoff of milliseconds and one reconcile; the rest is margin for a shared
2-core machine."""
OTHERS_BOUND = 0.6 * LEASE
"""The longest write → reconcile gap of a write to a key no fault held, sent
while a fault's keys were out: a key the lease paused waits at least 2/3 of it
(renewed every third), so a gap under 0.6 of it is no pause (client-go's
leader election pauses every key for its lease). Typical here: under 0.5 s."""
SETTLE_TIMEOUT = 30.0


def _status_lags(items: list[Any]) -> list[str]:
    return [
        cm.metadata.name
        for cm in items
        if (cm.data or {}).get("observed") != (cm.data or {}).get("counter")
    ]


async def _settled(v1: k8s.CoreV1Api, namespace: str) -> list[str]:
    """Wait (bounded) until every object's status says its spec; those that do not."""
    deadline = time.monotonic() + SETTLE_TIMEOUT
    while True:
        lagging = _status_lags((await v1.list_namespaced_config_map(namespace)).items)
        if not lagging or time.monotonic() > deadline:
            return lagging
        await asyncio.sleep(0.1)


class Load:
    """Writes of specs through the official client, each recorded as a ``Write``."""

    def __init__(self, v1: k8s.CoreV1Api, namespace: str) -> None:
        self.v1 = v1
        self.namespace = namespace
        self.writes: list[Write] = []
        self.counter = itertools.count(1)

    async def write(self, name: str) -> None:
        sent = time.monotonic()
        cm = await self.v1.patch_namespaced_config_map(
            name, self.namespace, {"data": {"counter": str(next(self.counter))}}
        )
        rv = int(cm.metadata.resource_version)
        self.writes.append(Write(f"{self.namespace}/{name}", rv, sent, time.monotonic()))

    async def run(self, names: list[str], until: float) -> None:
        """WRITERS clients writing random objects' specs until ``until``, RATE
        writes a second in all (paced: a gap measures a pause, not a backlog
        of a load the shared machine cannot carry)."""
        rng = random.Random(7)
        every = WRITERS / RATE

        async def writer() -> None:
            due = time.monotonic()
            while due < until:
                await self.write(rng.choice(names))
                due += every
                await asyncio.sleep(max(0.0, due - time.monotonic()))

        await asyncio.gather(*(writer() for _ in range(WRITERS)))


async def _write_held(load: Load, fault: Fault) -> None:
    await asyncio.gather(*(load.write(key.rpartition("/")[2]) for key in fault.held))


async def _faults(fleet: Fleet, load: Load, start: float) -> list[Fault]:
    """Kill replica 0 and (its keys back) restart it, then pause replica 1 past
    its lease and resume it; right after each fault, write the spec of every
    key the replica held (a change that must wait for the lease)."""
    await asyncio.sleep(max(0.0, start + KILL_AT - time.monotonic()))
    killed = await fleet.kill(0)
    await _write_held(load, killed)
    await asyncio.sleep(max(0.0, start + RESTART_AT - time.monotonic()))
    await fleet.restart(0)
    await asyncio.sleep(max(0.0, start + PAUSE_AT - time.monotonic()))
    frozen = await fleet.freeze(1)
    await _write_held(load, frozen)
    await asyncio.sleep(max(0.0, frozen.at + PAUSE - time.monotonic()))
    return [killed, fleet.thaw(frozen)]


@pytest.mark.parametrize("mode", ["async", "threads"])
async def test_replicated_controller_reconciles_every_spec_through_a_kill_and_a_stop(
    mode: str, etcd_url: str, valkey_url: str
) -> None:
    namespace = f"e2e-{uuid.uuid4().hex[:8]}"
    names = [f"obj-{i}" for i in range(OBJECTS)]
    async with serve_api(etcd_url) as url, api(url) as client:
        v1 = k8s.CoreV1Api(client)
        for name in names:
            body = k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name), data={"counter": "0"})
            await v1.create_namespaced_config_map(namespace, body)
        config = ReplicaConfig(
            api=url,
            redis=valkey_url,
            queue=f"e2e-{uuid.uuid4().hex[:8]}",
            lease=LEASE,
            workers=8,
            mode=mode,
            namespace=namespace,
            work=WORK,
        )
        async with Fleet(config, replicas=3) as fleet:
            assert await _settled(v1, namespace) == [], "the first sync was never reconciled"
            start = time.monotonic()
            load = Load(v1, namespace)
            _, faults = await asyncio.gather(
                load.run(names, start + LOAD), _faults(fleet, load, start)
            )
            writes = load.writes
            lagging = await _settled(v1, namespace)
            server = await fleet.stats()
        log = fleet.log
        with contextlib.suppress(Exception):
            await k8s.CoreV1Api(client).delete_collection_namespaced_config_map(namespace)

    killed, paused = faults
    reconciles = log.reconciles()
    result = failover(reconciles, writes, faults)
    excused, violations = overlaps(reconciles, faults)
    cut_short = [r for r in reconciles if r.replica == killed.replica and r.end == math.inf]
    # A claimed key's start reaches the server with the claimant's next claim or
    # renewal (every third of the lease): one cut short before that is, on the
    # server, a lease that ran out unstarted (no stall, no charge).
    reported = sum(1 for r in cut_short if r.start <= killed.until - LEASE / 3 - 0.2)
    print(
        f"\n[{mode}] {len(writes)} writes, {len(log.ended)} reconciles; kill held "
        f"{len(killed.held)} keys, pause held {len(paused.held)} for "
        f"{paused.until - paused.at:.2f}s; held writes {result.held_writes} longest gap "
        f"{result.held_gap:.3f}s, others meanwhile {result.during_writes} longest gap "
        f"{result.during_gap:.3f}s (all run {result.other_writes}: {result.other_gap:.3f}s), "
        f"recovery {result.recovery:.3f}s; leases expired {server.leases_expired}, stalls "
        f"{server.stalls} ({len(cut_short)} cut short by the kill, {reported} of them reported); "
        f"excused overlaps {len(excused)}; logs {log.logs[:5]}"
    )
    # Every spec reached its status, and every write was reconciled.
    assert lagging == [], f"status != spec after {SETTLE_TIMEOUT:g} s: {lagging[:10]}"
    assert result.unreconciled == ()
    # What the test meant to cause happened.
    assert killed.held, "the killed replica held no key when it died"
    assert paused.held, "the paused replica held no key when it stopped"
    assert paused.until - paused.at > LEASE
    assert any(replica == paused.replica for replica, _, _ in log.lost), (
        "the paused replica never learned its leases were taken back"
    )
    assert result.held_writes > 0
    assert sum(s["processed"] for s in log.stats.values()) > 0
    # The server saw the faults: every held lease ran out and was taken back, each
    # handler the kill cut short and the server had heard of counted as a stall
    # (not a failure), nothing given up.
    assert server.leases_expired >= len(killed.held) + len(paused.held), server
    assert reported <= server.stalls <= server.leases_expired, server
    assert (server.given_up_retries, server.given_up_stalls) == (0, 0), server
    # Nothing given up, no outcome that failed to apply, nothing logged as an error.
    assert sum(s["gave_up"] + s["errors"] for s in log.stats.values()) == 0, log.stats
    assert [entry for entry in log.logs if entry[1] not in ("WARNING",)] == []
    # The queue's promise across processes, and the status's fencing.
    assert violations == [], f"reconciles of one key overlapped: {violations[:3]}"
    assert fencing(reconciles) == []
    # The faulted keys came back within the lease plus the bound; no other key paused.
    assert result.unrecovered == ()
    assert result.recovery <= LEASE + RECOVERY_BOUND
    assert result.during_writes > 0
    assert result.during_gap < OTHERS_BOUND
