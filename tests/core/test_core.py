"""The pure state machine (``keyqueue._core.Core``) on its own, table by table.

No front, no threads, no clock: every call gets ``now`` explicitly, so every
duration below is exact.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import random
from collections.abc import Callable
from typing import Any

import pytest

from keyqueue import Empty, EventKind, ShutDown, Stats
from keyqueue._checks import check_number
from keyqueue._core import Core

K = "k"

# -- helpers ------------------------------------------------------------------------


def in_state(state: str) -> Core[str]:
    """A core in which key ``K`` is in ``state`` (a row of DESIGN.md's table)."""
    core: Core[str] = Core()
    if state == "absent":
        return core
    core.add(K, 0.0)
    if state == "waiting":
        return core
    assert core.get(0.0) == K
    if state == "processing":
        return core
    core.add(K, 0.0)
    assert state == "pending"
    return core


def state_of(core: Core[str], key: str = K) -> str:
    """Read ``key``'s state back, checking the DESIGN.md invariants on the way."""
    dirty = key in core.dirty
    processing = key in core.processing
    in_fifo = list(core.fifo).count(key)
    assert in_fifo <= 1, "a key is in the FIFO at most once"
    if in_fifo:
        assert dirty, "every key in the FIFO is dirty"
        assert not processing, "no key in the FIFO is processing"
    if dirty and not processing:
        assert in_fifo == 1, "a dirty key that nobody holds is waiting in the FIFO"
    return {
        (False, False): "absent",
        (True, False): "waiting",
        (False, True): "processing",
        (True, True): "pending",
    }[(dirty, processing)]


def counters(core: Core[Any]) -> dict[str, int]:
    s = core.stats()
    return {
        "adds": s.adds,
        "enqueued": s.enqueued,
        "coalesced": s.coalesced,
        "marked_while_processing": s.marked_while_processing,
        "redeliveries": s.redeliveries,
        "gets": s.gets,
        "dones": s.dones,
    }


def delta(before: dict[str, int], after: dict[str, int]) -> dict[str, int]:
    return {name: after[name] - before[name] for name in before if after[name] != before[name]}


def assert_depth_within_high_water_mark(s: Stats) -> None:
    assert 0 <= s.depth <= s.max_depth


Record = tuple[EventKind, Any, float, "float | None"]


def observed(core: Core[Any]) -> list[Record]:
    events: list[Record] = []

    def observer(kind: EventKind, key: Any, now: float, duration: float | None) -> None:
        events.append((kind, key, now, duration))

    core.observer = observer
    return events


# -- the per-key state table ----------------------------------------------------------


@pytest.mark.parametrize(
    ("start", "returned", "end", "counted"),
    [
        ("absent", True, "waiting", {"adds": 1, "enqueued": 1}),
        ("waiting", False, "waiting", {"adds": 1, "coalesced": 1}),
        ("processing", False, "pending", {"adds": 1, "marked_while_processing": 1}),
        ("pending", False, "pending", {"adds": 1, "coalesced": 1}),
    ],
)
def test_add_transition(start: str, returned: bool, end: str, counted: dict[str, int]) -> None:
    core = in_state(start)
    before = counters(core)
    assert core.add(K, 1.0) is returned
    assert state_of(core) == end
    assert delta(before, counters(core)) == counted
    assert_depth_within_high_water_mark(core.stats())


def test_get_transition_hands_out_waiting_key() -> None:
    core = in_state("waiting")
    before = counters(core)
    assert core.get(1.0) == K
    assert state_of(core) == "processing"
    assert delta(before, counters(core)) == {"gets": 1}


@pytest.mark.parametrize("start", ["absent", "processing", "pending"])
def test_get_with_nothing_waiting_raises_empty_and_changes_nothing(start: str) -> None:
    core = in_state(start)
    before = core.stats()
    with pytest.raises(Empty):
        core.get(1.0)
    assert state_of(core) == start
    assert core.stats() == before


@pytest.mark.parametrize(
    ("start", "returned", "end", "counted"),
    [
        ("processing", False, "absent", {"dones": 1}),
        ("pending", True, "waiting", {"dones": 1, "redeliveries": 1}),
    ],
)
def test_done_transition(start: str, returned: bool, end: str, counted: dict[str, int]) -> None:
    core = in_state(start)
    before = counters(core)
    assert core.done(K, 1.0) is returned
    assert state_of(core) == end
    assert delta(before, counters(core)) == counted
    assert_depth_within_high_water_mark(core.stats())


@pytest.mark.parametrize("start", ["absent", "waiting"])
def test_done_of_key_not_processing_raises_and_changes_nothing(start: str) -> None:
    core = in_state(start)
    events = observed(core)
    before = core.stats()
    fifo_before = list(core.fifo)
    dirty_before = dict(core.dirty)
    with pytest.raises(ValueError, match="not being processed"):
        core.done(K, 1.0)
    assert state_of(core) == start
    assert core.stats() == before
    assert list(core.fifo) == fifo_before
    assert core.dirty == dirty_before
    assert events == []


def test_done_twice_raises_on_second_call() -> None:
    core = in_state("processing")
    core.done(K, 1.0)
    with pytest.raises(ValueError, match="not being processed"):
        core.done(K, 2.0)
    assert core.stats().dones == 1


def test_done_of_other_key_leaves_held_key_held() -> None:
    core = in_state("processing")
    with pytest.raises(ValueError, match="'other'"):
        core.done("other", 1.0)
    assert state_of(core) == "processing"
    assert core.stats().processing == 1


def test_pending_key_is_redelivered_exactly_once_however_many_adds() -> None:
    core = in_state("processing")
    for t in range(5):
        core.add(K, float(t))
    assert core.done(K, 5.0) is True
    assert list(core.fifo) == [K]
    assert core.get(6.0) == K
    assert core.done(K, 7.0) is False
    assert state_of(core) == "absent"
    with pytest.raises(Empty):
        core.get(8.0)


# -- FIFO order ---------------------------------------------------------------------


def test_fifo_hands_out_keys_in_order_of_first_add() -> None:
    core: Core[str] = Core()
    for key in "abcab":
        core.add(key, 0.0)
    assert [core.get(0.0) for _ in range(3)] == ["a", "b", "c"]
    with pytest.raises(Empty):
        core.get(0.0)


def test_coalesced_add_does_not_move_key_to_back() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)
    core.add("b", 0.0)
    core.add("a", 1.0)
    assert core.get(2.0) == "a"
    assert core.get(2.0) == "b"


