"""The batched claims path at its edges, one scenario each.

Where a docstring tells what went wrong (in the past tense of the code it
names), that is the fault the test rules out; the test checks the behaviour:

1. two claims of one client in flight: claims that take keys are one at a
   time per client, so a claim whose reply is lost is recovered from the
   client's one claim record, and none of its keys is given up;
2. batching is an option (``batch=``), and a replaced ``get``/``done`` on a
   batched queue is refused at once; a replaced ``forget`` is called;
3. a claimed key whose lease was taken back while it waited for a worker is
   put back, not handed out;
4. the keys claimed and left at stop go back in one script, and a second
   Ctrl-C puts the running handlers' keys back (asyncio: keeps the changes of
   cancelled handlers);
5. a ``MaxConnectionsError`` is said once, nothing having been sent, and the
   holds stay renewed;
6. ``LEASE_LOST`` is emitted once when a renewal and a done both learn it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

import keyqueue
from keyqueue import EventKind, ItemFastSlowRateLimiter, RunStats
from keyqueue._flow import drive
from keyqueue._source import worker_source
from keyqueue.redis import AsyncRedisWorkQueue, LeaseLost, RedisWorkQueue
from keyqueue.redis._claims import Claims
from keyqueue.testing import FakeClock
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a local limiter that retries at once
WAIT = 10.0  # generous bound, wall seconds, on a wait for the workers
SRC = Path(__file__).resolve().parents[2] / "src"


def wait_until(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def idle(q: RedisWorkQueue) -> bool:
    s = q.stats()
    return s.depth == s.processing == s.delayed == 0


async def aidle(q: AsyncRedisWorkQueue) -> bool:
    s = await q.stats()
    return s.depth == s.processing == s.delayed == 0


def scripts_of(q: RedisWorkQueue) -> list[str]:
    """The scripts ``q`` runs from now on (recorded)."""
    seen: list[str] = []
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        seen.append(script)
        return real(script, args)

    q._run = run  # type: ignore[method-assign]  # on the instance: a private hook, honoured
    return seen


# -- 1. several claims of one client in flight --------------------------------------------


def test_two_runs_on_one_client_recover_a_claim_whose_reply_was_lost(
    valkey_url: str, name: str
) -> None:
    """Two run_workers on one RedisWorkQueue, each with its own ClaimBook, made
    claims at once. claim.lua kept one record per client (SET of the last
    claim's keys): the second claim's record replaced the first's, so when the
    first's reply was lost the next claim had nothing to hand back, and its
    keys were given up after their lease (max_retries=1), unprocessed
    (reproduced every time with this interleaving: the second claim runs
    while the first's reply is held, then the first's reply is lost)."""
    q = RedisWorkQueue(name, url=valkey_url, lease=5.0, max_retries=1)
    adder = RedisWorkQueue(name, url=valkey_url)
    real = q._run
    lost: list[list[str]] = []  # the keys of the claim whose reply was lost
    other_ran = threading.Event()

    def run(script: str, args: list[str]) -> Any:
        reply = real(script, args)
        if script == "claim" and reply[2]:
            if not lost:
                lost.append([k.decode() for k in reply[2][::2]])
                # Another claim that takes keys may run now, before this reply
                # is read (it cannot: it waits for this one; 1 s, then go on).
                other_ran.wait(1.0)
                raise redis.exceptions.ConnectionError("reply lost")
            other_ran.set()
        return reply

    q._run = run  # type: ignore[method-assign]
    handled: list[str] = []
    stops = [threading.Event(), threading.Event()]
    runs = [
        threading.Thread(target=keyqueue.run_workers, args=(q, handled.append, 2, stop))
        for stop in stops
    ]
    try:
        for runner in runs:
            runner.start()
        wait_until(lambda: q._getters >= 4, "the four workers did not wait in get")
        keys = [f"k{i}" for i in range(8)]
        adder.add_many(keys)
        wait_until(lambda: len(handled) >= len(keys) and idle(adder), "not all handled", 4.0)
        assert lost
        assert len(lost[0]) >= 1
        assert sorted(handled) == keys
        s = adder.stats()
        back = len(lost[0])  # handed back (a done each), then handed out again
        assert (s.leases_expired, s.gets, s.dones) == (0, 8 + back, 8 + back)
    finally:
        for stop in stops:
            stop.set()
        for runner in runs:
            runner.join(WAIT)
        q.close()
        adder.close()


async def test_two_async_runs_on_one_client_recover_a_claim_whose_reply_was_lost(
    valkey_url: str, name: str
) -> None:
    """The same on the loop: two arun_workers on one AsyncRedisWorkQueue."""
    q = AsyncRedisWorkQueue(name, url=valkey_url, lease=5.0, max_retries=1)
    adder = AsyncRedisWorkQueue(name, url=valkey_url)
    real = q._run
    lost: list[list[str]] = []
    other_ran = asyncio.Event()

    async def run(script: str, args: list[str]) -> Any:
        reply = await real(script, args)
        if script == "claim" and reply[2]:
            if not lost:
                lost.append([k.decode() for k in reply[2][::2]])
                try:
                    await asyncio.wait_for(other_ran.wait(), 1.0)
                except TimeoutError:
                    pass
                raise redis.exceptions.ConnectionError("reply lost")
            other_ran.set()
        return reply

    q._run = run  # type: ignore[method-assign]
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    stops = [asyncio.Event(), asyncio.Event()]
    runs = [asyncio.create_task(keyqueue.arun_workers(q, handler, 2, stop)) for stop in stops]
    try:
        deadline = time.monotonic() + WAIT
        while q._getters < 4:
            assert time.monotonic() < deadline, "the four workers did not wait in get"
            await asyncio.sleep(0.005)
        keys = [f"k{i}" for i in range(8)]
        await adder.add_many(keys)
        deadline = time.monotonic() + 4.0
        while len(handled) < len(keys) or not await aidle(adder):
            assert time.monotonic() < deadline, f"not every key was handled: {handled}"
            await asyncio.sleep(0.01)
        assert lost
        assert len(lost[0]) >= 1
        assert sorted(handled) == keys
        s = await adder.stats()
        back = len(lost[0])  # handed back (a done each), then handed out again
        assert (s.leases_expired, s.gets, s.dones) == (0, 8 + back, 8 + back)
    finally:
        for stop in stops:
            stop.set()
        await asyncio.wait_for(asyncio.gather(*runs), WAIT)
        await q.aclose()
        await adder.aclose()


# -- 2. batching is an option; what the user installed is honoured or refused ---------------


class _Counted(RedisWorkQueue):
    def done(self, key: str) -> None:
        super().done(key)


def test_a_batched_queue_whose_get_or_done_is_replaced_is_refused_at_once(
    valkey_url: str, name: str
) -> None:
    """RedisProtocol._overrides sniffed the class: a subclass overriding any of
    seven methods silently lost batching, and ``q.done = wrapper`` on the
    instance was silently skipped by the batched runner (its done never ran).
    Now batch= (default True) says it, and run_workers refuses at once, before
    taking a key, what the batched workers would not call."""
    sub = _Counted(name, url=valkey_url)
    plain = RedisWorkQueue(name, url=valkey_url)
    try:
        assert sub.batch
        assert plain.batch
        sub.add("k")
        with pytest.raises(TypeError, match=r"_Counted overrides done.*batch=False"):
            keyqueue.run_workers(sub, lambda key: None)
        calls: list[str] = []

        def wrapper(key: str) -> None:
            calls.append(key)
            RedisWorkQueue.done(plain, key)

        plain.done = wrapper  # type: ignore[method-assign]
        with pytest.raises(TypeError, match=r"done is set on the instance.*batch=False"):
            keyqueue.run_workers(plain, lambda key: None)
        assert plain.stats().gets == 0  # refused before taking a key
    finally:
        sub.close()
        plain.close()


def test_batch_false_calls_an_instance_done_for_every_key(valkey_url: str, name: str) -> None:
    q = RedisWorkQueue(name, url=valkey_url, batch=False)
    try:
        assert not q.batch
        assert not isinstance(worker_source(q, None), Claims)
        seen = scripts_of(q)
        calls: list[str] = []
        real = q.done

        def wrapper(key: str) -> None:
            calls.append(key)
            real(key)

        q.done = wrapper  # type: ignore[method-assign]
        keys = [f"k{i}" for i in range(5)]
        q.add_many(keys)
        stop = threading.Event()
        handled: list[str] = []

        def handler(key: str) -> None:
            handled.append(key)
            if len(handled) == len(keys):
                stop.set()

        stats = keyqueue.run_workers(q, handler, 2, stop)
        wait_until(lambda: len(calls) == len(keys), "not every done went through the wrapper")
        assert stats.processed == len(keys)
        assert sorted(calls) == keys
        assert "claim" not in seen
    finally:
        q.close()


def test_batch_must_be_a_bool(valkey_url: str, name: str) -> None:
    with pytest.raises(TypeError, match="batch must be True or False"):
        RedisWorkQueue(name, url=valkey_url, batch="no")  # type: ignore[arg-type]


def test_a_replaced_forget_is_called_by_the_batched_workers(valkey_url: str, name: str) -> None:
    """The batched view folded a handler's forget into the claim (its ``f``
    mode) whatever ``forget`` the queue had: an instance's forget never ran.
    Now a replaced forget is called (one script for it), the claim settling
    with a plain done."""
    q = RedisWorkQueue(name, url=valkey_url)
    try:
        forgotten: list[str] = []
        real = q.forget

        def forget(key: str) -> None:
            forgotten.append(key)
            real(key)

        q.forget = forget  # type: ignore[method-assign]
        seen = scripts_of(q)
        keys = [f"k{i}" for i in range(4)]
        q.add_many(keys)
        stop = threading.Event()

        def handler(key: str) -> None:
            if q.stats().gets == len(keys):
                stop.set()

        keyqueue.run_workers(q, handler, 2, stop)
        assert sorted(forgotten) == keys
        assert seen.count("forget") == len(keys)
        assert "claim" in seen
        s = q.stats()
        assert (s.processing, s.dones) == (0, len(keys))
    finally:
        q.close()


# -- 3. a claimed key taken back before a worker got it --------------------------------------


def test_a_claimed_key_taken_back_while_it_waited_is_not_handed_to_a_worker(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """Claims.get handed out the oldest claimed key (ClaimBook.hand_out) whatever
    had happened to its lease meanwhile: a key reaped and handed to another
    holder while it waited in the book went to a worker too, and two handlers
    ran at once (only a fencing store would catch it). Now it is set aside and
    put back (a fenced put_back: the other holder keeps it), with one
    LEASE_LOST, and the worker gets the next key."""
    clock = FakeClock()
    q = make(clock=clock, lease=10, rate_limiter=NOW)
    other = make(clock=clock, lease=10, rate_limiter=NOW)
    view = worker_source(q, None)
    assert isinstance(view, Claims)
    events: list[Any] = []
    q.subscribe(events.append)
    q.add_many(["a", "b"])
    taken, _, _ = q._drive(q._op_claim(2, [], time.monotonic()))
    view._book.claimed.extend(taken)  # claimed, waiting for workers
    clock.step(11)  # both leases run out, are reaped, and both keys wait again
    [(again, hold)] = other._drive(other._op_claim(1, [], time.monotonic()))[0]
    assert again == "a"
    assert hold.token > taken[0][1].token
    q.add("c")

    key = view.get()  # "a" and "b" waited past their lease: neither is handed out

    assert key in ("b", "c")
    assert key != "a"
    assert other.token("a") == hold.token  # the other holder keeps it
    lost = [e.key for e in events if e.kind is EventKind.LEASE_LOST]
    assert sorted(lost) == ["a", "b"]  # both leases were taken back: one event each
    s = q.stats()
    assert s.processing == 2  # "a" by the other, the key handed to the worker by q
    assert s.leases_expired == 2


def test_a_claimed_key_past_its_lease_not_yet_reaped_is_put_back_not_handed_out(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """A claimed key that waited longer than a lease (the process stalled and
    its renewals with it) may have been taken back already: it is put back
    (no failure: its lease is still its token's) and claimed again with a new
    token, never handed out on the old one."""
    clock = FakeClock()
    q = make(clock=clock, lease=10)
    view = worker_source(q, None)
    assert isinstance(view, Claims)
    q.add("a")
    [(key, stale)] = q._drive(q._op_claim(1, [], time.monotonic()))[0]
    view._book.claimed.append((key, stale))
    clock._now += 10  # past the lease, and no reap ran (nothing told the server)

    assert view.get() == "a"

    assert q.token("a") > stale.token  # claimed again: a new lease
    s = q.stats()
    assert (s.leases_expired, s.processing, s.gets, s.dones) == (0, 1, 2, 1)


# -- 4. put-backs at stop, and a second Ctrl-C ------------------------------------------------


def test_claimed_keys_left_at_the_end_of_a_run_go_back_in_one_script(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """Claims._put_back sent one put_back script per key, in series: with 1 s
    replies a stop took 8.5 s. Now one script puts back them all."""
    q = make(lease=30)
    view = worker_source(q, None)
    assert isinstance(view, Claims)
    keys = [f"k{i}" for i in range(8)]
    q.add_many(keys)
    taken, _, _ = q._drive(q._op_claim(8, [], time.monotonic()))
    view._book.claimed.extend(taken)
    seen = scripts_of(q)

    drive(view.close(False))

    assert seen == ["put_back"]
    s = q.stats()
    assert (s.depth, s.processing, s.leases_expired) == (8, 0, 0)
    assert not q._holds


DOUBLE_CTRL_C = """
import signal, sys, threading
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's job has it
import keyqueue
from keyqueue.redis import RedisWorkQueue

url, name, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
q = RedisWorkQueue(name, url=url, lease=30)
started, said, lock = [], [], threading.Lock()
interrupt = q.interrupt

def stopping():  # the run's watcher wakes the workers: the first Ctrl-C was taken
    if not said:
        said.append(True)
        print("stopping", flush=True)
    interrupt()

q.interrupt = stopping

def handler(key):
    with lock:
        started.append(key)
        if len(started) == workers:
            print("handling", flush=True)
    threading.Event().wait(120)  # a handler that does not end soon

keyqueue.run_workers(q, handler, workers=workers)
"""


def test_a_second_ctrl_c_while_the_handlers_finish_leaves_no_key_held(
    valkey_url: str, name: str
) -> None:
    """A real process in run_workers, its handlers busy: Ctrl-C (the workers
    stop as with stop: each finishes its key), then Ctrl-C again. The second
    KeyboardInterrupt escaped run_workers' join: the keys the handlers held
    stayed held (renewed by nobody, each a failure after its lease). Now they
    are put back with the claimed ones, and the process ends at once."""
    workers = 4
    q = RedisWorkQueue(name, url=valkey_url)
    proc = None
    try:
        keys = [f"k{i}" for i in range(2 * workers)]
        q.add_many(keys)
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        proc = subprocess.Popen(
            [sys.executable, "-c", DOUBLE_CTRL_C, valkey_url, name, str(workers)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == "handling\n"
        assert q.stats().processing == workers
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "stopping\n"  # the run waits for its handlers
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode != 0
        assert "KeyboardInterrupt" in err
        s = q.stats()
        assert (s.processing, s.depth, s.leases_expired) == (0, len(keys), 0)
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()  # and its pipes closed
        q.close()


ASYNC_DOUBLE_CTRL_C = """
import asyncio, signal, sys
signal.signal(signal.SIGINT, signal.default_int_handler)  # as a terminal's job has it
import keyqueue
from keyqueue.redis import AsyncRedisWorkQueue

url, name, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])

