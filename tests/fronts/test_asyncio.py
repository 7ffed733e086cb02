"""What is specific to the asyncio front, ``keyqueue.AsyncWorkQueue``.

The shared semantics are pinned once for every front in conformance/test_behaviour.py;
here: cancellation (of a waiting ``get`` and of ``arun_workers``), getters and a
drain waiting on other tasks, the async runner's concurrency bound, ``stop``
event and return at shutdown, calls from foreign threads, which loop a queue
binds to, and the two timers (a ``FakeClock`` stepped from the loop or another
thread, and the real-clock ``loop.call_at`` timer).

Every task a test creates is awaited and every thread joined, both with generous
wall-clock bounds; the only waiting is for another task or thread to act, never
for time to pass (except the real-clock timer tests, which bound their wait with
``asyncio.wait_for``).
"""

from __future__ import annotations

import asyncio
import gc
import math
import random
import sys
import threading
import time
import weakref
from collections import Counter
from collections.abc import Awaitable, Callable
from decimal import Decimal
from typing import Any, TypeVar

import pytest

from keyqueue import (
    AsyncWorkQueue,
    BucketRateLimiter,
    Empty,
    Event,
    EventKind,
    ItemFastSlowRateLimiter,
    Requeue,
    ShutDown,
    Stats,
    arun_workers,
)
from keyqueue.testing import FakeClock

BOUND = 5.0  # generous wall seconds for another task or thread to act
T = TypeVar("T")


# -- helpers -----------------------------------------------------------------------