def test_redelivered_key_goes_behind_keys_already_waiting() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)
    assert core.get(0.0) == "a"
    core.add("a", 1.0)  # pending
    core.add("b", 2.0)  # waiting, added after a was marked
    assert core.done("a", 3.0) is True
    assert list(core.fifo) == ["b", "a"]


def test_two_keys_can_be_processing_at_once() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)
    core.add("b", 0.0)
    assert {core.get(0.0), core.get(0.0)} == {"a", "b"}
    assert core.stats().processing == 2
    assert set(core.processing) == {"a", "b"}


# -- counters and Stats --------------------------------------------------------------


def test_stats_counters_after_mixed_sequence() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)  # enqueued
    core.add("a", 0.0)  # coalesced
    core.add("b", 0.0)  # enqueued
    core.get(0.0)  # a
    core.add("a", 0.0)  # marked
    core.add("a", 0.0)  # coalesced (pending)
    core.done("a", 0.0)  # redelivered
    core.get(0.0)  # b
    s = core.stats()
    assert (s.adds, s.enqueued, s.coalesced, s.marked_while_processing) == (5, 2, 2, 1)
    assert (s.redeliveries, s.gets, s.dones) == (1, 2, 1)
    assert (s.depth, s.processing, s.delayed, s.max_depth) == (1, 1, 0, 2)
    assert s.shutting_down is False


def test_fresh_core_stats_are_all_zero() -> None:
    s = Core[str]().stats()
    assert s == Stats(
        adds=0,
        enqueued=0,
        coalesced=0,
        marked_while_processing=0,
        redeliveries=0,
        gets=0,
        dones=0,
        retries=0,
        rate_limited=0,
        rate_limit_delay_seconds=0.0,
        max_rate_limit_delay_seconds=0.0,
        depth=0,
        max_depth=0,
        processing=0,
        delayed=0,
        queue_wait_seconds=0.0,
        work_seconds=0.0,
        shutting_down=False,
        waiting_by_priority={},
        oldest_wait_seconds=0.0,
    )


