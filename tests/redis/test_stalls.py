"""What a dead holder costs: nothing for a key whose handler
never started, a stall for one whose handler did, a poison give-up past
``max_stalls`` stalls in a row (``lua/lib/reap.lua``, ``lib/lease.lua``).

In one process, on the session's server: the claim script's hold stays
unstarted until its client reports the start (with its next claim, its
renewal, or synchronously for a key whose last holder died holding it); the
runners report starts so and pass a poison key to ``on_give_up`` with
``Stalled``. A "dead" holder is a client whose hold is taken by a script run
by hand (no renewal) or whose renewals are stopped. The same with processes
killed for real: tests/redis/test_processes.py.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
import redis

import keyqueue
from keyqueue import ItemFastSlowRateLimiter
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue, Stalled
from keyqueue.redis._holds import REPORTED, STARTED, UNSTARTED
from keyqueue.redis._schema import key_names
from keyqueue.testing import FakeClock
from tests.support import valkey_server

NOW = ItemFastSlowRateLimiter(0, 0, 1)  # a local limiter that retries at once
WAIT = 10.0  # generous bound, wall seconds

name = valkey_server.name
make = valkey_server.make


def run_of(client: redis.Redis, queue: str, key: str) -> str:
    """The run field of ``key``'s lease on the server (lib/lease.lua): 'u', 's', 'U', 'S'."""
    lease = client.hget(key_names(queue)[3], key)
    assert lease is not None, f"{key!r} is not held"
    return str(lease.split()[-1])


def stall_records(client: redis.Redis, queue: str) -> dict[str, int]:
    raw = client.hgetall(f"keyqueue:{{{queue}}}:stalls")
    return {k: int(v) for k, v in raw.items()}


def claim(q: RedisWorkQueue, want: int) -> list[tuple[str, Any]]:
    taken, _, _ = q._drive(q._op_claim(want, [], time.monotonic()))
    return taken