async def main():
    q = AsyncRedisWorkQueue(name, url=url, lease=30)
    real, started = q._run, []

    async def run(script, args):  # the wind-down's scripts answer in 1 s
        if script == "put_back" or (script == "claim" and args[4] == "0" and args[9:]):
            print("slow", flush=True)
            await asyncio.sleep(1.0)
        return await real(script, args)

    q._run = run
    async def handler(key):
        started.append(key)
        if len(started) == workers:
            print("handling", flush=True)
        await asyncio.sleep(120)

    await keyqueue.arun_workers(q, handler, workers=workers)

asyncio.run(main())
"""


def test_a_second_ctrl_c_while_arun_workers_winds_down_loses_no_change_and_holds_no_key(
    valkey_url: str, name: str
) -> None:
    """asyncio.run: Ctrl-C cancels arun_workers, whose handlers are cancelled:
    each cancelled key was added again, then settled with done, in two
    steps; Ctrl-C again while the run wound down (slow replies) cancelled
    every task, re-adds included, and the keys were done without them: the
    changes they stood for were lost (5 or 6 of 8 keys left). Now a cancelled
    handler's key is put back (added again and released in one script),
    which a cancellation meanwhile sends once more."""
    workers = 4
    q = RedisWorkQueue(name, url=valkey_url)
    proc = None
    try:
        keys = [f"k{i}" for i in range(2 * workers)]
        q.add_many(keys)
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        proc = subprocess.Popen(
            [sys.executable, "-c", ASYNC_DOUBLE_CTRL_C, valkey_url, name, str(workers)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline() == "handling\n"
        proc.send_signal(signal.SIGINT)
        assert proc.stdout.readline() == "slow\n"  # the wind-down's first script
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=WAIT)
        assert proc.returncode != 0
        assert "KeyboardInterrupt" in err
        s = q.stats()
        assert (s.processing, s.depth, s.leases_expired) == (0, len(keys), 0)
    finally:
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.communicate()  # and its pipes closed
        q.close()


# -- 5. a pool with no free connection ----------------------------------------------------


def test_a_pool_without_a_free_connection_is_said_once_and_holds_stay_renewed(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """redis-py raises MaxConnectionsError (a ConnectionError) when the pool
    has no free connection: nothing was sent. _op_fenced and _op_claim took it
    as an unknown outcome and marked the holds unsure, so renewals left them
    out and their leases ran out; the runner warned at every retry. Now the
    holds stay renewed and one ERROR says what to change; the runner asks
    again quietly, and every key is processed."""
    pool = redis.ConnectionPool.from_url(valkey_url, max_connections=3)
    client = redis.Redis(connection_pool=pool)
    q = RedisWorkQueue(name, client=client, lease=1.5)
    try:
        q.add("held")
        key = q.get_nowait()
        taken = [pool.get_connection() for _ in range(3)]  # every connection busy
        with pytest.raises(redis.exceptions.MaxConnectionsError):
            q.forget(key)
        with pytest.raises(redis.exceptions.MaxConnectionsError):
            q.done(key)
        hold = q._holds[key]
        assert not hold.unsure  # still renewed: nothing was sent
        assert q._renewal()[0][2:] == [key, str(hold.token), "-"]
        for conn in taken:
            pool.release(conn)
        q.done(key)

        keys = [f"k{i}" for i in range(6)]
        q.add_many(keys)
        stop = threading.Event()
        handled: list[str] = []
        busy = threading.Event()

        def handler(key: str) -> None:
            handled.append(key)
            if len(handled) == 1:  # the pool runs dry for a while (longer than a lease)
                busy.set()
            if len(handled) == len(keys):
                stop.set()

        def hog() -> None:
            busy.wait(WAIT)
            held = []
            for _ in range(10):
                try:
                    held.append(pool.get_connection())
                except redis.exceptions.MaxConnectionsError:
                    break
            time.sleep(2.0)  # a pool too small for a while: past a lease
            for conn in held:
                pool.release(conn)

        hogger = threading.Thread(target=hog)
        hogger.start()
        with caplog.at_level(logging.DEBUG, logger="keyqueue"):
            stats = keyqueue.run_workers(q, handler, 3, stop)
        hogger.join()
        assert stats == RunStats(processed=len(keys), succeeded=len(keys))
        said = [r for r in caplog.records if "no free connection" in r.getMessage()]
        assert len(said) == 1
        assert said[0].levelno == logging.ERROR
        assert not [
            r
            for r in caplog.records
            if r.levelno >= logging.WARNING
            and "MaxConnectionsError" in r.getMessage()
            and r not in said
        ]
        s = q.stats()
        assert (s.leases_expired, s.processing, s.depth) == (0, 0, 0)
    finally:
        q.close()
        client.close()


# -- 6. LEASE_LOST once per lost hold --------------------------------------------------------


@pytest.mark.parametrize("batch", [False, True])
def test_lease_lost_is_emitted_once_when_a_renewal_and_the_done_both_learn_it(
    make: Callable[..., RedisWorkQueue], batch: bool
) -> None:
    """A renewal answered while the done (or claim settle) was in flight found
    the lease taken back and emitted LEASE_LOST; the done's reply, 'lost',
    emitted it again: two events (and two in Prometheus' leases_lost) for one
    hold, on both paths."""
    clock = FakeClock()
    q = make(clock=clock, lease=10, batch=batch)
    events: list[Any] = []
    q.subscribe(lambda event: events.append(event.kind))
    q.add("k")
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        reply = real(script, args)
        if script in ("done", "claim") and (script == "done" or args[9:]):
            q._renew_once()  # a renewal answered before this reply is read
        return reply

    if batch:
        view = worker_source(q, None)
        assert isinstance(view, Claims)
        key = view.get()
        clock.step(11)  # taken back
        q._run = run  # type: ignore[method-assign]
        assert drive(view.report(key, "succeeded", None)) == "succeeded"  # not known yet
        drive(view.close(False))  # the done: answered lost, a renewal meanwhile
        assert view.corrections["lease_lost"] == 1
    else:
        key = q.get_nowait()
        clock.step(11)
        q._run = run  # type: ignore[method-assign]
        with pytest.raises(LeaseLost):
            q.done(key)
    assert events.count(EventKind.LEASE_LOST) == 1
    assert q.stats().leases_lost == 1


def test_one_claims_keys_reach_every_parked_worker_at_once_when_handlers_block(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """Four workers idle (three parked, the claimant at the doorbell), four
    keys added in one call: one claim takes them, the claimant wakes one
    worker and each woken one the next, so four handlers that wait for each
    other all run."""
    q = make(lease=30.0)
    together = threading.Barrier(4, timeout=WAIT)
    stop = threading.Event()
    met: list[str] = []
    runs: list[RunStats] = []
    runner = threading.Thread(
        target=lambda: runs.append(keyqueue.run_workers(q, handle, workers=4, stop=stop))
    )

    def handle(key: str) -> None:
        together.wait()
        met.append(key)
        if len(met) == 4:
            stop.set()

    runner.start()
    try:
        wait_until(lambda: q._getters == 4, "four idle workers")
        q.add_many([f"k{i}" for i in range(4)])
        assert stop.wait(WAIT), met
    finally:
        stop.set()
        runner.join(WAIT)
    assert sorted(met) == [f"k{i}" for i in range(4)]
    assert runs[0].succeeded == 4
