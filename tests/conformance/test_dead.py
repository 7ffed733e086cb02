"""Dead keys on every front: a key given up is kept, listed newest first, and
can be replayed or forgotten.

Each test takes the ``front`` fixture (conftest.py), so it runs once per
queue (threading, asyncio, Redis, async Redis, and both sharded).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import pytest

from keyqueue import DeadKey, ItemFastSlowRateLimiter, PermanentError
from keyqueue.testing import FakeClock

if TYPE_CHECKING:
    from tests.support.fronts import Front


def failing(times: dict[Any, int], error: BaseException) -> Any:
    """A handler that raises ``error`` for every key, counting its calls."""

    def handler(key: Any) -> None:
        times[key] = times.get(key, 0) + 1
        raise error

    return handler


def immediate(front: Front, name: str, **kwargs: Any) -> Any:
    """A queue whose retries come back at once."""
    return front.make(name, rate_limiter=ItemFastSlowRateLimiter(0, 0, 1), **kwargs)


async def test_a_key_given_up_after_max_retries_is_kept_with_its_last_error(
    front: Front,
) -> None:
    q = immediate(front, "dead-retries", max_retries=3)
    calls: dict[Any, int] = {}
    q.add("a")
    before = time.time()
    stats = await front.run_workers(q, failing(calls, ValueError("boom")))

    assert (stats.gave_up, calls) == (1, {"a": 3})
    (dead,) = q.dead()
    assert isinstance(dead, DeadKey)
    assert (dead.key, dead.reason, dead.error_type, dead.error, dead.failures) == (
        "a",
        "retries",
        "ValueError",
        "boom",
        3,
    )
    assert dead.at >= before - 5  # wall time (the server's on Redis)
    assert q.snapshot().dead == (dead,)
    assert q.snapshot().failing == ()  # given up: its failures forgotten
    assert q.num_requeues("a") == 0


async def test_a_permanent_error_is_kept_as_dead_with_reason_permanent(front: Front) -> None:
    q = immediate(front, "dead-permanent", max_retries=5)
    q.add("p")
    await front.run_workers(q, failing({}, PermanentError("gone for good")))

    (dead,) = q.dead()
    assert (dead.key, dead.reason, dead.error_type, dead.error, dead.failures) == (
        "p",
        "permanent",
        "PermanentError",
        "gone for good",
        0,
    )


async def bury(front: Front, q: Any, clock: FakeClock, key: Any, error: BaseException) -> None:
    """Give ``key`` up as a runner does: held, ``retry`` says no, ``give_up``,
    ``done``; then a second passes on ``clock``, the queue's."""
    q.add(key)
    assert await front.get(q) == key
    assert q.retry(key) is False
    q.give_up(key, "retries", error)
    q.done(key)
    clock.step(1)  # one given up after another: newest first is by time


async def test_dead_lists_newest_first_and_limit_bounds_the_list(front: Front) -> None:
    clock = FakeClock()
    q = front.make("dead-order", clock=clock, max_retries=1)
    for key in ("a", "b", "c"):
        await bury(front, q, clock, key, RuntimeError(key))
    assert [d.key for d in q.dead()] == ["c", "b", "a"]
    assert [d.key for d in q.dead(limit=2)] == ["c", "b"]
    assert q.dead(limit=0) == ()
    assert [d.key for d in q.snapshot(limit=1).dead] == ["c"]
    assert [row["key"] for row in q.snapshot().as_dict()["dead"]] == ["c", "b", "a"]


@pytest.mark.parametrize(
    ("limit", "error"), [(-1, ValueError), (True, TypeError), (1.5, TypeError), ("5", TypeError)]
)
async def test_dead_with_a_bad_limit_raises_naming_it(
    front: Front, limit: Any, error: type[Exception]
) -> None:
    q = front.make("dead-bad-limit", clock=FakeClock())
    q.give_up("a", "manual")
    with pytest.raises(error, match="limit"):
        q.dead(limit=limit)
    assert [d.key for d in q.dead(limit=1)] == ["a"]


