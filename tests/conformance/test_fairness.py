"""Priorities and aging, on every front (docs/fairness.md is the contract).

The same ``front`` fixture as conformance/test_behaviour.py: each test runs on
``WorkQueue``, ``AsyncWorkQueue`` and both Redis fronts, on a ``FakeClock``, and
pins an exact order of hand-outs. The rule: higher priority first, the
earliest arrival among equals; a key keeps the highest priority it was added
with until its ``get``; with ``aging=a`` a waiting key's effective priority is
``priority + wait / a``, so ranking is by ``arrival - priority * a``. With
``fair_by``, the groups with keys waiting at the priority a key is handed out
from take turns, FIFO within each.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import pytest
from prometheus_client import CollectorRegistry

from keyqueue import Empty, ItemExponentialFailureRateLimiter, Requeue
from keyqueue.prometheus import PrometheusMetrics
from keyqueue.testing import FakeClock

if TYPE_CHECKING:
    from tests.support.fronts import Front


def take_all(q: Any) -> list[Any]:
    """Get and finish every waiting key, in order."""
    keys = []
    while True:
        try:
            key = q.get_nowait()
        except Empty:
            return keys
        q.done(key)
        keys.append(key)


def stream(q: Any, clock: FakeClock, seconds: int, priority: int) -> tuple[list[str], float | None]:
    """One key of ``priority`` arrives each second, then one get (and done):
    the order of hand-outs, and when ``low`` was handed out (None: never)."""
    order: list[str] = []
    low_at = None
    for i in range(seconds):
        clock.step(1)
        q.add(f"high-{i}", priority)
        key = q.get_nowait()
        q.done(key)
        order.append(key)
        if key == "low":
            low_at = clock.now()
    return order, low_at


# -- priorities --------------------------------------------------------------------


async def test_higher_priority_first_and_first_come_first_served_within_a_priority(
    front: Front,
) -> None:
    q = front.make("prio", clock=FakeClock())
    q.add("a")
    q.add("b", 0)
    q.add("c", 5)
    q.add("d", 1)
    q.add("e", 5)
    q.add("f", -3)
    q.add("g")

    assert take_all(q) == ["c", "e", "d", "a", "b", "g", "f"]


async def test_keys_waiting_before_the_first_priority_keep_their_order(front: Front) -> None:
    q = front.make("switch", clock=FakeClock())
    for key in ["x", "y", "z"]:
        q.add(key)
    q.add("urgent", 1)
    q.add("w")

    assert take_all(q) == ["urgent", "x", "y", "z", "w"]


async def test_a_waiting_key_keeps_the_highest_priority_it_was_added_with(front: Front) -> None:
    q = front.make("keep-highest", clock=FakeClock())
    q.add("a", 1)
    q.add("b", 3)
    q.add("a", 5)  # raised above b
    q.add("a", 2)  # lower: ignored
    q.add("a")  # the default: ignored too
    q.add("c", 4)

    assert dict(q.stats().waiting_by_priority) == {5: 1, 4: 1, 3: 1}
    assert take_all(q) == ["a", "c", "b"]


async def test_a_raised_key_keeps_its_arrival_among_keys_of_its_new_priority(
    front: Front,
) -> None:
    q = front.make("raise-keeps-arrival", clock=FakeClock())
    q.add("early")
    q.add("late", 5)
    q.add("early", 5)  # same priority as late now, but it arrived first

    assert take_all(q) == ["early", "late"]


async def test_a_key_below_zero_is_raised_by_a_default_add(front: Front) -> None:
    q = front.make("below-zero", clock=FakeClock())
    q.add("a", -5)
    q.add("b", -1)
    q.add("a")  # 0 > -5

    assert take_all(q) == ["a", "b"]


async def test_the_priority_is_forgotten_once_the_key_is_handed_out(front: Front) -> None:
    q = front.make("forgotten", clock=FakeClock())
    q.add("a", 5)
    assert q.get_nowait() == "a"
    q.done("a")
    q.add("b", 1)
    q.add("a")

    assert take_all(q) == ["b", "a"]


async def test_key_added_while_held_comes_back_with_the_highest_priority_of_those_adds(
    front: Front,
) -> None:
    q = front.make("held", clock=FakeClock())
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a", 3)  # marked while processing
    q.add("a", 1)  # coalesced: lower, ignored
    q.add("b", 2)
    assert len(q) == 1
    q.done("a")  # pushed back at priority 3

    assert dict(q.stats().waiting_by_priority) == {3: 1, 2: 1}
    assert take_all(q) == ["a", "b"]


async def test_key_added_while_held_below_zero_is_raised_by_a_later_default_add(
    front: Front,
) -> None:
    q = front.make("held-below-zero", clock=FakeClock())
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a", -2)
    q.add("a")  # 0 > -2
    q.add("b", -1)
    q.done("a")

    assert take_all(q) == ["a", "b"]


async def test_add_after_adds_with_the_highest_priority_asked_at_the_earliest_time(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("delayed-priority", clock=clock)
    q.add_after("a", 5, priority=1)
    q.add_after("a", 10, priority=3)  # later: ignored, but its priority is kept
    q.add_after("b", 2, priority=2)
    q.add("c")
    clock.step(5)

    assert take_all(q) == ["a", "b", "c"]
    clock.step(10)
    assert take_all(q) == []


async def test_add_after_zero_adds_now_with_its_priority(front: Front) -> None:
    q = front.make("delay-zero-priority", clock=FakeClock())
    q.add("a")
    q.add_after("b", 0, priority=2)

    assert take_all(q) == ["b", "a"]


async def test_add_rate_limited_adds_with_its_priority(front: Front) -> None:
    clock = FakeClock()
    q = front.make(
        "rate-limited-priority",
        clock=clock,
        rate_limiter=ItemExponentialFailureRateLimiter(1.0, 10.0),
    )
    q.add_rate_limited("a", priority=4)
    q.add_rate_limited("b")
    clock.step(1)
    q.add("c", 2)

    assert take_all(q) == ["a", "c", "b"]


@pytest.mark.parametrize(
    ("priority", "error"),
    [(1.5, TypeError), ("1", TypeError), (True, TypeError), (2**31, ValueError)],
)
async def test_a_bad_priority_raises_naming_it_and_changes_nothing(
    front: Front, priority: Any, error: type[Exception]
) -> None:
    clock = FakeClock()
    q = front.make("bad-priority", clock=clock)
    q.add("a")
    before = q.stats()

    for call in (
        lambda: q.add("b", priority),
        lambda: q.add_after("b", 1, priority=priority),
        lambda: q.add_after("b", 0, priority=priority),
        lambda: q.add_rate_limited("b", priority=priority),
    ):
        with pytest.raises(error, match="priority"):
            call()

    clock.step(100)
    after = q.stats()
    assert after.oldest_wait_seconds == 100.0  # a still waits, nothing else
    assert dataclasses.replace(after, oldest_wait_seconds=0.0) == before
    assert take_all(q) == ["a"]


async def test_a_false_priority_is_zero_also_once_ranked(front: Front) -> None:
    clock = FakeClock()
    q = front.make("false-priority", clock=clock)
    q.add("a", None)
    q.add("b", 1)
    q.add("a", None)  # coalesced into a ranked waiting key
    q.add_after("c", 0, priority=0.0)
    q.add_after("d", 1, priority=None)
    q.add_after("d", 2, priority=None)
    clock.step(1)

    assert dict(q.stats().waiting_by_priority) == {1: 1, 0: 3}
    assert take_all(q) == ["b", "a", "c", "d"]


async def test_the_priority_range_is_32_bit(front: Front) -> None:
    q = front.make("range", clock=FakeClock())
    q.add("lowest", -(2**31))
    q.add("highest", 2**31 - 1)
    q.add("zero")

    assert take_all(q) == ["highest", "zero", "lowest"]


# -- aging ---------------------------------------------------------------------------


async def test_strict_priorities_starve_a_low_key_while_higher_ones_keep_coming(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("strict", clock=clock)
    q.add("low")

    order, low_at = stream(q, clock, 20, priority=2)

    assert low_at is None
    assert order == [f"high-{i}" for i in range(20)]
    assert q.stats().oldest_wait_seconds == 20.0


async def test_aging_hands_a_low_key_out_after_priority_steps_times_aging(front: Front) -> None:
    clock = FakeClock()
    q = front.make("aging", clock=clock, aging=1.0)
    q.add("low")  # t=0, priority 0: score 0

    order, low_at = stream(q, clock, 6, priority=2)

    # high-i arrives at t=i+1 with score i+1-2: high-1 ties with low (score 0)
    # and low arrived first, so low goes at t=2: (2 - 0) * 1 s after it arrived.
    assert order == ["high-0", "low", "high-1", "high-2", "high-3", "high-4"]
    assert low_at == 2.0


async def test_aging_bound_scales_with_the_priority_gap(front: Front) -> None:
    clock = FakeClock()
    q = front.make("aging-gap", clock=clock, aging=0.5)
    q.add("low", -2)

    _, low_at = stream(q, clock, 20, priority=4)

    assert low_at == (4 - -2) * 0.5  # (P_max - p) * aging: 3 s


async def test_aging_equal_scores_go_to_the_earlier_arrival(front: Front) -> None:
    clock = FakeClock()
    q = front.make("aging-ties", clock=clock, aging=2.0)
    q.add("first")  # t=0: score 0
    clock.step(2)
    q.add("second", 1)  # t=2: score 2 - 1 * 2 = 0
    clock.step(0.5)
    q.add("third", 1)  # t=2.5: score 0.5

    assert take_all(q) == ["first", "second", "third"]


async def test_aging_counts_from_arrival_also_for_keys_waiting_before_the_first_priority(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("aging-switch", clock=clock, aging=1.0)
    q.add("a")  # t=0
    clock.step(1)
    q.add("b")  # t=1
    clock.step(2)
    q.add("c", 1)  # t=3: score 2, behind a (0) and b (1)
    clock.step(1)
    q.add("d", 3)  # t=4: score 1, ties with b, which arrived first

    assert take_all(q) == ["a", "b", "d", "c"]


async def test_a_key_pushed_back_before_the_first_priority_keeps_its_arrival_at_that_done(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("aging-switch-redelivered", clock=clock, aging=1.0)
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # t=0: marked while held
    clock.step(1)
    q.add("x")  # t=1
    clock.step(2)
    q.done("a")  # t=3: a arrives, after x
    clock.step(1)
    assert q.stats().oldest_wait_seconds == 3.0  # x
    q.add("c", 1)  # t=4, ranked from now: score 3, as a's (a came first)

    assert take_all(q) == ["x", "a", "c"]


async def test_aging_of_a_key_pushed_back_by_done_counts_from_that_done(front: Front) -> None:
    clock = FakeClock()
    q = front.make("aging-redelivered", clock=clock, aging=1.0)
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # t=0, marked while held
    clock.step(3)
    q.add("b", 1)  # t=3: score 2
    clock.step(1)
    q.done("a")  # t=4: a enters the waiting set: score 4

    assert take_all(q) == ["b", "a"]


async def test_a_raised_key_ages_from_its_first_arrival(front: Front) -> None:
    clock = FakeClock()
    q = front.make("aging-raise", clock=clock, aging=1.0)
    q.add("a")  # t=0
    clock.step(1)
    q.add("b", 1)  # t=1: score 0
    clock.step(1)
    q.add("a", 1)  # raised: score 0 - 1 = -1, ahead of b

    assert take_all(q) == ["a", "b"]


async def test_aging_rejects_anything_but_none_or_positive_finite_seconds(front: Front) -> None:
    for aging in (0, -1.0, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="aging"):
            front.make("bad-aging", aging=aging)
    for aging in ("1", True):
        with pytest.raises(TypeError, match="aging"):
            front.make("bad-aging", aging=aging)
    assert front.make("aging-int", aging=2).aging == 2.0


# -- fairness within a priority: fair_by --------------------------------------------


def namespace(key: str) -> str:
    """The group of ``namespace/name``."""
    return key.split("/", 1)[0]


async def test_fair_by_hands_out_the_groups_in_turn_fifo_within_each(front: Front) -> None:
    q = front.make("fair-turns", clock=FakeClock(), fair_by=namespace)
    for i in range(5):
        q.add(f"a/{i}")
    q.add("b/0")
    q.add("c/0")
    q.add("b/1")

    assert q.fair_by is namespace
    assert len(q) == 8
    assert take_all(q) == ["a/0", "b/0", "c/0", "a/1", "b/1", "a/2", "a/3", "a/4"]


async def test_fair_by_a_group_that_starts_waiting_joins_the_turns_at_the_back(
    front: Front,
) -> None:
    q = front.make("fair-join", clock=FakeClock(), fair_by=namespace)
    for i in range(4):
        q.add(f"a/{i}")
    q.add("b/0")
    assert q.get_nowait() == "a/0"  # a goes to the back: b, a
    q.done("a/0")
    q.add("c/0")  # joins behind a: b, a, c

    assert take_all(q) == ["b/0", "a/1", "c/0", "a/2", "a/3"]


async def test_fair_by_a_quiet_groups_key_waits_for_one_key_of_each_busy_group(
    front: Front,
) -> None:
    q = front.make("fair-relist", clock=FakeClock(), fair_by=namespace)
    q.add_many([f"relist/{i}" for i in range(200)])
    q.add_many([f"other/{i}" for i in range(200)])
    q.add("quiet/edit")

    assert take_all(q)[:3] == ["relist/0", "other/0", "quiet/edit"]


async def test_fair_by_takes_turns_within_a_priority_higher_priorities_first(
    front: Front,
) -> None:
    q = front.make("fair-prio", clock=FakeClock(), fair_by=namespace)
    for i in range(3):
        q.add(f"a/{i}")
    q.add("b/0")
    q.add("b/1", 2)
    q.add("a/9", 2)
    q.add("a/0", 2)  # raised: it joins a's keys at 2 by its arrival, ahead of a/9

    assert dict(q.stats().waiting_by_priority) == {2: 3, 0: 3}
    listed = [(w.key, w.priority) for w in q.snapshot(limit=5).waiting]
    assert listed == [("b/1", 2), ("a/0", 2), ("a/9", 2), ("a/1", 0), ("b/0", 0)]
    assert take_all(q) == ["b/1", "a/0", "a/9", "a/1", "b/0", "a/2"]


async def test_fair_by_a_group_whose_only_key_moved_up_joins_at_the_back_when_it_comes_back(
    front: Front,
) -> None:
    q = front.make("fair-moved-up", clock=FakeClock(), fair_by=namespace)
    q.add("a/0")
    q.add("b/0")  # turns at 0: a, b
    q.add("a/0", 1)  # a has no key left at 0: b's turn there
    q.add("a/1")  # a waits at 0 again: behind b

    assert take_all(q) == ["a/0", "b/0", "a/1"]


async def test_fair_by_a_key_added_while_held_comes_back_behind_its_group(front: Front) -> None:
    q = front.make("fair-held", clock=FakeClock(), fair_by=namespace)
    q.add("a/0")
    q.add("a/1")
    q.add("b/0")
    assert q.get_nowait() == "a/0"
    q.add("a/0")  # pending: its done pushes it behind a/1
    q.done("a/0")

    assert take_all(q) == ["b/0", "a/1", "a/0"]


async def test_fair_by_keeps_the_aging_bound_taking_turns_within_the_aged_priority(
    front: Front,
) -> None:
    orders = []
    for fair_by in (None, namespace):
        clock = FakeClock()
        q = front.make(f"fair-aging-{fair_by is None}", clock=clock, aging=5.0, fair_by=fair_by)
        q.add_many(["a/0", "a/1", "c/0"])  # priority 0 at t=0
        handed: list[tuple[float, str]] = []
        for i in range(8):
            clock.step(1)
            q.add(f"b/{i}", 1)  # a priority-1 stream at full capacity
            key = q.get_nowait()
            q.done(key)
            handed.append((clock.now(), key))
        orders.append([(at, key) for at, key in handed if key[0] != "b"])

    plain, fair = orders
    assert plain == [(5.0, "a/0"), (6.0, "a/1"), (7.0, "c/0")]
    assert fair == [(5.0, "a/0"), (6.0, "c/0"), (7.0, "a/1")]  # the same slots, in turn


async def test_fair_by_must_return_a_str_and_its_errors_add_nothing(front: Front) -> None:
    def group(key: str) -> Any:
        if key == "boom":
            raise LookupError(key)
        return 1 if key == "int" else "g"

    q = front.make("fair-bad", clock=FakeClock(), fair_by=group)
    with pytest.raises(TypeError, match="fair_by must return a str"):
        q.add("int")
    with pytest.raises(LookupError):
        q.add("boom")
    q.add("ok")

    assert q.stats().depth == 1
    assert take_all(q) == ["ok"]
    with pytest.raises(TypeError, match="fair_by must be a callable"):
        front.make("fair-not-callable", fair_by="namespace")


async def test_fair_by_is_asked_at_every_add_and_a_raise_changes_nothing(front: Front) -> None:
    """A key's group is checked by the call that adds it, also when the key
    is pushed later (a delay, a backoff, a held key's done) or with others
    (``add_many``: none added): the error is the caller's, never a timer's
    or a later ``done``'s."""
    broken: set[str] = {"bad"}

    def group(key: str) -> str:
        if key in broken:
            raise LookupError(key)
        return key.split("/", 1)[0]

    clock = FakeClock()
    q = front.make(
        "fair-checked",
        clock=clock,
        fair_by=group,
        rate_limiter=ItemExponentialFailureRateLimiter(1.0, 10.0),
    )
    with pytest.raises(LookupError):
        q.add_many(["a/1", "bad", "a/2"])
    assert q.stats().depth == 0
    with pytest.raises(LookupError):
        q.add_after("bad", 5)
    with pytest.raises(LookupError):
        q.add_rate_limited("bad")
    assert (q.stats().delayed, q.num_requeues("bad")) == (0, 0)

    q.add("h/1")
    assert await front.get(q) == "h/1"
    broken.add("h/1")
    with pytest.raises(LookupError):
        q.add("h/1")  # held: its done would push it
    q.done("h/1")
    clock.step(10)
    assert q.stats().depth == 0  # not marked, nothing pushed, nothing due
    broken.clear()
    q.add_many(["a/1", "b/1", "a/2"])
    assert sorted(take_all(q)) == ["a/1", "a/2", "b/1"]


async def test_fair_by_a_key_given_up_by_hand_is_replayed_into_its_group(front: Front) -> None:
    """A key given up that was never added (``give_up`` by hand) comes back
    in its group: in memory ``replay`` asks ``fair_by``, on Redis
    ``give_up`` sent the group with the dead key."""
    q = front.make("fair-replay", clock=FakeClock(), fair_by=lambda key: key.split("/", 1)[0])
    q.add("c/0")  # the queue in use (on Redis: fair from this first add)
    assert take_all(q) == ["c/0"]
    for key in ("a/1", "a/2", "b/1"):
        q.give_up(key, "manual")
    assert q.replay_all() == 3  # oldest first: a/1, a/2, then b/1 joins the turns
    assert take_all(q) == ["a/1", "b/1", "a/2"]


# -- stats and metrics -------------------------------------------------------------


async def test_stats_waiting_by_priority_and_oldest_wait(front: Front) -> None:
    clock = FakeClock()
    q = front.make("stats", clock=clock)
    s = q.stats()
    assert (dict(s.waiting_by_priority), s.oldest_wait_seconds) == ({}, 0.0)

    q.add("a")  # t=0
    clock.step(1)
    q.add("b")  # t=1
    clock.step(4)
    s = q.stats()
    assert (dict(s.waiting_by_priority), s.oldest_wait_seconds) == ({0: 2}, 5.0)

    q.add("c", 2)  # t=5
    q.add("d", 2)
    q.add("e", -1)
    clock.step(1)
    s = q.stats()
    assert (dict(s.waiting_by_priority), s.oldest_wait_seconds) == ({2: 2, 0: 2, -1: 1}, 6.0)

    assert [q.get_nowait() for _ in range(3)] == ["c", "d", "a"]
    s = q.stats()
    assert (dict(s.waiting_by_priority), s.oldest_wait_seconds) == ({0: 1, -1: 1}, 5.0)
    with pytest.raises(TypeError):
        s.waiting_by_priority[7] = 1  # type: ignore[index]


async def test_oldest_wait_of_a_key_pushed_back_by_done_counts_from_that_done(
    front: Front,
) -> None:
    clock = FakeClock()
    q = front.make("oldest-redelivered", clock=clock)
    q.add("a")
    assert q.get_nowait() == "a"
    q.add("a")  # t=0: dirty, held
    clock.step(3)
    assert q.stats().oldest_wait_seconds == 0.0  # nothing waits
    q.done("a")  # t=3: waiting from now
    clock.step(2)
    assert q.stats().oldest_wait_seconds == 2.0
    q.add("b")  # t=5
    clock.step(1)
    assert q.stats().oldest_wait_seconds == 3.0  # a, pushed back at t=3


async def test_prometheus_waiting_keys_by_priority_and_oldest_wait(front: Front) -> None:
    clock = FakeClock()
    registry = CollectorRegistry()
    q = front.make("pods", clock=clock, metrics=PrometheusMetrics(registry))

    def waiting(priority: int) -> float | None:
        return registry.get_sample_value(
            "workqueue_waiting_keys", {"name": "pods", "priority": str(priority)}
        )

    assert waiting(0) == 0.0  # the priority 0 series is always there
    q.add("a")
    q.add("b", 3)
    q.add("c", 3)
    clock.step(2.5)

    assert (waiting(3), waiting(0), waiting(1)) == (2.0, 1.0, None)
    assert registry.get_sample_value("workqueue_oldest_wait_seconds", {"name": "pods"}) == 2.5
    take_all(q)
    assert (waiting(3), waiting(0)) == (None, 0.0)
    assert registry.get_sample_value("workqueue_oldest_wait_seconds", {"name": "pods"}) == 0.0


# -- the runner passes the priority ---------------------------------------------------------


async def test_runner_requeue_with_a_priority_brings_the_key_back_with_it(front: Front) -> None:
    no_backoff = ItemExponentialFailureRateLimiter(0.0, 0.0)
    q = front.make("run-priority", clock=FakeClock(), rate_limiter=no_backoff)
    handled: list[str] = []

    def handler(key: str) -> Requeue | None:
        handled.append(key)
        if handled.count(key) > 1:
            return None
        if key == "a":
            return Requeue(after=0, priority=5)  # add_after: back at once, ahead of b, c
        if key == "b":
            return Requeue(priority=7)  # add_rate_limited (no backoff): ahead of c
        return None

    for key in ["a", "b", "c"]:
        q.add(key)
    stats = await front.run_workers(q, handler)

    assert handled == ["a", "a", "b", "b", "c"]
    assert (stats.requeued, stats.succeeded) == (2, 3)


def test_requeue_rejects_a_bad_priority() -> None:
    with pytest.raises(TypeError, match="priority"):
        Requeue(priority=1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="priority"):
        Requeue(after=1, priority=2**31)
    assert Requeue(priority=-3).priority == -3
