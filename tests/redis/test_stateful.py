"""The Lua scripts against the core they transcribe (Hypothesis stateful testing).

Two clients of one Redis queue and one in-memory ``Core`` get the same random
calls on a shared ``FakeClock``; after each, the server's state (FIFO order,
dirty keys and their times, holders, delayed keys and their ready times,
failure counts, stall records) and every counter must equal the core's. The
model adds only what the core does not know: leases (a held key whose lease
runs out is done by its holder, then added again with the priority it was
handed out with: charged nothing if its handler had not started, else a
stall, and past MAX_STALLS stalls in a row given up and forgotten), which
holds the server knows started (a get's at once; a claim's once its client
reports it, with its next claim or synchronously), the server rate
limiter's per-key counts, and which client holds what. Keys are taken and
released one at a time (``get``, ``done``) and in batches (``claim``: the
script ``run_workers`` uses, which settles several holds, some forgotten
first, some taken back, reports the starts of holds handed to a worker, and
takes up to n keys in one go). Adds carry priorities, so the ranked set (the
order get would hand keys out, each key's priority, the priorities of
pending and delayed keys) is compared too; a second machine runs with aging.
Failures shrink to a minimal call sequence.

The same machine runs on a sharded queue (``shards=3``) on the session's
3-primary Valkey Cluster: a ``Core`` per shard, each key in its shard's
(``shard_of``), each shard's server state compared with its core's. A get
takes from any shard that has a key ready, so the model asks only that the
key it got is the one its shard's core hands out next, and that a get finds
nothing only when no core has anything; a claim goes to one shard's queue,
as ``run_workers`` claims per shard. The counters are the cores' added up
(``max_depth`` too, as ``merge_stats`` adds it).
"""

from __future__ import annotations

import dataclasses
import time
import uuid
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from keyqueue import Empty, EventKind, ShutDown
from keyqueue._core import Core
from keyqueue.redis import LeaseLost, RedisRateLimiter, RedisWorkQueue, shard_of
from keyqueue.redis._schema import KEY_NAMES, key_names
from keyqueue.redis._shards import shard_name
from keyqueue.testing import FakeClock, ValkeyCluster

KEY_SET = "abt"
"""The keys: on 3 shards, one in each (``shard_of``: a 1, b 0, t 2)."""
KEYS = st.sampled_from(KEY_SET)
CLIENTS = st.sampled_from([0, 1])
DELAYS = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.5])
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0, 10.0])
LEASE = 3.0
BASE, CAP = 0.5, 4.0
MAX_RETRIES = 2
MAX_STALLS = 1
PRIORITIES = st.sampled_from([0, 0, 0, 1, 2, -1])