def test_stats_is_frozen_snapshot_not_live_view() -> None:
    core: Core[str] = Core()
    snapshot = core.stats()
    core.add("a", 0.0)
    assert snapshot.adds == 0
    assert snapshot.depth == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        snapshot.adds = 5  # type: ignore[misc]


def test_max_depth_is_high_water_mark() -> None:
    core: Core[str] = Core()
    for key in "abc":
        core.add(key, 0.0)
    for _ in range(3):
        core.get(0.0)
    core.add("d", 0.0)
    s = core.stats()
    assert (s.depth, s.max_depth) == (1, 3)


def test_max_depth_counts_redelivery_push() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)
    core.get(0.0)
    core.add("a", 0.0)  # pending
    core.add("b", 0.0)  # depth 1
    core.done("a", 0.0)  # depth 2 via redelivery
    assert core.stats().max_depth == 2


def test_queue_wait_runs_from_add_that_made_key_dirty_to_get() -> None:
    core: Core[str] = Core()
    core.add("a", 1.0)
    core.add("a", 2.5)  # coalesced: does not restart the wait
    core.get(4.0)
    assert core.stats().queue_wait_seconds == 3.0


def test_queue_wait_of_redelivered_key_runs_from_add_while_held() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)
    core.get(1.0)  # waited 1
    core.add("a", 5.0)  # marked while processing: the wait starts here
    core.add("a", 6.0)  # coalesced into the pending mark
    core.done("a", 7.0)
    core.get(10.0)  # waited 5
    s = core.stats()
    assert s.queue_wait_seconds == 1.0 + 5.0


def test_work_seconds_sum_finished_holds_only() -> None:
    core: Core[str] = Core()
    core.add("a", 0.0)
    core.add("b", 0.0)
    core.get(1.0)  # a
    core.get(2.0)  # b
    core.done("a", 4.0)  # held 3
    assert core.stats().work_seconds == 3.0
    core.done("b", 7.5)  # held 5.5
    assert core.stats().work_seconds == 8.5


def test_unfinished_reports_total_and_longest_hold() -> None:
    core: Core[str] = Core()
    assert core.unfinished(10.0) == (0.0, 0.0)
    core.add("a", 0.0)
    core.add("b", 0.0)
    core.get(1.0)
    core.get(4.0)
    assert core.unfinished(6.0) == (5.0 + 2.0, 5.0)
    core.done("a", 6.0)
    assert core.unfinished(6.0) == (2.0, 2.0)


# -- shutdown ---------------------------------------------------------------------


def test_shutdown_returns_true_once_then_false() -> None:
    core: Core[str] = Core()
    assert core.shutdown(0.0) is True
    assert core.shutdown(1.0) is False
    assert core.stats().shutting_down is True


@pytest.mark.parametrize("start", ["absent", "waiting", "processing", "pending"])
def test_add_after_shutdown_is_uncounted_noop(start: str) -> None:
    core = in_state(start)
    core.shutdown(1.0)
    events = observed(core)
    before = core.stats()
    assert core.add(K, 2.0) is False
    assert core.add("new", 2.0) is False
    assert state_of(core) == start
    assert state_of(core, "new") == "absent"
    assert core.stats() == before
    assert events == []


def test_waiting_keys_still_handed_out_in_order_after_shutdown() -> None:
    core: Core[str] = Core()
    for key in "abc":
        core.add(key, 0.0)
    core.shutdown(1.0)
    assert core.exhausted is False
    assert [core.get(2.0) for _ in range(3)] == ["a", "b", "c"]
    assert core.exhausted is True
    with pytest.raises(ShutDown):
        core.get(3.0)


def test_get_on_empty_shut_down_core_raises_shutdown_every_time() -> None:
    core: Core[str] = Core()
    core.shutdown(0.0)
    for _ in range(3):
        with pytest.raises(ShutDown):
            core.get(1.0)
    assert core.stats().gets == 0


