"""Timing workloads. Each group holds keyqueue and its floor/peers, measured in one run.

Run through ``make bench`` (benchmarks/run.py), which turns the medians into ratios.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import queue
import threading
import time
from typing import Any

import pytest
from breakdown import bare_cycle  # a sibling module: pytest puts benchmarks/ on sys.path

from keyqueue import AsyncWorkQueue, WorkQueue, default_controller_rate_limiter
from keyqueue.testing import FakeClock

# -- coalesced add -----------------------------------------------------------------


@pytest.mark.benchmark(group="coalesced add")
def test_coalesced_add_keyqueue(benchmark: Any) -> None:
    q: WorkQueue[str] = WorkQueue()
    q.add("k")
    benchmark(q.add, "k")
    assert len(q) == 1


@pytest.mark.benchmark(group="coalesced add")
def test_coalesced_add_floor_lock_set(benchmark: Any) -> None:
    lock, dirty = threading.Lock(), {"k"}

    def add(key: str) -> None:
        with lock:
            if key in dirty:
                return

    benchmark(add, "k")


# -- one-thread add/get/done cycle ----------------------------------------------------


@pytest.mark.benchmark(group="cycle")
def test_cycle_keyqueue(benchmark: Any) -> None:
    q: WorkQueue[int] = WorkQueue()
    add, get, done = q.add, q.get, q.done

    def cycle() -> None:
        add(1)
        done(get())

    benchmark(cycle)


@pytest.mark.benchmark(group="cycle")
def test_cycle_keyqueue_ranked(benchmark: Any) -> None:
    """The priority path: a queue that has seen a priority keeps a heap."""
    q: WorkQueue[int] = WorkQueue(aging=1.0)
    add, get, done = q.add, q.get, q.done

    def cycle() -> None:
        add(1, 5)
        done(get())

    benchmark(cycle)


@pytest.mark.benchmark(group="cycle")
def test_cycle_floor_bare_structures(benchmark: Any) -> None:
    benchmark(bare_cycle())


@pytest.mark.benchmark(group="cycle")
def test_cycle_stdlib_queue(benchmark: Any) -> None:
    q: queue.Queue[int] = queue.Queue()
    put, get, task_done = q.put, q.get, q.task_done

    def cycle() -> None:
        put(1)
        get()
        task_done()

    benchmark(cycle)


# -- producer -> 4 worker threads, distinct keys --------------------------------------

THREAD_KEYS = 20_000
WORKERS = 4


def _producer_workers_keyqueue() -> None:
    q: WorkQueue[int] = WorkQueue()

    def work() -> None:
        get, done = q.get, q.done
        try:
            while True:
                done(get())
        except Exception:  # ShutDown
            return

    threads = [threading.Thread(target=work) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    add = q.add
    for i in range(THREAD_KEYS):
        add(i)
    q.shutdown(drain=True)
    for t in threads:
        t.join()
    assert q.stats().dones == THREAD_KEYS


def _producer_workers_stdlib() -> None:
    q: queue.Queue[int | None] = queue.Queue()

    def work() -> None:
        get, task_done = q.get, q.task_done
        while get() is not None:
            task_done()
        task_done()

    threads = [threading.Thread(target=work) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    put = q.put
    for i in range(THREAD_KEYS):
        put(i)
    for _ in threads:
        put(None)
    q.join()
    for t in threads:
        t.join()


@pytest.mark.benchmark(group="producer to 4 workers")
def test_threads_keyqueue(benchmark: Any) -> None:
    benchmark.pedantic(_producer_workers_keyqueue, rounds=7, warmup_rounds=1)
    benchmark.extra_info["items"] = THREAD_KEYS


@pytest.mark.benchmark(group="producer to 4 workers")
def test_threads_stdlib_queue(benchmark: Any) -> None:
    benchmark.pedantic(_producer_workers_stdlib, rounds=7, warmup_rounds=1)
    benchmark.extra_info["items"] = THREAD_KEYS


# -- firehose: 20 hot keys, 4 workers --------------------------------------------------

FIREHOSE_ADDS = 200_000
HOT_KEYS = 20


def _firehose(result: dict[str, float]) -> None:
    q: WorkQueue[int] = WorkQueue()

    def work() -> None:
        get, done = q.get, q.done
        try:
            while True:
                key = get()
                time.sleep(0.0002)  # a reconcile that waits on I/O
                done(key)
        except Exception:  # ShutDown
            return

    threads = [threading.Thread(target=work) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    add = q.add
    keys = list(range(HOT_KEYS)) * (FIREHOSE_ADDS // HOT_KEYS)
    start = time.perf_counter()
    for key in keys:
        add(key)
    elapsed = time.perf_counter() - start
    q.shutdown(drain=True)
    for t in threads:
        t.join()
    s = q.stats()
    result["adds_per_second"] = FIREHOSE_ADDS / elapsed
    result["absorbed"] = s.coalesced / s.adds  # as the lab: adds that cost no reconcile
    result["processed"] = s.dones


@pytest.mark.benchmark(group="firehose")
def test_firehose_keyqueue(benchmark: Any) -> None:
    rates: list[float] = []
    absorbed: list[float] = []

    def run() -> None:
        result: dict[str, float] = {}
        _firehose(result)
        rates.append(result["adds_per_second"])
        absorbed.append(result["absorbed"])

    benchmark.pedantic(run, rounds=5, warmup_rounds=1)
    rates.sort()
    absorbed.sort()
    benchmark.extra_info["adds_per_second_median"] = rates[len(rates) // 2]
    benchmark.extra_info["adds_per_second_min"] = rates[0]
    benchmark.extra_info["adds_per_second_max"] = rates[-1]
    benchmark.extra_info["absorbed_median"] = absorbed[len(absorbed) // 2]


# -- add_after insert + fire -------------------------------------------------------------

DELAYED = 1_000


@pytest.mark.benchmark(group="add_after insert+fire")
def test_add_after_keyqueue(benchmark: Any) -> None:
    def setup() -> tuple[tuple[WorkQueue[int], FakeClock], dict[str, Any]]:
        clock = FakeClock()
        return (WorkQueue(clock=clock), clock), {}

    def run(q: WorkQueue[int], clock: FakeClock) -> None:
        add_after = q.add_after
        for i in range(DELAYED):
            add_after(i, 1.0 + (i % 7))
        clock.step(10.0)
        assert len(q) == DELAYED

    benchmark.pedantic(run, setup=setup, rounds=50, warmup_rounds=2)
    benchmark.extra_info["per"] = DELAYED


@pytest.mark.benchmark(group="add_after insert+fire")
def test_add_after_floor_heapq(benchmark: Any) -> None:
    def run() -> None:
        heap: list[tuple[float, int, int]] = []
        counter = itertools.count()
        push, pop = heapq.heappush, heapq.heappop
        for i in range(DELAYED):
            push(heap, (1.0 + (i % 7), next(counter), i))
        while heap:
            pop(heap)

    benchmark.pedantic(run, rounds=50, warmup_rounds=2)
    benchmark.extra_info["per"] = DELAYED


# -- rate limiter --------------------------------------------------------------------------


@pytest.mark.benchmark(group="rate limiter when()")
def test_rate_limiter_default_when(benchmark: Any) -> None:
    limiter = default_controller_rate_limiter(FakeClock())
    keys = itertools.cycle(range(1000))
    when = limiter.when
    benchmark(lambda: when(next(keys)))


# -- asyncio cycle ---------------------------------------------------------------------------

ASYNC_CYCLES = 1_000


def _run_async(benchmark: Any, make: Any) -> None:
    loop = asyncio.new_event_loop()
    try:
        body = loop.run_until_complete(make())
        benchmark.pedantic(lambda: loop.run_until_complete(body()), rounds=30, warmup_rounds=2)
        benchmark.extra_info["per"] = ASYNC_CYCLES
    finally:
        loop.close()


@pytest.mark.benchmark(group="asyncio cycle")
def test_async_keyqueue_nowait(benchmark: Any) -> None:
    async def make() -> Any:
        q: AsyncWorkQueue[int] = AsyncWorkQueue()
        add, get_nowait, done = q.add, q.get_nowait, q.done

        async def body() -> None:
            for _ in range(ASYNC_CYCLES):
                add(1)
                done(get_nowait())

        return body

    _run_async(benchmark, make)


@pytest.mark.benchmark(group="asyncio cycle")
def test_async_keyqueue_await_get(benchmark: Any) -> None:
    async def make() -> Any:
        q: AsyncWorkQueue[int] = AsyncWorkQueue()
        add, get, done = q.add, q.get, q.done

        async def body() -> None:
            for _ in range(ASYNC_CYCLES):
                add(1)
                done(await get())

        return body

    _run_async(benchmark, make)


@pytest.mark.benchmark(group="asyncio cycle")
def test_async_stdlib_asyncio_queue(benchmark: Any) -> None:
    async def make() -> Any:
        q: asyncio.Queue[int] = asyncio.Queue()
        put, get, task_done = q.put_nowait, q.get_nowait, q.task_done

        async def body() -> None:
            for _ in range(ASYNC_CYCLES):
                put(1)
                get()
                task_done()

        return body

    _run_async(benchmark, make)


@pytest.mark.benchmark(group="asyncio cycle")
def test_async_peer_aiok8s(benchmark: Any) -> None:
    from aiok8s.workqueue import queue as aiok8s_queue  # noqa: PLC0415 (bench-only peer)

    async def make() -> Any:
        q = aiok8s_queue.new()

        async def body() -> None:
            for _ in range(ASYNC_CYCLES):
                await q.add(1)
                item, _ = await q.get()
                await q.done(item)

        return body

    _run_async(benchmark, make)


@pytest.mark.benchmark(group="asyncio cycle")
def test_async_peer_leasedkeyq(benchmark: Any) -> None:
    from leasedkeyq import LeasedKeyQueue  # noqa: PLC0415 (bench-only peer)

    async def make() -> Any:
        q: LeasedKeyQueue[int, None] = LeasedKeyQueue()

        async def body() -> None:
            for _ in range(ASYNC_CYCLES):
                await q.put(1, None)
                _, _, lease = await q.get()
                await q.ack(lease)

        return body

    _run_async(benchmark, make)
