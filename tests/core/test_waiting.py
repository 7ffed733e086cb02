"""The waiting set's two orders behind one interface (``_waiting``) and the lazy heap (``_heap``).

The core's rules are tested through the core (test_core, test_transitions,
the Hypothesis model); these pin the storage on its own: each ``Waiting``
hands keys out in its order, knows when each arrived, and counts them by
priority; ``LazyHeap`` skips replaced entries and compacts by one rule.
"""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from keyqueue._heap import REMOVED, LazyHeap
from keyqueue._waiting import FairWaiting, FifoWaiting, RankedWaiting, Waiting


def fifo() -> FifoWaiting[str]:
    return FifoWaiting()


def ranked(aging: float | None = None) -> RankedWaiting[str]:
    return RankedWaiting(aging, FifoWaiting(), {}, 0)


@pytest.mark.parametrize("make", [fifo, ranked], ids=["fifo", "ranked"])
def test_equal_priorities_come_out_in_arrival_order(make: Callable[[], Waiting[str]]) -> None:
    waiting = make()
    for i, key in enumerate("abc"):
        assert waiting.push(key, 0, float(i), 0) == i + 1  # the depth after the push
    assert len(waiting) == 3
    assert waiting.touch("b", 0)  # waiting: added again, nothing moves
    assert not waiting.touch("z", 0)
    assert waiting.by_priority() == {0: 3}
    assert waiting.oldest(10.0, {"a": 0.0, "b": 1.0, "c": 2.0}, 0) == 10.0
    assert [waiting.pop() for _ in range(3)] == ["a", "b", "c"]
    assert len(waiting) == 0
    assert waiting.by_priority() == {}
    assert waiting.oldest(10.0, {}, 3) == 0.0


def test_a_fifo_dates_a_pushed_back_key_by_its_push_not_its_dirty_time() -> None:
    waiting = fifo()
    waiting.keys.append("a")  # an add's push, as the core inlines it: dirty time is arrival
    waiting.push("b", 0, 5.0, 0)  # done pushed it back at 5.0 (dirty since 1.0)
    dirty = {"a": 2.0, "b": 1.0}
    assert waiting.oldest(6.0, dirty, 0) == 4.0  # a arrived at 2.0
    assert waiting.pop() == "a"
    assert waiting.oldest(6.0, dirty, 1) == 1.0  # b arrived at 5.0, not at 1.0


def test_ranked_hands_out_the_highest_priority_first_and_touch_raises_it() -> None:
    waiting = ranked()
    waiting.push("low", 1, 0.0, 0)
    waiting.push("high", 5, 1.0, 0)
    waiting.push("mid", 3, 2.0, 0)
    assert waiting.by_priority() == {5: 1, 3: 1, 1: 1}
    assert list(waiting.by_priority()) == [5, 3, 1]  # highest first
    assert waiting.touch("low", 9)  # raised: it keeps its arrival
    assert waiting.touch("mid", 0)  # lower: it keeps 3
    assert waiting.oldest(10.0, {}, 0) == 10.0  # "low" arrived first, at 0.0
    assert [waiting.pop() for _ in range(3)] == ["low", "high", "mid"]


def test_ranked_with_aging_ranks_an_old_low_key_ahead_of_a_new_high_one() -> None:
    waiting = ranked(aging=1.0)
    waiting.push("old", 0, 0.0, 0)  # score 0
    waiting.push("new", 2, 5.0, 0)  # score 5 - 2 = 3: it arrived more than 2 s later
    assert waiting.pop() == "old"


def test_ranked_takes_over_a_fifo_in_order_with_its_arrivals() -> None:
    before = fifo()
    before.keys.extend(["a", "b"])
    before.push("c", 0, 9.0, 0)  # pushed back at 9.0
    waiting = RankedWaiting(None, before, {"a": 1.0, "b": 2.0, "c": 3.0}, 0)
    assert [entry[4] for entry in waiting.entries.values()] == [1.0, 2.0, 9.0]
    assert [waiting.pop() for _ in range(3)] == ["a", "b", "c"]


def test_the_lazy_heap_skips_replaced_entries_and_compacts_past_64() -> None:
    heap = LazyHeap()
    live = [float(heap.next_seq()), heap.next_seq(), "k"]
    heap.push(live)
    for i in range(64):
        newer = [100.0 - i, heap.next_seq(), "k"]
        heap.replace(live, newer)
        live = newer
    assert (len(heap), heap.replaced) == (65, 64)  # not yet: 64 replaced is not > 64
    newer = [0.5, heap.next_seq(), "k"]
    heap.replace(live, newer)
    assert (len(heap), heap.replaced) == (1, 0)  # 65 > 64 and > 1 live: rebuilt
    heap.push([2.0, heap.next_seq(), "j"])
    heap.replace(heap.entries[-1], [3.0, heap.next_seq(), "j"])
    assert heap.first() == 0.5
    assert heap.pop_until(0.4) is None
    assert heap.pop()[2] == "k"
    assert heap.pop_until(2.5) is None  # the replaced 2.0 entry is skipped, 3.0 is not due
    assert heap.replaced == 0
    assert heap.pop_until(3.0) == [3.0, 68, "j"]
    assert REMOVED not in [entry[2] for entry in heap.entries]


FAIR_CALLS = st.lists(
    st.tuples(st.sampled_from("abcdefgh"), st.sampled_from([0, 0, 1, 2, -1]), st.booleans()),
    max_size=40,
)


@settings(max_examples=200, deadline=None)
@given(calls=FAIR_CALLS, aging=st.sampled_from([None, 1.0]), limit=st.integers(0, 12))
def test_fair_first_lists_the_keys_in_the_order_pop_hands_them_out(
    calls: list[tuple[str, int, bool]], aging: float | None, limit: int
) -> None:
    waiting: FairWaiting[str] = FairWaiting(aging, lambda key: "x" if key in "abc" else key)
    for now, (key, priority, pop) in enumerate(calls):
        if pop and len(waiting):
            waiting.pop()
        elif not waiting.touch(key, priority):
            waiting.push(key, priority, float(now), 0)
    listed = waiting.first(limit, 100.0, {}, 0)
    out = [waiting.pop() for _ in range(len(waiting))]
    assert [key for key, _, _ in listed] == out[:limit]
    assert waiting.levels == {}
