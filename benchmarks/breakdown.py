"""Where a cycle's time goes, on both builds.

Interleaved timeit (every variant once per repeat, minimum and median over
repeats) of: the standard-library floors, keyqueue's core on its own (no
front, a constant ``now``), the C calls the fronts add (three clock reads and,
for asyncio, three loop-thread checks), and the real fronts, also on a constant
clock; each keyqueue variant on the compiled build (the installed package)
and on the pure one (the same sources as ``keyqueue_pure``, ``builds.py``), in
this one process.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import statistics
import threading
import time
import timeit
from collections.abc import Callable
from typing import Any

from builds import load_pure, require_compiled

import keyqueue

NUMBER = 20_000
REPEATS = 21


class ConstantClock:
    """A clock read at C speed that never moves: isolates the cost of real reads."""

    now = staticmethod(itertools.repeat(0.0).__next__)


def bare_cycle() -> Callable[[], None]:
    """The floor: the same three operations on set/set/deque under one lock, each a call."""
    lock = threading.Lock()
    dirty: set[int] = set()
    processing: set[int] = set()
    fifo: collections.deque[int] = collections.deque()

    def add(key: int) -> None:
        with lock:
            if key not in dirty:
                dirty.add(key)
                if key not in processing:
                    fifo.append(key)

    def get() -> int:
        with lock:
            key = fifo.popleft()
            dirty.discard(key)
            processing.add(key)
            return key

    def done(key: int) -> None:
        with lock:
            processing.discard(key)
            if key in dirty:
                fifo.append(key)

    def cycle() -> None:
        add(1)
        done(get())

    return cycle


def _cycle(add: Any, get: Any, done: Any) -> Callable[[], None]:
    def cycle() -> None:
        add(1)
        done(get())

    return cycle


def _keyqueue_variants(kq: Any, build: str) -> dict[str, Callable[[], None]]:
    """The core alone and both fronts, real and constant clock, of one build."""
    core = kq._core.Core()
    core_add, core_get, core_done = core.add, core.get, core.done

    def core_cycle() -> None:
        core_add(1, 0.0)
        core_done(core_get(0.0), 0.0)

    async_q, async_c = kq.AsyncWorkQueue(), kq.AsyncWorkQueue(clock=ConstantClock())
    thread_q, thread_c = kq.WorkQueue(), kq.WorkQueue(clock=ConstantClock())
    return {
        f"core alone (no front, constant now), {build}": core_cycle,
        f"AsyncWorkQueue add/get_nowait/done, {build}": _cycle(
            async_q.add, async_q.get_nowait, async_q.done
        ),
        f"AsyncWorkQueue, constant clock, {build}": _cycle(
            async_c.add, async_c.get_nowait, async_c.done
        ),
        f"WorkQueue add/get/done, {build}": _cycle(thread_q.add, thread_q.get, thread_q.done),
        f"WorkQueue, constant clock, {build}": _cycle(thread_c.add, thread_c.get, thread_c.done),
    }


async def _variants() -> dict[str, Callable[[], None]]:
    monotonic, ident = time.monotonic, threading.get_ident
    loop_thread = ident()

    def front_c_calls() -> None:
        monotonic()
        monotonic()
        monotonic()
        # The asyncio front's check, as it makes it: the comparison is the cost.
        ident() != loop_thread  # noqa: B015
        ident() != loop_thread  # noqa: B015
        ident() != loop_thread  # noqa: B015

    aq: asyncio.Queue[int] = asyncio.Queue()
    put, aget, task_done = aq.put_nowait, aq.get_nowait, aq.task_done

    def asyncio_queue() -> None:
        put(1)
        aget()
        task_done()

    return {
        "asyncio.Queue put_nowait/get_nowait/task_done": asyncio_queue,
        "bare set/set/deque, three calls under one lock": bare_cycle(),
        "3 time.monotonic() + 3 get_ident() != loop thread": front_c_calls,
        **_keyqueue_variants(keyqueue, "compiled"),
        **_keyqueue_variants(load_pure(), "pure"),
    }


def measure() -> list[dict[str, float | str]]:
    require_compiled()

    async def run() -> dict[str, list[float]]:
        variants = await _variants()
        times: dict[str, list[float]] = {name: [] for name in variants}
        for _ in range(REPEATS):
            for name, fn in variants.items():
                times[name].append(timeit.timeit(fn, number=NUMBER) / NUMBER)
        return times

    times = asyncio.run(run())
    return [
        {"variant": name, "min": min(ts), "median": statistics.median(ts)}
        for name, ts in times.items()
    ]


if __name__ == "__main__":
    for row in measure():
        low, mid = float(row["min"]) * 1e9, float(row["median"]) * 1e9
        print(f"{row['variant']:50s} min {low:6.0f} ns  median {mid:6.0f} ns")