class RedisAgainstCore(RuleBasedStateMachine):
    url = ""  # set by the test below, from the session's server
    aging: float | None = None
    fair_by: Callable[[str], str] | None = None
    shards = 1
    cluster = False  # whether ``url`` is a Cluster's

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        name = f"stateful-{uuid.uuid4().hex}"
        kind = redis.RedisCluster if self.cluster else redis.Redis
        self.raw = kind.from_url(self.url, decode_responses=True)
        names = [name] if self.shards == 1 else [shard_name(name, i) for i in range(self.shards)]
        # Shard i's Redis keys, and the core it is compared with.
        self.shard_keys = [dict(zip(KEY_NAMES, key_names(n), strict=True)) for n in names]
        self.cores: list[Core[str]] = [Core(MAX_RETRIES, self.aging, self.fair_by) for _ in names]
        limiter = RedisRateLimiter(BASE, CAP, qps=None)
        self.clients = [
            RedisWorkQueue(
                name,
                client=self.raw,
                clock=self.clock,
                lease=LEASE,
                rate_limiter=limiter,
                max_retries=MAX_RETRIES,
                max_stalls=MAX_STALLS,
                aging=self.aging,
                fair_by=self.fair_by,
                shards=self.shards,
            )
            for _ in range(2)
        ]
        self.requeues: dict[str, int] = {}  # the server limiter's per-key counts
        self.holder: dict[str, int] = {}  # key -> client holding it
        self.held_since: dict[str, float] = {}
        self.lease_end: dict[str, float] = {}  # held key -> when its lease runs out
        # (key, client): the client's hold on the key whose lease was taken back
        # (one client may have several, of several keys), and those of them whose
        # holder learned it from a fenced outcome (counted then, once).
        self.lost: set[tuple[str, int]] = set()
        self.learned: set[tuple[str, int]] = set()
        self.shut: set[int] = set()
        self.leases_expired = self.leases_lost = self.stalls = self.given_up_stalls = 0
        self.reaped_work = 0.0  # held time of reaped leases: the core counts it as work
        self.token: dict[str, int] = {}  # held key -> the token of its hold
        self.priority: dict[str, int] = {}  # held key -> the priority it was handed out with
        self.started: set[str] = set()  # held keys whose hold the server has started
        # (client, shard) -> (key, token) of its claimed holds handed to a worker,
        # whose start goes with its next claim on that shard (Claims: _started)
        self.unreported: dict[tuple[int, int], list[tuple[str, int]]] = {
            (c, i): [] for c in (0, 1) for i in range(self.shards)
        }
        self.stall_records: dict[str, int] = {}  # the STALLS hash: key -> stalls in a row

    def teardown(self) -> None:
        for q in self.clients:
            q.close()
        self.raw.close()

    @property
    def now(self) -> float:
        return self.clock.now()

    def shard(self, key: str) -> int:
        return shard_of(key, self.shards)

    def core(self, key: str) -> Core[str]:
        """The core of ``key``'s shard."""
        return self.cores[self.shard(key)]

    def shard_queue(self, client: int, shard: int) -> Any:
        """``client``'s queue of shard ``shard`` (the client itself for one shard)."""
        q = self.clients[client]
        return q if self.shards == 1 else q._shards[shard]  # type: ignore[attr-defined]

    # -- the model's transitions the core does not have ---------------------------------

    def model_rate_limited(self, key: str, priority: int = 0) -> None:
        failures = self.requeues.get(key, 0)
        self.requeues[key] = failures + 1
        delay = min(BASE * 2.0**failures, CAP)
        self.core(key).add_after(key, delay, self.now, EventKind.RATE_LIMIT, priority)

    def model_reap(self) -> None:
        """Leases that ran out by now, in expiry order (ties by key), as reap.lua."""
        expired = sorted((end, key) for key, end in self.lease_end.items() if end <= self.now)
        for _, key in expired:
            self.leases_expired += 1
            self.reaped_work += self.now - self.held_since.pop(key)
            del self.lease_end[key]
            self.lost.add((key, self.holder.pop(key)))
            del self.token[key]
            priority = self.priority.pop(key)
            self.core(key).done(key, self.now)
            if key in self.started:  # a stall
                self.started.discard(key)
                self.stalls += 1
                self.stall_records[key] = self.stall_records.get(key, 0) + 1
                if self.stall_records[key] > MAX_STALLS:  # given up as poison
                    del self.stall_records[key]
                    self.given_up_stalls += 1
                    self.core(key).forget(key)
                    self.requeues.pop(key, None)
                    continue
            else:  # its handler never started: charged nothing, but recorded
                self.stall_records.setdefault(key, 0)
            self.core(key).add(key, self.now, priority)

    def model_taken(self, client: int, key: str, token: int, priority: int, started: bool) -> None:
        """``client`` took ``key`` (hold ``token``, handed out with ``priority``)."""
        self.holder[key] = client
        self.held_since[key] = self.now
        self.lease_end[key] = self.now + LEASE
        self.token[key] = token
        self.priority[key] = priority
        if started:
            self.started.add(key)

    def model_released(self, key: str) -> None:
        """A done of ``key``'s live hold: it ends the key's stalls in a row."""
        del self.holder[key], self.held_since[key], self.lease_end[key]
        del self.token[key], self.priority[key]
        self.started.discard(key)
        self.stall_records.pop(key, None)
        self.core(key).done(key, self.now)

    def model_priority(self) -> dict[str, int]:
        """The waiting keys' priorities now: a hold keeps the one it was handed out with."""
        return {key: entry[3] for core in self.cores for key, entry in core.ranked.items()}

    # -- rules ------------------------------------------------------------------------------

    @rule(client=CLIENTS, key=KEYS, priority=PRIORITIES)
    def add(self, client: int, key: str, priority: int) -> None:
        self.clients[client].add(key, priority)
        self.core(key).add(key, self.now, priority)

    @rule(client=CLIENTS, priority=PRIORITIES)
    def add_all(self, client: int, priority: int) -> None:
        """Every key at once (one script), so that claims find several waiting."""
        keys = list(KEY_SET)
        self.clients[client].add_many(keys, priority)
        for key in keys:
            self.core(key).add(key, self.now, priority)

    def fenced_out(self, client: int, key: str, call: Callable[[], object]) -> bool:
        """True if ``client``'s hold on ``key`` was taken back: then ``call`` (an
        outcome of the key: forget, add_after, add_rate_limited) is fenced,
        raises LeaseLost and changes nothing, and the holder has learned it (its
        done raises without asking the server; counted once)."""
        if (key, client) not in self.lost:
            return False
        with pytest.raises(LeaseLost):
            call()
        if (key, client) not in self.learned:
            self.learned.add((key, client))
            self.leases_lost += 1
        return True

    @rule(client=CLIENTS, key=KEYS, delay=DELAYS, priority=PRIORITIES)
    def add_after(self, client: int, key: str, delay: float, priority: int) -> None:
        q = self.clients[client]
        if self.fenced_out(client, key, lambda: q.add_after(key, delay, priority=priority)):
            return
        q.add_after(key, delay, priority=priority)
        self.core(key).add_after(key, delay, self.now, priority=priority)

    @rule(client=CLIENTS, key=KEYS, priority=PRIORITIES)
    def add_rate_limited(self, client: int, key: str, priority: int) -> None:
        q = self.clients[client]
        if self.fenced_out(client, key, lambda: q.add_rate_limited(key, priority=priority)):
            return
        q.add_rate_limited(key, priority=priority)
        self.model_rate_limited(key, priority)

    @rule(client=CLIENTS, key=KEYS)
    def forget(self, client: int, key: str) -> None:
        if self.fenced_out(client, key, lambda: self.clients[client].forget(key)):
            return
        self.clients[client].forget(key)
        self.core(key).forget(key)
        self.requeues.pop(key, None)
        self.stall_records.pop(key, None)

    @rule(client=CLIENTS)
    def get(self, client: int) -> None:
        q = self.clients[client]
        if client in self.shut:
            with pytest.raises(ShutDown):
                q.get_nowait()
            return
        priorities = self.model_priority()
        try:
            expected = q.get_nowait()
        except Empty:
            for core in self.cores:  # no shard had a key ready
                with pytest.raises(Empty):
                    core.get(self.now)
            return
        assert self.core(expected).get(self.now) == expected
        # A get's hold is started at once (its caller has the key).
        self.model_taken(client, expected, q.token(expected), priorities.get(expected, 0), True)
        # The same client moved on: its old hold is gone.
        self.lost.discard((expected, client))
        self.learned.discard((expected, client))

    @precondition(lambda self: self.holder)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.holder)))
        self.clients[self.holder[key]].done(key)
        self.model_released(key)

    @precondition(lambda self: self.holder)
    @rule(data=st.data())
    def retry(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.holder)))
        again = self.core(key).record_failure(key)
        if again:
            self.model_rate_limited(key)
        assert self.clients[self.holder[key]].retry(key) is again

    @precondition(lambda self: self.lost)
    @rule(data=st.data())
    def late_done(self, data: st.DataObject) -> None:
        key, client = data.draw(st.sampled_from(sorted(self.lost)))
        with pytest.raises(LeaseLost):
            self.clients[client].done(key)
        self.lost.discard((key, client))
        if (key, client) in self.learned:
            self.learned.discard((key, client))  # counted when an outcome learned it
        else:
            self.leases_lost += 1

    # -- batches: the claim script run_workers uses (redis/_claims.py) ----------------------

    @rule(data=st.data(), client=CLIENTS, n=st.integers(0, 4))
    def claim(self, data: st.DataObject, client: int, n: int) -> None:
        shard = 0 if self.shards == 1 else data.draw(st.integers(0, self.shards - 1))
        self.claim_on(data, client, n, shard)

    def claim_on(self, data: st.DataObject, client: int, n: int, shard: int) -> None:
        """What one worker of ``client`` sends when it wants a key (Claims.get):
        one claim script settling the holds it finished (a drawn subset of the
        client's live holds, some forgotten first, and every hold whose lease
        was taken back) and taking up to ``n`` keys: the next ``n`` gets. A
        taken-back hold its holder learned of (from a fenced outcome) is not
        sent: it is finished here, as ClaimBook.release does. On a sharded queue,
        one shard's claim (``shard``): its holds, its keys."""
        q = self.shard_queue(client, shard)
        core = self.cores[shard]
        mine = {key for key in KEY_SET if self.shard(key) == shard}
        live = sorted(key for key, c in self.holder.items() if c == client and key in mine)
        done = data.draw(st.lists(st.sampled_from(live), unique=True)) if live else []
        forgets = data.draw(st.lists(st.booleans(), min_size=len(done), max_size=len(done)))
        lost = sorted(key for key, c in self.lost - self.learned if c == client and key in mine)
        for key, c in sorted(self.learned):
            if c == client and key in mine:
                q._finish(key, q._holds[key])
                self.lost.discard((key, c))
                self.learned.discard((key, c))
        settles = [(key, q._holds[key], forget) for key, forget in zip(done, forgets, strict=True)]
        settles += [(key, q._holds[key], False) for key in lost]
        # The model: each done (after its forget), then the takes.
        # The starts the claim reports: holds handed to a worker since the
        # client's last claim, still its live holds, not settled by this one.
        for key, token in self.unreported[client, shard]:
            if key not in done and self.holder.get(key) == client and self.token[key] == token:
                self.started.add(key)
        self.unreported[client, shard] = []
        for key, forget in zip(done, forgets, strict=True):
            if forget:
                core.forget(key)
                self.requeues.pop(key, None)
        for key in done:
            self.model_released(key)
        for key in lost:
            self.lost.discard((key, client))
            self.leases_lost += 1
        expected: list[tuple[str, int]] = []
        while client not in self.shut and len(expected) < n:
            priorities = self.model_priority()
            try:
                key = core.get(self.now)
            except Empty:
                break
            expected.append((key, priorities.get(key, 0)))
        suspects = [key for key, _ in expected if key in self.stall_records]

        taken, statuses, _ = q._drive(q._op_claim(n, settles, time.monotonic()))

        assert statuses == ["ok"] * len(done) + ["lost"] * len(lost)
        assert [hold.lost for _, hold, _ in settles] == [s == "lost" for s in statuses]
        assert [key for key, _ in taken] == [key for key, _ in expected]
        assert [key for key, hold in taken if hold.suspect] == suspects
        # Some are handed to a worker (their start goes with the next claim):
        handed = data.draw(st.lists(st.booleans(), min_size=len(taken), max_size=len(taken)))
        for (key, hold), (_, priority), hand in zip(taken, expected, handed, strict=True):
            hold.owner = q._owner()  # handed to this thread, as Claims hands to a worker
            self.model_taken(client, key, hold.token, priority, False)
            if hand and not hold.suspect:
                q._started(key, hold)
                self.unreported[client, shard].append((key, hold.token))

    @precondition(lambda self: self.holder or self.lost)
    @rule(data=st.data())
    def start(self, data: st.DataObject) -> None:
        """A claimant reports a hold's start synchronously (as for a suspect,
        Claims.get): True if live (the server has it started), else False and
        the hold is finished (its lease was taken back: learned here)."""
        choices = sorted((key, c) for key, c in self.holder.items()) + sorted(self.lost)
        key, client = data.draw(st.sampled_from(choices))
        q = self.shard_queue(client, self.shard(key))
        hold = q._holds[key]
        live = (key, client) not in self.lost
        start = q._op_start(key, hold)  # a bool if the hold is known lost: no call
        assert (start if isinstance(start, bool) else q._drive(start)) is live
        if live:  # a renewal of that hold alone: its lease runs from now
            self.started.add(key)
            self.lease_end[key] = self.now + LEASE
            assert q._holds[key] is hold
            return
        assert key not in q._holds or q._holds[key] is not hold
        if (key, client) in self.learned:
            self.learned.discard((key, client))
        else:
            self.leases_lost += 1
        self.lost.discard((key, client))

    @rule(client=CLIENTS)
    def shutdown(self, client: int) -> None:
        assert self.clients[client].shutdown() is True
        self.shut.add(client)

    @rule(seconds=STEPS)
    def step(self, seconds: float) -> None:
        self.clock.step(seconds)  # each client's reap runs: promote, then reap
        for core in self.cores:
            core.promote(self.now)
        self.model_reap()

    @rule()
    def holders_die(self) -> None:
        """Every lease runs out (the clients' processes died): a reap of all."""
        self.step(LEASE)

    # -- the comparison ---------------------------------------------------------------------

    def model_stats(self) -> Any:
        """The cores' stats, added up as ``merge_stats`` adds the shards' (one core's
        as they are)."""
        parts = [core.stats(self.now) for core in self.cores]
        if len(parts) == 1:
            return parts[0]
        summed: dict[str, Any] = {
            f.name: sum(getattr(p, f.name) for p in parts)
            for f in dataclasses.fields(parts[0])
            if f.name not in ("waiting_by_priority", "oldest_wait_seconds", "shutting_down")
        }
        by_priority: dict[int, int] = {}
        for p in parts:
            for priority, count in p.waiting_by_priority.items():
                by_priority[priority] = by_priority.get(priority, 0) + count
        return SimpleNamespace(
            **summed,
            waiting_by_priority=by_priority,
            oldest_wait_seconds=max(p.oldest_wait_seconds for p in parts),
        )

    @invariant()
    def server_state_is_the_cores(self) -> None:
        for shard, (keys, core) in enumerate(zip(self.shard_keys, self.cores, strict=True)):
            self.shard_state_is_its_cores(shard, keys, core)

    def shard_state_is_its_cores(self, shard: int, keys: dict[str, str], core: Core[str]) -> None:
        raw = self.raw
        mine = {key for key in KEY_SET if self.shard(key) == shard}
        assert raw.lrange(keys["fifo"], 0, -1) == list(core.fifo)
        ranked = core.waiting is core.ranked
        if self.fair_by is None or raw.hget(keys["stats"], "fair") == "1":
            assert (raw.hget(keys["stats"], "ranked") == "1") is ranked
        if self.fair_by is not None:  # each waiting key in its group's keys, once
            members = raw.zrange(keys["fair_keys"], 0, -1)
            assert sorted(map(fair_member_key, members)) == sorted(core.ranked)
        # The order get hands the waiting keys out in, and their priorities.
        by_rank = sorted(core.ranked.values(), key=lambda entry: (entry[0], entry[1]))
        assert [m[16:] for m in raw.zrange(keys["ranked"], 0, -1)] == [e[2] for e in by_rank]
        rank = {k: int(v.split()[0]) for k, v in raw.hgetall(keys["rank"]).items()}
        assert rank == {key: entry[3] for key, entry in core.ranked.items()}
        pending = {k: int(v) for k, v in raw.hgetall(keys["pending_priority"]).items()}
        assert pending == core.pending_priority
        delayed_priority = {k: int(v) for k, v in raw.hgetall(keys["delayed_priority"]).items()}
        assert delayed_priority == {k: e[3] for k, e in core.delayed.items() if e[3]}
        dirty = {k: float(v) for k, v in raw.hgetall(keys["dirty"]).items()}
        assert dirty == core.dirty
        assert set(raw.zrange(keys["processing"], 0, -1)) == set(core.processing)
        assert set(raw.hkeys(keys["lease"])) == set(self.holder) & mine
        delayed = dict(raw.zrange(keys["delayed"], 0, -1, withscores=True))
        assert delayed == {key: entry[0] for key, entry in core.delayed.items()}
        failures = {k: int(v) for k, v in raw.hgetall(keys["failures"]).items()}
        assert failures == core.failures
        requeues = {k: int(v) for k, v in raw.hgetall(keys["requeues"]).items()}
        assert requeues == {k: v for k, v in self.requeues.items() if k in mine}
        stalls = {k: int(v) for k, v in raw.hgetall(keys["stalls"]).items()}
        assert stalls == {k: v for k, v in self.stall_records.items() if k in mine}
        # Their count, read with the flags (a hand-out reads STALLS only if > 0).
        assert int(raw.hget(keys["stats"], "stalled_keys") or 0) == len(stalls)

    @invariant()
    def counters_are_the_cores(self) -> None:
        s, c = self.clients[0].stats(), self.model_stats()
        assert s.waiting_by_priority == c.waiting_by_priority
        assert s.oldest_wait_seconds == pytest.approx(c.oldest_wait_seconds)
        assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (
            c.adds,
            c.enqueued,
            c.coalesced,
            c.marked_while_processing,
        )
        assert (s.redeliveries, s.gets, s.retries, s.rate_limited) == (
            c.redeliveries,
            c.gets,
            c.retries,
            c.rate_limited,
        )
        assert (s.depth, s.max_depth, s.processing, s.delayed) == (
            c.depth,
            c.max_depth,
            c.processing,
            c.delayed,
        )
        # The core has no leases: a reaped hold is a done there.
        assert s.dones + s.leases_expired == c.dones
        assert (s.leases_expired, s.leases_lost) == (self.leases_expired, self.leases_lost)
        assert (s.stalls, s.given_up_stalls) == (self.stalls, self.given_up_stalls)
        assert s.queue_wait_seconds == pytest.approx(c.queue_wait_seconds)
        assert s.work_seconds == pytest.approx(c.work_seconds - self.reaped_work)
        assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing


