"""The Redis backend: what the conformance suite cannot show with one client.

Many clients of one queue, per-client shutdown, leases and fencing, lost
replies, the server rate limiter, stats across clients, construction errors.
Every test runs against the session's real valkey-server (tests/support/valkey_server.py)
on a queue name of its own. Time is a shared ``FakeClock`` wherever it can be
(the clients pass its readings instead of the server's TIME); the lease tests
that must watch a real renewal loop use short leases and bounded waits.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from prometheus_client import CollectorRegistry
from redis.crc import key_slot

import keyqueue
from keyqueue import (
    Empty,
    EventKind,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    Requeue,
    ShutDown,
    Stats,
)
from keyqueue._errors import LeaseLost as CoreLeaseLost
from keyqueue.prometheus import PrometheusMetrics
from keyqueue.redis import (
    AsyncRedisWorkQueue,
    LeaseLost,
    RedisRateLimiter,
    RedisStats,
    RedisWorkQueue,
)
from keyqueue.testing import FakeClock
from tests.conformance import test_backlog, test_behaviour, test_dead, test_fairness
from tests.support import valkey_server
from tests.support.redis_fronts import REDIS_SKIPS

E = EventKind
NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a local limiter that retries at once


name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make


@pytest.fixture
def client(valkey_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(valkey_url, decode_responses=True)
    yield c
    c.close()


def events_of(q: Any) -> list[tuple[EventKind, Any, float | None]]:
    seen: list[tuple[EventKind, Any, float | None]] = []
    q.subscribe(lambda event: seen.append((event.kind, event.key, event.duration)))
    return seen


# -- the public surface ------------------------------------------------------------


def test_lease_lost_is_the_one_class_from_keyqueue() -> None:
    assert LeaseLost is CoreLeaseLost
    assert issubclass(RedisStats, Stats)


def test_import_keyqueue_does_not_import_redis() -> None:
    code = "import sys, keyqueue; print('redis' in sys.modules, 'keyqueue.redis' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]


def test_conformance_skips_name_tests_that_exist() -> None:
    modules = (test_backlog, test_behaviour, test_dead, test_fairness)
    for test_name in REDIS_SKIPS:
        assert any(callable(getattr(m, test_name, None)) for m in modules), test_name


# -- construction ---------------------------------------------------------------------


def test_exactly_one_of_url_and_client(valkey_url: str, client: redis.Redis) -> None:
    with pytest.raises(TypeError, match="exactly one"):
        RedisWorkQueue("q")
    with pytest.raises(TypeError, match="exactly one"):
        RedisWorkQueue("q", url=valkey_url, client=client)
    with pytest.raises(TypeError, match=r"redis\.asyncio"):
        RedisWorkQueue("q", client=redis.asyncio.Redis())  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="exactly one"):
        AsyncRedisWorkQueue("q")


def test_bad_url_is_a_value_error_at_construction() -> None:
    with pytest.raises(ValueError, match="redis://"):
        RedisWorkQueue("q", url="http://127.0.0.1:1/")


def test_unreachable_server_is_a_clear_connection_error_at_construction() -> None:
    c = redis.Redis(host="127.0.0.1", port=1, socket_connect_timeout=1, retry=None)
    with pytest.raises(redis.exceptions.ConnectionError, match=r"queue 'q'.*127\.0\.0\.1:1"):
        RedisWorkQueue("q", client=c)


def test_server_below_6_2_is_a_clear_error_at_construction(client: redis.Redis) -> None:
    client.info = lambda *args, **kwargs: {"redis_version": "6.0.9"}  # type: ignore[method-assign]
    with pytest.raises(RuntimeError, match=r"Redis 6\.0\.9.*Redis >= 6\.2"):
        RedisWorkQueue("q", client=client)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"lease": 0}, ValueError, "lease"),
        ({"lease": float("inf")}, ValueError, "lease"),
        ({"lease": True}, TypeError, "lease"),
        ({"max_retries": 0}, ValueError, "max_retries"),
        ({"rate_limiter": "fast"}, TypeError, "rate_limiter"),
        ({"clock": keyqueue.MonotonicClock()}, TypeError, "virtual clock"),
    ],
)
def test_bad_arguments_are_rejected_naming_the_parameter(
    client: redis.Redis, kwargs: dict[str, Any], error: type[Exception], match: str
) -> None:
    with pytest.raises(error, match=match):
        RedisWorkQueue("q", client=client, **kwargs)


def test_a_name_is_needed_for_the_hash_tag(client: redis.Redis) -> None:
    with pytest.raises(ValueError, match="non-empty name"):
        RedisWorkQueue("", client=client)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"base_delay": -1}, "base_delay"),
        ({"max_delay": float("inf")}, "max_delay"),
        ({"base_delay": 2, "max_delay": 1}, "max_delay"),
        ({"qps": 0}, "qps"),
        ({"burst": 0}, "burst"),
    ],
)
def test_redis_rate_limiter_rejects_bad_parameters(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        RedisRateLimiter(**kwargs)


def test_non_str_keys_are_a_type_error_naming_the_key(make: Callable[..., RedisWorkQueue]) -> None:
    q = make()
    for call in (q.add, q.forget, q.done, q.add_rate_limited, q.retry, q.num_requeues):
        with pytest.raises(TypeError, match=r"\(1, 2\)"):
            call((1, 2))  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="b'x'"):
        q.add_after(b"x", 1)  # type: ignore[arg-type]
    assert q.stats().adds == 0


def test_every_redis_key_of_a_queue_maps_to_one_hash_slot(valkey_url: str, name: str) -> None:
    """In a database no other test uses (db 9), so that every key in it is one
    this queue wrote, whatever ran before (the cluster test checks the slots
    with CLUSTER KEYSLOT)."""
    url = valkey_url.rsplit("/", 1)[0] + "/9"
    client = redis.Redis.from_url(url, decode_responses=True)
    client.flushdb()
    q = RedisWorkQueue(
        name, url=url, clock=FakeClock(), rate_limiter=RedisRateLimiter(1.0, 10.0, qps=5, burst=1)
    )
    try:
        q.add("a")
        q.add("b")
        q.add_after("c", 5)
        assert q.get_nowait() == "a"
        q.retry("a")
        q.done("a")
        keys = client.keys("*")
    finally:
        q.close()
        client.flushdb()
        client.close()
    assert len(keys) >= 8
    assert all(key.startswith(f"keyqueue:{{{name}}}:") for key in keys), keys
    assert len({key_slot(key.encode()) for key in keys}) == 1


# -- many clients -----------------------------------------------------------------------


def test_a_key_added_on_one_client_is_handed_out_by_another(
    make: Callable[..., RedisWorkQueue],
) -> None:
    producer, worker = make(), make()
    producer.add("a")
    producer.add("a")
    assert worker.get(timeout=5) == "a"
    producer.add("a")  # held by the worker: marked, not handed to anyone
    with pytest.raises(keyqueue.Empty):
        producer.get_nowait()
    worker.done("a")
    assert producer.get(timeout=5) == "a"  # the one redelivery, to whoever asks
    producer.done("a")
    s = worker.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (3, 1, 1, 1)
    assert (s.gets, s.dones, s.redeliveries, s.processing, s.depth) == (2, 2, 1, 0, 0)


def test_a_blocked_get_wakes_within_milliseconds_of_an_add_on_another_client(
    make: Callable[..., RedisWorkQueue],
) -> None:
    producer, worker = make(), make()
    woke: list[float] = []
    getter = threading.Thread(target=lambda: woke.append(_timed_get(worker)))
    getter.start()
    time.sleep(0.2)  # let the getter block in BLPOP (it would find the key anyway)
    added = time.monotonic()
    producer.add("a")
    getter.join(10)
    assert not getter.is_alive()
    assert woke[0] - added < 0.1  # a doorbell, not a poll (the BLPOP slice is 2 s)


def test_a_delayed_key_wakes_a_blocked_get_on_time_not_on_the_servers_tick(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """A getter blocked in BLPOP with a key due in 10 ms gets it within tens of
    milliseconds, not a BLPOP slice (seconds) late: its client's timer releases
    the key when due (which rings the doorbell), and its BLPOP timeout ends by
    then anyway. (The bound leaves a loaded machine room: 13 ms typical, 65 ms
    with the timer off on Valkey 9, whose blocked-client timeouts no longer wait
    for the 100 ms cron tick.)"""
    producer, worker = make(), make()
    producer.add_after("a", 0.01)
    started = time.monotonic()
    assert worker.get(timeout=5) == "a"
    assert time.monotonic() - started < 0.3


def test_a_delayed_key_added_while_a_getter_waits_wakes_it_on_time(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """The getter computed its next due time before the delay existed; an
    add_after that moves the queue's next due time earlier rings the doorbell,
    so the getter reads it again and sets its timer (not up to one BLPOP slice,
    2 s, late)."""
    producer, worker = make(), make()
    got: list[float] = []
    getter = threading.Thread(target=lambda: got.append(_timed_get(worker)))
    getter.start()
    deadline = time.monotonic() + 10
    while not worker._getters:  # blocked in BLPOP
        assert time.monotonic() < deadline
        time.sleep(0.001)
    added = time.monotonic()

    producer.add_after("a", 0.05)

    getter.join(10)
    assert 0.04 < got[0] - added < 0.5


def test_a_delay_too_small_to_move_the_servers_now_adds_at_once_and_rings_the_bell(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """As the core: ``now + delay <= now`` (not ``delay <= 0``) adds now, so the
    key is pushed and the doorbell rung by the add_after itself, not left in the
    delayed set for the next script to find."""
    clock = FakeClock(1e6)
    assert 1e6 + 1e-12 == 1e6
    q = make(clock=clock)
    seen = events_of(q)

    q.add_after("tiny", 1e-12)

    assert [(kind, key) for kind, key, _ in seen] == [(E.DELAY, "tiny"), (E.ENQUEUE, "tiny")]
    s = q.stats()
    assert (s.depth, s.delayed, s.enqueued) == (1, 0, 1)


def _timed_get(q: RedisWorkQueue) -> float:
    q.get(timeout=10)
    return time.monotonic()


def test_get_with_no_timeout_waits_longer_than_the_socket_timeout(
    valkey_url: str, name: str
) -> None:
    """Each BLPOP stays under the client's socket timeout, so get() never times out."""
    c = redis.Redis.from_url(valkey_url, socket_timeout=0.5)
    q = RedisWorkQueue(name, client=c)
    got: list[str] = []
    getter = threading.Thread(target=lambda: got.append(q.get()))
    getter.start()
    time.sleep(1.6)  # three socket timeouts
    assert getter.is_alive()
    assert not got
    RedisWorkQueue(name, client=c).add("late")
    getter.join(5)
    assert got == ["late"]
    q.close()
    c.close()


