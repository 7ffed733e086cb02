"""Dead keys on the server (``lua/lib/dead.lua``): a poison key kept as dead,
the bounds (``DEAD_LIMIT`` keys, ``DEAD_MAX_AGE`` seconds) trimmed by each
give-up, and nothing written on a path that gives nothing up.

The rules every queue shares are in tests/conformance/test_dead.py.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest
import redis

from keyqueue import ItemFastSlowRateLimiter
from keyqueue._dead import DEAD_LIMIT, DEAD_MAX_AGE
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue, shard_of
from keyqueue.redis._schema import _read
from keyqueue.testing import FakeClock
from tests.support import valkey_server

NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a local limiter that retries at once

name = valkey_server.name
make = valkey_server.make


@pytest.fixture
def raw(valkey_url: str) -> Any:
    c = redis.Redis.from_url(valkey_url, decode_responses=True)
    yield c
    c.close()


def dead_keys(raw: redis.Redis, queue: str) -> list[str]:
    return list(raw.zrange(f"keyqueue:{{{queue}}}:dead", 0, -1))


def test_the_scripts_bounds_are_the_libraries(make: Callable[..., RedisWorkQueue]) -> None:
    lua = _read("lib/dead.lua")
    assert re.search(r"^local DEAD_LIMIT = (\d+)$", lua, re.M)[1] == str(DEAD_LIMIT)  # type: ignore[index]
    age = re.search(r"^local DEAD_MAX_AGE = (\d+)$", lua, re.M)[1]  # type: ignore[index]
    assert float(age) == DEAD_MAX_AGE


def test_a_poison_key_is_kept_as_dead_with_its_stalls(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=10, max_retries=5, max_stalls=1, rate_limiter=NOW)
    poisoned: list[str] = []
    q._watch_poison(poisoned.append)  # what the runners pass to on_give_up
    q.add("p")
    for _ in range(2):  # its holder dies twice with the handler running
        assert q.get_nowait() == "p"
        clock.step(10)
    assert q.stats().given_up_stalls == 1
    assert poisoned == ["p"]
    (dead,) = q.dead()
    assert (dead.key, dead.reason, dead.error_type, dead.error, dead.failures) == (
        "p",
        "stalls",
        None,
        None,
        2,
    )
    assert dead.at == clock.now()  # the server's clock: here the virtual one
    assert q.replay("p") is True
    assert q.get_nowait() == "p"  # back, its stalls in a row cleared
    q.done("p")


def test_the_dead_set_keeps_the_newest_dead_limit_keys(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock)
    for i in range(DEAD_LIMIT + 2):
        q.give_up(f"k{i}", "retries")
        clock.step(0.001)
    keys = dead_keys(raw, name)
    assert len(keys) == DEAD_LIMIT
    assert keys[0] == "k2"
    assert keys[-1] == f"k{DEAD_LIMIT + 1}"
    assert raw.hlen(f"keyqueue:{{{name}}}:dead_info") == DEAD_LIMIT
    assert [d.key for d in q.dead(limit=2)] == [f"k{DEAD_LIMIT + 1}", f"k{DEAD_LIMIT}"]


def test_a_dead_key_older_than_the_max_age_is_dropped_by_the_next_give_up(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock)
    q.give_up("old", "permanent", ValueError("x"))
    clock.step(DEAD_MAX_AGE - 1)
    q.give_up("mid", "retries")
    assert dead_keys(raw, name) == ["old", "mid"]
    clock.step(2)
    assert dead_keys(raw, name) == ["old", "mid"]  # a reader does not write
    q.give_up("new", "retries")
    assert dead_keys(raw, name) == ["mid", "new"]
    assert raw.hkeys(f"keyqueue:{{{name}}}:dead_info") == ["mid", "new"]


def test_a_dead_key_older_than_the_max_age_is_never_listed_nor_replayed(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    """Between give-ups an entry past the age is still on the server, but
    ``dead()`` and the snapshot skip it, and ``replay``, ``replay_all`` and
    ``forget_dead`` drop it first (a key kept for 7 days, not until the next
    give-up)."""
    clock = FakeClock()
    q = make(clock=clock)
    for key in ("a", "b", "c"):
        q.give_up(key, "retries")
        clock.step(1)
    clock.step(DEAD_MAX_AGE - 2.5)  # a is 7 days and 0.5 s old, b and c younger
    assert [d.key for d in q.dead()] == ["c", "b"]
    assert [d.key for d in q.snapshot().dead] == ["c", "b"]
    assert [d.key for d in q.dead(limit=1)] == ["c"]
    assert dead_keys(raw, name) == ["a", "b", "c"]
    assert q.replay("a") is False
    assert dead_keys(raw, name) == ["b", "c"]  # the replay trimmed it
    clock.step(1)  # b is past the age too
    assert q.forget_dead("b") is False
    assert q.replay_all() == 1
    assert q.get_nowait() == "c"
    q.done("c")
    assert (q.dead(), dead_keys(raw, name)) == ((), [])


def test_no_dead_key_is_written_on_paths_that_give_nothing_up(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=10, max_retries=3, max_stalls=1, rate_limiter=NOW)
    q.add_many(["a", "b"])
    assert q.get_nowait() == "a"
    assert q.retry("a") is True
    q.done("a")
    assert q.get_nowait() == "b"
    clock.step(10)  # one stall: not poison yet
    q.stats()
    assert not raw.exists(f"keyqueue:{{{name}}}:dead", f"keyqueue:{{{name}}}:dead_info")
    assert q.dead() == ()


def test_delete_removes_the_dead_keys(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    q = make()
    q.add("b")
    q.give_up("a", "retries")
    assert q.delete() is True
    assert not raw.exists(f"keyqueue:{{{name}}}:dead", f"keyqueue:{{{name}}}:dead_info")


async def test_the_async_client_reads_and_replays_as_coroutines(valkey_url: str, name: str) -> None:
    clock = FakeClock()
    async with AsyncRedisWorkQueue(name, url=valkey_url, clock=clock) as q:
        assert not await q.exists()
        await q.give_up("a", "permanent", RuntimeError("no"))
        assert await q.exists()  # a give-up uses the queue
        clock.step(1)
        await q.give_up("b", "retries")
        assert [d.key for d in await q.dead()] == ["b", "a"]
        assert await q.forget_dead("b") is True
        assert await q.replay("a") is True
        assert await q.replay_all() == 0
        assert await q.get_nowait() == "a"
        await q.done("a")
        await q.delete()


def test_a_key_given_up_before_a_reshard_is_listed_and_replayed_after_it(
    make: Callable[..., RedisWorkQueue], name: str
) -> None:
    """Dead entries stay in the shard that gave the key up; a reshard does not
    move them. ``dead()`` still lists them, and ``replay`` finds one in any
    shard, drops it and adds the key to its shard by the new map."""
    q = make(shards=2)
    keys = [f"k{i}" for i in range(40)]
    for key in keys:
        q.give_up(key, "retries", RuntimeError(key))
    q.reshard(3)
    assert sorted(d.key for d in q.dead()) == sorted(keys)
    moved = [key for key in keys if shard_of(key, 3) != shard_of(key, 2)]
    assert len(moved) >= 2  # some keys' shard changed
    assert q.replay(moved[0]) is True
    assert q.replay(moved[0]) is False
    assert q.forget_dead(moved[1]) is True
    assert q.replay_all() == len(keys) - 2
    assert q.dead() == ()
    assert q.stats().depth == len(keys) - 1
    assert sorted(q.get_nowait() for _ in range(len(keys) - 1)) == sorted(
        key for key in keys if key != moved[1]
    )
