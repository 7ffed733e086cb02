"""The core's transitions table (``keyqueue._core.TRANSITIONS``), walked against the core.

Every (state, call) the table lists is run on a core holding one key in that
state, FIFO and ranked: the key must land in the state the table names, and
the core must report exactly the events it names. Every call the table leaves
out of a state is refused for that key, changing nothing; after shutdown an
add changes nothing. So the table at the top of ``_core.py`` is the machine,
not a description of it.
"""

from __future__ import annotations

from typing import Any

import pytest

from keyqueue import Empty, EventKind
from keyqueue._core import ABSENT, PENDING, PROCESSING, TRANSITIONS, WAITING, Core

K = "k"
CALLS = ("add", "get", "done")


def core_in(state: str, *, ranked: bool) -> Core[str]:
    """A core whose one key ``K`` is in ``state`` (at time 0)."""
    core: Core[str] = Core()
    if ranked:
        core.rank()
    if state == ABSENT:
        return core
    core.add(K, 0.0)
    if state == WAITING:
        return core
    assert core.get(0.0) == K
    if state == PENDING:
        core.add(K, 0.0)
    return core


def state_of(core: Core[str]) -> str:
    """``K``'s state, read from the core's maps, checking they agree."""
    dirty, processing, waiting = K in core.dirty, K in core.processing, K in core.waiting
    assert waiting == (dirty and not processing), "a key waits iff it is dirty and not held"
    return {
        (False, False): ABSENT,
        (True, False): WAITING,
        (False, True): PROCESSING,
        (True, True): PENDING,
    }[(dirty, processing)]


def call(core: Core[str], name: str) -> Any:
    if name == "add":
        return core.add(K, 1.0)
    if name == "get":
        return core.get(1.0)
    return core.done(K, 1.0)


def observe(core: Core[str]) -> list[EventKind]:
    seen: list[EventKind] = []
    core.observer = lambda kind, key, now, duration: seen.append(kind)
    return seen


def test_the_table_covers_every_state_and_only_known_calls() -> None:
    assert set(TRANSITIONS) == {ABSENT, WAITING, PROCESSING, PENDING}
    for row in TRANSITIONS.values():
        assert set(row) <= set(CALLS)
        assert "add" in row  # an add is accepted in every state of a live queue
        for target, _ in row.values():
            assert target in TRANSITIONS


@pytest.mark.parametrize("ranked", [False, True], ids=["fifo", "ranked"])
@pytest.mark.parametrize(
    ("state", "name"),
    [(state, name) for state, row in TRANSITIONS.items() for name in row],
)
def test_each_listed_transition_lands_where_the_table_says(
    state: str, name: str, ranked: bool
) -> None:
    core = core_in(state, ranked=ranked)
    assert state_of(core) == state
    seen = observe(core)
    target, events = TRANSITIONS[state][name]
    result = call(core, name)
    assert state_of(core) == target
    assert tuple(seen) == events
    if name == "get":
        assert result == K
    else:  # add and done say whether they pushed the key (the front wakes a getter)
        assert result is (state != WAITING and target == WAITING)


@pytest.mark.parametrize("ranked", [False, True], ids=["fifo", "ranked"])
@pytest.mark.parametrize(
    ("state", "name"),
    [(state, name) for state, row in TRANSITIONS.items() for name in CALLS if name not in row],
)
def test_each_call_the_table_leaves_out_is_refused_and_changes_nothing(
    state: str, name: str, ranked: bool
) -> None:
    core = core_in(state, ranked=ranked)
    seen = observe(core)
    with pytest.raises(ValueError if name == "done" else Empty):
        call(core, name)
    assert state_of(core) == state
    assert seen == []


@pytest.mark.parametrize("ranked", [False, True], ids=["fifo", "ranked"])
@pytest.mark.parametrize("state", list(TRANSITIONS))
def test_after_shutdown_an_add_changes_nothing_and_reports_nothing(
    state: str, ranked: bool
) -> None:
    core = core_in(state, ranked=ranked)
    core.shutdown(0.5)
    seen = observe(core)
    assert core.add(K, 1.0) is False
    assert state_of(core) == state
    assert seen == []