def wait_for(check: Callable[[], object], what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


@pytest.fixture
def raw(valkey_url: str) -> Any:
    c = redis.Redis.from_url(valkey_url, decode_responses=True)
    yield c
    c.close()


# -- the scripts, one process, a virtual clock ------------------------------------------------


def test_a_claimed_key_no_worker_started_comes_back_charged_nothing_and_suspect(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    """A claim's holds are unstarted on the server; the claimant hands one to a
    worker (its start not reported yet) and dies. Both come back at once after
    the lease, charged nothing (no failure, no stall, no backoff), each with a
    stall record of 0; the next claim flags both as suspects."""
    clock = FakeClock()
    dead = make(clock=clock, lease=10, max_retries=1)
    other = make(clock=clock, lease=10, max_retries=1)
    other.add_many(["a", "b"])
    taken = claim(dead, 2)
    assert [key for key, _ in taken] == ["a", "b"]
    assert [run_of(raw, name, key) for key, _ in taken] == ["u", "u"]
    dead._started(*taken[0])  # handed to a worker: reported with the next claim
    assert [hold.run for _, hold in taken] == [STARTED, UNSTARTED]
    clock.step(10)
    s = other.stats()
    assert (s.leases_expired, s.stalls, s.retries, s.depth, s.given_up_stalls) == (2, 0, 0, 2, 0)
    assert other.snapshot().failing == ()
    assert stall_records(raw, name) == {"a": 0, "b": 0}
    again = claim(other, 2)
    assert [(key, hold.suspect) for key, hold in again] == [("a", True), ("b", True)]
    assert [run_of(raw, name, key) for key, _ in again] == ["U", "U"]


def test_a_start_reported_with_the_next_claim_makes_a_dead_holder_a_stall(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    clock = FakeClock()
    q = make(clock=clock, lease=10, max_retries=1)
    q.add_many(["a", "b"])
    (a, hold_a), (b, _) = claim(q, 2)
    q._started(a, hold_a)
    claim(q, 1)  # the next claim carries a's start (a settle triple, mode 's')
    assert (hold_a.run, run_of(raw, name, a), run_of(raw, name, b)) == (REPORTED, "s", "u")
    clock.step(10)  # the process died: a is a stall, b cost nothing
    s = q.stats()
    assert (s.leases_expired, s.stalls, s.given_up_stalls, s.retries) == (2, 1, 0, 0)
    assert stall_records(raw, name) == {"a": 1, "b": 0}


def test_a_renewal_reports_the_starts_and_renews_every_held_key(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    q = make(lease=30)
    q.add_many(["a", "b"])
    (a, hold_a), (b, hold_b) = claim(q, 2)
    q._started(a, hold_a)
    args, starts = q._renewal()
    assert args[2:] == ["a", str(hold_a.token), "s", "b", str(hold_b.token), "-"]
    assert starts == [hold_a]
    q._renew_once()
    assert (hold_a.run, run_of(raw, name, a), run_of(raw, name, b)) == (REPORTED, "s", "u")
    assert q._renewal()[1] == []  # reported once
    q.close()


def test_a_done_ends_the_stalls_in_a_row_and_a_poison_key_is_given_up_past_max_stalls(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    """max_stalls=2: a key stalls twice, is done once (the row ends), then
    stalls three times in a row: given up at the third, forgotten with its
    failures, its stall record gone."""
    clock = FakeClock()
    q = make(clock=clock, lease=10, max_retries=5, max_stalls=2, rate_limiter=NOW)
    q.add("p")
    for _ in range(2):
        assert q.get_nowait() == "p"
        clock.step(10)
    assert stall_records(raw, name) == {"p": 2}
    assert q.get_nowait() == "p"
    assert q.retry("p") is True  # a handler failure: counted apart from stalls
    q.done("p")  # the row ends (not the failures)
    assert stall_records(raw, name) == {}
    for _ in range(3):
        assert q.get_nowait() == "p"
        clock.step(10)
    with pytest.raises(keyqueue.Empty):
        q.get_nowait()
    s = q.stats()
    assert (s.stalls, s.given_up_stalls, s.given_up_retries) == (5, 1, 0)
    assert stall_records(raw, name) == {}
    assert q.snapshot().failing == ()  # forgotten, failures and all


def test_max_stalls_is_checked(make: Callable[..., RedisWorkQueue]) -> None:
    for bad in (-1, 1.5, True, None, "1"):
        with pytest.raises(ValueError, match="max_stalls must be an int >= 0"):
            make(max_stalls=bad)
    assert make().max_stalls == 1
    assert make(max_stalls=0).max_stalls == 0


# -- the runners ------------------------------------------------------------------------------


def test_run_workers_reports_a_suspect_keys_start_before_its_handler_runs(
    make: Callable[..., RedisWorkQueue], raw: redis.Redis, name: str
) -> None:
    """A key whose last holder died with it unstarted has a stall record: the
    worker that gets it reports its start (one renewal, start 'S') before the
    handler runs, so the handler finds its hold started on the server."""
    dead = make(lease=0.3, max_retries=1)
    dead.add("k")
    dead._stop_renewing.set()  # it dies holding k, unstarted
    claim(dead, 1)
    wait_for(lambda: dead.stats().leases_expired == 1, "k's lease to run out")
    assert stall_records(raw, name) == {"k": 0}
    q = make(lease=30, max_retries=1)
    sent: list[tuple[str, list[str]]] = []
    real = q._run

    def run(script: str, args: list[str]) -> Any:
        sent.append((script, args))
        return real(script, args)

    q._run = run  # type: ignore[method-assign]
    runs: list[str] = []
    stop = threading.Event()

    def handler(key: str) -> None:
        runs.append(run_of(raw, name, key))
        stop.set()

    stats = keyqueue.run_workers(q, handler, stop=stop)
    assert stats == keyqueue.RunStats(processed=1, succeeded=1)
    assert runs == ["S"]  # started on the server before the handler ran
    starts = [args for script, args in sent if script == "renew" and args[-1] == "S"]
    assert [args[2] for args in starts] == ["k"]
    assert stall_records(raw, name) == {}  # its done ended the record


@pytest.mark.parametrize("front", ["threads", "asyncio"])
def test_a_poison_key_goes_to_on_give_up_with_stalled(
    front: str, make: Callable[..., RedisWorkQueue], valkey_url: str, name: str
) -> None:
    """A holder took the key (a get: started) and died; the runner's claim
    reaps it: with max_stalls=0 its first stall gives it up, and the runner
    passes it to on_give_up with Stalled (an async one awaited)."""
    dead = make(lease=0.3)
    dead.add("p")
    dead._run(*next(dead._op_get(time.monotonic())))  # a get whose holder died at once
    given: list[tuple[str, BaseException]] = []
    if front == "threads":
        q = make(lease=0.3, max_stalls=0)
        stop = threading.Event()

        def on_give_up(key: str, error: BaseException) -> None:
            given.append((key, error))
            stop.set()

        stats = keyqueue.run_workers(q, lambda key: None, stop=stop, on_give_up=on_give_up)
        s = q.stats()
    else:

        async def main() -> tuple[keyqueue.RunStats, Any]:
            aq = AsyncRedisWorkQueue(name, url=valkey_url, lease=0.3, max_stalls=0)
            stop = asyncio.Event()

            async def on_give_up(key: str, error: BaseException) -> None:
                await asyncio.sleep(0)
                given.append((key, error))
                stop.set()

            async def handler(key: str) -> None:
                pass

            try:
                async with asyncio.timeout(WAIT):
                    result = await keyqueue.arun_workers(
                        aq, handler, stop=stop, on_give_up=on_give_up
                    )
                return result, await aq.stats()
            finally:
                await aq.aclose()

        stats, s = asyncio.run(main())
    assert stats == keyqueue.RunStats()  # no handler ran
    assert [key for key, _ in given] == ["p"]
    assert isinstance(given[0][1], Stalled)
    assert "max_stalls (0)" in str(given[0][1])
    assert (s.stalls, s.given_up_stalls, s.depth) == (1, 1, 0)