async def settle(turns: int = 5) -> None:
    """Let every ready task run a few steps (no time passes)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def wait_for_state(predicate: Callable[[], bool], what: str) -> None:
    """Wait for another thread to act (not for time to pass)."""
    deadline = time.monotonic() + BOUND
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"timed out waiting for {what}")
        await asyncio.sleep(0.001)


async def join(thread: threading.Thread) -> None:
    await asyncio.to_thread(thread.join, BOUND)
    assert not thread.is_alive()


# -- cancelling a waiting get -----------------------------------------------------


async def test_cancelled_get_passes_its_wake_up_to_the_next_waiter() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("pass-on")
    first = asyncio.create_task(q.get())
    await settle()  # first waits
    second = asyncio.create_task(q.get())
    await settle()  # second waits behind it

    q.add("a")  # wakes the first waiter...
    first.cancel()  # ...which is cancelled before it can take the key

    assert await asyncio.wait_for(second, BOUND) == "a"
    with pytest.raises(asyncio.CancelledError):
        await first
    s = q.stats()
    assert (s.gets, s.processing, s.depth) == (1, 1, 0)


async def test_cancelled_get_loses_no_key() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("no-loss")
    getter = asyncio.create_task(q.get())
    await settle()

    q.add("a")
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter

    assert len(q) == 1
    assert q.stats().gets == 0
    assert q.get_nowait() == "a"


async def test_cancelled_idle_get_does_not_absorb_a_later_wake_up() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("idle-cancel")
    first = asyncio.create_task(q.get())
    await settle()
    second = asyncio.create_task(q.get())
    await settle()
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first

    q.add("a")

    assert await asyncio.wait_for(second, BOUND) == "a"


async def test_each_waiting_getter_gets_its_own_key() -> None:
    q: AsyncWorkQueue[int] = AsyncWorkQueue("fan-out")
    getters = [asyncio.create_task(q.get()) for _ in range(5)]
    await settle()
    for key in range(5):
        q.add(key)

    got = await asyncio.wait_for(asyncio.gather(*getters), BOUND)

    assert sorted(got) == [0, 1, 2, 3, 4]
    assert q.stats().processing == 5


async def test_shutdown_releases_waiting_getters_with_shutdown() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("release")
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await settle()

    assert await q.shutdown() is True

    results = await asyncio.wait_for(asyncio.gather(*getters, return_exceptions=True), BOUND)
    assert all(isinstance(r, ShutDown) for r in results)


async def test_getter_waits_for_a_redelivery_owed_after_shutdown() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("owed")
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")
    getters = [asyncio.create_task(q.get()) for _ in range(2)]
    await settle()
    await q.shutdown()
    await settle()
    assert not any(g.done() for g in getters)  # a change is still owed

    q.done("a")

    results = await asyncio.wait_for(asyncio.gather(*getters, return_exceptions=True), BOUND)
    keys = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert keys == ["a"]  # the owed change, handed out once
    assert len(errors) == 1
    assert isinstance(errors[0], ShutDown)


async def test_drain_with_an_infinite_timeout_waits_for_the_held_key_like_no_timeout() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("drain-inf")
    q.add("a")
    key = q.get_nowait()
    drainer = asyncio.create_task(q.shutdown(drain=True, timeout=float("inf")))
    await settle()
    assert not drainer.done()  # waiting for "a", not timed out

    q.done(key)

    assert await asyncio.wait_for(drainer, BOUND) is True


# -- cancelling arun_workers -------------------------------------------------------


async def test_cancelling_arun_workers_releases_and_re_adds_in_flight_keys() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("cancel-runner")
    started: list[str] = []
    both = asyncio.Event()

    async def handler(key: str) -> None:
        started.append(key)
        if len(started) == 2:
            both.set()
        await asyncio.Event().wait()  # never finishes on its own

    for key in ["a", "b", "c"]:
        q.add(key)
    runner = asyncio.create_task(arun_workers(q, handler, workers=2))
    await asyncio.wait_for(both.wait(), BOUND)

    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner

    s = q.stats()
    assert (s.processing, s.gets, s.dones) == (0, 2, 2)
    assert s.redeliveries == 2  # the unfinished changes are owed again
    assert sorted(started) == ["a", "b"]
    assert q.get_nowait() == "c"
    assert sorted([q.get_nowait(), q.get_nowait()]) == ["a", "b"]
    with pytest.raises(Empty):
        q.get_nowait()
    # The test's 3 adds, and the runner's re-add of each cancelled key, which it held.
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (5, 3, 0, 2)


async def test_cancelling_arun_workers_after_shutdown_releases_without_re_adding() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("cancel-shutdown")
    entered = asyncio.Event()

    async def handler(key: str) -> None:
        entered.set()
        await asyncio.Event().wait()

    q.add("a")
    q.add("b")
    runner = asyncio.create_task(arun_workers(q, handler, workers=1))
    await asyncio.wait_for(entered.wait(), BOUND)
    await q.shutdown()

    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner

    s = q.stats()
    assert (s.processing, s.dones, s.redeliveries) == (0, 1, 0)
    assert q.get_nowait() == "b"  # was waiting before shutdown: still handed out
    q.done("b")
    with pytest.raises(ShutDown):
        q.get_nowait()
    assert await q.shutdown(drain=True, timeout=BOUND) is True


async def test_cancelling_arun_workers_with_idle_workers_leaves_the_queue_usable() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("cancel-idle")
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    runner = asyncio.create_task(arun_workers(q, handler, workers=3))
    await settle()
    runner.cancel()
    with pytest.raises(asyncio.CancelledError):
        await runner

    q.add("a")
    assert handled == []
    assert await asyncio.wait_for(q.get(), BOUND) == "a"
    q.done("a")
    assert q.stats().processing == 0


# -- the async runner's bounds ------------------------------------------------------


async def test_arun_workers_runs_at_most_n_handlers_and_never_two_for_one_key() -> None:
    q: AsyncWorkQueue[int] = AsyncWorkQueue("bounded")
    workers, keys = 3, 12
    active: set[int] = set()
    peak = 0
    overlaps: list[int] = []
    runs: dict[int, int] = {}
    all_handled = asyncio.Event()

    async def handler(key: int) -> None:
        nonlocal peak
        if key in active:
            overlaps.append(key)
        active.add(key)
        peak = max(peak, len(active))
        runs[key] = runs.get(key, 0) + 1
        if runs[key] == 1:
            q.add(key)  # changed while held: one more run, after this one
        await settle(3)
        active.discard(key)
        if sum(runs.values()) == 2 * keys:
            all_handled.set()

    runner = asyncio.create_task(arun_workers(q, handler, workers=workers))
    for key in range(keys):
        q.add(key)
    await asyncio.wait_for(all_handled.wait(), BOUND)
    assert await q.shutdown(drain=True, timeout=BOUND) is True
    await asyncio.wait_for(runner, BOUND)

    assert overlaps == []
    assert peak == workers
    assert runs == dict.fromkeys(range(keys), 2)
    s = q.stats()
    assert (s.processing, s.gets, s.dones, s.redeliveries) == (0, 2 * keys, 2 * keys, keys)


async def test_stop_event_finishes_in_flight_handlers_and_returns() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("stop")
    stop = asyncio.Event()
    gate = asyncio.Event()
    started: list[str] = []
    finished: list[str] = []
    both = asyncio.Event()

    async def handler(key: str) -> None:
        started.append(key)
        if len(started) == 2:
            both.set()
        await gate.wait()
        finished.append(key)

    q.add("a")
    q.add("b")
    runner = asyncio.create_task(arun_workers(q, handler, workers=3, stop=stop))
    await asyncio.wait_for(both.wait(), BOUND)  # two busy, one idle in get

    stop.set()
    q.add("c")  # arrives as the idle worker is being stopped: must not be lost
    await settle()
    assert not runner.done()  # still finishing a and b

    gate.set()
    await asyncio.wait_for(runner, BOUND)

    assert sorted(finished) == ["a", "b"]
    s = q.stats()
    assert (s.processing, s.dones, s.shutting_down) == (0, 2, False)
    assert q.get_nowait() == "c"


async def test_stop_set_by_a_handler_takes_no_further_key() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("stop-in-handler")
    stop = asyncio.Event()
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)
        await asyncio.sleep(0)
        stop.set()  # e.g. the controller decided to stop: finish this key, take no other

    for key in ["a", "b", "c"]:
        q.add(key)
    await asyncio.wait_for(arun_workers(q, handler, workers=1, stop=stop), BOUND)

    assert handled == ["a"]
    assert len(q) == 2
    assert q.stats().processing == 0


async def test_stop_set_before_the_runner_starts_handles_no_key() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("stop-preset")
    stop = asyncio.Event()
    stop.set()
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    q.add("a")
    q.add("b")
    await asyncio.wait_for(arun_workers(q, handler, workers=2, stop=stop), BOUND)

    assert handled == []  # as run_workers with a set threading.Event
    assert len(q) == 2
    assert q.stats().gets == 0


async def test_arun_workers_returns_when_the_queue_is_shut_down() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("shut")
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    runner = asyncio.create_task(arun_workers(q, handler, workers=3))
    await settle()  # every worker waits in get

    assert await q.shutdown() is True

    await asyncio.wait_for(runner, BOUND)
    assert handled == []
    with pytest.raises(ShutDown):
        q.get_nowait()


async def test_arun_workers_requeue_on_a_fake_clock() -> None:
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("requeue", clock=clock)
    calls: list[float] = []
    first_done = asyncio.Event()
    second_done = asyncio.Event()

    async def handler(key: str) -> Requeue | None:
        calls.append(clock.now())
        if len(calls) == 1:
            return Requeue(after=3)
        return None

    def observe(event: Event[str]) -> None:
        if event.kind is EventKind.DONE:
            (second_done if first_done.is_set() else first_done).set()

    q.subscribe(observe)
    q.add("a")
    runner = asyncio.create_task(arun_workers(q, handler))
    await asyncio.wait_for(first_done.wait(), BOUND)
    clock.step(2.5)
    await settle()
    assert calls == [0.0]
    clock.step(0.5)
    await asyncio.wait_for(second_done.wait(), BOUND)
    assert await q.shutdown(drain=True, timeout=BOUND)
    await asyncio.wait_for(runner, BOUND)

    assert calls == [0.0, 3.0]


async def test_arun_workers_accepts_an_async_on_give_up() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue(
        "give-up", rate_limiter=ItemFastSlowRateLimiter(0, 0, 1), max_retries=2
    )
    given_up: list[tuple[str, str]] = []
    gave_up = asyncio.Event()

    async def handler(key: str) -> None:
        raise RuntimeError(f"{key} broke")

    async def on_give_up(key: str, exc: BaseException) -> None:
        await asyncio.sleep(0)
        given_up.append((key, str(exc)))
        gave_up.set()

    q.add("a")
    runner = asyncio.create_task(arun_workers(q, handler, on_give_up=on_give_up))
    await asyncio.wait_for(gave_up.wait(), BOUND)
    assert await q.shutdown(drain=True, timeout=BOUND)
    await asyncio.wait_for(runner, BOUND)

    assert given_up == [("a", "a broke")]
    s = q.stats()
    assert (s.gets, s.dones, s.processing) == (2, 2, 0)


# -- foreign threads --------------------------------------------------------------


async def test_add_from_a_foreign_thread_reaches_a_waiting_get_on_the_loop_thread() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-add")
    applied_on: list[tuple[EventKind, int]] = []
    q.subscribe(lambda event: applied_on.append((event.kind, threading.get_ident())))
    getter = asyncio.create_task(q.get())
    await settle()

    thread = threading.Thread(target=q.add, args=("x",))
    thread.start()

    assert await asyncio.wait_for(getter, BOUND) == "x"
    await join(thread)
    loop_thread = threading.get_ident()
    assert applied_on == [(EventKind.ENQUEUE, loop_thread), (EventKind.GET, loop_thread)]


async def test_add_after_from_a_foreign_thread_reaches_the_loop_timer() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-delay")
    getter = asyncio.create_task(q.get())
    await settle()

    applied_on: list[int] = []
    q.subscribe(lambda event: applied_on.append(threading.get_ident()))

    thread = threading.Thread(target=q.add_after, args=("y", 0.01))
    thread.start()

    assert await asyncio.wait_for(getter, BOUND) == "y"
    await join(thread)
    assert q.stats().retries == 1
    assert set(applied_on) == {threading.get_ident()}  # DELAY, ENQUEUE, GET: all on the loop


async def test_add_rate_limited_from_a_foreign_thread_reaches_the_loop() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue(
        "foreign-rate", rate_limiter=ItemFastSlowRateLimiter(0.01, 1, 1)
    )
    getter = asyncio.create_task(q.get())
    await settle()

    thread = threading.Thread(target=q.add_rate_limited, args=("z",))
    thread.start()

    assert await asyncio.wait_for(getter, BOUND) == "z"
    await join(thread)
    assert q.stats().rate_limited == 1


async def test_fair_by_errors_of_adds_from_a_foreign_thread_are_raised_in_that_thread() -> None:
    def group(key: str) -> str:
        if key == "bad":
            raise LookupError(key)
        return "g"

    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-fair", fair_by=group)
    for call, args in (
        (q.add, ("bad",)),
        (q.add_many, (["ok", "bad"],)),
        (q.add_after, ("bad", 5)),
        (q.add_rate_limited, ("bad",)),
    ):
        with pytest.raises(LookupError):
            await asyncio.to_thread(call, *args)
    await settle()
    s = q.stats()
    assert (s.adds, s.depth, s.delayed) == (0, 0, 0)


async def test_many_adds_from_foreign_threads_are_coalesced_and_none_lost() -> None:
    q: AsyncWorkQueue[int] = AsyncWorkQueue("foreign-many")

    def produce() -> None:
        for key in range(50):
            q.add(key)

    threads = [threading.Thread(target=produce) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        await join(thread)
    await wait_for_state(lambda: q.stats().adds == 200, "every add to land")

    s = q.stats()
    assert (s.enqueued, s.coalesced, s.depth) == (50, 150, 50)
    assert sorted(q.get_nowait() for _ in range(50)) == list(range(50))


async def test_add_after_then_step_from_a_foreign_thread_land_in_order() -> None:
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-step", clock=clock)
    getter = asyncio.create_task(q.get())
    await settle()

    def feed() -> None:
        q.add_after("k", 5)
        clock.step(5)

    thread = threading.Thread(target=feed)
    thread.start()

    assert await asyncio.wait_for(getter, BOUND) == "k"
    await join(thread)
    assert q.stats().delayed == 0


async def test_shutdown_from_another_thread_via_run_coroutine_threadsafe() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-shutdown")
    loop = asyncio.get_running_loop()
    getter = asyncio.create_task(q.get())
    await settle()
    results: list[bool] = []

    def stop() -> None:
        results.append(asyncio.run_coroutine_threadsafe(q.shutdown(), loop).result(BOUND))

    thread = threading.Thread(target=stop)
    thread.start()

    with pytest.raises(ShutDown):
        await asyncio.wait_for(getter, BOUND)
    await join(thread)
    assert results == [True]
    assert q.shutting_down


async def test_drain_from_another_thread_waits_for_the_loop_to_finish_its_key() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-drain")
    loop = asyncio.get_running_loop()
    q.add("a")
    key = q.get_nowait()
    results: list[bool] = []

    def drain() -> None:
        future = asyncio.run_coroutine_threadsafe(q.shutdown(drain=True, timeout=BOUND), loop)
        results.append(future.result(BOUND * 2))

    thread = threading.Thread(target=drain)
    thread.start()
    await wait_for_state(lambda: q.shutting_down, "the drain to begin")
    await settle()
    assert results == []  # still waiting for "a"

    q.done(key)
    await join(thread)
    assert results == [True]


# -- FakeClock and the loop ----------------------------------------------------


async def test_fake_clock_step_on_the_loop_releases_before_step_returns() -> None:
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("step", clock=clock)
    q.add_after("a", 1)
    q.add_after("b", 2)

    clock.step(1)
    assert q.get_nowait() == "a"  # no loop turn needed
    with pytest.raises(Empty):
        q.get_nowait()
    clock.step(1)
    assert q.get_nowait() == "b"


async def test_fake_clock_step_wakes_a_waiting_get() -> None:
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("step-wake", clock=clock)
    getter = asyncio.create_task(q.get())
    q.add_after("a", 10)
    await settle()
    assert not getter.done()

    clock.step(9.5)
    await settle()
    assert not getter.done()  # not before its time

    clock.step(0.5)
    assert await asyncio.wait_for(getter, BOUND) == "a"


async def test_fake_clock_step_from_another_thread_releases_on_the_loop() -> None:
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("step-thread", clock=clock)
    q.add_after("a", 3)
    getter = asyncio.create_task(q.get())
    await settle()

    thread = threading.Thread(target=clock.step, args=(3,))
    thread.start()

    assert await asyncio.wait_for(getter, BOUND) == "a"
    await join(thread)


# -- which loop a queue binds to ------------------------------------------------------


def test_queue_created_outside_a_loop_binds_to_the_loop_of_first_use() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("late-bind")
    q.add("early")  # no loop anywhere: applied directly

    async def first() -> list[str]:
        got = [await q.get()]
        q.done(got[0])
        waiter = asyncio.create_task(q.get())  # binds here
        await settle()
        thread = threading.Thread(target=q.add, args=("from-thread",))
        thread.start()  # hops onto this loop
        got.append(await asyncio.wait_for(waiter, BOUND))
        q.done(got[1])
        await join(thread)
        return got

    assert asyncio.run(first()) == ["early", "from-thread"]

    async def second() -> None:
        with pytest.raises(RuntimeError, match="different event loop"):
            await asyncio.wait_for(q.get(), BOUND)
        with pytest.raises(RuntimeError, match="different event loop"):
            await q.shutdown()

    asyncio.run(second())
    assert q.stats().processing == 0


def test_delay_requested_before_binding_is_timed_on_the_loop_of_first_use() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("bind-timer")
    q.add_after("k", 0.01)

    async def main() -> str:
        return await asyncio.wait_for(q.get(), BOUND)

    assert asyncio.run(main()) == "k"


# -- the real-clock loop timer ------------------------------------------------------


async def test_loop_timer_fires_add_after_on_the_real_clock() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("timer")
    q.add_after("k", 0.01)
    with pytest.raises(Empty):
        q.get_nowait()

    assert await asyncio.wait_for(q.get(), BOUND) == "k"
    assert q.stats().delayed == 0


async def test_loop_timer_is_re_armed_for_an_earlier_ready_time() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("re-arm")
    q.add_after("late", 3600)
    q.add_after("soon", 0.01)

    assert await asyncio.wait_for(q.get(), BOUND) == "soon"
    with pytest.raises(Empty):
        q.get_nowait()
    assert q.stats().delayed == 1
    await q.shutdown()
    assert q.stats().delayed == 0


async def test_many_delayed_keys_come_out_in_ready_time_order_from_one_timer() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("order")
    delays = {f"k{i:02d}": 0.005 * (i + 1) for i in range(25)}
    names = list(delays)
    random.Random(7).shuffle(names)
    for name in names:
        q.add_after(name, delays[name])
    assert q.stats().delayed == 25

    got = []
    for _ in range(25):
        key = await asyncio.wait_for(q.get(), BOUND)
        q.done(key)
        got.append(key)

    assert got == sorted(delays)
    assert q.stats().delayed == 0


async def test_shutdown_cancels_the_loop_timer_and_drops_delayed_keys() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("timer-shutdown")
    q.add_after("k", 0.01)
    await q.shutdown()

    with pytest.raises(ShutDown):
        await asyncio.wait_for(q.get(), BOUND)
    assert q.stats().delayed == 0


async def test_foreign_add_after_landing_after_a_clock_step_is_released_once_due() -> None:
    # The delay runs from the call: asked at t=0 for 1 s, it is due at t=1 even
    # though the hop onto the loop lands after the loop stepped to t=5.
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("hop", clock=clock)
    thread = threading.Thread(target=q.add_after, args=("k", 1))
    thread.start()
    thread.join(BOUND)  # queued with call_soon_threadsafe, not yet applied
    assert not thread.is_alive()
    clock.step(5)  # on the loop: nothing is due yet
    for _ in range(5):
        await asyncio.sleep(0)  # the hopped add_after lands
    assert q.stats().delayed == 0, "ready at t=1 but still delayed at t=5"
    assert q.get_nowait() == "k"


def test_foreign_adds_after_shutdown_and_loop_close_are_silent_no_ops() -> None:
    holder: list[AsyncWorkQueue[str]] = []

    async def main() -> None:
        q: AsyncWorkQueue[str] = AsyncWorkQueue("closed")
        holder.append(q)
        await q.shutdown()

    asyncio.run(main())  # the queue's loop is closed now
    q = holder[0]
    errors: list[BaseException] = []

    def informer() -> None:  # an informer may still fire after shutdown
        for call in (lambda: q.add("late"), lambda: q.add_after("late", 1)):
            try:
                call()
            except BaseException as exc:
                errors.append(exc)

    thread = threading.Thread(target=informer)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive()
    assert errors == []
    assert q.stats().adds == 0


# -- other threads: adds before shutdown, blocking calls, bad input -------------------


def in_thread(fn: Callable[[], T]) -> T:
    """Run ``fn`` in a new thread and wait for it, blocking this one (bounded).

    Returns what ``fn`` returned, or raises here what it raised there.
    """
    results: list[T] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            results.append(fn())
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join(BOUND)
    assert not thread.is_alive()
    if errors:
        raise errors[0]
    return results[0]


@pytest.mark.parametrize("call", ["add", "add_after_zero"])
async def test_foreign_add_that_returned_before_shutdown_is_accepted_and_drained(
    call: str,
) -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("add-then-drain")
    handled: list[str] = []

    async def worker() -> None:
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            handled.append(key)
            q.done(key)

    consumer = asyncio.create_task(worker())
    await settle()  # the worker waits in get
    if call == "add":
        in_thread(lambda: q.add("k"))  # returned, but the loop has not run since
    else:
        in_thread(lambda: q.add_after("k", 0))

    assert await q.shutdown(drain=True, timeout=BOUND) is True

    await asyncio.wait_for(consumer, BOUND)
    assert handled == ["k"]
    s = q.stats()
    assert (s.adds, s.gets, s.dones) == (1, 1, 1)


async def test_done_from_a_foreign_thread_runs_on_the_loop_and_wakes_a_waiting_get() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("foreign-done")
    applied_on: list[tuple[EventKind, int]] = []
    q.subscribe(lambda event: applied_on.append((event.kind, threading.get_ident())))
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # changed while held: owed one redelivery
    getter = asyncio.create_task(q.get())
    await settle()  # waits for that redelivery

    thread = threading.Thread(target=q.done, args=("a",))
    thread.start()

    assert await asyncio.wait_for(getter, BOUND) == "a"
    await join(thread)
    here = threading.get_ident()
    assert applied_on == [
        (EventKind.ENQUEUE, here),
        (EventKind.GET, here),
        (EventKind.MARK_WHILE_PROCESSING, here),
        (EventKind.DONE, here),
        (EventKind.REDELIVER, here),
        (EventKind.GET, here),
    ]


async def test_blocking_calls_from_a_foreign_thread_run_on_the_loop_and_return_or_raise_there() -> (
    None
):
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue(
        "foreign-calls", clock=clock, rate_limiter=ItemFastSlowRateLimiter(5, 10, 3)
    )
    applied_on: set[int] = set()
    q.subscribe(lambda event: applied_on.add(threading.get_ident()))
    q.add("a")
    outcomes: list[object] = []

    def attempt(call: Callable[[], object]) -> None:
        try:
            outcomes.append(call())
        except Exception as exc:
            outcomes.append(type(exc))

    def foreign() -> None:
        attempt(q.get_nowait)
        attempt(q.get_nowait)  # nothing else waits: Empty
        attempt(lambda: q.done("b"))  # not held: ValueError, raised here
        attempt(lambda: q.retry("a"))  # a rate-limited re-add, applied on the loop
        attempt(lambda: q.num_requeues("a"))
        attempt(lambda: q.forget("a"))
        attempt(lambda: q.num_requeues("a"))
        attempt(lambda: q.done("a"))
        attempt(q.stats)

    await asyncio.to_thread(foreign)

    stats = outcomes.pop()
    assert outcomes == ["a", Empty, ValueError, True, 1, None, 0, None]
    assert isinstance(stats, Stats)
    assert (stats.gets, stats.dones, stats.retries, stats.rate_limited) == (1, 1, 1, 1)
    assert stats.delayed == 1  # "a" comes back after its backoff
    await q.shutdown()
    outcomes.clear()
    await asyncio.to_thread(attempt, q.get_nowait)
    assert outcomes == [ShutDown]
    assert applied_on == {threading.get_ident()}  # every transition ran on the loop


def test_blocking_calls_from_a_foreign_thread_raise_runtime_error_unless_the_loop_runs() -> None:
    loop = asyncio.new_event_loop()

    async def make() -> AsyncWorkQueue[str]:
        return AsyncWorkQueue("not-running")

    q = loop.run_until_complete(make())  # bound to loop, which is not running now
    q.add("a")  # on the loop's thread: applied here

    def attempts() -> list[str]:
        calls: list[Callable[[], object]] = [
            q.get_nowait,
            lambda: q.done("a"),
            lambda: q.retry("a"),
            lambda: q.forget("a"),
            q.stats,
        ]
        messages = []
        for call in calls:
            try:
                call()
            except RuntimeError as exc:
                messages.append(str(exc))
        return messages

    try:
        messages = in_thread(attempts)
        assert len(messages) == 5
        assert all("event loop is not running" in message for message in messages)
        in_thread(lambda: q.add("b"))  # fire and forget: lands once the loop runs
        loop.run_until_complete(asyncio.sleep(0))
    finally:
        loop.close()
    messages = in_thread(attempts)
    assert len(messages) == 5
    assert all("event loop is closed" in message for message in messages)
    with pytest.raises(RuntimeError, match="event loop is closed"):
        in_thread(lambda: q.add("c"))
    s = q.stats()  # on the loop's thread: read here
    assert (s.depth, s.gets, s.retries, s.adds) == (2, 0, 0, 2)


def test_a_foreign_call_waiting_when_the_loop_stops_raises_and_is_never_applied() -> None:
    loop = asyncio.new_event_loop()
    outcome: list[object] = []
    threads: list[threading.Thread] = []

    def take(q: AsyncWorkQueue[str]) -> None:
        try:
            outcome.append(q.get_nowait())
        except RuntimeError as exc:
            outcome.append(str(exc))

    async def main() -> AsyncWorkQueue[str]:
        q: AsyncWorkQueue[str] = AsyncWorkQueue("stops")
        q.add("a")
        loop.stop()  # the loop ends after this turn...
        threads.append(threading.Thread(target=take, args=(q,)))
        threads[0].start()
        deadline = time.monotonic() + BOUND
        while not q._inbox:  # ...and the call is posted during it, so never taken
            assert time.monotonic() < deadline, "the call was not posted"
            time.sleep(0.001)
        return q

    try:
        q = loop.run_until_complete(main())
        threads[0].join(BOUND)
        assert not threads[0].is_alive()
        assert len(outcome) == 1
        assert "stopped before running the call" in str(outcome[0])
        loop.call_soon(loop.stop)
        loop.run_forever()  # one more turn: the loop finds the call withdrawn
        assert (len(q), q.stats().gets) == (1, 0)
    finally:
        loop.close()


async def test_bad_input_from_a_foreign_thread_raises_there_and_changes_nothing() -> None:
    clock = FakeClock()
    bucket = BucketRateLimiter(1, 1, clock=clock)  # one token
    q: AsyncWorkQueue[Any] = AsyncWorkQueue("foreign-bad", clock=clock, rate_limiter=bucket)
    loop_errors: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda _, context: loop_errors.append(context))
    events: list[Event[Any]] = []
    q.subscribe(events.append)
    before = q.stats()
    calls: list[Callable[[], None]] = [
        lambda: q.add([1]),
        lambda: q.add_after("k", Decimal(1)),
        lambda: q.add_after("k", True),
        lambda: q.add_after([1], 1),
        lambda: q.add_after("k", math.nan),
        lambda: q.add_rate_limited([1]),
    ]

    def foreign() -> list[type[Exception] | None]:
        raised: list[type[Exception] | None] = []
        for call in calls:
            try:
                call()
                raised.append(None)
            except (TypeError, ValueError) as exc:
                raised.append(type(exc))
        return raised

    raised = await asyncio.to_thread(foreign)
    await settle()

    assert raised == [TypeError, TypeError, TypeError, TypeError, ValueError, TypeError]
    assert loop_errors == []
    assert events == []
    assert q.stats() == before
    assert bucket.when("other") == 0.0  # no token spent on the unhashable key


# -- get with a timeout (wall seconds) --------------------------------------------------


async def test_get_timeout_expires_in_wall_time_on_a_fake_clock() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("wall", clock=FakeClock())
    q.add_after("k", 1)  # due only when the fake clock steps, which it never does
    started = time.monotonic()

    with pytest.raises(Empty):
        await q.get(timeout=0.05)

    assert time.monotonic() - started >= 0.04
    assert q.stats().delayed == 1
    assert not q._getters  # the expired get left no waiter behind


async def test_get_timeout_returns_a_key_that_arrives_in_time_and_zero_takes_a_waiting_key() -> (
    None
):
    q: AsyncWorkQueue[str] = AsyncWorkQueue("in-time")
    getter = asyncio.create_task(q.get(timeout=BOUND))
    infinite = asyncio.create_task(q.get(timeout=math.inf))
    await settle()
    q.add("a")
    q.add("b")

    assert await asyncio.wait_for(getter, BOUND) == "a"
    assert await asyncio.wait_for(infinite, BOUND) == "b"
    q.add("c")
    assert await q.get(timeout=0) == "c"
    with pytest.raises(Empty):
        await q.get(timeout=0)
    with pytest.raises(ValueError, match="timeout"):
        await q.get(timeout=-1)


async def test_expired_get_takes_no_key_and_shutdown_ends_a_timed_get_with_shutdown() -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("expired")
    with pytest.raises(Empty):
        await q.get(timeout=0.01)
    getter = asyncio.create_task(q.get())
    await settle()

    q.add("a")

    assert await asyncio.wait_for(getter, BOUND) == "a"  # the expired get absorbed nothing
    timed = asyncio.create_task(q.get(timeout=BOUND))
    await settle()
    await q.shutdown()
    with pytest.raises(ShutDown):
        await asyncio.wait_for(timed, BOUND)


# -- the README's promises: loop binding, foreign producers under load ----------------


def test_queue_binds_to_the_loop_running_at_creation_and_refuses_another_loop() -> None:
    home = asyncio.new_event_loop()
    runner = threading.Thread(target=home.run_forever)
    runner.start()
    try:

        async def create() -> AsyncWorkQueue[str]:
            q: AsyncWorkQueue[str] = AsyncWorkQueue("home")
            q.add("a")
            return q

        q = asyncio.run_coroutine_threadsafe(create(), home).result(BOUND)

        async def elsewhere() -> list[str]:
            errors = []
            attempts: list[Callable[[], Awaitable[object]]] = [
                q.get,  # even with "a" waiting: no key leaves for another loop
                lambda: q.get(timeout=1),
                q.shutdown,
            ]
            for attempt in attempts:
                try:
                    await attempt()
                except RuntimeError as exc:
                    errors.append(str(exc))
            return errors

        errors = asyncio.run(elsewhere())  # a second loop, first to use the queue

        assert len(errors) == 3
        assert all("different event loop" in error for error in errors)
        s = q.stats()  # from this thread: taken on the home loop
        assert (s.depth, s.gets, s.shutting_down) == (1, 0, False)
        assert asyncio.run_coroutine_threadsafe(q.shutdown(), home).result(BOUND) is True
    finally:
        home.call_soon_threadsafe(home.stop)
        runner.join(BOUND)
        assert not runner.is_alive()
        home.close()


async def test_foreign_producers_and_async_consumers_lose_nothing_and_never_share_a_key() -> None:
    producers, adds_each, consumers = 4, 2_000, 8
    keys = [f"k{i}" for i in range(40)]
    q: AsyncWorkQueue[str] = AsyncWorkQueue("storm")
    events: list[tuple[EventKind, str]] = []
    q.subscribe(lambda event: events.append((event.kind, event.key)))  # on the loop, in order
    held: set[str] = set()
    shared: list[str] = []
    gets = dones = 0

    async def consume() -> None:
        nonlocal gets, dones
        while True:
            try:
                key = await q.get()
            except ShutDown:
                return
            gets += 1
            if key in held:
                shared.append(key)
            held.add(key)
            await asyncio.sleep(0)  # hold it across a loop turn: adds land meanwhile
            held.discard(key)
            if gets % 5 == 0:
                await asyncio.to_thread(q.done, key)  # released from another thread
            else:
                q.done(key)
            dones += 1

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        for i in range(adds_each):
            q.add(rng.choice(keys))
            if i % 3 == 0:
                time.sleep(0)  # yield, so adds interleave with the loop's gets and dones

    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # switch threads often, so adds land while keys are held
    try:
        tasks = [asyncio.create_task(consume()) for _ in range(consumers)]
        threads = [threading.Thread(target=produce, args=(seed,)) for seed in range(producers)]
        for thread in threads:
            thread.start()
        for thread in threads:
            await join(thread)
        assert await q.shutdown(drain=True, timeout=30) is True
        await asyncio.wait_for(asyncio.gather(*tasks), BOUND)
    finally:
        sys.setswitchinterval(switch)

    assert shared == []  # no key held twice
    kinds = Counter(kind for kind, _ in events)
    s = q.stats()
    # Counters against counts this test made: its add calls, gets, dones and the events.
    assert s.adds == producers * adds_each
    assert (s.enqueued, s.coalesced, s.marked_while_processing, s.redeliveries) == (
        kinds[EventKind.ENQUEUE],
        kinds[EventKind.COALESCE],
        kinds[EventKind.MARK_WHILE_PROCESSING],
        kinds[EventKind.REDELIVER],
    )
    assert s.adds == s.enqueued + s.coalesced + s.marked_while_processing
    assert s.gets == gets == kinds[EventKind.GET] == s.enqueued + s.redeliveries
    assert s.dones == dones == kinds[EventKind.DONE] == gets
    assert s.marked_while_processing > 0  # the storm did land adds on held keys
    assert (s.depth, s.processing) == (0, 0)
    # No change lost: after each key's last add, the key was handed out again.
    last_add: dict[str, int] = {}
    last_get: dict[str, int] = {}
    added = {EventKind.ENQUEUE, EventKind.COALESCE, EventKind.MARK_WHILE_PROCESSING}
    for at, (kind, key) in enumerate(events):
        if kind in added:
            last_add[key] = at
        elif kind is EventKind.GET:
            last_get[key] = at
    assert set(last_add) == set(keys)
    assert all(last_get[key] > at for key, at in last_add.items())


@pytest.mark.parametrize("delay", [1e300, 3600.0])
async def test_dropped_queue_with_a_far_delayed_key_is_collected_though_its_loop_timer_is_armed(
    delay: float,
) -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("dropped")  # real clock: a loop.call_at timer
    q.add_after("k", delay)
    q.add_after("first", 0.001)
    assert await q.get(timeout=5) == "first"  # the timer fired once and was re-armed
    q.done("first")
    ref = weakref.ref(q)

    del q
    gc.collect()

    assert ref() is None


# -- the inbox, the loop timer and retry at shutdown -------------------------------


async def test_arun_workers_failure_during_a_drain_of_a_key_re_added_while_held_redelivers_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    q: AsyncWorkQueue[str] = AsyncWorkQueue("drain-dirty", max_retries=5)
    started, release = asyncio.Event(), asyncio.Event()
    calls: list[str] = []
    given_up: list[str] = []

    async def handler(key: str) -> None:
        calls.append(key)
        if len(calls) == 1:
            started.set()
            await release.wait()
            raise RuntimeError("failed with a change pending")

    q.add("a")
    runner = asyncio.create_task(
        arun_workers(q, handler, on_give_up=lambda k, e: given_up.append(k))
    )
    await asyncio.wait_for(started.wait(), BOUND)
    q.add("a")  # changed while held: owed one redelivery
    drain = asyncio.create_task(q.shutdown(drain=True, timeout=BOUND))
    await settle()
    assert q.shutting_down
    assert not drain.done()
    release.set()

    assert await asyncio.wait_for(drain, BOUND) is True
    stats = await asyncio.wait_for(runner, BOUND)
    assert calls == ["a", "a"]  # the change that arrived while it was held was handled
    assert given_up == []
    assert "giving up" not in caplog.text
    s = q.stats()
    assert (s.gets, s.dones, s.redeliveries, s.retries, s.delayed) == (2, 2, 1, 0, 0)
    assert (stats.processed, stats.retried, stats.succeeded, stats.gave_up) == (2, 1, 1, 0)


async def test_foreign_add_re_entered_during_its_own_post_does_not_deadlock() -> None:
    # A signal handler, __del__ or weakref callback may call add on a thread that
    # is itself inside add: the inbox takes no lock, so the second add just joins it.
    q: AsyncWorkQueue[str] = AsyncWorkQueue("re-entered")
    loop = asyncio.get_running_loop()
    real = loop.call_soon_threadsafe
    re_entered: list[str] = []

    def call_soon_threadsafe(callback: Callable[..., object], *args: Any) -> asyncio.Handle:
        if not re_entered:
            re_entered.append("once")
            q.add("re-entered")  # as a signal handler running at this point would
        return real(callback, *args)

    loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign]
    try:
        thread = threading.Thread(target=q.add, args=("k",), daemon=True)
        thread.start()
        thread.join(BOUND)
        assert not thread.is_alive(), "the foreign add deadlocked on its own post"
    finally:
        del loop.call_soon_threadsafe  # type: ignore[method-assign]
    await settle()

    assert re_entered == ["once"]
    assert [q.get_nowait(), q.get_nowait()] == ["k", "re-entered"]


def test_foreign_add_raises_once_the_loop_closed_with_a_post_still_pending() -> None:
    loop = asyncio.new_event_loop()

    async def make() -> AsyncWorkQueue[str]:
        return AsyncWorkQueue("closed-pending", clock=FakeClock())

    q = loop.run_until_complete(make())
    in_thread(lambda: q.add("a"))  # posted; the loop is not running, so it stays pending
    loop.close()  # ...and now never runs

    calls: list[Callable[[], None]] = [
        lambda: q.add("b"),
        lambda: q.add_after("b", 1),
        lambda: q.add_after("b", 0),
        lambda: q.add_rate_limited("b"),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match="event loop is closed"):
            in_thread(call)
    assert q.stats().adds == 0  # on the loop's thread: read here


async def test_foreign_post_failing_but_not_for_a_closed_loop_raises_as_is_and_adds_nothing() -> (
    None
):
    q: AsyncWorkQueue[str] = AsyncWorkQueue("post-error")
    loop = asyncio.get_running_loop()

    def call_soon_threadsafe(callback: Callable[..., object], *args: Any) -> asyncio.Handle:
        raise RecursionError("maximum recursion depth exceeded")

    loop.call_soon_threadsafe = call_soon_threadsafe  # type: ignore[method-assign]
    try:
        with pytest.raises(RecursionError):  # not dressed up as "event loop is closed"
            in_thread(lambda: q.add("a"))
    finally:
        del loop.call_soon_threadsafe  # type: ignore[method-assign]
    in_thread(lambda: q.add("b"))  # the failed post left nothing stuck: this one is posted
    await settle()

    assert q.get_nowait() == "b"
    assert q.stats().adds == 1


async def test_foreign_add_after_without_a_delay_takes_its_time_on_the_loop_as_add_does() -> None:
    clock = FakeClock()
    q: AsyncWorkQueue[str] = AsyncWorkQueue("hop-now", clock=clock)
    events: list[tuple[EventKind, str | None, float]] = []
    q.subscribe(lambda event: events.append((event.kind, event.key, event.time)))
    in_thread(lambda: q.add_after("k", 0))  # asked at t=0, not applied yet
    clock.step(5)
    q.add("first")  # on the loop, at t=5
    await settle()  # the foreign add_after lands: its add is at t=5 too, not back at t=0

    assert events == [
        (EventKind.ENQUEUE, "first", 5.0),
        (EventKind.DELAY, "k", 5.0),
        (EventKind.ENQUEUE, "k", 5.0),
    ]
    assert [q.get_nowait(), q.get_nowait()] == ["first", "k"]
    assert q.stats().queue_wait_seconds == 0.0


async def test_dropped_queues_leave_no_timer_in_their_loop() -> None:
    # Reads asyncio's private schedule: what the loop keeps for a dropped queue.
    loop = asyncio.get_running_loop()
    before = len(loop._scheduled)  # type: ignore[attr-defined]
    queues = [AsyncWorkQueue[str](f"dropped-{i}") for i in range(1000)]
    for q in queues:
        q.add_after("k", 3600.0)  # real clock: one loop.call_at timer each
    assert len(loop._scheduled) == before + 1000  # type: ignore[attr-defined]
    refs = [weakref.ref(q) for q in queues]

    del queues, q
    gc.collect()
    await asyncio.sleep(0)  # one loop turn: the loop sweeps out cancelled timers

    assert all(ref() is None for ref in refs)
    assert len(loop._scheduled) == before  # type: ignore[attr-defined]
