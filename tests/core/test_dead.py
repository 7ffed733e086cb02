"""The core's dead keys (``Core.give_up``, ``dead_keys``, ``replay``): the bound,
the order, and what a give-up does to the key's failures; and the runners'
reasons on an in-memory queue."""

from __future__ import annotations

import pytest

from keyqueue import DeadKey, WorkQueue
from keyqueue._core import Core
from keyqueue._dead import DEAD_LIMIT, ERROR_MESSAGE_MAX, check_reason, describe
from keyqueue.testing import FakeClock


def test_the_dead_set_keeps_the_newest_dead_limit_keys_oldest_dropped_first() -> None:
    core: Core[int] = Core()
    for key in range(DEAD_LIMIT + 3):
        core.give_up(key, "retries", None, None, float(key))
    assert len(core.dead) == DEAD_LIMIT
    assert next(iter(core.dead)) == 3
    assert [d.key for d in core.dead_keys(2)] == [DEAD_LIMIT + 2, DEAD_LIMIT + 1]


def test_a_give_up_keeps_the_failures_and_forgets_them() -> None:
    core: Core[str] = Core(max_retries=3)
    core.add("a", 0.0)
    assert core.get(0.0) == "a"
    assert core.retry("a", 1.0, 0.0) is False  # one failure, backing off
    core.give_up("a", "permanent", "PermanentError", "no", 12.5)
    assert core.dead_keys(10) == (DeadKey("a", "permanent", "PermanentError", "no", 1, 12.5),)
    assert (core.failures, core.failing) == ({}, {})


def test_replay_is_refused_after_shutdown_and_changes_nothing() -> None:
    core: Core[str] = Core()
    core.give_up("a", "retries", None, None, 1.0)
    core.shutdown(0.0)
    assert core.replay("a", 0.0) is None
    assert core.replay_all(0.0) == ([], 0)
    assert [d.key for d in core.dead_keys(10)] == ["a"]


def test_nothing_but_give_up_touches_the_dead_set() -> None:
    core: Core[str] = Core(max_retries=1)
    core.add("a", 0.0)
    assert core.get(0.0) == "a"
    assert core.retry("a", 0.0, 0.0) is None  # given up by retry: kept only by give_up
    core.forget("a")
    core.done("a", 0.0)
    assert core.dead == {}


def test_an_errors_message_is_cut_and_a_reason_is_a_non_empty_str() -> None:
    assert describe(None) == (None, None)
    error_type, message = describe(ValueError("x" * 1000))
    assert (error_type, len(message or "")) == ("ValueError", ERROR_MESSAGE_MAX)
    with pytest.raises(TypeError):
        check_reason(None)
    with pytest.raises(ValueError, match="empty"):
        check_reason("")


def test_a_key_failing_during_a_shutdown_without_a_drain_is_dead_with_reason_shutdown() -> None:
    q: WorkQueue[str] = WorkQueue("dead-shutdown", clock=FakeClock())
    q.add("a")
    assert q.get_nowait() == "a"
    q.shutdown()
    assert q.retry("a") is False  # what the runner's outcome asks next
    q.give_up("a", "shutdown", RuntimeError("late"))
    q.done("a")
    assert [(d.key, d.reason) for d in q.dead()] == [("a", "shutdown")]
    assert q.replay("a") is False  # adds are refused after shutdown


def test_a_replay_whose_fair_by_raises_leaves_the_dead_keys_as_they_were() -> None:
    broken = {"b"}

    def group(key: str) -> str:
        if key in broken:
            raise LookupError(key)
        return key

    core: Core[str] = Core(fair_by=group)
    for at, key in enumerate(("a", "b", "c")):
        core.give_up(key, "retries", None, None, float(at))
    with pytest.raises(LookupError):
        core.replay("b", 0.0)
    with pytest.raises(LookupError):
        core.replay_all(0.0)  # b's group is asked before any key is replayed
    assert [d.key for d in core.dead_keys(10)] == ["c", "b", "a"]
    assert (len(core.waiting), core.dirty) == (0, {})
    broken.clear()
    assert core.replay_all(0.0) == (["a", "b", "c"], 3)
