"""The distributed edges where an added change could be lost, and workers that
must not poll: the empty key, a get or a claim cancelled in flight, a holder
whose lease was taken back (fencing), outcomes during a server outage, idle
workers, fencing after many reaps, any queue name, outcomes asked again.

Real valkey-servers throughout: the session's, or one of the test's own where
the test kills it or counts its commands.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

import keyqueue
from keyqueue import Empty, RunStats, WorkQueue, run_workers
from keyqueue._runner import apply_outcome
from keyqueue.redis import AsyncRedisWorkQueue, LeaseLost, RedisRateLimiter, RedisWorkQueue
from keyqueue.redis._schema import key_names
from keyqueue.testing import FakeClock, ValkeyServer
from tests.support import valkey_server

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

WAIT = 20.0  # generous bound, wall seconds, on what other threads make true
NOW = RedisRateLimiter(base_delay=0.0, max_delay=0.0, qps=None)  # retries at once


def wait_for(check: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.002)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ValkeyServer]:
    """A server of this test's own: killed and restarted from its append-only file."""
    with ValkeyServer(tmp_path, config={"appendonly": "yes", "appendfsync": "always"}) as s:
        yield s


def failures(q: RedisWorkQueue, key: str) -> int:
    """The key's failures on the server (what max_retries counts)."""
    return int(q._client.hget(q._keys[6], key) or 0)


# -- 1. the empty key ---------------------------------------------------------------------


def test_the_empty_key_is_handed_out_and_released_like_any_other(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(max_retries=1)
    q.add("")
    q.add("x")
    assert q.get_nowait() == ""
    assert q.token("") >= 1
    q.add("")  # marked while held: one redelivery
    q.done("")
    assert q.get_nowait() == "x"
    q.done("x")
    assert q.get(timeout=5) == ""
    q.done("")
    s = q.stats()
    assert (s.gets, s.dones, s.processing, s.depth, s.leases_expired) == (3, 3, 0, 0, 0)


async def test_the_empty_key_on_the_async_queue(valkey_url: str, name: str) -> None:
    async with AsyncRedisWorkQueue(name, url=valkey_url) as q:
        await q.add("")
        assert await q.get(timeout=5) == ""
        await q.done("")
        assert (await q.stats()).processing == 0


# -- 2. a cancelled get -------------------------------------------------------------------


class _SlowReply(AsyncRedisWorkQueue):
    """The get script's reply is held back (in flight) until ``release`` is set:
    the server has handed the key out, the caller has not learned it yet."""

    in_flight: asyncio.Event
    release: asyncio.Event

    async def _run(self, script: str, args: list[str]) -> Any:
        reply = await super()._run(script, args)
        if script == "get" and int(reply[1]):
            self.in_flight.set()
            await self.release.wait()
        return reply


async def test_a_get_cancelled_while_its_reply_is_in_flight_puts_the_key_back_at_once(
    valkey_url: str, name: str
) -> None:
    q = _SlowReply(name, url=valkey_url, lease=30.0, max_retries=1)
    q.in_flight, q.release = asyncio.Event(), asyncio.Event()
    other = AsyncRedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1)
    await other.add("k")
    getter = asyncio.create_task(q.get())
    await asyncio.wait_for(q.in_flight.wait(), WAIT)
    getter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await getter
    q.release.set()

    # Back at once, long before the 30 s lease: no failure counted.
    assert await asyncio.wait_for(other.get(), 5) == "k"
    s = await other.stats()
    assert (s.leases_expired, s.processing, s.gets, s.dones) == (0, 1, 2, 1)
    await other.done("k")
    assert await other.num_requeues("k") == 0
    await q.aclose()
    await other.aclose()