def test_pending_redelivery_survives_shutdown() -> None:
    core = in_state("pending")
    core.shutdown(1.0)
    # Nothing is waiting, but the held key's done will push it: not exhausted.
    assert core.exhausted is False
    with pytest.raises(Empty):
        core.get(2.0)
    assert core.done(K, 3.0) is True
    assert core.get(4.0) == K
    assert core.exhausted is True
    assert core.done(K, 5.0) is False  # no add can mark it now
    with pytest.raises(ShutDown):
        core.get(6.0)
    assert core.stats().redeliveries == 1


def test_key_held_at_shutdown_does_not_keep_get_open() -> None:
    core = in_state("processing")
    core.shutdown(1.0)
    assert core.exhausted is True
    assert core.idle is False
    with pytest.raises(ShutDown):
        core.get(2.0)
    core.done(K, 3.0)
    assert core.idle is True


@pytest.mark.parametrize(
    ("start", "shut_down", "exhausted", "idle"),
    [
        ("absent", False, False, True),
        ("waiting", False, False, False),
        ("processing", False, False, False),
        ("pending", False, False, False),
        ("absent", True, True, True),
        ("waiting", True, False, False),
        ("processing", True, True, False),
        ("pending", True, False, False),
    ],
)
def test_exhausted_and_idle_table(start: str, shut_down: bool, exhausted: bool, idle: bool) -> None:
    core = in_state(start)
    if shut_down:
        core.shutdown(1.0)
    assert core.exhausted is exhausted
    assert core.idle is idle


# -- add_after ----------------------------------------------------------------------


def test_add_after_does_not_add_before_ready_time() -> None:
    core: Core[str] = Core()
    assert core.add_after("a", 5.0, now=10.0) is False
    assert state_of(core, "a") == "absent"
    assert core.next_ready == 15.0
    assert core.stats().delayed == 1
    assert core.promote(14.999) == 0
    assert state_of(core, "a") == "absent"
    assert core.promote(15.0) == 1
    assert state_of(core, "a") == "waiting"
    assert core.stats().delayed == 0
    assert core.next_ready is None


@pytest.mark.parametrize(
    ("first", "second", "fires_at"),
    [
        (10.0, 5.0, 5.0),  # an earlier request wins
        (5.0, 10.0, 5.0),  # a later request does not postpone
        (5.0, 5.0, 5.0),  # the same time again
    ],
)
def test_add_after_earliest_ready_time_wins(first: float, second: float, fires_at: float) -> None:
    core: Core[str] = Core()
    core.add_after("a", first, now=0.0)
    core.add_after("a", second, now=0.0)
    assert core.stats().delayed == 1
    assert core.next_ready == fires_at
    assert core.promote(math.nextafter(fires_at, 0.0)) == 0
    assert core.promote(fires_at) == 1
    core.get(fires_at)
    core.done("a", fires_at)
    # Nothing left behind fires again, not even at the later time.
    assert core.promote(1000.0) == 0
    assert state_of(core, "a") == "absent"
    s = core.stats()
    assert (s.enqueued, s.adds, s.retries) == (1, 1, 2)


@pytest.mark.parametrize("delay", [0.0, -0.0, -1.0, -math.inf])
def test_add_after_non_positive_delay_adds_now(delay: float) -> None:
    core: Core[str] = Core()
    assert core.add_after("a", delay, now=3.0) is True
    assert state_of(core, "a") == "waiting"
    s = core.stats()
    assert (s.delayed, s.retries, s.enqueued, s.adds) == (0, 1, 1, 1)
    assert core.next_ready is None


@pytest.mark.parametrize(
    ("start", "returned", "end"),
    [
        ("absent", True, "waiting"),
        ("waiting", False, "waiting"),
        ("processing", False, "pending"),
        ("pending", False, "pending"),
    ],
)
def test_add_after_zero_applies_add_rule(start: str, returned: bool, end: str) -> None:
    core = in_state(start)
    assert core.add_after(K, 0.0, now=1.0) is returned
    assert state_of(core) == end


