"""Priorities and per-endpoint buckets on the Redis backend: what the shared
conformance suite (conformance/test_fairness.py) cannot show with one client.

The queue stays a LIST until the first priority, then is ranked for good with
the aging of the client that ranked it; the server limiter's endpoint buckets
give the same delays as ``EndpointRateLimiter``, shared by every client, and
keep at most ``max_endpoints`` buckets. A shared ``FakeClock`` stands in for
the server's TIME.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis

from keyqueue import EndpointRateLimiter, EventKind
from keyqueue.redis import RedisRateLimiter, RedisWorkQueue, shard_of
from keyqueue.redis._schema import key_names
from keyqueue.testing import FakeClock
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make


@pytest.fixture
def raw(valkey_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(valkey_url, decode_responses=True)
    yield c
    c.close()


def keys_of(name: str) -> dict[str, str]:
    return {key.rsplit(":", 1)[1]: key for key in key_names(name)}


def delays(q: RedisWorkQueue) -> list[float]:
    """The backoff of every add_rate_limited / retry this client makes, in order."""
    seen: list[float] = []

    def on_event(event: Any) -> None:
        if event.kind is EventKind.RATE_LIMIT:
            seen.append(event.duration)

    q.subscribe(on_event)
    return seen


def host(key: str) -> str:
    return key.split("/", maxsplit=1)[0]


# -- the LIST until the first priority ---------------------------------------------------


def test_the_queue_is_a_list_until_the_first_priority_then_ranked_with_its_aging(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    first = make(clock=clock, aging=2.0)
    other = make(clock=clock, aging=100.0)  # not the one that ranks the queue
    keys = keys_of(name)
    first.add("a")
    other.add("b")
    assert raw.type(keys["fifo"]) == "list"
    assert raw.exists(keys["ranked"]) == 0
    assert raw.hget(keys["stats"], "ranked") is None

    clock.step(2)
    first.add("c", 1)  # t=2: score 2 - 1 * 2 = 0, as a and b (t=0), which came first

    assert raw.exists(keys["fifo"]) == 0
    assert (raw.hget(keys["stats"], "ranked"), raw.hget(keys["stats"], "aging")) == ("1", "2.0")
    assert raw.zcard(keys["ranked"]) == 3
    clock.step(1)
    other.add("d", 1)  # t=3 with the queue's aging (2, not 100): score 1, last
    assert [other.get_nowait() for _ in range(4)] == ["a", "b", "c", "d"]


def test_add_many_adds_every_key_with_its_priority(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock())
    q.add("edit", 1)
    q.add_many([f"relist-{i}" for i in range(3)], priority=-1)
    q.add("other")

    assert [q.get_nowait() for _ in range(5)] == [
        "edit",
        "other",
        "relist-0",
        "relist-1",
        "relist-2",
    ]
    with pytest.raises(TypeError, match="priority"):
        q.add_many(["x"], priority=0.5)  # type: ignore[arg-type]
    assert q.stats().depth == 0


def test_a_ranked_queue_leaves_no_priority_state_behind(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock, aging=1.0)
    q.add("a", 2)
    assert q.get_nowait() == "a"
    q.add("a", 3)  # pending, priority 3
    q.add_after("b", 1, priority=4)
    q.done("a")
    clock.step(1)
    while q.stats().depth:
        q.done(q.get_nowait())

    keys = keys_of(name)
    for part in ("ranked", "rank", "arrivals", "by_priority", "pending_priority"):
        assert raw.exists(keys[part]) == 0, part
    assert raw.exists(keys["delayed_priority"]) == 0


# -- fair_by: groups kept with the keys -----------------------------------------------------


FAIR_PARTS = ("groups", "fair_keys", "fair_turns", "fair_turn_of")


def test_a_fair_queue_keeps_each_keys_group_until_the_key_is_gone(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock, fair_by=host)
    keys = keys_of(name)
    q.add_many(["a/0", "a/1", "b/0"])
    q.add_after("c/0", 1)
    assert raw.hget(keys["stats"], "fair") == "1"
    assert raw.hgetall(keys["groups"]) == {"a/0": "a", "a/1": "a", "b/0": "b", "c/0": "c"}
    assert q.get_nowait() == "a/0"
    q.add("a/0")  # held: its done pushes it back into its group
    q.done("a/0")
    assert raw.hget(keys["groups"], "a/0") == "a"
    assert q.get_nowait() == "b/0"
    assert q.retry("b/0")  # delayed: it keeps its group
    q.done("b/0")
    assert raw.hget(keys["groups"], "b/0") == "b"
    clock.step(10)
    handed = []
    while q.stats().depth:
        key = q.get_nowait()
        handed.append(key)
        q.done(key)
        q.forget(key)

    assert handed == ["a/1", "b/0", "c/0", "a/0"]  # b/0 came due first: it joined first
    for part in FAIR_PARTS:
        assert raw.exists(keys[part]) == 0, part


def test_a_queue_without_fair_by_writes_no_fair_state(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock)
    q.add_many(["a/0", "b/0"], priority=1)
    q.add_after("c/0", 1)
    q.add_rate_limited("d/0")
    clock.step(10)
    q.done(q.get_nowait())

    keys = keys_of(name)
    assert raw.hget(keys["stats"], "fair") is None
    for part in FAIR_PARTS:
        assert raw.exists(keys[part]) == 0, part


def test_a_dead_key_keeps_its_group_and_a_replay_puts_it_back_in_its_turn(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    q = make(clock=FakeClock(), fair_by=host)
    keys = keys_of(name)
    q.add_many(["a/0", "a/1", "b/0", "b/1"])
    assert q.get_nowait() == "a/0"
    q.give_up("a/0", "retries", RuntimeError("boom"))
    q.done("a/0")
    assert raw.hget(keys["groups"], "a/0") == "a"
    assert q.replay_all() == 1  # a/0 joins a's keys: behind a/1
    assert [q.get_nowait() for _ in range(4)] == ["b/0", "a/1", "b/1", "a/0"]

    q.give_up("gone/0", "retries", None)
    assert raw.hget(keys["groups"], "gone/0") == "gone"  # never added: give_up sent it
    assert q.forget_dead("gone/0") is True
    assert raw.hget(keys["groups"], "gone/0") is None  # it goes with the dead entry
    q.add("x/0")
    q.give_up("x/0", "retries", None)  # waiting and dead: its group stays for both
    assert q.forget_dead("x/0") is True
    assert raw.hget(keys["groups"], "x/0") == "x"


def test_a_fair_key_moves_with_its_group_and_each_shard_takes_turns(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    plain = make(fair_by=host)
    added = [f"{group}/{i}" for i in range(20) for group in "abc"]
    plain.add_many(added)
    q = make(shards=3, fair_by=host)
    assert q.fair_by is host
    q.reshard(3)

    for index, shard in enumerate(q._shards):  # type: ignore[attr-defined]
        mine = [key for key in added if shard_of(key, 3) == index]
        groups = raw.hgetall(keys_of(shard.name)["groups"])
        assert groups == {key: host(key) for key in mine}, index
        taken = []
        while shard.stats().depth:
            key = shard.get_nowait()
            taken.append(key)
            shard.done(key)
        assert sorted(taken) == sorted(mine)
        # Round-robin across the groups with keys waiting, FIFO within each.
        by_group = {g: [k for k in mine if host(k) == g] for g in "abc"}
        for g, own in by_group.items():
            assert [k for k in taken if host(k) == g] == own
        firsts = taken[: len([g for g in by_group if by_group[g]])]
        assert len({host(k) for k in firsts}) == len(firsts)


# -- the server's endpoint buckets -------------------------------------------------------------


def test_server_endpoint_buckets_give_the_endpoint_rate_limiters_delays(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    server = RedisRateLimiter(
        base_delay=0.0, max_delay=0.0, qps=None, endpoint=host, endpoint_qps=2, endpoint_burst=2
    )
    q = make(clock=clock, rate_limiter=server)
    local = EndpointRateLimiter(host, qps=2, burst=2, clock=clock)
    seen = delays(q)
    expected = []
    for step, key in [
        (0.0, "a/1"),
        (0.0, "a/2"),
        (0.0, "a/3"),
        (0.0, "b/1"),
        (0.0, "a/4"),
        (0.25, "a/5"),
        (3.0, "a/6"),
        (0.0, "b/2"),
    ]:
        clock.step(step)
        q.add_rate_limited(key)
        expected.append(local.when(key))

    assert seen == expected
    assert expected[:5] == [0.0, 0.0, 0.5, 0.0, 1.0]


def test_server_endpoint_buckets_are_shared_by_every_client_and_used_by_retry(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    server = RedisRateLimiter(
        base_delay=0.0, max_delay=0.0, qps=None, endpoint=host, endpoint_qps=1, endpoint_burst=1
    )
    one, two = make(clock=clock, rate_limiter=server), make(clock=clock, rate_limiter=server)
    seen_one, seen_two = delays(one), delays(two)
    one.add_rate_limited("a/1")  # the bucket's one token: added at once
    two.add_rate_limited("a/2")  # the same bucket, from another client: in debt
    assert one.get_nowait() == "a/1"
    assert one.retry("a/1") is True  # a failure: the same bucket again
    two.add_rate_limited("b/1")

    assert (seen_one, seen_two) == ([0.0, 2.0], [1.0, 0.0])


def test_server_endpoint_buckets_keep_at_most_max_endpoints(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    server = RedisRateLimiter(
        base_delay=0.0,
        max_delay=0.0,
        qps=None,
        endpoint=host,
        endpoint_qps=1,
        endpoint_burst=1,
        max_endpoints=2,
    )
    q = make(clock=clock, rate_limiter=server)
    local = EndpointRateLimiter(host, qps=1, burst=1, clock=clock, max_endpoints=2)
    seen = delays(q)
    order = ["a/1", "b/1", "a/2", "c/1", "a/3", "b/2", "c/2", "d/1", "e/1"]
    for key in order:
        q.add_rate_limited(key)

    assert seen == [local.when(key) for key in order]
    assert raw.hlen(keys_of(name)["endpoints"]) == 2
    assert raw.zcard(keys_of(name)["endpoint_lru"]) == 2


def test_server_endpoint_bucket_composes_with_the_per_key_backoff_and_queue_bucket(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    server = RedisRateLimiter(
        base_delay=1.0,
        max_delay=100.0,
        qps=10,
        burst=100,
        endpoint=host,
        endpoint_qps=1,
        endpoint_burst=2,
    )
    q = make(clock=clock, rate_limiter=server)
    seen = delays(q)
    for key in ["a/1", "a/1", "a/1", "a/2", "a/3", "a/4", "b/1"]:
        q.add_rate_limited(key)

    # a/1: its own backoff (1, 2, 4; a's bucket is at -1 then); a/2..a/4 pay
    # a's debt (2, 3, 4 s, more than their first backoff); b/1: its backoff.
    assert seen == [1.0, 2.0, 4.0, 2.0, 3.0, 4.0, 1.0]


def test_redis_rate_limiter_endpoint_parameters_are_checked() -> None:
    with pytest.raises(TypeError, match="endpoint"):
        RedisRateLimiter(endpoint="host")  # type: ignore[arg-type]
    for kwargs, match in [
        ({"endpoint_qps": 0}, "endpoint_qps"),
        ({"endpoint_burst": 0}, "endpoint_burst"),
        ({"max_endpoints": 0}, "max_endpoints"),
        ({"max_endpoints": True}, "max_endpoints"),
    ]:
        with pytest.raises(ValueError, match=match):
            RedisRateLimiter(endpoint=host, **kwargs)