@pytest.fixture(autouse=True)
def _server(request: pytest.FixtureRequest, valkey_url: str) -> None:
    """The machines' clients connect to the session's server; the sharded one's
    to the session's 3-primary Cluster (started on first use)."""
    RedisAgainstCore.url = valkey_url
    if "sharded" in request.node.nodeid:
        cluster: ValkeyCluster = request.getfixturevalue("valkey_cluster")
        ShardedRedisAgainstCores.url = cluster.url


class RedisWithAgingAgainstCore(RedisAgainstCore):
    aging = 0.5


def fair_member_key(member: str) -> str:
    """The key of a fair_keys member, "<priority> <#group> <group><seq, 16 hex><key>"."""
    _, size, rest = member.split(" ", 2)
    return rest[int(size) + 16 :]


def tenant(key: str) -> str:
    """Two groups of the keys: a and b share one."""
    return "ab" if key in "ab" else key


class FairRedisAgainstCore(RedisAgainstCore):
    fair_by = staticmethod(tenant)


class FairRedisWithAgingAgainstCore(RedisAgainstCore):
    aging = 0.5
    fair_by = staticmethod(tenant)


class ShardedRedisAgainstCores(RedisAgainstCore):
    shards = 3
    cluster = True


for machine in (
    RedisAgainstCore,
    RedisWithAgingAgainstCore,
    FairRedisAgainstCore,
    FairRedisWithAgingAgainstCore,
):
    machine.TestCase.settings = settings(
        max_examples=40,
        stateful_step_count=40,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
ShardedRedisAgainstCores.TestCase.settings = settings(
    max_examples=15,
    stateful_step_count=30,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_redis_queue_matches_the_core = RedisAgainstCore.TestCase
test_redis_queue_with_aging_matches_the_core = RedisWithAgingAgainstCore.TestCase
test_fair_redis_queue_matches_the_fair_core = FairRedisAgainstCore.TestCase
test_fair_redis_queue_with_aging_matches_the_fair_core = FairRedisWithAgingAgainstCore.TestCase
test_sharded_queue_on_a_cluster_matches_a_core_per_shard = ShardedRedisAgainstCores.TestCase