def test_add_after_nan_raises_and_changes_nothing() -> None:
    core: Core[str] = Core()
    events = observed(core)
    with pytest.raises(ValueError, match="nan"):
        core.add_after("a", math.nan, now=0.0)
    assert core.stats() == Core[str]().stats()
    assert core.next_ready is None
    assert events == []


def test_explicit_add_does_not_cancel_delayed_entry() -> None:
    core: Core[str] = Core()
    core.add_after("a", 5.0, now=0.0)
    core.add("a", 1.0)
    assert core.get(1.0) == "a"
    core.done("a", 2.0)
    assert core.stats().delayed == 1
    assert core.promote(5.0) == 1  # the requested future check still happens
    assert core.get(5.0) == "a"


def test_delayed_keys_come_out_in_ready_time_order() -> None:
    core: Core[str] = Core()
    core.add_after("a", 3.0, now=0.0)
    core.add_after("b", 1.0, now=0.0)
    core.add_after("c", 2.0, now=0.0)
    assert core.promote(10.0) == 3
    assert list(core.fifo) == ["b", "c", "a"]


def test_delayed_keys_with_equal_ready_time_come_out_in_request_order() -> None:
    core: Core[str] = Core()
    for key in "cab":
        core.add_after(key, 1.0, now=0.0)
    assert core.promote(1.0) == 3
    assert list(core.fifo) == ["c", "a", "b"]


def test_promote_returns_number_pushed_not_number_due() -> None:
    core: Core[str] = Core()
    core.add("waiting", 0.0)
    core.add("held", 0.0)
    core.add("waiting", 0.0)
    assert core.get(0.0) == "waiting"
    core.add("waiting", 0.0)  # now pending: waiting is processing + dirty
    assert core.get(0.0) == "held"
    core.add("queued", 0.0)
    for key in ["waiting", "held", "queued", "fresh1", "fresh2"]:
        core.add_after(key, 1.0, now=0.0)
    before = counters(core)
    # waiting: coalesced (pending); held: marked; queued: coalesced; fresh1/2: pushed.
    assert core.promote(1.0) == 2
    assert delta(before, counters(core)) == {
        "adds": 5,
        "enqueued": 2,
        "coalesced": 2,
        "marked_while_processing": 1,
    }
    assert state_of(core, "held") == "pending"


def test_promote_only_releases_due_keys() -> None:
    core: Core[str] = Core()
    core.add_after("a", 1.0, now=0.0)
    core.add_after("b", 2.0, now=0.0)
    assert core.promote(1.5) == 1
    assert list(core.fifo) == ["a"]
    assert core.next_ready == 2.0
    assert core.stats().delayed == 1


def test_stale_entry_later_than_new_request_never_fires_early() -> None:
    core: Core[str] = Core()
    core.add_after("a", 10.0, now=0.0)  # entry at 10
    core.add_after("a", 3.0, now=0.0)  # wins; the 10 entry is stale
    assert core.promote(3.0) == 1
    core.get(3.0)
    core.done("a", 3.0)
    core.add_after("a", 20.0, now=3.0)  # ready at 23
    assert core.promote(10.0) == 0  # the stale 10 must not release it
    assert state_of(core, "a") == "absent"
    assert core.stats().delayed == 1
    assert core.promote(22.9) == 0
    assert core.promote(23.0) == 1
    assert core.promote(1000.0) == 0


def test_stale_entry_equal_to_new_request_fires_once() -> None:
    core: Core[str] = Core()
    core.add_after("a", 10.0, now=0.0)
    core.add_after("a", 3.0, now=0.0)
    assert core.promote(3.0) == 1
    core.get(3.0)
    core.done("a", 3.0)
    core.add_after("a", 7.0, now=3.0)  # ready at 10, same as the stale entry
    assert core.promote(9.5) == 0
    assert core.promote(10.0) == 1
    core.get(10.0)
    core.done("a", 10.0)
    assert core.promote(1000.0) == 0
    assert core.stats().enqueued == 2


