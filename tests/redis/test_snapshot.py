"""Snapshots on Redis: who holds what (``holder=``), ``exists``, ``delete``, and a
snapshot across clients. The behaviour every queue shares is in
conformance/test_behaviour.py (its snapshot tests run on both Redis clients too)."""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio

from keyqueue import Empty, ItemFastSlowRateLimiter
from keyqueue.redis import AsyncRedisWorkQueue, LeaseLost, RedisWorkQueue
from keyqueue.redis._schema import KEY_NAMES, key_names
from keyqueue.testing import FakeClock
from tests.support import valkey_server

name = valkey_server.name
make = valkey_server.make
NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a local limiter that retries at once


@pytest.fixture
def client(valkey_url: str) -> Iterator[redis.Redis]:
    c = redis.Redis.from_url(valkey_url, decode_responses=True)
    yield c
    c.close()


def client_names(client: redis.Redis) -> list[str]:
    return [str(c.get("name", "")) for c in client.client_list()]


def test_the_default_holder_is_hostname_pid_and_names_the_connections(
    make: Callable[..., RedisWorkQueue], client: redis.Redis
) -> None:
    q = make()
    assert q.holder == f"{socket.gethostname()}:{os.getpid()}"
    q.stats()
    assert q.holder in client_names(client)


def test_each_hold_shows_the_holder_that_took_it(
    make: Callable[..., RedisWorkQueue], client: redis.Redis
) -> None:
    clock = FakeClock()
    web, worker = make(holder="web-1", clock=clock), make(holder="worker-7", clock=clock)
    web.add_many(["a", "b", "c"])
    assert web.get_nowait() == "a"
    assert worker.get_nowait() == "b"
    clock.step(2.0)
    snap = worker.snapshot()
    assert [(h.key, h.holder, h.token) for h in snap.processing] == [
        ("a", "web-1", web.token("a")),
        ("b", "worker-7", worker.token("b")),
    ]
    assert [(h.held, h.lease_left) for h in snap.processing] == [(2.0, 28.0), (2.0, 28.0)]
    assert {"web-1", "worker-7"} <= set(client_names(client))
    worker.retry("b")  # a fenced outcome rewrites the lease: the holder stays
    assert [h.holder for h in web.snapshot().processing] == ["web-1", "worker-7"]


def test_a_client_passed_in_keeps_its_own_name(valkey_url: str, name: str) -> None:
    named = redis.Redis.from_url(valkey_url, client_name="billing-app")
    try:
        q = RedisWorkQueue(name, client=named, holder="worker-1")
        assert named.client_getname() == "billing-app"
        q.add("k")
        assert q.get_nowait() == "k"
        assert [h.holder for h in q.snapshot().processing] == ["worker-1"]
        q.done("k")
        q.close()
    finally:
        named.close()


@pytest.mark.parametrize(
    ("holder", "error"),
    [("", ValueError), ("has space", ValueError), ("tab\there", ValueError), (7, TypeError)],
)
def test_a_bad_holder_raises(valkey_url: str, name: str, holder: Any, error: type) -> None:
    with pytest.raises(error, match="holder"):
        RedisWorkQueue(name, url=valkey_url, holder=holder)


def test_a_lease_that_ran_out_is_a_stall_not_a_failure_in_the_snapshot(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=5.0, rate_limiter=NOW)
    q.add("k")
    assert q.get_nowait() == "k"
    clock.step(6.0)  # reaped: a stall (a get's hold is started), waiting again at once
    snap = q.snapshot()
    assert snap.failing == ()
    assert ([w.key for w in snap.waiting], snap.processing) == (["k"], ())
    assert snap.stats.leases_expired == snap.stats.stalls == 1  # type: ignore[attr-defined]


def test_a_queue_exists_once_a_client_used_it_and_not_after_delete(
    make: Callable[..., RedisWorkQueue], client: redis.Redis
) -> None:
    q = make()
    assert not q.exists()
    q.stats()
    q.snapshot()
    assert not q.exists()  # reading a queue does not make it
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.exists()  # an idle getter used it
    q.add("k")
    q.add_after("later", 60.0)
    assert q.delete() is True
    assert not q.exists()
    tag = key_names(q.name)[0].rsplit(":", 1)[0]
    assert client.keys(tag.replace("{", "[{]").replace("}", "[}]") + ":*") == []
    assert q.delete() is False  # nothing left: it did not exist
    q.add("k")  # a client that goes on starts it anew
    assert [w.key for w in q.snapshot().waiting] == ["k"]


def test_delete_removes_every_key_of_the_queue(
    make: Callable[..., RedisWorkQueue], client: redis.Redis
) -> None:
    q = make(max_retries=5, rate_limiter=None)
    q.add("a", priority=2)  # ranked
    q.add_rate_limited("b")  # the server limiter's state
    assert q.get_nowait() == "a"
    q.retry("a")
    q.done("a")
    q.forget("nothing")
    present = {k for k in key_names(q.name) if client.exists(k)}
    assert len(present) >= 8
    assert q.delete() is True
    assert [k for k in key_names(q.name) if client.exists(k)] == []
    assert len(KEY_NAMES) == 31


def test_delete_is_refused_while_a_key_is_held_unless_forced(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q, other = make(), make()
    q.add_many(["a", "b"])
    assert other.get_nowait() == "a"
    with pytest.raises(RuntimeError, match=r"1 key\(s\) are held"):
        q.delete()
    assert [w.key for w in q.snapshot().waiting] == ["b"]  # nothing changed
    with pytest.raises(TypeError, match="force"):
        q.delete(force=1)  # type: ignore[arg-type]
    assert q.delete(force=True) is True
    with pytest.raises(LeaseLost):
        other.done("a")
    assert q.snapshot().stats.depth == 0


def test_the_async_client_snapshots_and_deletes(valkey_url: str, name: str) -> None:
    async def main() -> None:
        clock = FakeClock()
        async with AsyncRedisWorkQueue(name, url=valkey_url, clock=clock, holder="async-1") as q:
            assert not await q.exists()
            await q.add("a")
            await q.add("b")
            assert await q.get_nowait() == "a"
            clock.step(1.0)
            snap = await q.snapshot(limit=10)
            assert [(w.key, w.waited) for w in snap.waiting] == [("b", 1.0)]
            assert [(h.key, h.holder, h.token) for h in snap.processing] == [
                ("a", "async-1", q.token("a"))
            ]
            with pytest.raises(RuntimeError, match="held"):
                await q.delete()
            await q.done("a")
            assert await q.exists()
            assert await q.delete() is True
            assert not await q.exists()
            with pytest.raises(ValueError, match="limit"):
                await q.snapshot(limit=-1)

    asyncio.run(main())