def test_two_clients_share_the_one_redelivery_rule_under_threads(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """Four workers on two clients, producers re-adding keys while they are held:
    never two holders of one key, and every key ends handled after its last add."""
    clients = [make(), make()]
    holding: set[str] = set()
    overlap: list[str] = []
    handled_after: dict[str, int] = {}
    version: dict[str, int] = {}
    lock = threading.Lock()

    def handler(q: RedisWorkQueue) -> Callable[[str], None]:
        def handle(key: str) -> None:
            with lock:
                if key in holding:
                    overlap.append(key)
                holding.add(key)
                seen = version[key]
            time.sleep(0.001)
            with lock:
                holding.discard(key)
                handled_after[key] = max(handled_after.get(key, 0), seen)

        return handle

    keys = [f"k{i}" for i in range(10)]
    stop = threading.Event()
    runners = [
        threading.Thread(
            target=keyqueue.run_workers,
            args=(q, handler(q)),
            kwargs={"workers": 2, "stop": stop},
        )
        for q in clients
    ]
    for runner in runners:
        runner.start()
    for round_ in range(30):
        for key in keys:
            with lock:
                version[key] = round_
            clients[round_ % 2].add(key)
    deadline = time.monotonic() + 20
    while any(handled_after.get(k, -1) < version[k] for k in keys):
        assert time.monotonic() < deadline, (handled_after, version)
        time.sleep(0.01)
    stop.set()
    for runner in runners:
        runner.join(10)
    assert overlap == []
    s = clients[0].stats()
    assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing == 300
    assert s.gets == s.dones


# -- per-client shutdown ----------------------------------------------------------------


def test_shutdown_is_per_client_other_clients_still_get_waiting_and_delayed_keys(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    leaving, staying = make(clock=clock), make(clock=clock)
    events = events_of(leaving)
    leaving.add("a")
    leaving.add_after("b", 5)

    assert leaving.shutdown() is True
    assert leaving.shutting_down
    assert not staying.shutting_down
    with pytest.raises(ShutDown):
        leaving.get_nowait()
    with pytest.raises(ShutDown):
        leaving.get(timeout=1)
    s = staying.stats()
    assert (s.depth, s.delayed, s.shutting_down) == (1, 1, False)
    assert leaving.stats().shutting_down is True
    assert staying.get_nowait() == "a"
    clock.step(5)
    staying.done("a")
    assert staying.get_nowait() == "b"  # the delay was not dropped: it is the queue's
    assert [kind for kind, *_ in events].count(E.SHUTDOWN) == 1


def test_adds_and_retries_after_a_per_client_shutdown_still_reach_the_shared_queue(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    leaving, staying = make(clock=clock, rate_limiter=NOW), make(clock=clock)
    leaving.add("held")
    assert leaving.get_nowait() == "held"
    leaving.shutdown()

    leaving.add("a")  # an informer in a pod that is going away: the change is kept
    leaving.add_after("b", 1)
    assert leaving.retry("held") is True  # the failure is retried by another client
    leaving.done("held")

    clock.step(1)
    got = [staying.get_nowait() for _ in range(3)]
    assert sorted(got) == ["a", "b", "held"]
    s = staying.stats()
    assert (s.adds, s.retries) == (4, 2)


def test_per_client_shutdown_wakes_only_this_clients_blocked_get(
    make: Callable[..., RedisWorkQueue],
) -> None:
    leaving, staying = make(), make()
    outcomes: dict[str, Any] = {}

    def wait(label: str, q: RedisWorkQueue) -> None:
        try:
            outcomes[label] = q.get(timeout=10)
        except BaseException as exc:
            outcomes[label] = type(exc)

    threads = [
        threading.Thread(target=wait, args=("leaving", leaving)),
        threading.Thread(target=wait, args=("staying", staying)),
    ]
    for thread in threads:
        thread.start()
    time.sleep(0.2)  # both blocked in BLPOP
    started = time.monotonic()
    leaving.shutdown()
    threads[0].join(5)
    assert outcomes == {"leaving": ShutDown}
    assert time.monotonic() - started < 1.0  # woken, not left to its 2 s BLPOP slice
    leaving.add("a")
    threads[1].join(5)
    assert outcomes == {"leaving": ShutDown, "staying": "a"}
    staying.done("a")


def test_drain_per_client_waits_only_for_this_clients_holds(
    make: Callable[..., RedisWorkQueue],
) -> None:
    leaving, staying = make(), make()
    for key in "abc":
        leaving.add(key)
    assert leaving.get_nowait() == "a"
    assert staying.get_nowait() == "b"  # held elsewhere: not this client's to wait for

    assert leaving.shutdown(drain=True, timeout=0.05) is False  # holds "a"
    leaving.done("a")
    assert leaving.shutdown(drain=True, timeout=5) is True  # "b" held, "c" waiting: others'
    assert staying.stats().depth == 1
    staying.done("b")


def test_stats_identity_holds_across_clients_with_adds_after_a_per_client_shutdown(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    one, two = make(clock=clock, rate_limiter=NOW), make(clock=clock, rate_limiter=NOW)
    one.add("a")
    two.add("b")
    two.add("a")  # coalesced
    assert one.get_nowait() == "a"
    two.add("a")  # marked
    one.add("a")  # coalesced (pending)
    two.add_after("c", 1)
    one.add_after("b", 1)  # comes due while b waits: coalesced
    two.add_after("d", 0)  # adds now
    one.add_rate_limited("a")  # now (local limiter): a is held and pending: coalesced
    clock.step(1)
    one.done("a")  # redelivered
    one.shutdown()
    one.add("e")  # still accepted: the queue is not shut down
    taken = []
    while (s := two.stats()).depth:
        taken.append(two.get_nowait())
        two.done(taken[-1])

    assert taken == ["b", "d", "c", "a", "e"]
    assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (10, 5, 4, 1)
    assert (s.redeliveries, s.gets, s.dones, s.retries, s.rate_limited) == (1, 6, 6, 4, 1)
    assert (s.depth, s.processing, s.delayed, s.max_depth) == (0, 0, 0, 5)
    assert (s.leases_expired, s.leases_lost) == (0, 0)


# -- leases --------------------------------------------------------------------------------


def test_expired_holders_late_done_raises_lease_lost_and_changes_nothing(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    stalled = make(clock=clock, lease=10, rate_limiter=NOW)
    other = make(clock=clock, lease=10, rate_limiter=NOW)
    stalled_events, other_events = events_of(stalled), events_of(other)
    stalled.add("a")
    assert stalled.get_nowait() == "a"
    first = stalled.token("a")
    clock.step(9.5)
    with pytest.raises(keyqueue.Empty):  # still leased
        other.get_nowait()

    clock.step(0.5)  # the lease runs out: the key goes back through the add rule

    assert other.get_nowait() == "a"
    assert other.token("a") > first
    before = other.stats()
    with pytest.raises(LeaseLost, match=rf"token {first}"):
        stalled.done("a")
    after = other.stats()
    assert after == RedisStats(**{**_fields(before), "leases_lost": 1})
    with pytest.raises(ValueError, match="not being processed"):
        stalled.done("a")  # the lost hold is gone from this client
    other.done("a")  # the new holder is untouched
    s = other.stats()
    assert (s.gets, s.dones, s.leases_expired, s.leases_lost, s.processing) == (2, 1, 1, 1, 0)
    assert s.gets == s.dones + s.processing + s.leases_expired
    assert (E.LEASE_EXPIRED, "a", 10.0) in other_events + stalled_events
    assert (E.LEASE_LOST, "a", None) in stalled_events


def _fields(s: RedisStats) -> dict[str, Any]:
    return {f: getattr(s, f) for f in RedisStats.__dataclass_fields__}


def test_reaped_key_is_handed_out_again_exactly_once(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    dead, a, b = (make(clock=clock, lease=10, rate_limiter=NOW) for _ in range(3))
    dead.add("k")
    assert dead.get_nowait() == "k"
    dead.add("k")  # changed while held: owed one redelivery
    clock.step(10)
    assert a.get_nowait() == "k"
    with pytest.raises(keyqueue.Empty):  # the redelivery and the retry coalesced
        b.get_nowait()
    a.done("k")
    with pytest.raises(keyqueue.Empty):
        b.get_nowait()


def test_a_reaped_key_stalls_and_past_max_stalls_in_a_row_is_given_up_as_poison(
    make: Callable[..., RedisWorkQueue], caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=10, max_retries=1, max_stalls=1, rate_limiter=NOW)
    seen: list[keyqueue.EventKind] = []
    q.subscribe(lambda e: seen.append(e.kind) if e.key == "poison" else None)
    q.add("poison")
    assert q.get_nowait() == "poison"
    clock.step(10)  # the first stall: not a failure (max_retries=1 would give it up)
    assert q.get_nowait() == "poison"
    clock.step(10)  # the second in a row: more than max_stalls, given up
    with pytest.raises(keyqueue.Empty):
        q.get_nowait()
    logged = [r.getMessage() for r in caplog.records]
    assert any("'poison'" in m and "poison key" in m for m in logged), logged
    s = q.stats()
    assert (s.leases_expired, s.stalls, s.given_up_stalls) == (2, 2, 1)
    assert (s.retries, s.given_up_retries, s.depth, s.delayed) == (0, 0, 0, 0)
    assert seen.count(keyqueue.EventKind.STALL) == 2
    assert seen.count(keyqueue.EventKind.POISON) == 1
    q.add("poison")  # forgotten: a fresh start
    assert q.get_nowait() == "poison"
    clock.step(10)  # one stall: the row starts again
    assert q.get_nowait() == "poison"
    q.done("poison")  # a done ends the row
    q.add("poison")
    assert q.get_nowait() == "poison"
    clock.step(10)
    assert q.get_nowait() == "poison"  # one stall in a row again: not given up
    assert q.stats().given_up_stalls == 1


def test_a_stall_waits_again_at_once_with_its_priority_and_no_backoff(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=10, rate_limiter=RedisRateLimiter(1.0, 100.0, qps=None))
    q.add("a", priority=3)
    q.add("b")
    assert q.get_nowait() == "a"
    clock.step(10)  # reaped: a stall, no backoff, no failure
    s = q.stats()
    assert (s.delayed, s.depth, s.stalls, s.retries) == (0, 2, 1, 0)
    assert q.num_requeues("a") == 0
    assert q.snapshot().failing == ()
    assert q.get_nowait() == "a"  # ahead of b: its priority kept


def test_late_done_in_the_same_client_does_not_release_the_new_hold(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """Thread 1's lease runs out; thread 2 of the same client gets the key again.
    Thread 1's late done raises LeaseLost; thread 2's hold is untouched."""
    clock = FakeClock()
    q = make(clock=clock, lease=10, rate_limiter=NOW)
    q.add("a")
    results: dict[str, Any] = {}
    go_on = threading.Event()

    def first() -> None:
        results["first-token"] = (q.get_nowait(), q.token("a"))
        go_on.wait(5)
        try:
            q.done("a")
        except LeaseLost:
            results["first-done"] = "LeaseLost"

    one = threading.Thread(target=first)
    one.start()
    while "first-token" not in results:
        time.sleep(0.001)
    clock.step(10)
    results["second-token"] = (q.get_nowait(), q.token("a"))  # this (main) thread
    go_on.set()
    one.join(5)
    assert results["first-done"] == "LeaseLost"
    assert results["second-token"][1] > results["first-token"][1]
    assert q.stats().processing == 1  # still held by the main thread
    q.done("a")
    assert q.stats().processing == 0


def test_a_renewal_that_finds_the_lease_taken_back_makes_done_raise(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    q, other = make(clock=clock, lease=10), make(clock=clock, lease=10)
    events = events_of(q)
    q.add("a")
    assert q.get_nowait() == "a"
    clock.step(10)  # reaped by the step
    q._renew_once()  # the renewal tick finds the lease taken back
    assert (E.LEASE_LOST, "a", None) in events
    assert other.stats().leases_lost == 1
    with pytest.raises(LeaseLost):
        q.done("a")
    assert other.stats().leases_lost == 1  # counted once per lost hold


def test_renewal_keeps_a_long_handlers_key(make: Callable[..., RedisWorkQueue]) -> None:
    holder, other = make(lease=0.3), make(lease=0.3)
    holder.add("a")
    assert holder.get_nowait() == "a"
    with pytest.raises(keyqueue.Empty):  # 1 s: more than three leases, renewed meanwhile
        other.get(timeout=1.0)
    holder.done("a")
    s = other.stats()
    assert (s.leases_expired, s.leases_lost, s.dones) == (0, 0, 1)


def test_a_holder_that_stops_renewing_loses_the_key_after_its_lease(
    make: Callable[..., RedisWorkQueue],
) -> None:
    holder, other = make(lease=0.3, rate_limiter=NOW), make(lease=0.3, rate_limiter=NOW)
    holder.add("a")
    taken = time.monotonic()  # before the get: its lease starts on the server after this
    assert holder.get_nowait() == "a"
    holder.close()  # stops renewing, as a process that died would

    assert other.get(timeout=5) == "a"  # woken by its lease running out, not by polling
    assert 0.25 < time.monotonic() - taken < 2.0  # the lease (0.3 s), not a BLPOP slice (2 s)
    with pytest.raises(LeaseLost):
        holder.done("a")
    other.done("a")
    s = other.stats()
    assert (s.leases_expired, s.leases_lost, s.dones) == (1, 1, 1)


def test_get_reply_lost_leaves_a_lease_that_expires_back_into_the_queue(
    make: Callable[..., RedisWorkQueue], client: redis.Redis, name: str
) -> None:
    other = make(lease=0.3, rate_limiter=NOW)
    other.add("a")
    lost_get = RedisWorkQueue(name, client=client, lease=0.3)
    # The reply never arrives, and this client makes no other get (which would hand it back).
    lost_get._run(*next(lost_get._op_get(time.monotonic())))
    assert other.get(timeout=5) == "a"
    other.done("a")
    assert other.stats().leases_expired == 1


def test_tokens_strictly_increase_across_clients(make: Callable[..., RedisWorkQueue]) -> None:
    clients = [make(), make()]
    tokens = []
    for i in range(6):
        q = clients[i % 2]
        q.add("k")
        assert q.get_nowait() == "k"
        tokens.append(q.token("k"))
        q.done("k")
    assert tokens == sorted(set(tokens))
    with pytest.raises(ValueError, match="not being processed"):
        clients[0].token("k")


# -- lost replies ------------------------------------------------------------------------


_lose_reply_of = valkey_server.lose_reply_of


def test_done_retried_after_a_lost_reply_releases_once(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make()
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # owed one redelivery
    _lose_reply_of(q, "done")
    with pytest.raises(redis.exceptions.ConnectionError):
        q.done("a")

    q.done("a")  # the same token again: harmless

    s = q.stats()
    assert (s.dones, s.redeliveries, s.depth, s.leases_lost) == (1, 1, 1, 0)
    with pytest.raises(ValueError, match="not being processed"):  # as on WorkQueue
        q.done("a")


def test_a_done_lost_to_the_connection_stops_renewing_so_the_key_comes_back(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """A done that never reached the server leaves the lease; the client stops
    renewing it (the outcome is unknown), so it runs out and the key is handed
    out again, instead of staying held for as long as the client lives."""
    holder, other = make(lease=0.3, rate_limiter=NOW), make(lease=0.3, rate_limiter=NOW)
    holder.add("a")
    assert holder.get_nowait() == "a"
    real = holder._run

    def unreachable(script: str, args: list[str]) -> Any:
        if script == "done":
            raise redis.exceptions.ConnectionError("connection refused")
        return real(script, args)

    holder._run = unreachable  # type: ignore[method-assign]
    with pytest.raises(redis.exceptions.ConnectionError):
        holder.done("a")
    holder._run = real  # type: ignore[method-assign]

    assert other.get(timeout=5) == "a"  # within about one lease: not renewed any more
    with pytest.raises(LeaseLost):
        holder.done("a")  # asked again: the key went to another holder meanwhile
    other.done("a")
    s = other.stats()
    assert (s.leases_expired, s.leases_lost, s.dones, s.processing) == (1, 1, 1, 0)


def test_add_retried_after_a_lost_reply_is_coalesced(make: Callable[..., RedisWorkQueue]) -> None:
    q = make(add_timeout=0)
    _lose_reply_of(q, "add")
    with pytest.raises(redis.exceptions.ConnectionError):
        q.add("a")
    q.add("a")
    s = q.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.depth) == (2, 1, 1, 1)


def test_an_add_whose_reply_was_lost_is_asked_again_by_the_client(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make()
    assert q.add_timeout == 30.0
    _lose_reply_of(q, "add")
    q.add("a")  # asked again within add_timeout: coalesced
    s = q.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.depth) == (2, 1, 1, 1)


# -- the rate limiter on the server --------------------------------------------------------


def test_server_rate_limiter_backoff_is_shared_by_every_client(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    limiter = RedisRateLimiter(base_delay=1.0, max_delay=100.0, qps=None)
    one, two = make(clock=clock, rate_limiter=limiter), make(clock=clock, rate_limiter=limiter)
    seen = events_of(one)
    two.subscribe(lambda e: seen.append((e.kind, e.key, e.duration)))
    one.add_rate_limited("a")
    two.add_rate_limited("a")  # the second failure, seen by the other client: 2 s
    one.add_rate_limited("a")
    assert [d for kind, _, d in seen if kind is E.RATE_LIMIT] == [1.0, 2.0, 4.0]
    assert two.num_requeues("a") == one.num_requeues("a") == 3
    two.forget("a")
    assert one.num_requeues("a") == 0


def test_server_token_bucket_is_shared_and_goes_into_debt(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    limiter = RedisRateLimiter(base_delay=0.0, max_delay=0.0, qps=2.0, burst=2)
    one, two = make(clock=clock, rate_limiter=limiter), make(clock=clock, rate_limiter=limiter)
    seen: list[float | None] = []
    for q in (one, two):
        q.subscribe(lambda e: seen.append(e.duration) if e.kind is E.RATE_LIMIT else None)
    for i, key in enumerate("abcd"):
        (one, two)[i % 2].add_rate_limited(key)
    assert seen == [0.0, 0.0, 0.5, 1.0]  # burst of 2, then 1/qps apart
    clock.step(1.5)  # three tokens back: the debt of two repaid, one to spend
    one.add_rate_limited("e")
    assert seen[-1] == 0.0
    assert one.num_requeues("e") == 1


def test_retry_with_the_server_limiter_counts_max_retries_for_every_client(
    make: Callable[..., RedisWorkQueue],
) -> None:
    limiter = RedisRateLimiter(0.0, 0.0, qps=None)
    one, two = make(max_retries=3, rate_limiter=limiter), make(max_retries=3, rate_limiter=limiter)
    assert one.retry("a") is True
    assert two.retry("a") is True
    assert one.retry("a") is False  # the third failure, whichever client saw it
    one.forget("a")
    assert two.retry("a") is True


def test_a_local_rate_limiter_keeps_its_state_in_this_client(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    local = ItemExponentialFailureRateLimiter(1.0, 100.0)
    q, other = make(clock=clock, rate_limiter=local), make(clock=clock)
    q.add_rate_limited("a")
    q.add_rate_limited("a")
    assert (q.num_requeues("a"), local.num_requeues("a")) == (2, 2)
    assert other.num_requeues("a") == 0  # the server limiter has seen nothing
    assert q.rate_limiter is local
    assert isinstance(other.rate_limiter, RedisRateLimiter)


# -- metrics --------------------------------------------------------------------------------


def test_prometheus_counts_this_clients_transitions_and_reads_queue_levels(
    make: Callable[..., RedisWorkQueue], name: str
) -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    q = make(clock=clock, lease=10, rate_limiter=NOW, metrics=PrometheusMetrics(registry))
    other = make(clock=clock, lease=10, rate_limiter=NOW)

    def value(metric: str) -> float | None:
        return registry.get_sample_value(metric, {"name": name})

    other.add("x")  # another client's add: not this client's event, but the level shows it
    q.add("a")
    assert value("workqueue_adds_total") == 1
    assert value("workqueue_depth") == 2
    assert q.get_nowait() == "x"
    clock.step(3)
    assert value("workqueue_unfinished_work_seconds") == 3
    clock.step(7)  # the lease runs out; q's own step reaps it (before other's)
    assert value("workqueue_leases_expired_total") == 1
    assert value("workqueue_stalls_total") == 1  # a get's hold: its handler started
    with pytest.raises(LeaseLost):
        q.done("x")
    assert value("workqueue_leases_lost_total") == 1
    assert value("workqueue_unfinished_work_seconds") == 0
    assert value("workqueue_poison_keys_total") == 0
    assert q.get_nowait() == "a"  # x waits again behind a, charged no failure
    q.done("a")
    assert q.get_nowait() == "x"
    clock.step(10)  # x stalls again: twice in a row, more than max_stalls (1)
    assert value("workqueue_stalls_total") == 2
    assert value("workqueue_poison_keys_total") == 1


# -- the async queue -----------------------------------------------------------------------


async def test_async_queue_get_wakes_on_an_add_from_another_client(
    valkey_url: str, name: str
) -> None:
    async with (
        AsyncRedisWorkQueue(name, url=valkey_url) as worker,
        AsyncRedisWorkQueue(name, url=valkey_url) as producer,
    ):
        getter = asyncio.create_task(worker.get(timeout=10))
        await asyncio.sleep(0.2)
        added = time.monotonic()
        await producer.add("a")
        assert await getter == "a"
        assert time.monotonic() - added < 0.1
        assert worker.token("a") >= 1
        await worker.done("a")
        assert (await producer.stats()).dones == 1


async def test_async_queue_unreachable_server_fails_on_the_first_call() -> None:
    aq = AsyncRedisWorkQueue(  # add_timeout=0: the add is not asked again for 30 s
        "q", client=redis.asyncio.Redis(port=1, socket_connect_timeout=1, retry=None), add_timeout=0
    )
    with pytest.raises(redis.exceptions.ConnectionError, match="queue 'q'"):
        await aq.add("a")
    await aq._client.aclose()


async def test_async_cancelled_get_leaves_the_client_working(valkey_url: str, name: str) -> None:
    async with AsyncRedisWorkQueue(name, url=valkey_url) as q:
        waiting = asyncio.create_task(q.get())
        await asyncio.sleep(0.1)  # blocked in BLPOP
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiting
        await q.add("a")
        assert await q.get(timeout=5) == "a"
        await q.done("a")
        assert (await q.stats()).gets == 1


async def test_async_aclose_waits_for_the_bell_a_cancelled_get_passes_on(
    valkey_url: str, name: str, client: redis.Redis
) -> None:
    """A cancelled get passes its doorbell on in a task of the queue's own; aclose
    waits for it, so it does not run later on a closed client (a new connection
    nobody closes) or not at all."""
    aclient = redis.asyncio.Redis.from_url(valkey_url)
    q = AsyncRedisWorkQueue(name, client=aclient)
    waiting = asyncio.create_task(q.get())
    deadline = time.monotonic() + 10
    while not q._getters:  # blocked in BLPOP
        assert time.monotonic() < deadline, waiting
        await asyncio.sleep(0.001)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting

    await q.aclose()

    assert client.llen(q._bell) == 1  # passed on before aclose returned
    assert not q._background
    await aclient.aclose()


async def test_async_get_honours_a_cancellation_redis_asyncio_swallowed(
    valkey_url: str, name: str
) -> None:
    """On Python 3.11, asyncio.wait_for (inside redis.asyncio's send) can lose a
    cancellation; the get must still end instead of waiting on forever."""
    aclient = redis.asyncio.Redis.from_url(valkey_url, socket_timeout=0.5)  # short BLPOPs
    real_blpop = aclient.blpop
    swallowed = 0

    async def blpop_losing_one_cancel(*args: Any, **kwargs: Any) -> Any:
        nonlocal swallowed
        try:
            return await real_blpop(*args, **kwargs)
        except asyncio.CancelledError:
            if swallowed:
                raise
            swallowed += 1
            return await real_blpop(*args, **kwargs)  # as if the cancel never came

    aclient.blpop = blpop_losing_one_cancel  # type: ignore[method-assign]
    q = AsyncRedisWorkQueue(name, client=aclient)
    waiting = asyncio.create_task(q.get())
    deadline = time.monotonic() + 10
    while not q._getters:  # blocked in BLPOP
        assert time.monotonic() < deadline, waiting
        await asyncio.sleep(0.001)

    waiting.cancel()

    done, _ = await asyncio.wait([waiting], timeout=5)
    assert done, "the get went on waiting after its cancellation was lost"
    assert waiting.cancelled()
    # Lost by the stand-in above, or (swallowed == 0) by the real wait_for first.
    assert swallowed <= 1
    await q.aclose()
    await aclient.aclose()


async def test_async_per_client_shutdown_releases_a_blocked_get_at_once(
    valkey_url: str, name: str
) -> None:
    async with AsyncRedisWorkQueue(name, url=valkey_url) as q:
        waiting = asyncio.create_task(q.get())
        await asyncio.sleep(0.2)  # blocked in BLPOP
        started = time.monotonic()
        assert await q.shutdown() is True
        with pytest.raises(ShutDown):
            await asyncio.wait_for(waiting, 5)
        assert time.monotonic() - started < 1.0  # woken, not left to its 2 s slice
        assert q.shutting_down


async def test_async_lease_lost_and_renewal(valkey_url: str, name: str) -> None:
    shared = redis.asyncio.Redis.from_url(valkey_url)  # outlives the holder's aclose
    holder = AsyncRedisWorkQueue(name, client=shared, lease=0.3, rate_limiter=NOW)
    other = AsyncRedisWorkQueue(name, url=valkey_url, lease=0.3, rate_limiter=NOW)
    await holder.add("a")
    assert await holder.get_nowait() == "a"
    with pytest.raises(keyqueue.Empty):  # renewed by the task meanwhile
        await other.get(timeout=1.0)
    await holder.aclose()  # stops renewing
    assert await other.get(timeout=5) == "a"
    with pytest.raises(LeaseLost):
        await holder.done("a")
    await other.done("a")
    s = await other.stats()
    assert (s.leases_expired, s.leases_lost, s.dones) == (1, 1, 1)
    await other.aclose()
    await shared.aclose()


async def test_async_aclose_stops_renewing_even_if_the_renewals_cancellation_is_lost(
    valkey_url: str, name: str
) -> None:
    shared = redis.asyncio.Redis.from_url(valkey_url)  # outlives the holder's aclose
    holder = AsyncRedisWorkQueue(name, client=shared, lease=0.3, rate_limiter=NOW)
    other = AsyncRedisWorkQueue(name, url=valkey_url, lease=0.3, rate_limiter=NOW)
    real_run = holder._run
    renewing, never = asyncio.Event(), asyncio.Event()

    async def run(script: str, args: list[str]) -> Any:
        if script == "renew" and not renewing.is_set():
            renewing.set()
            try:
                await never.wait()
            except asyncio.CancelledError:
                pass  # lost, as Python 3.11's asyncio.wait_for can
        return await real_run(script, args)

    holder._run = run  # type: ignore[method-assign]
    await holder.add("a")
    assert await holder.get_nowait() == "a"
    await asyncio.wait_for(renewing.wait(), 5)

    await holder.aclose()  # cancels the renewal task in the middle of a renewal

    assert await other.get(timeout=5) == "a"  # nobody renews: the lease ran out
    await other.done("a")
    assert (await other.stats()).leases_expired == 1
    await other.aclose()
    await shared.aclose()


async def test_arun_workers_on_the_async_queue(valkey_url: str, name: str) -> None:
    async with AsyncRedisWorkQueue(name, url=valkey_url, rate_limiter=NOW) as q:
        handled: list[str] = []

        async def handler(key: str) -> Requeue | None:
            handled.append(key)
            return Requeue(after=0) if handled.count(key) == 1 else None

        for key in "abc":
            await q.add(key)
        runner = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=2))
        deadline = time.monotonic() + 10
        while len(handled) < 6:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.01)
        assert await q.shutdown(drain=True, timeout=5)
        stats = await asyncio.wait_for(runner, 5)
        assert sorted(handled) == ["a", "a", "b", "b", "c", "c"]
        assert stats == keyqueue.RunStats(processed=6, succeeded=3, requeued=3)


def test_run_workers_counts_a_lost_lease_and_does_not_retry(
    make: Callable[..., RedisWorkQueue], caplog: pytest.LogCaptureFixture
) -> None:
    q, other = make(lease=0.3, rate_limiter=NOW), make(lease=0.3, rate_limiter=NOW)
    q.add("a")
    started, stalled = threading.Event(), threading.Event()

    def handler(key: str) -> None:
        q._stop_renewing.set()  # this process stalls: its renewals stop
        started.set()
        stalled.wait(5)

    stop = threading.Event()
    result: list[keyqueue.RunStats] = []
    runner = threading.Thread(
        target=lambda: result.append(keyqueue.run_workers(q, handler, stop=stop))
    )
    runner.start()
    assert started.wait(5)
    assert other.get(timeout=5) == "a"  # the lease ran out
    stop.set()
    stalled.set()
    runner.join(5)
    other.done("a")
    assert result == [keyqueue.RunStats(processed=1, lease_lost=1)]
    assert any("lease" in r.getMessage() and "'a'" in r.getMessage() for r in caplog.records)
    s = other.stats()
    # The worker's start was never reported (no claim, no renewal after it):
    # reaped as a hold whose handler did not start, no failure and no stall.
    assert (s.retries, s.stalls, s.leases_lost, s.leases_expired) == (0, 0, 1, 1)


# -- join -------------------------------------------------------------------------------


def count_looks(q: Any) -> list[float]:
    """Wrap ``q``'s ``idle`` script (join's one look): the list fills with the
    monotonic time of each look."""
    looks: list[float] = []
    script = q._scripts["idle"]

    def look(*args: Any, **kwargs: Any) -> Any:
        looks.append(time.monotonic())
        return script(*args, **kwargs)

    q._scripts["idle"] = look
    return looks


def test_join_sees_other_clients_work_without_busy_polling(
    make: Callable[..., RedisWorkQueue],
) -> None:
    joiner, worker = make(), make()
    joiner.add("a")  # a producer that joins: it holds nothing itself
    assert worker.get_nowait() == "a"
    looks = count_looks(joiner)
    returned: list[bool] = []
    thread = threading.Thread(target=lambda: returned.append(joiner.join(timeout=60)))
    thread.start()
    time.sleep(2.5)  # the other client holds "a" meanwhile
    busy = len(looks)
    worker.done("a")
    thread.join(10)

    assert returned == [True]
    # At once, then 50 ms doubling to 1 s: about 7 looks in 2.5 s (a busy poll
    # would make thousands); the done on the other client is seen by the next.
    assert 3 <= busy <= 9, busy
    assert len(looks) <= busy + 2
    assert max(b - a for a, b in itertools.pairwise(looks)) <= 1.5  # never slower than that


def test_join_looks_again_when_this_clients_last_hold_ends(
    make: Callable[..., RedisWorkQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    # No fallback look within the test's bounds: only the done can wake it.
    monkeypatch.setattr(keyqueue.redis._ends, "JOIN_FIRST", 60.0)
    monkeypatch.setattr(keyqueue.redis._ends, "JOIN_MAX", 60.0)
    q = make()
    q.add("a")
    assert q.get_nowait() == "a"
    looks = count_looks(q)
    returned: list[bool] = []
    thread = threading.Thread(target=lambda: returned.append(q.join(timeout=120)))
    thread.start()
    deadline = time.monotonic() + 10
    while not looks:  # its first look found "a" held
        assert time.monotonic() < deadline
        time.sleep(0.01)
    time.sleep(0.1)
    q.done("a")
    thread.join(10)  # woken by the done: not by a look a minute later

    assert not thread.is_alive()
    assert returned == [True]
    assert len(looks) == 2


def test_join_with_a_timeout_returns_false_and_changes_nothing(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    q = make(clock=clock)
    q.add_after("a", 5)
    assert q.join(timeout=0) is False
    assert q.join(timeout=0.2) is False
    s = q.stats()
    assert (s.delayed, s.shutting_down) == (1, False)
    clock.step(5)
    assert q.get_nowait() == "a"
    q.done("a")
    assert q.join(timeout=0) is True


async def test_async_join_looks_again_when_this_clients_last_hold_ends(
    valkey_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(keyqueue.redis._ends, "JOIN_FIRST", 60.0)
    monkeypatch.setattr(keyqueue.redis._ends, "JOIN_MAX", 60.0)
    async with AsyncRedisWorkQueue(name, url=valkey_url) as q:
        await q.add("a")
        assert await q.get_nowait() == "a"
        looks = count_looks(q)
        joining = asyncio.create_task(q.join(timeout=120))
        for _ in range(1000):
            if looks:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0.1)
        await q.done("a")
        assert await asyncio.wait_for(joining, 10) is True  # woken by the done
        assert len(looks) == 2  # the one look after the done found it idle


def test_a_dropped_queue_holding_keys_is_collected(valkey_url: str, name: str) -> None:
    """Its renewal thread and reap timer hold it only weakly: dropped while it
    holds a key (renewals running) and a getter armed the timer, it is
    collected, and its leases run out."""
    client = redis.Redis.from_url(valkey_url)  # closed here: it outlives the queue
    q = RedisWorkQueue(name, client=client, lease=3.0)  # no renewal in flight meanwhile
    q.add("k")
    q.get()
    with pytest.raises(Empty):
        q.get(timeout=0.05)  # the timer is armed for the lease's end
    ref = weakref.ref(q)
    del q
    gc.collect()
    assert ref() is None
    client.close()


async def test_a_dropped_async_queue_holding_keys_is_collected(valkey_url: str, name: str) -> None:
    """The same on asyncio: its renewal task holds it only weakly."""
    client = redis.asyncio.Redis.from_url(valkey_url)  # closed here: it outlives the queue
    q = AsyncRedisWorkQueue(name, client=client, lease=3.0)
    await q.add("k")
    await q.get()
    await asyncio.sleep(0.01)  # the get's shielded call and its callbacks are over
    ref = weakref.ref(q)
    del q
    gc.collect()
    assert ref() is None
    await client.aclose()