def test_many_stale_entries_fire_once_at_earliest_time() -> None:
    core: Core[str] = Core()
    # Each request is earlier than the last: 199 stale entries, compaction runs.
    for i in range(200):
        core.add_after("a", 1000.0 - i, now=0.0)
        core.add_after(f"k{i}", 500.0 + i, now=0.0)
    assert core.stats().delayed == 201
    assert core.next_ready == 500.0
    assert core.promote(500.0) == 1
    assert list(core.fifo) == ["k0"]
    assert core.promote(800.0) == 199  # k1..k199 (ready 501..699); "a" is due at 801
    assert state_of(core, "a") == "absent"
    assert core.promote(801.0) == 1
    assert state_of(core, "a") == "waiting"
    assert core.promote(10_000.0) == 0
    s = core.stats()
    assert s.delayed == 0
    assert s.enqueued == 201
    assert list(core.fifo).count("a") == 1


def test_delayed_key_coming_due_counts_as_accepted_add() -> None:
    core: Core[str] = Core()
    core.add_after("a", 1.0, now=0.0)
    assert core.stats().adds == 0
    core.promote(1.0)
    s = core.stats()
    assert (s.adds, s.enqueued, s.retries) == (1, 1, 1)


def test_add_after_counts_retries_and_rate_limit_kind_counts_rate_limited() -> None:
    core: Core[str] = Core()
    core.add_after("a", 1.0, now=0.0)
    core.add_after("b", 1.0, now=0.0, kind=EventKind.RATE_LIMIT)
    core.add_after("c", 0.0, now=0.0, kind=EventKind.RATE_LIMIT)
    s = core.stats()
    assert (s.retries, s.rate_limited) == (3, 2)


def test_shutdown_drops_delayed_keys() -> None:
    core: Core[str] = Core()
    core.add_after("a", 1.0, now=0.0)
    core.add_after("b", 2.0, now=0.0)
    core.shutdown(0.5)
    assert core.stats().delayed == 0
    assert core.next_ready is None
    assert core.promote(1000.0) == 0
    assert state_of(core, "a") == "absent"
    assert core.exhausted is True
    with pytest.raises(ShutDown):
        core.get(1000.0)


@pytest.mark.parametrize("delay", [0.0, 1.0, -1.0])
def test_add_after_after_shutdown_is_noop_and_not_a_retry(delay: float) -> None:
    core: Core[str] = Core()
    core.shutdown(0.0)
    events = observed(core)
    before = core.stats()
    assert core.add_after("a", delay, now=1.0) is False
    assert core.add_after("b", delay, now=1.0, kind=EventKind.RATE_LIMIT) is False
    assert core.stats() == before
    assert core.stats().retries == 0
    assert core.next_ready is None
    assert events == []


# -- record_failure and max_retries --------------------------------------------------


@pytest.mark.parametrize(
    ("max_retries", "answers"),
    [
        (None, [True] * 10),
        (1, [False, False]),
        (2, [True, False, False]),
        (3, [True, True, False]),
    ],
)
def test_record_failure_gives_up_on_nth_failure(
    max_retries: int | None, answers: list[bool]
) -> None:
    core: Core[str] = Core(max_retries)
    assert [core.record_failure("a") for _ in answers] == answers


def test_record_failure_counts_per_key() -> None:
    core: Core[str] = Core(max_retries=2)
    assert core.record_failure("a") is True
    assert core.record_failure("b") is True
    assert core.record_failure("a") is False
    assert core.record_failure("b") is False


def test_forget_resets_failure_count() -> None:
    core: Core[str] = Core(max_retries=2)
    assert core.record_failure("a") is True
    assert core.record_failure("a") is False
    core.forget("a")
    assert core.record_failure("a") is True
    assert core.record_failure("a") is False


def test_forget_of_unknown_key_is_harmless() -> None:
    core: Core[str] = Core(max_retries=2)
    core.forget("never-failed")
    assert core.record_failure("never-failed") is True


def test_retry_of_a_held_key_counts_the_failure_and_re_adds_it_rate_limited() -> None:
    core = in_state("processing")
    core.max_retries = 3
    events = observed(core)

    assert core.retry_backs_off(K) is True
    assert core.retry(K, 2.0, 1.0) is False  # back after 2 s: delayed, not pushed now
    assert core.failures == {K: 1}
    assert events == [(EventKind.RATE_LIMIT, K, 1.0, 2.0)]
    assert (core.retries, core.rate_limited, core.next_ready) == (1, 1, 3.0)
    assert core.retry(K, 0.0, 1.0) is False  # no delay: marked for redelivery (it is held)
    assert state_of(core) == "pending"
    assert core.retry_backs_off(K) is False  # the next failure is the third: give up
    assert core.retry(K, 5.0, 1.0) is None
    assert (core.failures, core.rate_limited) == ({K: 3}, 2)  # the give-up scheduled nothing