async def test_a_key_given_up_again_replaces_its_entry_as_the_newest(front: Front) -> None:
    clock = FakeClock()
    q = front.make("dead-again", clock=clock, max_retries=1)
    await bury(front, q, clock, "a", RuntimeError("first"))
    await bury(front, q, clock, "b", RuntimeError("b"))
    await bury(front, q, clock, "a", RuntimeError("second"))
    assert [(d.key, d.error) for d in q.dead()] == [("a", "second"), ("b", "b")]


async def test_replay_adds_a_dead_key_back_with_its_failures_cleared(front: Front) -> None:
    q = front.make("dead-replay", clock=FakeClock(), max_retries=2)
    q.add("a")
    assert await front.get(q) == "a"
    assert q.retry("a") is True  # one failure, backing off
    q.give_up("a", "permanent", PermanentError("no"))
    q.done("a")
    assert q.stats().delayed == 1  # the backoff's delayed add stands

    assert q.replay("a") is True
    assert q.dead() == ()
    assert q.replay("a") is False  # not dead any more
    assert q.replay("never-dead") is False
    assert await front.get(q) == "a"
    # Its failures were cleared: it has max_retries tries again.
    assert q.retry("a") is True
    q.done("a")
    assert q.snapshot().failing[0].failures == 1


async def test_replay_all_adds_every_dead_key_back_oldest_first(front: Front) -> None:
    clock = FakeClock()
    q = front.make("dead-all", clock=clock, max_retries=1)
    for key in ("a", "b", "c"):
        await bury(front, q, clock, key, RuntimeError(key))
    assert q.replay_all() == 3
    assert q.dead() == ()
    got = {await front.get(q) for _ in range(3)}
    assert got == {"a", "b", "c"}
    for key in got:
        q.done(key)
    assert q.replay_all() == 0


async def test_replaying_a_key_already_waiting_coalesces(front: Front) -> None:
    clock = FakeClock()
    q = front.make("dead-waiting", clock=clock, max_retries=1)
    await bury(front, q, clock, "a", RuntimeError("x"))
    q.add("a")  # waiting again meanwhile
    assert q.replay("a") is True  # the entry is dropped; the add coalesces
    assert q.dead() == ()
    assert q.stats().depth == 1
    assert await front.get(q) == "a"
    q.done("a")
    assert q.stats().depth == 0


async def test_replaying_a_held_key_marks_it_for_one_redelivery(front: Front) -> None:
    clock = FakeClock()
    q = front.make("dead-held", clock=clock, max_retries=1)
    await bury(front, q, clock, "a", RuntimeError("x"))
    q.add("a")
    assert await front.get(q) == "a"  # held
    assert q.replay("a") is True
    q.done("a")
    assert await front.get(q) == "a"  # handed out once more
    q.done("a")
    assert q.stats().depth == 0


async def test_forget_dead_drops_one_entry_without_adding_it(front: Front) -> None:
    clock = FakeClock()
    q = front.make("dead-forget", clock=clock, max_retries=1)
    await bury(front, q, clock, "a", RuntimeError("x"))
    await bury(front, q, clock, "b", RuntimeError("x"))
    assert q.forget_dead("a") is True
    assert q.forget_dead("a") is False
    assert [d.key for d in q.dead()] == ["b"]
    assert q.stats().depth == 0


async def test_give_up_by_hand_keeps_the_error_and_forgets_the_failures(front: Front) -> None:
    q = front.make("dead-by-hand", clock=FakeClock(), max_retries=5)
    q.add("a")
    assert await front.get(q) == "a"
    assert q.retry("a") is True
    q.give_up("a", "retries", OSError("timed out"))
    q.done("a")
    (dead,) = q.dead()
    assert (dead.reason, dead.error_type, dead.error, dead.failures) == (
        "retries",
        "OSError",
        "timed out",
        1,
    )
    assert q.snapshot().failing == ()
    q.give_up("b", "manual")  # any str; no error
    assert next((d.key, d.reason, d.error_type, d.error) for d in q.dead()) == (
        "b",
        "manual",
        None,
        None,
    )


async def test_a_queue_that_never_gives_up_has_no_dead_keys(front: Front) -> None:
    q = immediate(front, "dead-none", max_retries=3)
    q.add("a")
    assert q.replay_all() == 0
    q.add("b")
    await front.run_workers(q, lambda key: None)
    assert q.dead() == ()
    assert q.snapshot().dead == ()