async def test_arun_workers_stop_during_a_gets_round_trip_loses_nothing(
    valkey_url: str, name: str
) -> None:
    # One get per key (batch=False): the get script's round trip is the one held.
    q = _SlowReply(name, url=valkey_url, lease=30.0, max_retries=1, batch=False)
    q.in_flight, q.release = asyncio.Event(), asyncio.Event()
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    stop = asyncio.Event()
    runner = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=2, stop=stop))
    await q.add("k")
    await asyncio.wait_for(q.in_flight.wait(), WAIT)
    stop.set()
    stats = await asyncio.wait_for(runner, WAIT)
    q.release.set()
    assert handled == []
    assert stats == RunStats()

    async with AsyncRedisWorkQueue(name, url=valkey_url) as other:
        assert await asyncio.wait_for(other.get(), 5) == "k"  # put back, not stranded
        assert (await other.stats()).leases_expired == 0
        await other.done("k")
    await q.aclose()


async def test_arun_workers_stop_during_a_claims_round_trip_loses_nothing(
    valkey_url: str, name: str
) -> None:
    # The batched path: the claim script has handed the key out, its reply is
    # held back, the workers stop (the claimant is cancelled): the claim ends
    # in its own task and the run's close puts the key back, no failure.
    q = AsyncRedisWorkQueue(name, url=valkey_url, lease=30.0, max_retries=1)
    in_flight, release = asyncio.Event(), asyncio.Event()
    claim = q._scripts["claim"]

    async def slow_claim(**kwargs: Any) -> Any:
        reply = await claim(**kwargs)
        if reply[2]:  # keys taken
            in_flight.set()
            await release.wait()
        return reply

    q._scripts["claim"] = slow_claim
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    stop = asyncio.Event()
    runner = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=2, stop=stop))
    await q.add("k")
    await asyncio.wait_for(in_flight.wait(), WAIT)
    workers = [t for t in asyncio.all_tasks() if t.get_name().startswith("keyqueue-worker-")]
    assert len(workers) == 2
    stop.set()
    await asyncio.wait_for(asyncio.wait(workers), WAIT)  # the claimant was cancelled, and left
    assert not runner.done()  # the run waits for the claim
    release.set()
    stats = await asyncio.wait_for(runner, WAIT)
    assert handled == []
    assert stats == RunStats()

    async with AsyncRedisWorkQueue(name, url=valkey_url) as other:
        assert await asyncio.wait_for(other.get(), 5) == "k"  # put back, not stranded
        s = await other.stats()
        assert (s.leases_expired, s.gets, s.dones) == (0, 2, 1)
        await other.done("k")
    await q.aclose()


# -- 3. a holder whose lease was taken back ---------------------------------------------------