def test_retry_of_a_key_nobody_holds_with_no_delay_pushes_it_now() -> None:
    core: Core[str] = Core()
    assert core.retry(K, 0.0, 1.0) is True  # as add_after returns: wake a getter
    assert state_of(core) == "waiting"


@pytest.mark.parametrize("max_retries", [None, 1, 3])
def test_retry_while_shutting_down_gives_up_a_key_nothing_brings_back(
    max_retries: int | None,
) -> None:
    core = in_state("processing")
    core.max_retries = max_retries
    core.shutdown(1.0)
    events = observed(core)

    assert core.retry_backs_off(K) is False  # no delay to ask a limiter for
    assert core.retry(K, 2.0, 2.0) is None
    assert (core.failures, core.retries, core.rate_limited, events) == ({}, 0, 0, [])
    assert state_of(core) == "processing"


@pytest.mark.parametrize("max_retries", [None, 1, 3])
def test_retry_while_shutting_down_of_a_key_added_again_while_held_keeps_it(
    max_retries: int | None,
) -> None:
    core = in_state("pending")
    core.max_retries = max_retries
    core.shutdown(1.0)
    events = observed(core)

    assert core.retry_backs_off(K) is False
    assert core.retry(K, 2.0, 2.0) is False  # it comes back anyway: not given up
    assert core.failures == ({} if max_retries is None else {K: 1})  # the failure counts
    assert (core.retries, core.rate_limited, core.next_ready, events) == (0, 0, None, [])
    assert core.done(K, 3.0) is True  # its done hands it out again
    assert core.get(3.0) == K


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0.0),
        (-2, -2.0),
        (1.5, 1.5),
        (math.inf, math.inf),
        (10**400, math.inf),
        (-(10**400), -math.inf),
    ],
)
def test_check_number_takes_ints_and_floats_and_an_int_beyond_float_range_as_infinite(
    value: Any, expected: float
) -> None:
    number = check_number(value, "x must be a number")
    assert (number, type(number)) == (expected, float)


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (True, TypeError, "x must be a number, got True"),
        ("1", TypeError, "x must be a number, got '1'"),
        (None, TypeError, "x must be a number, got None"),
        (math.nan, ValueError, "x must be a number, got nan"),
    ],
)
def test_check_number_rejects_bools_non_numbers_and_nan_saying_the_contract(
    value: Any, error: type[Exception], message: str
) -> None:
    with pytest.raises(error) as raised:
        check_number(value, "x must be a number")
    assert str(raised.value) == message


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (math.inf, "x must be finite, got inf"),
        (-math.inf, "x must be finite, got -inf"),
        (10**400, "x must be finite, got an int beyond float range"),
        ("1", "x must be finite, got '1'"),
    ],
)
def test_check_number_finite_rejects_infinities_with_the_error_asked_for(
    value: Any, message: str
) -> None:
    with pytest.raises(ValueError, match=r"^x must be finite, got ") as raised:
        check_number(value, "x must be finite", finite=True, error=ValueError)
    assert str(raised.value) == message


