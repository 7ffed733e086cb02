"""Batched claims under faults, one test each.

Each docstring tells the fault (in the past tense of the code it names) that
the test rules out; the test checks the behaviour:

1. a settle of more holds than Lua's unpack takes: the scripts work in
   chunks, and a claim settles at most MAX_CLAIM holds;
2. claimed keys put back while a stop cancels the run: the put-back is
   shielded, and the run's close waits for it;
3. a settle answered 'lost' emits a LEASE_LOST event, as a done does;
4. the keys of a claim whose reply was lost are not failures: the next claim
   hands them back, from the client's claim record;
5. a handler that calls done itself counts an error, batched or not.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

import pytest
import redis

import keyqueue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from keyqueue.testing import FakeClock
from tests.support import valkey_server

name = valkey_server.name  # a queue of this test's own

# -- 1. a settle of more than ~8,000 holds can never be sent ---------------------------------


def test_a_claim_settles_more_holds_than_lua_can_unpack(valkey_url: str, name: str) -> None:
    """lib/settle.lua unpacks every settled key at once (HMGET LEASE unpack(keys),
    forget(unpack(...)), release_many's ZREM/HDEL/HMGET): Lua's unpack stops at
    LUAI_MAXCSTACK (8000), and ClaimBook.next_claim put every queued done in
    one claim (MAX_CLAIM bounds only the keys taken). The script raises
    'too many results to unpack'."""
    q = RedisWorkQueue(name, url=valkey_url, clock=FakeClock(), lease=100)
    try:
        n = 8200
        q.add_many([f"k{i}" for i in range(n)])
        taken: list[Any] = []
        while len(taken) < n:
            got, _, _ = q._drive(q._op_claim(1000, [], time.monotonic()))
            taken += got
        _, statuses, _ = q._drive(
            q._op_claim(0, [(k, h, True) for k, h in taken], time.monotonic())
        )
        assert statuses == ["ok"] * n
    finally:
        q.close()


async def test_arun_workers_with_many_tasks_releases_every_key(valkey_url: str, name: str) -> None:
    """The same fault end to end: 8,200 async workers whose handlers end in one
    loop turn queue 8,199 settles behind one claim; every later claim carries
    them all and raises, so no finished key is ever released: each stays held
    (no longer renewed) until its lease runs out and is counted as a failure,
    and the run reports them as errors."""
    n = 8200
    q = AsyncRedisWorkQueue(name, url=valkey_url, lease=30)
    try:
        await q.add_many([f"k{i}" for i in range(n)])
        gate = asyncio.Event()
        started = 0

        async def handler(key: str) -> None:
            nonlocal started
            started += 1
            if started == n:
                gate.set()
            await gate.wait()

        stop = asyncio.Event()
        run = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=n, stop=stop))
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and (await q.stats()).dones < n:
            await asyncio.sleep(0.2)
        stop.set()
        stats = await asyncio.wait_for(run, 30)
        assert (await q.stats()).dones == n
        assert stats.succeeded == n
    finally:
        await q.aclose()


# -- 2. AsyncClaims puts claimed keys back in the cancellable worker task ----------------------


async def test_async_claimed_keys_put_back_even_if_the_run_stops_meanwhile(
    valkey_url: str, name: str
) -> None:
    """AsyncClaims' claimant (shutting down) takes the claimed keys
    (book.to_put_back()) and then awaits _put_back key by key in the worker task,
    which is in the runner's idle set: a stop (or a cancel of arun_workers)
    cancels it mid-way. The keys not yet put back are in neither the book (close
    sees nothing) nor put back: they stay this client's holds, renewed for
    ever, never handed to a worker, and shutdown(drain=True) never returns."""
    q = AsyncRedisWorkQueue(name, url=valkey_url, lease=1.0)
    try:
        await q.add_many(["a", "b", "c"])
        real = q._run
        claimed, reply = asyncio.Event(), asyncio.Event()
        putting_back, put_back = asyncio.Event(), asyncio.Event()

        async def run(script: str, args: list[str]) -> Any:
            if script == "put_back":
                putting_back.set()
                await put_back.wait()  # a round trip, held until the run was stopped
            answer = await real(script, args)
            if script == "claim" and args[4] != "0":
                claimed.set()
                await reply.wait()  # the claim ran on the server; its reply is late
            return answer

        q._run = run  # type: ignore[method-assign]  # on the instance: still batched

        async def handler(key: str) -> None:
            pass

        stop = asyncio.Event()
        runner = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=3, stop=stop))
        await claimed.wait()
        workers = [t for t in asyncio.all_tasks() if t.get_name().startswith("keyqueue-worker-")]
        await q.shutdown()  # this client stops taking keys
        reply.set()  # the claim's keys arrive: the claimant puts them back
        await asyncio.wait_for(putting_back.wait(), 10)
        stop.set()  # and the run is stopped meanwhile: its workers are cancelled
        await asyncio.wait_for(asyncio.wait(workers), 10)
        put_back.set()
        await asyncio.wait_for(runner, 10)
        assert await q.shutdown(drain=True, timeout=3)  # 3 leases: nothing may be held
        assert not q._holds
        assert (await q.stats()).processing == 0
    finally:
        await q.aclose()


# -- 3. a settle answered 'lost' emits no LEASE_LOST event ------------------------------------


def _lease_lost_events(q: RedisWorkQueue, clock: FakeClock) -> tuple[list[Any], Any]:
    seen: list[Any] = []
    q.subscribe(lambda event: seen.append(event.kind))

    def handler(key: str) -> None:
        clock.step(11)  # the handler stalls past its lease: reaped, handed to nobody yet

    q.add("k")
    stop_after_one = threading.Event()

    def handle(key: str) -> None:
        handler(key)
        stop_after_one.set()

    stats = keyqueue.run_workers(q, handle, workers=1, stop=stop_after_one)
    return [kind for kind in seen if kind is keyqueue.EventKind.LEASE_LOST], stats


def test_a_settle_answered_lost_emits_lease_lost_as_done_did(valkey_url: str, name: str) -> None:
    """_op_claim (redis/_ops.py claim, the 'lost' status branch) marks the hold lost
    and finishes it, but never calls self._lost(key, hold, now), which is what
    emitted EventKind.LEASE_LOST for a done answered 'lost' (_op_done). So a
    subscriber, and keyqueue.prometheus' leases_lost counter, no longer see a
    lease lost at done time on a batched queue; the per-key path still emits it."""
    per_key_clock, batched_clock = FakeClock(), FakeClock()
    per_key = RedisWorkQueue(
        name + "-per-key", url=valkey_url, clock=per_key_clock, lease=10, batch=False
    )
    batched = RedisWorkQueue(name + "-batched", url=valkey_url, clock=batched_clock, lease=10)
    try:
        old_events, old_stats = _lease_lost_events(per_key, per_key_clock)
        new_events, new_stats = _lease_lost_events(batched, batched_clock)
        assert old_stats.lease_lost == new_stats.lease_lost == 1
        assert len(old_events) == 1  # the per-key path: done raised LeaseLost, one event
        assert len(new_events) == 1  # the batched path too
    finally:
        per_key.close()
        batched.close()


# -- 4. a claim whose reply is lost: every key it took is a failure, none was started -----------


def test_keys_of_a_claim_whose_reply_was_lost_are_not_counted_as_failures(
    valkey_url: str, name: str
) -> None:
    """Claims._claim / RedisProtocol._op_claim: when the claim script ran but its
    reply was lost (a connection error after the server applied it), the keys it
    took are known to nobody: their leases run out and reap counts each as one
    failure of the key (reap.lua record_failure), although no handler started.
    With max_retries=1 all of them are given up and dropped at once: a lost
    claim would cost as many keys as the process had free workers (up to
    MAX_CLAIM). A lease that runs out counts as the holder's failure only for
    keys whose handler had started."""
    q = RedisWorkQueue(name, url=valkey_url, lease=0.5, max_retries=1)
    adder = RedisWorkQueue(name, url=valkey_url)
    try:
        real = q._run
        lost_once: list[bool] = []

        def run(script: str, args: list[str]) -> Any:
            reply = real(script, args)
            if script == "claim" and int(args[4]) > 1 and not lost_once:
                lost_once.append(True)
                raise redis.exceptions.ConnectionError("reply lost")
            return reply

        q._run = run  # type: ignore[method-assign]  # on the instance: still batched
        handled: list[str] = []
        stop = threading.Event()
        runner = threading.Thread(
            target=keyqueue.run_workers, args=(q, handled.append, 4, stop), daemon=True
        )
        runner.start()
        deadline = time.monotonic() + 10
        while q._getters < 4:  # the four workers wait in get
            assert time.monotonic() < deadline, "the workers did not wait in get"
            time.sleep(0.005)
        adder.add_many(["a", "b", "c", "d"])
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(handled) < 4:
            time.sleep(0.05)
        stop.set()
        runner.join(10)
        assert lost_once  # the fault was injected
        assert sorted(handled) == ["a", "b", "c", "d"]
    finally:
        q.close()
        adder.close()


# -- 5. a handler that calls done itself ------------------------------------------------------


def test_a_handler_that_calls_done_itself_counts_an_error_batched_or_not(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The batched release sent the settle of a hold the handler's own done had
    ended, as asked again: the server answered repeat and the run counted a
    success. The per-key path's done raised ValueError (not held): errors."""
    q = RedisWorkQueue(name, url=valkey_url, lease=5.0)
    try:
        q.add("k")
        stop = threading.Event()

        def handler(key: str) -> None:
            q.done(key)
            stop.set()

        with caplog.at_level(logging.ERROR, logger="keyqueue"):
            stats = keyqueue.run_workers(q, handler, 1, stop)
        assert stats == keyqueue.RunStats(processed=1, errors=1)
        assert any("'k'" in r.getMessage() for r in caplog.records if r.levelno == logging.ERROR)
        s = q.stats()
        assert (s.gets, s.dones, s.processing) == (1, 1, 0)
    finally:
        q.close()
