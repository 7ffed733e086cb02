"""Random call sequences against a tiny reference model (Hypothesis stateful testing).

The model is written from DESIGN.md's per-key table, independently of the core:
a FIFO list, a set of dirty keys, a set of held keys, the delayed keys with their
ready times, and the counters ``Stats`` promises. The queue under test is a
``WorkQueue`` and an ``AsyncWorkQueue``, each on a ``FakeClock``, driven only
through their public, non-blocking calls. Failures shrink to a minimal sequence of calls.

Priorities (docs/fairness.md): adds carry a priority; the model keeps each
waiting key's priority and arrival, and its ``get`` takes the key of highest
effective priority now, ``priority + (now - arrival) / aging`` (or
``priority`` when strict), the earliest arrival among equals. Aging and times
are binary fractions, so the arithmetic is exact. With ``fair_by`` the model
keeps a rotation of groups per priority (``FairWorkQueueMachine``).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from contextlib import AbstractContextManager
from typing import Any

import pytest
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from keyqueue import AsyncWorkQueue, Empty, ShutDown, Stats, WorkQueue
from keyqueue.testing import FakeClock

KEYS = st.sampled_from("abcd")
DELAYS = st.sampled_from([-1.0, 0.0, 0.5, 1.0, 2.5])
STEPS = st.sampled_from([0.0, 0.25, 0.5, 1.0, 3.0])
PRIORITIES = st.sampled_from([0, 0, 0, 1, 2, -1])


class WorkQueueMachine(RuleBasedStateMachine):
    aging: float | None = None

    def make_queue(self, clock: FakeClock) -> Any:
        return WorkQueue("stateful", clock=clock, aging=self.aging)

    def shutdown_queue(self) -> bool:
        return self.q.shutdown()  # type: ignore[no-any-return]

    def serialized(self) -> AbstractContextManager[object]:
        """Hold what serializes the queue, to read its internals consistently."""
        return self.q._lock  # type: ignore[no-any-return]

    def __init__(self) -> None:
        super().__init__()
        self.clock = FakeClock()
        self.q: Any = self.make_queue(self.clock)
        # The model. now: the same float sums FakeClock makes.
        self.now = 0.0
        self.fifo: list[str] = []  # waiting keys, in arrival order
        # Waiting key -> (priority, arrival); pending key -> its priority.
        self.waiting: dict[str, tuple[int, float]] = {}
        self.pending_priority: dict[str, int] = {}
        self.dirty: set[str] = set()  # waiting or pending redelivery
        self.held: set[str] = set()  # processing
        # key -> (ready time, request order): the earliest request wins.
        self.delayed: dict[str, tuple[float, int]] = {}
        self.delayed_priority: dict[str, int] = {}  # the highest priority asked
        self.requests = 0
        self.shut = False
        self.counts: Counter[str] = Counter()
        self.max_depth = 0
        # key -> time of the add that made it dirty / of its get; the totals of
        # Stats.queue_wait_seconds and work_seconds, summed in the same order.
        self.dirty_since: dict[str, float] = {}
        self.held_since: dict[str, float] = {}
        self.wait_total = 0.0
        self.work_total = 0.0
        # Keys added (dirty) since their last get: each must be handed out again.
        self.owed: set[str] = set()

    # -- the model's add rule -------------------------------------------------------

    def model_add(self, key: str, priority: int = 0) -> None:
        if self.shut:
            return
        self.counts["adds"] += 1
        self.owed.add(key)
        if key in self.dirty:
            self.counts["coalesced"] += 1
            if key in self.waiting:  # the highest priority it was added with
                current, arrival = self.waiting[key]
                self.waiting[key] = (max(current, priority), arrival)
            else:
                self.pending_priority[key] = max(self.pending_priority[key], priority)
        elif key in self.held:
            self.dirty.add(key)
            self.dirty_since[key] = self.now
            self.pending_priority[key] = priority
            self.counts["marked"] += 1
        else:
            self.dirty.add(key)
            self.dirty_since[key] = self.now
            self.arrive(key, priority)
            self.counts["enqueued"] += 1

    def arrive(self, key: str, priority: int) -> None:
        self.fifo.append(key)
        self.waiting[key] = (priority, self.now)
        self.max_depth = max(self.max_depth, len(self.fifo))

    def effective(self, key: str) -> float:
        priority, arrival = self.waiting[key]
        if self.aging is None:
            return priority
        return priority + (self.now - arrival) / self.aging

    def next_key(self) -> str:
        """The highest effective priority; the earliest arrival among equals."""
        best = max(self.effective(key) for key in self.fifo)
        return next(key for key in self.fifo if self.effective(key) == best)

    # -- rules ------------------------------------------------------------------------

    @rule(key=KEYS, priority=PRIORITIES)
    def add(self, key: str, priority: int) -> None:
        self.q.add(key, priority)
        self.model_add(key, priority)

    @rule()
    def get(self) -> None:
        if self.fifo:
            expected = self.next_key()
            self.fifo.remove(expected)
            del self.waiting[expected]
            got = self.q.get_nowait()
            assert got == expected, "FIFO order differs from the model"
            assert got not in self.held, "a key was handed out while held"
            self.dirty.discard(got)
            self.held.add(got)
            self.owed.discard(got)
            self.counts["gets"] += 1
            self.wait_total += self.now - self.dirty_since.pop(got)
            self.held_since[got] = self.now
        elif self.shut and not self.dirty:
            with pytest.raises(ShutDown):
                self.q.get_nowait()
        else:
            with pytest.raises(Empty):
                self.q.get_nowait()

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def done(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from(sorted(self.held)))
        self.q.done(key)
        self.held.remove(key)
        self.counts["dones"] += 1
        self.work_total += self.now - self.held_since.pop(key)
        if key in self.dirty:
            self.arrive(key, self.pending_priority.pop(key))
            self.counts["redeliveries"] += 1

    @precondition(lambda self: len(self.held) < 4)
    @rule(data=st.data())
    def done_of_key_not_held_raises(self, data: st.DataObject) -> None:
        key = data.draw(st.sampled_from([k for k in "abcd" if k not in self.held]))
        before = self.q.stats()
        with pytest.raises(ValueError, match="not being processed"):
            self.q.done(key)
        assert self.q.stats() == before

    @rule(key=KEYS, delay=DELAYS, priority=PRIORITIES)
    def add_after(self, key: str, delay: float, priority: int) -> None:
        self.q.add_after(key, delay, priority=priority)
        if self.shut:
            return
        self.counts["retries"] += 1
        if delay <= 0:
            self.model_add(key, priority)
            return
        ready = self.now + delay
        current = self.delayed.get(key)
        if current is None or ready < current[0]:
            self.delayed[key] = (ready, self.requests)
        if current is not None:
            priority = max(priority, self.delayed_priority[key])
        self.delayed_priority[key] = priority
        self.requests += 1

    @rule(seconds=STEPS)
    def step(self, seconds: float) -> None:
        self.clock.step(seconds)
        self.now += seconds
        self.release_due()

    def release_due(self) -> None:
        due = sorted((entry, key) for key, entry in self.delayed.items() if entry[0] <= self.now)
        for _, key in due:
            del self.delayed[key]
            self.model_add(key, self.delayed_priority.pop(key))

    @precondition(lambda self: not self.shut)
    @rule(roll=st.integers(0, 4))
    def shutdown(self, roll: int) -> None:
        # Taken one time in five, so most runs spend most steps on a live queue.
        if roll:
            return
        assert self.shutdown_queue() is True
        self.shut = True
        self.delayed.clear()
        self.delayed_priority.clear()

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def model_is_consistent(self) -> None:
        # DESIGN.md's invariants, on the model: it is the yardstick.
        assert len(self.fifo) == len(set(self.fifo)), "a key is in the FIFO twice"
        for key in self.fifo:
            assert key in self.dirty
            assert key not in self.held
        assert {k for k in self.dirty if k not in self.held} == set(self.fifo)
        assert set(self.waiting) == set(self.fifo)
        assert set(self.pending_priority) == self.dirty & self.held
        assert self.owed == self.dirty

    @invariant()
    def queue_matches_model(self) -> None:
        # Every field from the model's own bookkeeping: none is derived from
        # another field of the snapshot under test.
        q = self.q
        assert len(q) == len(self.fifo)
        assert q.shutting_down is self.shut
        assert q.stats() == Stats(
            adds=self.counts["adds"],
            enqueued=self.counts["enqueued"],
            coalesced=self.counts["coalesced"],
            marked_while_processing=self.counts["marked"],
            redeliveries=self.counts["redeliveries"],
            gets=self.counts["gets"],
            dones=self.counts["dones"],
            retries=self.counts["retries"],
            rate_limited=0,  # the machine never calls add_rate_limited
            rate_limit_delay_seconds=0.0,
            max_rate_limit_delay_seconds=0.0,
            depth=len(self.fifo),
            max_depth=self.max_depth,
            processing=len(self.held),
            delayed=len(self.delayed),
            queue_wait_seconds=self.wait_total,
            work_seconds=self.work_total,
            shutting_down=self.shut,
            waiting_by_priority=Counter(priority for priority, _ in self.waiting.values()),
            oldest_wait_seconds=max(
                (self.now - arrival for _, arrival in self.waiting.values()), default=0.0
            ),
        )

    @invariant()
    def core_structures_match_model(self) -> None:
        # White-box: the real FIFO, dirty set and processing set, read under the lock.
        with self.serialized():
            core = self.q._core
            assert list(core.waiting) == self.fifo  # arrival order, FIFO or ranked
            assert set(core.dirty) == self.dirty
            assert set(core.processing) == self.held
            assert set(core.delayed) == set(self.delayed)

    # -- teardown: nothing lost, nothing duplicated ---------------------------------

    def teardown(self) -> None:
        if not self.shut and self.delayed:
            # Let every delayed key come due, so it is owed too.
            seconds = max(r for r, _ in self.delayed.values()) - self.now + 1.0
            self.clock.step(seconds)
            self.now += seconds
            self.release_due()
            assert not self.delayed
            assert len(self.q) == len(self.fifo)
        owed = set(self.owed)
        assert self.shutdown_queue() is True  # also when already shut down
        assert self.shutdown_queue() is True
        for key in sorted(self.held):
            self.q.done(key)
        handed_out: list[str] = []
        while True:
            try:
                key = self.q.get_nowait()
            except ShutDown:
                break
            handed_out.append(key)
            self.q.done(key)
        assert sorted(handed_out) == sorted(owed), "a key was lost or handed out twice"
        s = self.q.stats()
        assert (s.depth, s.processing, s.delayed) == (0, 0, 0)
        # The gets and dones teardown made, on top of the model's counts.
        gets = self.counts["gets"] + len(handed_out)
        dones = self.counts["dones"] + len(self.held) + len(handed_out)
        assert (s.gets, s.dones) == (gets, dones)


class AsyncWorkQueueMachine(WorkQueueMachine):
    """The same model against the asyncio front, driven from outside any loop.

    Its non-blocking calls need no loop; ``shutdown`` is awaited in a fresh one.
    """

    def make_queue(self, clock: FakeClock) -> Any:
        return AsyncWorkQueue("stateful", clock=clock, aging=self.aging)

    def shutdown_queue(self) -> bool:
        if not hasattr(self, "loop"):
            self.loop = asyncio.new_event_loop()  # the queue binds to it: reuse it
        return self.loop.run_until_complete(self.q.shutdown())  # type: ignore[no-any-return]

    def serialized(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()  # one thread: nothing to lock

    def teardown(self) -> None:
        try:
            super().teardown()
        finally:
            if hasattr(self, "loop"):
                self.loop.close()


class AgingWorkQueueMachine(WorkQueueMachine):
    """The same model with ``aging``: a waiting key gains a priority step a second."""

    aging = 1.0


class AgingAsyncWorkQueueMachine(AsyncWorkQueueMachine):
    aging = 0.5


def group_of(key: str) -> str:
    """Two groups: a and b, c and d."""
    return "ab" if key in "ab" else "cd"


class FairWorkQueueMachine(WorkQueueMachine):
    """The same model with ``fair_by`` (docs/fairness.md): the first key by
    rank names the priority; there the groups take turns (a rotation per
    priority, a group joining at the back), FIFO within each group."""

    def make_queue(self, clock: FakeClock) -> Any:
        return WorkQueue("stateful", clock=clock, aging=self.aging, fair_by=group_of)

    def __init__(self) -> None:
        super().__init__()
        self.rotation: dict[int, list[str]] = {}  # priority -> groups waiting there, in turn

    def at(self, priority: int, group: str, but: str | None = None) -> list[str]:
        """The waiting keys of ``group`` at ``priority`` (but one), in arrival order."""
        return [
            key
            for key in self.fifo
            if key != but and group_of(key) == group and self.waiting[key][0] == priority
        ]

    def joins(self, priority: int, group: str) -> None:
        turns = self.rotation.setdefault(priority, [])
        if group not in turns:
            turns.append(group)

    def leaves(self, priority: int, group: str) -> None:
        self.rotation[priority].remove(group)
        if not self.rotation[priority]:
            del self.rotation[priority]

    def arrive(self, key: str, priority: int) -> None:
        self.joins(priority, group_of(key))
        super().arrive(key, priority)

    def model_add(self, key: str, priority: int = 0) -> None:
        before = self.waiting[key][0] if key in self.waiting else None
        super().model_add(key, priority)
        after = self.waiting[key][0] if key in self.waiting else None
        if before is not None and after != before:  # moved up: it changes turns
            assert after is not None
            group = group_of(key)
            if not self.at(before, group, but=key):
                self.leaves(before, group)
            self.joins(after, group)

    def next_key(self) -> str:
        """The first key of the group whose turn it is at the first key's priority
        (the model's get takes it: the rotation moves here)."""
        priority = self.waiting[super().next_key()][0]
        group = self.rotation[priority][0]
        key = self.at(priority, group)[0]
        self.rotation[priority].remove(group)
        if self.at(priority, group, but=key):
            self.rotation[priority].append(group)
        elif not self.rotation[priority]:
            del self.rotation[priority]
        return key


class FairAsyncWorkQueueMachine(AsyncWorkQueueMachine, FairWorkQueueMachine):
    def make_queue(self, clock: FakeClock) -> Any:
        return AsyncWorkQueue("stateful", clock=clock, aging=self.aging, fair_by=group_of)


class FairAgingWorkQueueMachine(FairWorkQueueMachine):
    aging = 1.0


for machine in (
    WorkQueueMachine,
    AsyncWorkQueueMachine,
    AgingWorkQueueMachine,
    AgingAsyncWorkQueueMachine,
    FairWorkQueueMachine,
    FairAsyncWorkQueueMachine,
    FairAgingWorkQueueMachine,
):
    machine.TestCase.settings = settings(max_examples=200, stateful_step_count=50, deadline=None)
test_work_queue_matches_reference_model = WorkQueueMachine.TestCase
test_async_work_queue_matches_reference_model = AsyncWorkQueueMachine.TestCase
test_work_queue_with_aging_matches_reference_model = AgingWorkQueueMachine.TestCase
test_async_work_queue_with_aging_matches_reference_model = AgingAsyncWorkQueueMachine.TestCase
test_fair_work_queue_matches_reference_model = FairWorkQueueMachine.TestCase
test_fair_async_work_queue_matches_reference_model = FairAsyncWorkQueueMachine.TestCase
test_fair_work_queue_with_aging_matches_reference_model = FairAgingWorkQueueMachine.TestCase
