"""``add_many`` on both Redis fronts: many adds in one round trip, the same as ``add`` each.

Runs against the session's valkey-server (tests/support/valkey_server.py), one queue
name per test, time from a ``FakeClock`` so queue waits are exact.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

from keyqueue import Event, EventKind, WorkQueue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.redis._config import ADD_BATCH
from keyqueue.testing import FakeClock
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make


def events_of(q: Any) -> list[tuple[EventKind, str | None]]:
    seen: list[tuple[EventKind, str | None]] = []

    def record(event: Event[str]) -> None:
        seen.append((event.kind, event.key))

    q.subscribe(record)
    return seen


def drain(q: RedisWorkQueue) -> list[str]:
    """Every waiting key, in FIFO order (each taken and released)."""
    keys = []
    while True:
        try:
            key = q.get_nowait()
        except Exception:
            return keys
        keys.append(key)
        q.done(key)


def test_add_many_is_add_on_each_key_in_order(valkey_url: str, name: str) -> None:
    clock = FakeClock()
    batched = RedisWorkQueue(name, url=valkey_url, clock=clock)
    one_by_one = RedisWorkQueue(f"{name}-each", url=valkey_url, clock=clock)
    try:
        held = "c"
        for q in (batched, one_by_one):
            q.add(held)
            assert q.get_nowait() == held  # held: the next add marks it, no push
        seen_batched, seen_each = events_of(batched), events_of(one_by_one)
        keys = ["a", "b", "a", held, "d", "b", held]
        batched.add_many(keys)
        for key in keys:
            one_by_one.add(key)
        assert seen_batched == seen_each
        assert seen_batched == [
            (EventKind.ENQUEUE, "a"),
            (EventKind.ENQUEUE, "b"),
            (EventKind.COALESCE, "a"),
            (EventKind.MARK_WHILE_PROCESSING, "c"),
            (EventKind.ENQUEUE, "d"),
            (EventKind.COALESCE, "b"),
            (EventKind.COALESCE, "c"),
        ]
        s1, s2 = batched.stats(), one_by_one.stats()
        assert (s1.adds, s1.enqueued, s1.coalesced, s1.marked_while_processing) == (8, 4, 3, 1)
        assert (s2.adds, s2.enqueued, s2.coalesced, s2.marked_while_processing) == (8, 4, 3, 1)
        for q in (batched, one_by_one):
            q.done(held)  # redelivered once, after d
        assert drain(batched) == drain(one_by_one) == ["a", "b", "d", "c"]
    finally:
        batched.close()
        one_by_one.close()


def test_add_many_matches_the_in_memory_queue_on_the_same_keys(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock())
    memory: WorkQueue[str] = WorkQueue()
    keys = [f"k{i % 7}" for i in range(40)]
    q.add_many(keys)
    for key in keys:
        memory.add(key)
    s, m = q.stats(), memory.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.depth) == (m.adds, m.enqueued, m.coalesced, m.depth)
    assert drain(q) == [memory.get() for _ in range(m.depth)]


def test_add_many_sends_one_script_run_per_batch(
    make: Callable[..., RedisWorkQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make()
    runs: list[int] = []
    run = q._run

    def counting(script: str, args: list[str]) -> Any:
        runs.append(len(args) - 4)  # keys after the clock, priority, aging and groups arguments
        return run(script, args)

    monkeypatch.setattr(q, "_run", counting)
    q.add_many(f"key-{i}" for i in range(ADD_BATCH + 5))  # any iterable, even a generator
    assert runs == [ADD_BATCH, 5]
    assert q.stats().enqueued == ADD_BATCH + 5


def test_add_many_of_nothing_sends_nothing(
    make: Callable[..., RedisWorkQueue], monkeypatch: pytest.MonkeyPatch
) -> None:
    q = make()
    monkeypatch.setattr(q, "_run", lambda *args: pytest.fail("sent a script"))
    q.add_many([])


@pytest.mark.parametrize(
    ("keys", "message"),
    [
        (["a", 1, "b"], "must be str, got 1"),
        (["a", b"b"], "must be str, got b'b'"),
        ("abc", "iterable of keys, got 'abc'"),
    ],
)
def test_add_many_with_a_bad_key_raises_and_adds_nothing(
    make: Callable[..., RedisWorkQueue], keys: Any, message: str
) -> None:
    q = make()
    with pytest.raises(TypeError, match=message):
        q.add_many(keys)
    assert q.stats().adds == 0


def test_add_many_after_shutdown_still_reaches_the_queue(
    make: Callable[..., RedisWorkQueue],
) -> None:
    producer, worker = make(), make()
    producer.shutdown()  # per client: adds still go to the shared queue
    producer.add_many(["a", "b"])
    assert drain(worker) == ["a", "b"]


def test_async_add_many_is_add_on_each_key(valkey_url: str, name: str) -> None:
    async def main() -> None:
        async with AsyncRedisWorkQueue(name, url=valkey_url, clock=FakeClock()) as q:
            seen = events_of(q)
            await q.add_many(["x", "y", "x"])
            with pytest.raises(TypeError, match="must be str"):
                await q.add_many(["z", None])  # type: ignore[list-item]
            s = await q.stats()
            assert (s.adds, s.enqueued, s.coalesced) == (3, 2, 1)
            assert seen == [
                (EventKind.ENQUEUE, "x"),
                (EventKind.ENQUEUE, "y"),
                (EventKind.COALESCE, "x"),
            ]
            assert [await q.get_nowait(), await q.get_nowait()] == ["x", "y"]

    asyncio.run(main())


def test_add_many_wakes_a_getter_on_another_client(make: Callable[..., RedisWorkQueue]) -> None:
    producer, worker = make(), make()
    got: list[str] = []
    getter = threading.Thread(target=lambda: got.append(worker.get(timeout=10)))
    getter.start()
    producer.add_many(["woken"])
    getter.join(15)
    assert got == ["woken"]