def test_a_stale_holders_outcomes_change_nothing_and_it_does_not_give_up_the_new_holders_key(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    a = RedisWorkQueue(name, url=valkey_url, lease=10.0, max_retries=2, clock=clock)
    b = RedisWorkQueue(name, url=valkey_url, lease=10.0, max_retries=2, clock=clock)
    a.add("k")
    assert a.get_nowait() == "k"
    clock.step(11)  # A stalled past its lease: reaped, a stall (not a failure)
    assert b.get_nowait() == "k"
    failures_before = failures(b, "k")
    assert failures_before == 0
    assert b.stats().stalls == 1
    given_up: list[str] = []

    # A resumes and its handler raises (a fenced store refused its token).
    outcome, gave_up = apply_outcome(a, "k", None, RuntimeError("stale token refused"))
    if gave_up is not None:
        given_up.append("k")

    assert (outcome, gave_up) == ("lease_lost", None)
    assert given_up == []
    assert failures(b, "k") == failures_before  # no second failure
    s = b.stats()
    assert (s.processing, s.delayed, s.depth, s.leases_lost) == (1, 0, 0, 1)
    for call in (a.retry, a.forget, a.add_rate_limited, lambda k: a.add_after(k, 1.0)):
        with pytest.raises(LeaseLost):
            call("k")
    with pytest.raises(LeaseLost):
        a.done("k")
    assert b.stats().leases_lost == 1  # learned once
    assert (b.stats().delayed, failures(b, "k")) == (0, failures_before)
    b.done("k")  # B's hold was untouched
    assert not any("giving up" in r.getMessage() for r in caplog.records)
    a.close()
    b.close()


def test_run_workers_counts_a_stale_holders_failure_as_lease_lost_once_and_calls_no_give_up(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    a = RedisWorkQueue(name, url=valkey_url, lease=10.0, max_retries=2, clock=clock)
    b = RedisWorkQueue(name, url=valkey_url, lease=10.0, max_retries=2, clock=clock)
    taken = threading.Event()
    resume = threading.Event()

    def handler(key: str) -> None:
        taken.set()
        assert resume.wait(WAIT)
        raise RuntimeError("the fenced store refused token")

    given_up: list[str] = []
    stop = threading.Event()
    stats: list[RunStats] = []
    a.add("k")
    runner = threading.Thread(
        target=lambda: stats.append(
            run_workers(a, handler, stop=stop, on_give_up=lambda k, e: given_up.append(k))
        )
    )
    runner.start()
    assert taken.wait(WAIT)
    # Reaped: the worker's start was never reported (one worker: no claim
    # since; no renewal on a virtual clock), so it is put back, charged nothing.
    clock.step(11)
    assert b.get_nowait() == "k"
    caplog.clear()
    resume.set()
    wait_for(lambda: b.stats().leases_lost == 1, "A to learn its lease is gone")
    stop.set()
    runner.join(WAIT)
    assert not runner.is_alive()

    assert stats == [RunStats(processed=1, lease_lost=1)]
    assert given_up == []
    assert failures(b, "k") == 0
    assert b.stats().stalls == 0
    lease_logs = [r for r in caplog.records if "lease" in r.getMessage().lower()]
    assert len(lease_logs) == 1, [r.getMessage() for r in lease_logs]
    assert b.stats().processing == 1
    b.done("k")
    a.close()
    b.close()


# -- 4. a handler failure during a server outage ----------------------------------------------


def calls_failed(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The runner's warnings that an outcome call raised and is asked again."""
    return [r.getMessage() for r in caplog.records if "asking again" in r.getMessage()]


@pytest.mark.parametrize("outcome", ["retry", "requeue_after", "requeue"])
def test_an_outcome_during_a_server_outage_is_asked_again_until_the_server_is_back(
    server: ValkeyServer,
    outcome: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr("keyqueue._outcome._BACKOFF_MAX", 0.2)
    client = redis.Redis.from_url(server.url, socket_timeout=2.0, socket_connect_timeout=1.0)
    q = RedisWorkQueue("outage", client=client, lease=30.0, rate_limiter=NOW)
    q.add("k")
    calls: list[str] = []
    failing = threading.Event()
    down = threading.Event()

    def handler(key: str) -> keyqueue.Requeue | None:
        calls.append(key)
        if len(calls) > 1:
            return None
        failing.set()
        assert down.wait(WAIT)
        if outcome == "requeue_after":
            return keyqueue.Requeue(after=0.0)
        if outcome == "requeue":
            return keyqueue.Requeue()
        raise RuntimeError("the store is down too")

    stop = threading.Event()
    stats: list[RunStats] = []
    runner = threading.Thread(target=lambda: stats.append(run_workers(q, handler, stop=stop)))
    runner.start()
    try:
        assert failing.wait(WAIT)
        server.kill()  # from this thread: a server dies with the thread that started it
        down.set()
        wait_for(lambda: bool(calls_failed(caplog)), "the outcome to fail")
        server.start()  # the same directory and port
        wait_for(lambda: len(calls) == 2, "the key to be handled again after the outage")
        wait_for(lambda: q.stats().processing == 0, "the second run's done")
    finally:
        down.set()
        stop.set()
        runner.join(WAIT)

    s = q.stats()
    assert (s.depth, s.delayed, s.processing) == (0, 0, 0)
    assert s.retries == 1  # asked again, applied once
    assert stats[0].processed == 2
    assert stats[0].errors == 0
    q.close()
    client.close()


def test_workers_stopped_during_an_outage_leave_the_key_to_come_back_with_its_lease(
    server: ValkeyServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr("keyqueue._outcome._BACKOFF_MAX", 0.1)
    client = redis.Redis.from_url(server.url, socket_timeout=2.0, socket_connect_timeout=1.0)
    q = RedisWorkQueue("stopped", client=client, lease=1.0, rate_limiter=NOW)
    q.add("k")
    failing = threading.Event()
    down = threading.Event()

    def handler(key: str) -> None:
        failing.set()
        assert down.wait(WAIT)
        raise RuntimeError("fails while the server is down")

    stop = threading.Event()
    stats: list[RunStats] = []
    runner = threading.Thread(target=lambda: stats.append(run_workers(q, handler, stop=stop)))
    runner.start()
    assert failing.wait(WAIT)
    server.kill()
    down.set()
    wait_for(lambda: len(calls_failed(caplog)) >= 2, "retry to be asked again")
    stop.set()
    runner.join(WAIT)
    assert not runner.is_alive()
    assert stats == [RunStats(processed=1, errors=1)]
    server.start()

    assert q.shutdown(drain=True, timeout=5.0)  # the hold was let go of, not waited for
    other = RedisWorkQueue("stopped", url=server.url, lease=1.0, rate_limiter=NOW)
    assert other.get(timeout=WAIT) == "k"  # its lease ran out: it came back
    other.done("k")
    assert other.stats().leases_expired == 1
    other.close()
    q.close()
    client.close()


# -- 5. idle workers do not poll ---------------------------------------------------------------


def _commands(client: redis.Redis) -> int:
    """Commands the server has run, scripts' inner commands included, minus INFO."""
    stats = client.info("commandstats")
    return sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")


def test_an_idle_pool_of_four_workers_sends_at_most_a_command_a_second(
    tmp_path: Path,
) -> None:
    with ValkeyServer(tmp_path) as server:
        probe = redis.Redis.from_url(server.url)
        q = RedisWorkQueue("idle", url=server.url)
        stop = threading.Event()
        runner = threading.Thread(target=run_workers, args=(q, lambda k: None, 4, stop))
        runner.start()
        wait_for(lambda: q._getters == 4, "the four workers to wait in get")
        before = _commands(probe)
        time.sleep(3.0)  # the measured idle window
        idle = _commands(probe) - before
        stop.set()
        runner.join(WAIT)
        assert not runner.is_alive()  # stop woke the blocked getters
        assert idle <= 3, f"{idle} commands in 3 s of idling"
        q.close()
        probe.close()


def test_in_memory_workers_block_in_get_and_stop_wakes_them() -> None:
    calls: list[float | None] = []

    class Counting(WorkQueue[str]):
        def get(self, timeout: float | None = None) -> str:
            calls.append(timeout)
            return super().get(timeout)

    q = Counting("blocking")
    stop = threading.Event()
    runner = threading.Thread(target=run_workers, args=(q, lambda k: None, 4, stop))
    runner.start()
    wait_for(lambda: q._getters == 4, "the workers to block")
    assert calls == [None] * 4  # each blocked once, no timeout (no polling)
    started = time.monotonic()
    stop.set()
    runner.join(WAIT)
    assert not runner.is_alive()
    assert time.monotonic() - started < 2.0


def test_interrupt_wakes_the_blocked_gets_of_a_redis_client_only(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q, other = make(), make()
    raised: list[type[BaseException]] = []

    def get(queue: RedisWorkQueue) -> None:
        try:
            queue.get()
        except BaseException as exc:
            raised.append(type(exc))

    mine = [threading.Thread(target=get, args=(q,)) for _ in range(2)]
    theirs = threading.Thread(target=get, args=(other,))
    for thread in (*mine, theirs):
        thread.start()
    wait_for(lambda: q._getters == 2 and other._getters == 1, "the gets to block")
    q.interrupt()
    for thread in mine:
        thread.join(WAIT)
    assert raised == [Empty, Empty]
    assert theirs.is_alive()
    q.add("k")  # the other client's get is still there, and gets it
    theirs.join(WAIT)
    assert raised == [Empty, Empty]
    other.done("k")


async def test_interrupt_wakes_the_waiting_gets_of_an_async_work_queue() -> None:
    q: keyqueue.AsyncWorkQueue[str] = keyqueue.AsyncWorkQueue("interrupt")
    getters = [asyncio.create_task(q.get()) for _ in range(3)]
    await asyncio.sleep(0)
    q.interrupt()
    for getter in getters:
        with pytest.raises(Empty):
            await getter
    q.add("k")
    assert await asyncio.wait_for(q.get(), 5) == "k"  # a later get waits as usual


# -- 7. fencing after many reaps ---------------------------------------------------------------


def test_a_late_done_raises_lease_lost_after_more_than_ten_thousand_reaps(
    valkey_url: str, name: str
) -> None:
    clock = FakeClock()
    q = RedisWorkQueue(name, url=valkey_url, lease=10.0, rate_limiter=NOW, clock=clock)
    q.add("old")
    assert q.get_nowait() == "old"
    others = [f"k{i}" for i in range(10_050)]
    q.add_many(others)
    pipe = q._client.pipeline(transaction=False)
    keys = q._script_keys["get"]
    args = [repr(clock.now()), "10.0", *q._cfg.reap_args, q.holder, "-", "0", "", ""]
    for _ in others:  # get scripts, without 10,050 holds in this client
        pipe.evalsha(q._scripts["get"].sha, len(keys), *keys, *args)
    pipe.execute()
    clock.step(11)
    wait_for(lambda: q.stats().leases_expired > len(others), "every lease reaped (100 a call)")
    with pytest.raises(LeaseLost):
        q.done("old")
    q.close()


# -- 8. any queue name ----------------------------------------------------------------------------


@pytest.mark.parametrize("queue_name", ["}x", "a}b", "}", "{}", "{x}"])
def test_a_name_with_braces_keeps_every_key_in_one_slot_and_works(
    valkey_url: str, queue_name: str
) -> None:
    keys = key_names(queue_name)
    assert len({key_slot(k.encode()) for k in keys}) == 1
    assert key_names(queue_name) != key_names(queue_name + "x")
    q = RedisWorkQueue(queue_name, url=valkey_url)
    for key in keys:
        q._client.delete(key)
    q.add("k")
    assert q.get_nowait() == "k"
    q.done("k")
    assert q.stats().dones == 1
    q.close()


@pytest.mark.parametrize(
    ("script", "call"),
    [
        ("retry", lambda q: q.retry("k")),
        ("add_rate_limited", lambda q: q.add_rate_limited("k")),
        ("add_after", lambda q: q.add_after("k", 5.0)),
    ],
)
def test_an_outcome_asked_again_after_its_reply_was_lost_is_applied_once(
    make: Callable[..., RedisWorkQueue], script: str, call: Callable[[RedisWorkQueue], Any]
) -> None:
    q = make(max_retries=5, clock=FakeClock())
    q.add("k")
    assert q.get_nowait() == "k"
    valkey_server.lose_reply_of(q, script)
    with pytest.raises(redis.exceptions.ConnectionError):
        call(q)

    call(q)  # the same request again: applied once

    s = q.stats()
    assert (s.retries, s.delayed) == (1, 1)
    assert failures(q, "k") == (1 if script == "retry" else 0)
    assert q.num_requeues("k") == (0 if script == "add_after" else 1)
    call(q)  # a new request: applied
    assert q.stats().retries == 2
    q.done("k")


# -- renewals and repeated dones that cross a new hold --------------------------------------


def test_a_renewal_that_crosses_its_done_leaves_the_keys_next_hold_alone(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(lease=30.0, max_retries=2)
    q.add("k")
    assert q.get_nowait() == "k"
    renewal, _ = q._renewal()  # the renewer read the holds (k, first token) ...
    q.add("k")
    q.done("k")  # ... then the key was released and handed out again
    assert q.get_nowait() == "k"
    q._renewed(q._run("renew", renewal))  # ... before the renewal reached the server

    assert q.retry("k") is True  # the new hold is live: not LeaseLost
    q.done("k")
    assert q.stats().leases_lost == 0


def test_a_done_asked_again_after_the_key_moved_on_is_a_repeat_not_a_lost_lease(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q, other = make(), make()
    q.add("k")
    assert q.get_nowait() == "k"
    q.add("k")  # owed a redelivery: done hands it out again
    valkey_server.lose_reply_of(q, "done")
    with pytest.raises(redis.exceptions.ConnectionError):
        q.done("k")
    assert other.get_nowait() == "k"  # the first done ran: the key moved on

    q.done("k")  # asked again: a repeat, not LeaseLost

    assert other.stats().leases_lost == 0
    other.done("k")