@pytest.mark.parametrize("bad", [0, -1, True, False, 1.5, "2"])
def test_max_retries_must_be_positive_int_or_none(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_retries"):
        Core(bad)


# -- the observer ---------------------------------------------------------------------


def test_observer_receives_every_transition_in_order() -> None:
    core: Core[str] = Core()
    events = observed(core)
    core.add("a", 1.0)
    core.add("a", 2.0)
    core.get(3.0)
    core.add("a", 4.0)
    core.add("a", 4.5)
    core.done("a", 6.0)
    core.get(6.5)
    core.done("a", 7.0)
    core.add_after("b", 2.0, now=7.0)
    core.promote(9.0)
    core.add_after("c", 0.0, now=9.0, kind=EventKind.RATE_LIMIT)
    core.shutdown(10.0)
    core.add("d", 11.0)
    assert events == [
        (EventKind.ENQUEUE, "a", 1.0, None),
        (EventKind.COALESCE, "a", 2.0, None),
        (EventKind.GET, "a", 3.0, 2.0),
        (EventKind.MARK_WHILE_PROCESSING, "a", 4.0, None),
        (EventKind.COALESCE, "a", 4.5, None),
        (EventKind.DONE, "a", 6.0, 3.0),
        (EventKind.REDELIVER, "a", 6.0, None),
        (EventKind.GET, "a", 6.5, 2.5),
        (EventKind.DONE, "a", 7.0, 0.5),
        (EventKind.DELAY, "b", 7.0, 2.0),
        (EventKind.ENQUEUE, "b", 9.0, None),
        (EventKind.RATE_LIMIT, "c", 9.0, 0.0),
        (EventKind.ENQUEUE, "c", 9.0, None),
        (EventKind.SHUTDOWN, None, 10.0, None),
    ]


def test_observer_sees_every_delay_request_but_one_enqueue() -> None:
    core: Core[str] = Core()
    events = observed(core)
    core.add_after("a", 1.0, now=0.0)
    core.add_after("a", 5.0, now=0.0)  # later: ignored, but still a retry event
    core.promote(5.0)
    assert events == [
        (EventKind.DELAY, "a", 0.0, 1.0),
        (EventKind.DELAY, "a", 0.0, 5.0),
        (EventKind.ENQUEUE, "a", 5.0, None),
    ]


def test_observer_durations_match_stats_totals() -> None:
    core: Core[str] = Core()
    events = observed(core)
    script: list[Callable[[], object]] = [
        lambda: core.add("a", 0.0),
        lambda: core.add("b", 1.0),
        lambda: core.get(2.0),
        lambda: core.add("a", 3.0),
        lambda: core.get(5.0),
        lambda: core.done("a", 6.0),
        lambda: core.get(9.0),
        lambda: core.done("b", 10.0),
        lambda: core.done("a", 12.0),
    ]
    for step in script:
        step()
    s = core.stats()
    waits = [d for kind, _, _, d in events if kind is EventKind.GET]
    works = [d for kind, _, _, d in events if kind is EventKind.DONE]
    assert waits == [2.0, 4.0, 6.0]  # a's second wait runs from the add at 3
    assert works == [4.0, 5.0, 3.0]
    assert s.queue_wait_seconds == sum(waits)  # type: ignore[arg-type]
    assert s.work_seconds == sum(works)  # type: ignore[arg-type]


def test_compaction_at_scale_keeps_release_in_ready_time_order_and_shrinks_the_heap() -> None:
    # 40 keys, 10 requests each, every request earlier than the key's last one
    # (so it replaces it and leaves a stale entry behind): 400 calls in a seeded
    # shuffle, enough stale entries for several compactions.
    rng = random.Random(19)
    keys = [f"k{i:02}" for i in range(40)]
    final = dict(zip(keys, rng.sample(range(1, 1000), len(keys)), strict=True))
    plan = {key: iter([final[key] + 100.0 * j for j in range(9, -1, -1)]) for key in keys}
    calls = [key for key in keys for _ in range(10)]
    rng.shuffle(calls)
    core: Core[str] = Core()
    heap_sizes = []
    for key in calls:
        core.add_after(key, next(plan[key]), now=0.0)
        heap_sizes.append(len(core.heap))
    assert core.stats().delayed == len(keys)
    # Compaction ran (the heap shrank) and kept the heap near the live entries.
    assert any(after < before for before, after in itertools.pairwise(heap_sizes))
    assert max(heap_sizes) <= 2 * len(keys) + 64

    released = []
    for t in sorted(final.values()):
        assert core.promote(t - 0.5) == 0, f"a key was released before t={t}"
        assert core.promote(t) == 1, f"no key was released at t={t}"
        released.append(core.get(t))
    assert released == sorted(keys, key=final.__getitem__)
    assert core.promote(math.inf) == 0
    assert core.stats().delayed == 0
