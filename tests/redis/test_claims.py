"""Batched claims and settles on a Redis queue (``redis/_claims.py``, ``lua/claim.lua``).

The claim script through ``_op_claim`` directly: how many keys one claim
takes and in which order, their tokens and leases, each settle status (ok,
lost, repeat), forget folded into done, one redelivery, and one script for
many settles and takes. Then ``run_workers`` on a Redis queue, which claims
through a ``Claims`` view: its RunStats, a lease lost at settle time, a
subclass or proxy that is not batched, a shutdown that puts claimed keys
back, and the scripts a drain costs; the same for ``arun_workers`` on an
``AsyncRedisWorkQueue`` (``AsyncClaims``). Time is a ``FakeClock`` wherever it can
be; script counts come from INFO commandstats of a server of the test's own.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
import redis

import keyqueue
from keyqueue import ItemFastSlowRateLimiter, PermanentError, Requeue, RunStats
from keyqueue._source import worker_source
from keyqueue.redis import AsyncRedisWorkQueue, RedisRateLimiter, RedisWorkQueue
from keyqueue.redis._async_claims import AsyncClaims
from keyqueue.redis._claims import Claims
from keyqueue.redis._holds import Hold
from keyqueue.testing import FakeClock, ValkeyServer
from tests.support import valkey_server

NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a local limiter that retries at once
WAIT = 10.0  # generous bound, wall seconds, on a wait for the workers

name = valkey_server.name  # fixtures: a queue of this test's own
make = valkey_server.make

Taken = list[tuple[str, Hold]]


def claim(
    q: RedisWorkQueue, want: int, settles: Sequence[tuple[str, Hold, bool]] = ()
) -> tuple[Taken, list[str]]:
    """One claim script: the keys taken and the settles' statuses."""
    taken, statuses, _ = q._drive(q._op_claim(want, list(settles), time.monotonic()))
    return taken, statuses


def keys_of(taken: Taken) -> list[str]:
    return [key for key, _ in taken]


