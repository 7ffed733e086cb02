"""``Snapshot`` in memory: the rows the core builds, the limit, the JSON shape.

The behaviour every queue shares (waiting order, holders, delays, failures)
is in conformance/test_behaviour.py; this file pins what only the in-memory queues and
the types themselves promise.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import threading
from typing import Any

import pytest

from keyqueue import (
    AsyncWorkQueue,
    DelayedKey,
    FailingKey,
    HeldKey,
    ItemExponentialFailureRateLimiter,
    Snapshot,
    WaitingKey,
    WorkQueue,
    arun_workers,
    run_workers,
)
from keyqueue._heap import REMOVED, LazyHeap
from keyqueue._snapshot import SNAPSHOT_VERSION
from keyqueue.testing import FakeClock


def make(**kwargs: Any) -> tuple[WorkQueue[Any], FakeClock]:
    clock = FakeClock()
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0)
    return WorkQueue("q", clock=clock, rate_limiter=limiter, **kwargs), clock


def test_an_empty_queue_snapshots_as_empty_lists_and_its_stats() -> None:
    q, clock = make()
    snap = q.snapshot()
    assert (snap.waiting, snap.processing, snap.delayed, snap.failing) == ((), (), (), ())
    assert snap.taken_at == clock.now()
    assert snap.limit == 100
    assert snap.stats == q.stats()


def test_rows_carry_each_keys_numbers_relative_to_taken_at() -> None:
    q, clock = make()
    q.add("held")
    assert q.get_nowait() == "held"
    clock.step(1.0)
    q.add("a")
    clock.step(2.0)
    q.add("b", priority=5)
    q.add_after("later", 10.0, priority=2)
    q.add("c")
    assert q.get_nowait() == "b"
    assert q.retry("b") is True  # failure 1: back after 1 s
    q.done("b")
    clock.step(0.5)
    snap = q.snapshot()
    assert snap.taken_at == clock.now()
    assert snap.waiting == (WaitingKey("a", 0, 2.5), WaitingKey("c", 0, 0.5))
    assert snap.processing == (HeldKey("held", "MainThread", None, 3.5, None),)
    assert snap.delayed == (DelayedKey("b", 0.5, 0), DelayedKey("later", 9.5, 2))
    assert snap.failing == (FailingKey("b", 1, 0.5),)
    assert snap.stats.depth == 2
    assert snap.stats.delayed == 2


def test_limit_caps_every_list_and_stats_keeps_the_full_sizes() -> None:
    q, _clock = make()
    for i in range(10):
        q.add(f"w{i}")
        q.add_after(f"d{i}", 1.0 + i)
    for _ in range(4):
        key = q.get_nowait()
        q.retry(key)  # 4 failing, delayed by their backoff
        q.done(key)
    for _ in range(4):
        q.get_nowait()  # 4 held, 2 left waiting
    q.add_many(["x", "y"])
    snap = q.snapshot(limit=3)
    assert len(snap.waiting) == len(snap.processing) == len(snap.delayed) == 3
    assert (len(snap.failing), snap.failing_keys) == (3, 4)
    assert (snap.stats.depth, snap.stats.processing, snap.stats.delayed) == (4, 4, 14)
    assert q.snapshot(limit=0).waiting == ()


@pytest.mark.parametrize("limit", [-1, 1.5, True, "3", None])
def test_a_bad_limit_raises(limit: Any) -> None:
    q, _ = make()
    with pytest.raises((TypeError, ValueError)):
        q.snapshot(limit=limit)


def test_a_ranked_queue_snapshots_in_hand_out_order_without_taking_keys() -> None:
    q, clock = make()
    for i, priority in enumerate([0, 3, 1, 3, 2, 0, 5]):
        q.add(f"k{i}", priority=priority)
        clock.step(1.0)
    q.add("k2", priority=4)  # touched: moves up, keeps its arrival
    snap = q.snapshot()
    order = [row.key for row in snap.waiting]
    assert [(row.key, row.priority) for row in snap.waiting][:2] == [("k6", 5), ("k2", 4)]
    assert snap.waiting[1].waited == 5.0
    out = []
    while len(q):
        out.append(q.get_nowait())
    assert out == order


def test_a_fifo_key_pushed_back_by_done_waits_from_its_done() -> None:
    q, clock = make()
    q.add("a")
    q.add("x")
    assert q.get_nowait() == "a"
    q.add("a")  # marked while held
    clock.step(3.0)
    q.done("a")  # pushed back now
    clock.step(1.0)
    assert q.snapshot().waiting == (WaitingKey("x", 0, 4.0), WaitingKey("a", 0, 1.0))


def test_failures_are_counted_without_max_retries_and_forget_clears_them() -> None:
    q, clock = make()
    for key, times in (("one", 1), ("three", 3), ("two", 2)):
        q.add(key)
        for _ in range(times):
            assert q.get_nowait() == key
            q.retry(key)
            q.done(key)
            clock.step(1000.0)  # past any backoff: added again
        assert q.get_nowait() == key
        q.done(key)
    assert [(row.key, row.failures) for row in q.snapshot().failing] == [
        ("three", 3),
        ("two", 2),
        ("one", 1),
    ]
    assert all(row.comes_back_in is None for row in q.snapshot().failing)
    q.forget("three")
    assert [row.key for row in q.snapshot().failing] == ["two", "one"]


def test_the_json_shape_is_stable_and_round_trips() -> None:
    q, _clock = make()
    q.add("a", priority=1)
    q.add(("tuple", 1))
    snap = q.snapshot()
    shape = json.loads(snap.to_json())
    assert shape == snap.as_dict()
    assert list(shape) == [
        "version",
        "taken_at",
        "limit",
        "stats",
        "waiting",
        "processing",
        "delayed",
        "failing",
        "failing_keys",
        "dead",
    ]
    assert shape["version"] == SNAPSHOT_VERSION == 1
    assert shape["stats"]["waiting_by_priority"] == {"1": 1, "0": 1}
    assert set(shape["stats"]) == {f.name for f in dataclasses.fields(snap.stats)}
    assert shape["waiting"] == [
        {"key": "a", "priority": 1, "waited": 0.0},
        {"key": "('tuple', 1)", "priority": 0, "waited": 0.0},
    ]
    assert [f.name for f in dataclasses.fields(HeldKey)] == [
        "key",
        "holder",
        "token",
        "held",
        "lease_left",
    ]
    assert [f.name for f in dataclasses.fields(DelayedKey)] == ["key", "due_in", "priority"]
    assert [f.name for f in dataclasses.fields(FailingKey)] == ["key", "failures", "comes_back_in"]
    assert [f.name for f in dataclasses.fields(WaitingKey)] == ["key", "priority", "waited"]


def test_a_snapshot_is_frozen() -> None:
    q, _ = make()
    snap = q.snapshot()
    assert isinstance(snap, Snapshot)
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.limit = 3  # type: ignore[misc]


def test_async_queue_snapshots_on_its_loop_and_from_another_thread() -> None:
    async def main() -> None:
        q: AsyncWorkQueue[str] = AsyncWorkQueue("q", clock=FakeClock())
        q.add("a")
        q.add("b")
        assert q.get_nowait() == "a"
        assert [row.key for row in q.snapshot().waiting] == ["b"]
        seen: list[Snapshot[str]] = []
        thread = threading.Thread(target=lambda: seen.append(q.snapshot(limit=1)))
        thread.start()
        while thread.is_alive():
            await asyncio.sleep(0.001)
        assert [row.key for row in seen[0].processing] == ["a"]

    asyncio.run(main())


def test_a_held_key_names_the_thread_that_took_it() -> None:
    q, _ = make()
    q.add_many(["main", "w0", "w1", "gone"])
    assert q.get_nowait() == "main"
    took = threading.Barrier(3)
    release = threading.Event()

    def worker() -> None:
        q.get_nowait()
        took.wait()
        release.wait()

    workers = [threading.Thread(target=worker, name=f"worker-{i}") for i in range(2)]
    for thread in workers:
        thread.start()
    took.wait()
    ended = threading.Thread(target=q.get_nowait, name="ended-worker")
    ended.start()
    ended.join()
    try:
        holders = {row.key: row.holder for row in q.snapshot().processing}
        assert holders.pop("main") == "MainThread"
        assert holders.pop("gone") == f"thread {ended.ident} (ended)"  # it holds it still
        assert sorted(holders.values()) == ["worker-0", "worker-1"]
        assert q.snapshot().as_dict()["processing"][0]["holder"] == "MainThread"
    finally:
        release.set()
        for thread in workers:
            thread.join()


def test_run_workers_threads_and_arun_workers_tasks_are_named_holders() -> None:
    q, _ = make()
    q.add_many(["a", "b"])
    started = threading.Barrier(3)
    release = threading.Event()

    def handler(key: str) -> None:
        started.wait()
        release.wait()

    stop = threading.Event()
    runner = threading.Thread(
        target=run_workers, args=(q, handler), kwargs={"workers": 2, "stop": stop}
    )
    runner.start()
    try:
        started.wait(timeout=10)
        holders = sorted(row.holder or "" for row in q.snapshot().processing)
        assert holders == ["keyqueue-worker-q-0", "keyqueue-worker-q-1"]
    finally:
        release.set()
        stop.set()
        runner.join()

    async def main() -> None:
        aq: AsyncWorkQueue[str] = AsyncWorkQueue("aq", clock=FakeClock())
        aq.add_many(["a", "b"])
        gate = asyncio.Event()
        running: list[str] = []

        async def ahandler(key: str) -> None:
            running.append(key)
            await gate.wait()

        astop = asyncio.Event()
        task = asyncio.create_task(arun_workers(aq, ahandler, workers=2, stop=astop))
        while len(running) < 2:
            await asyncio.sleep(0)
        snap = aq.snapshot()
        assert sorted(row.holder or "" for row in snap.processing) == [
            "keyqueue-worker-aq-0",
            "keyqueue-worker-aq-1",
        ]
        aq.add("c")
        # a get_nowait from this task: this task holds it; from another thread: that thread
        aq.get_nowait()
        aq.add("d")
        other = threading.Thread(target=aq.get_nowait, name="other-thread")
        other.start()
        while other.is_alive():
            await asyncio.sleep(0.001)
        by_key = {row.key: row.holder for row in aq.snapshot().processing}
        assert by_key["c"] == asyncio.current_task().get_name()  # type: ignore[union-attr]
        assert by_key["d"] == "other-thread"
        for key in ("c", "d"):
            aq.done(key)
        gate.set()
        astop.set()
        await task

    asyncio.run(main())


def test_lazy_heap_smallest_walks_in_heap_order_skipping_replaced_entries() -> None:
    heap = LazyHeap()
    entries = {}
    for i, order in enumerate([5, 3, 8, 1, 9, 2, 7, 4, 6, 0]):
        entries[i] = [order, heap.next_seq(), i]
        heap.push(entries[i])
    moved = [10, heap.next_seq(), 3]
    heap.replace(entries[3], moved)  # key 3: order 1 -> 10
    assert entries[3][2] is REMOVED
    assert [e[0] for e in heap.smallest(4)] == [0, 2, 3, 4]
    assert [e[0] for e in heap.smallest(100)] == [0, 2, 3, 4, 5, 6, 7, 8, 9, 10]
    assert heap.smallest(0) == []
    assert len(heap) == 11  # nothing popped