def watch_sources(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """The worker sources the runners make from now on (recorded)."""
    sources: list[Any] = []

    def recorded(queue: Any, batch: bool | None) -> Any:
        sources.append(worker_source(queue, batch))
        return sources[-1]

    monkeypatch.setattr("keyqueue._runner.worker_source", recorded)
    return sources


@pytest.fixture
def own_server(tmp_path: Path) -> Iterator[ValkeyServer]:
    """A server of this test's own, so that its commandstats count only this test."""
    with ValkeyServer(tmp_path) as server:
        yield server


def scripts_run(r: redis.Redis) -> int:
    """Script calls the server has run so far (EVALSHA and EVAL)."""
    stats = r.info("commandstats")
    return sum(int(stats.get(f"cmdstat_{c}", {}).get("calls", 0)) for c in ("evalsha", "eval"))


# -- the claim script ---------------------------------------------------------------------


def test_a_claim_takes_at_most_want_keys_in_fifo_order_with_increasing_tokens(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock(), lease=10)
    q.add_many([f"k{i}" for i in range(5)])
    first, statuses = claim(q, 3)
    assert keys_of(first) == ["k0", "k1", "k2"]
    assert statuses == []
    second, _ = claim(q, 3)
    assert keys_of(second) == ["k3", "k4"]  # fewer waited than wanted
    tokens = [q.token(key) for key in keys_of(first + second)]
    assert tokens == [hold.token for _, hold in first + second]
    assert tokens == sorted(set(tokens))  # distinct, increasing in hand-out order
    s = q.stats()
    assert (s.processing, s.depth, s.gets) == (5, 0, 5)
    assert claim(q, 3) == ([], [])


def test_a_claim_takes_keys_in_rank_order_once_ranked(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock(), lease=10)
    for key, priority in [("a", 0), ("b", 2), ("c", 1), ("d", 2), ("e", 0)]:
        q.add(key, priority)
    taken, _ = claim(q, 4)
    assert keys_of(taken) == ["b", "d", "c", "a"]  # higher first, FIFO among equals
    assert [hold.token for _, hold in taken] == sorted({hold.token for _, hold in taken})
    s = q.stats()
    assert (s.processing, s.depth) == (4, 1)
    assert keys_of(claim(q, 4)[0]) == ["e"]


def test_a_claim_of_no_keys_takes_none_and_leaves_the_queue_as_it_was(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock(), lease=10)
    q.add_many(["a", "b"])
    assert claim(q, 0) == ([], [])
    s = q.stats()
    assert (s.depth, s.processing, s.gets) == (2, 0, 0)


def test_a_shut_down_client_claims_no_keys_but_still_settles(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock(), lease=10)
    q.add_many(["a", "b"])
    [(key, hold)] = claim(q, 1)[0]
    q.shutdown()
    taken, statuses = claim(q, 5, [(key, hold, False)])
    assert (taken, statuses) == ([], ["ok"])
    s = q.stats()
    assert (s.depth, s.processing, s.dones) == (1, 0, 1)


def test_settle_ok_releases_each_hold_and_a_key_added_while_held_comes_back_once(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock(), lease=10)
    q.add_many(["a", "b", "c"])
    taken, _ = claim(q, 3)
    q.add("b")
    q.add("b")  # coalesced: owed one redelivery
    _, statuses = claim(q, 0, [(key, hold, False) for key, hold in taken])
    assert statuses == ["ok", "ok", "ok"]
    s = q.stats()
    assert (s.processing, s.depth, s.dones, s.redeliveries) == (0, 1, 3, 1)
    with pytest.raises(ValueError, match="not being processed"):
        q.token("a")  # every settled hold is finished
    again, _ = claim(q, 3)
    assert keys_of(again) == ["b"]
    assert again[0][1].token > max(hold.token for _, hold in taken)
    claim(q, 0, [("b", again[0][1], False)])
    assert claim(q, 3) == ([], [])  # exactly once
    assert q.stats().redeliveries == 1


def test_settle_of_a_lease_taken_back_is_lost_counted_once_and_leaves_the_new_holder(
    make: Callable[..., RedisWorkQueue],
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=10, rate_limiter=NOW)
    other = make(clock=clock, lease=10, rate_limiter=NOW)
    q.add_many(["a", "b"])
    taken, _ = claim(q, 2)
    (a, stale), (b, live) = taken
    clock.step(10)  # both leases run out and are reaped; both come back at once
    assert q.stats().leases_expired == 2
    [(_, new)] = claim(other, 1)[0]
    assert new.token > live.token

    _, statuses = claim(q, 0, [(a, stale, False), (b, live, True)])

    assert statuses == ["lost", "lost"]
    assert stale.lost
    assert live.lost
    s = other.stats()
    assert (s.leases_lost, s.processing, s.dones, s.depth) == (2, 1, 0, 1)
    assert other.token("a") == new.token  # the new holder is untouched
    # Settled once more (a stale holder asking again): not counted again.
    _, statuses = claim(q, 0, [(a, stale, False)])
    assert statuses == ["lost"]
    assert other.stats().leases_lost == 2
    assert claim(other, 0, [("a", new, False)])[1] == ["ok"]
    s = other.stats()
    assert (s.processing, s.dones, s.leases_lost) == (0, 1, 2)


def test_settle_asked_again_after_a_lost_reply_is_repeat_and_releases_once(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(clock=FakeClock(), lease=10)
    q.add_many(["a", "b"])
    taken, _ = claim(q, 2)
    q.add("a")  # owed one redelivery
    settles = [(key, hold, False) for key, hold in taken]
    valkey_server.lose_reply_of(q, "claim")
    with pytest.raises(redis.exceptions.ConnectionError):
        claim(q, 0, settles)
    assert all(hold.unsure for _, hold in taken)  # no longer renewed

    _, statuses = claim(q, 0, settles)  # asked again: the first one ran

    assert statuses == ["repeat", "repeat"]
    s = q.stats()
    assert (s.dones, s.redeliveries, s.depth, s.processing, s.leases_lost) == (2, 1, 1, 0, 0)


def test_settle_asked_again_after_its_lease_was_taken_back_is_lost(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """Asked again, a settle whose first call never reached the server is
    ``lost`` (not ``repeat``) if reap took the lease back meanwhile."""
    clock = FakeClock()
    q = make(clock=clock, lease=10, rate_limiter=NOW)
    q.add("a")
    [(key, hold)] = claim(q, 1)[0]
    real = q._run

    def unreachable(script: str, args: list[str]) -> Any:
        if script == "claim":
            raise redis.exceptions.ConnectionError("connection refused")
        return real(script, args)

    q._run = unreachable  # type: ignore[method-assign]
    with pytest.raises(redis.exceptions.ConnectionError):
        claim(q, 0, [(key, hold, False)])
    q._run = real  # type: ignore[method-assign]
    clock.step(10)
    assert claim(q, 0, [(key, hold, False)])[1] == ["lost"]
    s = q.stats()
    assert (s.leases_expired, s.leases_lost, s.dones) == (1, 1, 0)


@pytest.mark.parametrize("limiter", ["server", "local"])
def test_forget_with_done_clears_the_keys_failures_and_done_alone_does_not(
    make: Callable[..., RedisWorkQueue], limiter: str
) -> None:
    q = make(
        clock=FakeClock(),
        lease=10,
        rate_limiter=RedisRateLimiter(1.0, 10.0, qps=None) if limiter == "server" else NOW,
    )
    q.add_many(["kept", "forgotten"])
    taken, _ = claim(q, 2)
    for key, _ in taken:
        q.add_rate_limited(key)  # one failure each, while held
    assert (q.num_requeues("kept"), q.num_requeues("forgotten")) == (1, 1)
    (kept, kept_hold), (forgotten, forgotten_hold) = taken

    _, statuses = claim(q, 0, [(kept, kept_hold, False), (forgotten, forgotten_hold, True)])

    assert statuses == ["ok", "ok"]
    assert (q.num_requeues("kept"), q.num_requeues("forgotten")) == (1, 0)
    assert q.stats().dones == 2


def test_one_claim_script_settles_many_holds_and_takes_many_keys(
    own_server: ValkeyServer,
) -> None:
    r = redis.Redis.from_url(own_server.url)
    q = RedisWorkQueue("q", url=own_server.url, clock=FakeClock(), lease=10)
    try:
        q.add_many([f"k{i:02}" for i in range(20)])
        first, _ = claim(q, 8)  # the script is loaded by now
        q.add(first[0][0])  # owed one redelivery
        before = scripts_run(r)

        settles = [(key, hold, i % 2 == 0) for i, (key, hold) in enumerate(first)]
        second, statuses = claim(q, 8, settles)

        assert scripts_run(r) - before == 1
        assert statuses == ["ok"] * 8
        assert keys_of(second) == [f"k{i:02}" for i in range(8, 16)]
        s = q.stats()
        assert (s.dones, s.gets, s.processing, s.depth, s.redeliveries) == (8, 16, 8, 5, 1)
    finally:
        q.close()
        r.close()


# -- run_workers on a Redis queue -----------------------------------------------------------


def run_until(
    q: Any, handler: Callable[[str], Any], until: Callable[[], bool], workers: int
) -> RunStats:
    """``run_workers`` in a thread until ``until()`` holds, then stopped; its RunStats."""
    stop = threading.Event()
    result: list[RunStats] = []
    errors: list[BaseException] = []

    def run() -> None:
        try:
            result.append(keyqueue.run_workers(q, handler, workers=workers, stop=stop))
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    runner = threading.Thread(target=run)
    runner.start()
    try:
        deadline = time.monotonic() + WAIT
        while not until():
            assert time.monotonic() < deadline, "the workers did not get there"
            assert runner.is_alive() or errors, "run_workers returned early"
            time.sleep(0.005)
    finally:
        stop.set()
        runner.join(WAIT)
    assert not runner.is_alive()
    if errors:
        raise errors[0]
    return result[0]


def idle(q: RedisWorkQueue) -> bool:
    s = q.stats()
    return s.depth == 0 and s.processing == 0 and s.delayed == 0


def test_a_claims_reply_carries_its_events_only_while_someone_listens(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """With nobody subscribed a claim's reply has no events (the client acts
    on poison ones only, which it would still get); subscribed, the settle's
    done and the take's get reach the callback, in order."""
    q = make(rate_limiter=NOW)
    q.add_many(["a", "b"])
    replies: list[Any] = []
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        reply = real(script, args)
        if script == "claim":
            replies.append(reply)
        return reply

    q._run = run  # type: ignore[method-assign]
    [(key, hold)] = claim(q, 1)[0]
    seen: list[keyqueue.Event[str]] = []
    q.subscribe(seen.append)
    assert keys_of(claim(q, 1, [(key, hold, False)])[0]) == ["b"]
    assert replies[0][4] == []
    assert [(event.kind, event.key) for event in seen] == [
        (keyqueue.EventKind.DONE, "a"),
        (keyqueue.EventKind.GET, "b"),
    ]


def test_run_workers_on_a_redis_queue_is_batched_and_its_run_stats_add_up(
    make: Callable[..., RedisWorkQueue],
) -> None:
    q = make(max_retries=2, rate_limiter=NOW)
    assert isinstance(worker_source(q, None), Claims)
    requeued: set[str] = set()
    lock = threading.Lock()

    def handler(key: str) -> Requeue | None:
        kind = key[0]
        if kind == "f":
            raise RuntimeError(f"{key} fails")
        if kind == "p":
            raise PermanentError(f"{key} is hopeless")
        if kind == "r":
            with lock:
                if key not in requeued:
                    requeued.add(key)
                    return Requeue(after=0)
        return None

    keys = [f"{kind}{i}" for kind in "sfpr" for i in range(5)]
    q.add_many(keys)
    stats = run_until(q, handler, lambda: idle(q), workers=4)

    fields = [f for f in RunStats.__dataclass_fields__ if f != "processed"]
    assert stats.processed == sum(getattr(stats, f) for f in fields)
    # s: one success each; f: retried once, then given up; p: permanent;
    # r: requeued once, then a success.
    assert stats == RunStats(
        processed=30, succeeded=10, requeued=5, retried=5, gave_up=5, permanent=5
    )
    s = q.stats()
    assert s.gets == s.dones == 30
    assert all(q.num_requeues(key) == 0 for key in keys)


def test_a_lease_lost_at_settle_turns_a_success_into_lease_lost_with_one_warning(
    make: Callable[..., RedisWorkQueue], caplog: pytest.LogCaptureFixture
) -> None:
    """The handler's lease runs out while it works (the virtual clock steps past
    it); it returns None, so its worker counts a success, and the settle sent
    with the next claim finds the lease taken back: the run counts lease_lost.
    The reaped key comes back once and succeeds."""
    clock = FakeClock()
    q = make(clock=clock, lease=10, rate_limiter=NOW)
    calls: list[tuple[str, int]] = []

    def handler(key: str) -> None:
        calls.append((key, q.token(key)))
        if len(calls) == 1:
            clock.step(10)  # reaped by the step: its hold does not know yet

    q.add_many(["a", "b"])
    with caplog.at_level(logging.WARNING, logger="keyqueue"):
        stats = run_until(q, handler, lambda: idle(q) and len(calls) == 3, workers=1)

    assert stats == RunStats(processed=3, succeeded=2, lease_lost=1)
    lost = [r for r in caplog.records if "lease lost" in r.getMessage()]
    assert len(lost) == 1, [r.getMessage() for r in caplog.records]
    assert repr(calls[0][0]) in lost[0].getMessage()
    again = [token for key, token in calls if key == calls[0][0]]
    assert len(again) == 2  # handed out again, once
    assert again[1] > again[0]
    s = q.stats()
    assert (s.leases_expired, s.leases_lost, s.dones, s.gets) == (1, 1, 2, 3)


def test_a_claim_whose_reply_is_lost_is_asked_again_and_settles_each_hold_once(
    make: Callable[..., RedisWorkQueue],
) -> None:
    """The reply of a claim that settled a hold and took a key is lost: the
    run asks again (the settle as asked again: answered repeat, released
    once), and the key the lost claim took, never known to this client, is
    handed back by the next claim without a failure (no lease runs out) and
    handed out again, once."""
    q = make(lease=30.0, rate_limiter=NOW)
    real = q._run
    lost: list[list[str]] = []
    statuses: dict[str, list[str]] = {}  # key -> the statuses of its settles

    def run(script: str, args: list[str]) -> Any:
        reply = real(script, args)
        if script == "claim":
            for i, status in enumerate(reply[1]):
                statuses.setdefault(args[9 + 3 * i], []).append(status.decode())
            if len(args) > 9 and not lost:  # it carries a settle
                lost.append(args[9:])
                raise redis.exceptions.ConnectionError("reply lost")
        return reply

    q._run = run  # type: ignore[method-assign]
    keys = [f"k{i}" for i in range(4)]
    q.add_many(keys)
    handled: list[str] = []
    stats = run_until(q, handled.append, lambda: len(handled) == 4 and idle(q), workers=1)

    assert len(lost) == 1
    assert lost[0][0] == "k0"  # the first key's settle rode on the lost claim
    assert statuses["k0"] == ["ok", "repeat"]  # asked again: applied once
    assert all(statuses[key] == ["ok"] for key in keys[1:])
    assert sorted(handled) == keys  # each once: the lost claim's key handed back first
    assert stats == RunStats(processed=4, succeeded=4)
    s = q.stats()
    # Five holds ended: four handled, one handed back (counted as a done).
    assert (s.dones, s.gets, s.leases_expired, s.leases_lost) == (5, 5, 0, 0)
    assert all(q.num_requeues(key) == 0 for key in keys)


class _DoneCounted(RedisWorkQueue):
    """A queue whose ``done`` does more: run_workers must call it for each key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dones: list[str] = []

    def done(self, key: str) -> None:
        self.dones.append(key)
        super().done(key)


class _Proxy:
    """A wrapper that forwards everything but ``done``, which it records."""

    def __init__(self, q: RedisWorkQueue) -> None:
        self.q = q
        self.dones: list[str] = []

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.q, attr)

    def done(self, key: str) -> None:
        self.dones.append(key)
        self.q.done(key)


def scripts_of(q: RedisWorkQueue) -> list[str]:
    """The scripts ``q`` runs from now on (recorded)."""
    seen: list[str] = []
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        seen.append(script)
        return real(script, args)

    q._run = run  # type: ignore[method-assign]
    return seen


@pytest.mark.parametrize("wrapping", ["subclass", "proxy"])
def test_an_unbatched_subclass_or_a_proxy_that_changes_done_gets_each_done(
    valkey_url: str, name: str, wrapping: str
) -> None:
    """A subclass made with batch=False, or a proxy object (never batched):
    the workers call its get and done, once per key, and no claim runs."""
    if wrapping == "subclass":
        inner = _DoneCounted(name, url=valkey_url, batch=False)
        q: Any = inner
        assert not isinstance(worker_source(inner, None), Claims)
    else:
        inner = RedisWorkQueue(name, url=valkey_url)
        q = _Proxy(inner)
    try:
        seen = scripts_of(inner)
        keys = [f"k{i}" for i in range(6)]
        inner.add_many(keys)
        handled: list[str] = []
        stats = run_until(
            q, handled.append, lambda: len(q.dones) == len(keys) and idle(inner), workers=3
        )
        assert stats == RunStats(processed=6, succeeded=6)
        assert sorted(q.dones) == sorted(handled) == keys  # its done, for every key
        assert "claim" not in seen
        assert seen.count("done") == len(keys)
    finally:
        inner.close()


def test_shutdown_while_workers_run_puts_claimed_keys_back_without_a_failure(
    valkey_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim of four waiting workers is answered just as this client shuts
    down: the keys it took were handed to no worker, so they are put back at
    once (not after the 30 s lease), uncounted as failures."""
    views = watch_sources(monkeypatch)
    q = RedisWorkQueue(name, url=valkey_url)
    peer = RedisWorkQueue(name, url=valkey_url)
    claimed, shut = threading.Event(), threading.Event()
    claims: list[tuple[int, int]] = []  # want, taken
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        reply = real(script, args)
        if script == "claim" and reply[2] and not claimed.is_set():
            claims.append((int(args[4]), len(reply[2]) // 2))
            claimed.set()  # answered; the claimant has not seen the reply yet
            shut.wait(WAIT)
        return reply

    q._run = run  # type: ignore[method-assign]
    handled: list[str] = []
    result: list[RunStats] = []
    runner = threading.Thread(
        target=lambda: result.append(keyqueue.run_workers(q, handled.append, workers=4))
    )
    try:
        runner.start()
        deadline = time.monotonic() + WAIT
        while not (views and views[0]._book.waiting == 4 and views[0]._book.claimant_at_bell):
            assert time.monotonic() < deadline, "the four workers did not all wait"
            time.sleep(0.005)
        q.add_many([f"k{i}" for i in range(6)])
        assert claimed.wait(WAIT)
        q.shutdown()
        shut.set()
        runner.join(WAIT)
        assert not runner.is_alive()
        assert claims == [(4, 4)]
        assert handled == []
        assert result == [RunStats()]
        s = peer.stats()
        assert (s.depth, s.processing, s.leases_expired, s.retries) == (6, 0, 0, 0)
        got = [peer.get_nowait() for _ in range(6)]  # at once: no lease to wait out
        assert sorted(got) == [f"k{i}" for i in range(6)]
        assert all(peer.num_requeues(key) == 0 for key in got)
        assert q.stats().leases_expired == 0
    finally:
        shut.set()
        q.shutdown()
        runner.join(WAIT)
        peer.close()
        q.close()


def test_a_drain_of_200_keys_by_8_workers_costs_under_one_and_a_half_scripts_a_key(
    own_server: ValkeyServer,
) -> None:
    """One claim per batch, its settles riding along: well under the three
    scripts a key (get, forget, done) of one key at a time. Counted on the
    server (commandstats), not timed."""
    r = redis.Redis.from_url(own_server.url)
    q = RedisWorkQueue("q", url=own_server.url)
    keys = [f"k{i:03}" for i in range(200)]
    handled: list[str] = []
    try:
        q.add("warm-up")  # loads the scripts the run uses
        q.done(q.get_nowait())
        q.add_many(keys)
        before = scripts_run(r)
        lock = threading.Lock()
        all_handled = threading.Event()

        def handler(key: str) -> None:
            with lock:
                handled.append(key)
                if len(handled) == len(keys):
                    all_handled.set()

        stats = run_until(q, handler, all_handled.is_set, workers=8)
        scripts = scripts_run(r) - before
        assert stats == RunStats(processed=200, succeeded=200)
        assert sorted(handled) == keys
        assert scripts / len(keys) < 1.5, scripts
        s = q.stats()
        assert (s.dones, s.processing, s.depth) == (201, 0, 0)
    finally:
        q.close()
        r.close()


# -- arun_workers on an async Redis queue ----------------------------------------------------


async def arun_until(
    q: Any, handler: Callable[[str], Any], until: Callable[[], Any], workers: int
) -> RunStats:
    """``arun_workers`` until ``await until()`` holds, then stopped; its RunStats."""
    stop = asyncio.Event()
    runner = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=workers, stop=stop))
    try:
        deadline = time.monotonic() + WAIT
        while not await until():
            assert time.monotonic() < deadline, "the workers did not get there"
            assert not runner.done(), "arun_workers returned early"
            await asyncio.sleep(0.005)
    finally:
        stop.set()
    return await asyncio.wait_for(runner, WAIT)


async def aidle(q: AsyncRedisWorkQueue) -> bool:
    s = await q.stats()
    return s.depth == 0 and s.processing == 0 and s.delayed == 0


async def test_arun_workers_on_an_async_redis_queue_is_batched_and_its_run_stats_add_up(
    valkey_url: str, name: str
) -> None:
    async with AsyncRedisWorkQueue(name, url=valkey_url, max_retries=2, rate_limiter=NOW) as q:
        assert isinstance(worker_source(q, None), AsyncClaims)
        seen = scripts_of(q)
        requeued: set[str] = set()

        async def handler(key: str) -> Requeue | None:
            await asyncio.sleep(0)
            if key[0] == "f":
                raise RuntimeError(f"{key} fails")
            if key[0] == "p":
                raise PermanentError(f"{key} is hopeless")
            if key[0] == "r" and key not in requeued:
                requeued.add(key)
                return Requeue(after=0)
            return None

        keys = [f"{kind}{i}" for kind in "sfpr" for i in range(5)]
        await q.add_many(keys)
        stats = await arun_until(q, handler, lambda: aidle(q), workers=4)

        fields = [f for f in RunStats.__dataclass_fields__ if f != "processed"]
        assert stats.processed == sum(getattr(stats, f) for f in fields)
        assert stats == RunStats(
            processed=30, succeeded=10, requeued=5, retried=5, gave_up=5, permanent=5
        )
        s = await q.stats()
        assert s.gets == s.dones == 30
        assert "claim" in seen
        assert "get" not in seen
        assert "done" not in seen


async def test_async_lease_lost_at_settle_turns_a_success_into_lease_lost_with_one_warning(
    valkey_url: str, name: str, caplog: pytest.LogCaptureFixture
) -> None:
    clock = FakeClock()
    async with AsyncRedisWorkQueue(
        name, url=valkey_url, clock=clock, lease=10, rate_limiter=NOW
    ) as q:
        calls: list[tuple[str, int]] = []

        async def handler(key: str) -> None:
            calls.append((key, q.token(key)))
            if len(calls) == 1:
                clock.step(10)  # its lease runs out while it works
                await q._drive(q._op_reap())  # reaped now: its hold does not know

        await q.add_many(["a", "b"])
        with caplog.at_level(logging.WARNING, logger="keyqueue"):
            stats = await arun_until(q, handler, lambda: _and(aidle(q), len(calls) == 3), workers=1)

        assert stats == RunStats(processed=3, succeeded=2, lease_lost=1)
        lost = [r for r in caplog.records if "lease lost" in r.getMessage()]
        assert len(lost) == 1, [r.getMessage() for r in caplog.records]
        again = [token for key, token in calls if key == calls[0][0]]
        assert len(again) == 2  # handed out again, once
        assert again[1] > again[0]
        s = await q.stats()
        assert (s.leases_expired, s.leases_lost, s.dones, s.gets) == (1, 1, 2, 3)


async def _and(first: Any, second: bool) -> bool:
    return bool(await first) and second


class _AsyncDoneCounted(AsyncRedisWorkQueue):
    """An async queue whose ``done`` does more: arun_workers must call it for each key."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.dones: list[str] = []

    async def done(self, key: str) -> None:
        self.dones.append(key)
        await super().done(key)


async def test_an_unbatched_async_subclass_that_changes_done_gets_each_done(
    valkey_url: str, name: str
) -> None:
    async with _AsyncDoneCounted(name, url=valkey_url, batch=False) as q:
        assert not isinstance(worker_source(q, None), AsyncClaims)
        seen = scripts_of(q)
        keys = [f"k{i}" for i in range(6)]
        await q.add_many(keys)
        handled: list[str] = []

        async def handler(key: str) -> None:
            handled.append(key)

        stats = await arun_until(
            q, handler, lambda: _and(aidle(q), len(q.dones) == len(keys)), workers=3
        )
        assert stats == RunStats(processed=6, succeeded=6)
        assert sorted(q.dones) == sorted(handled) == keys
        assert "claim" not in seen
        assert seen.count("done") == len(keys)


async def test_async_shutdown_while_workers_run_puts_claimed_keys_back_without_a_failure(
    valkey_url: str, name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    views = watch_sources(monkeypatch)
    q = AsyncRedisWorkQueue(name, url=valkey_url)
    peer = AsyncRedisWorkQueue(name, url=valkey_url)
    claimed, shut = asyncio.Event(), asyncio.Event()
    claims: list[tuple[int, int]] = []
    real = q._run

    async def run(script: str, args: list[str]) -> Any:
        reply = await real(script, args)
        if script == "claim" and reply[2] and not claimed.is_set():
            claims.append((int(args[4]), len(reply[2]) // 2))
            claimed.set()
            await asyncio.wait_for(shut.wait(), WAIT)
        return reply

    q._run = run  # type: ignore[method-assign]
    handled: list[str] = []

    async def handler(key: str) -> None:
        handled.append(key)

    runner = asyncio.create_task(keyqueue.arun_workers(q, handler, workers=4))
    try:
        deadline = time.monotonic() + WAIT
        while not (views and views[0]._book.waiting == 4 and views[0]._book.claimant_at_bell):
            assert time.monotonic() < deadline, "the four workers did not all wait"
            await asyncio.sleep(0.005)
        await q.add_many([f"k{i}" for i in range(6)])
        await asyncio.wait_for(claimed.wait(), WAIT)
        await q.shutdown()
        shut.set()
        assert await asyncio.wait_for(runner, WAIT) == RunStats()
        assert claims == [(4, 4)]
        assert handled == []
        s = await peer.stats()
        assert (s.depth, s.processing, s.leases_expired, s.retries) == (6, 0, 0, 0)
        got = [await peer.get_nowait() for _ in range(6)]  # at once: no lease to wait out
        assert sorted(got) == [f"k{i}" for i in range(6)]
        assert [await peer.num_requeues(key) for key in got] == [0] * 6
    finally:
        shut.set()
        runner.cancel()
        await peer.aclose()
        await q.aclose()


async def test_an_async_drain_of_200_keys_by_8_workers_costs_under_one_and_a_half_scripts_a_key(
    own_server: ValkeyServer,
) -> None:
    r = redis.Redis.from_url(own_server.url)
    keys = [f"k{i:03}" for i in range(200)]
    handled: list[str] = []
    try:
        async with AsyncRedisWorkQueue("q", url=own_server.url) as q:
            await q.add("warm-up")  # loads the scripts the run uses
            await q.done(await q.get_nowait())
            await q.add_many(keys)
            before = scripts_run(r)

            async def handler(key: str) -> None:
                handled.append(key)

            async def all_handled() -> bool:
                return len(handled) == len(keys)

            stats = await arun_until(q, handler, all_handled, workers=8)
            scripts = scripts_run(r) - before
            assert stats == RunStats(processed=200, succeeded=200)
            assert sorted(handled) == keys
            assert scripts / len(keys) < 1.5, scripts
            s = await q.stats()
            assert (s.dones, s.processing, s.depth) == (201, 0, 0)
    finally:
        r.close()


async def test_an_asyncio_waiter_woken_then_cancelled_passes_the_wake_up_on(
    valkey_url: str, name: str
) -> None:
    """A claimant that leaves with a key wakes one waiter; if that waiter's
    task is cancelled before it looks, the next waiter is woken instead, so
    the keys left and the next claim are not left to nobody."""
    async with AsyncRedisWorkQueue(name, url=valkey_url) as q:
        claims = worker_source(q, None)
        assert isinstance(claims, AsyncClaims)
        first = asyncio.create_task(claims._wait_turn())
        second = asyncio.create_task(claims._wait_turn())
        await asyncio.sleep(0)  # both wait
        claims._claimant_left(True)
        first.cancel()  # woken, cancelled before it steps
        await asyncio.wait_for(second, WAIT)
        assert first.cancelled()
        assert claims._getters.blocked == 0
