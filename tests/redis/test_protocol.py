"""The Redis client's structure: the scripts as assembled, the operations without a server.

``_schema`` assembles each script from its body and the libraries it
includes, with the keys its header names. The operations (``_ops``,
``_holding``) are generators over a client's parts, built here bare (a
``QueueConfig``, a ``Holds``, a ``Getters``), driven by hand with replies
written out, as a driver drives them with a server's.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

import pytest

from keyqueue import EventKind
from keyqueue._events import Subscribers
from keyqueue._options import QueueOptions
from keyqueue.redis import AsyncRedisWorkQueue, LeaseLost, RedisWorkQueue
from keyqueue.redis import _holding as holding
from keyqueue.redis import _ops as ops
from keyqueue.redis._config import configure
from keyqueue.redis._connection import Keys
from keyqueue.redis._getters import Getters
from keyqueue.redis._holds import Holds
from keyqueue.redis._ops import Op, answer, failed
from keyqueue.redis._replies import Reports
from keyqueue.redis._schema import KEY_NAMES, SCRIPTS, key_names, script_keys, script_source

LUA = files("keyqueue.redis") / "lua"


def libraries() -> list[str]:
    return sorted(p.name[:-4] for p in (LUA / "lib").iterdir() if p.name.endswith(".lua"))


def defined(name: str) -> list[str]:
    text = (LUA / "lib" / f"{name}.lua").read_text(encoding="utf-8")
    return re.findall(r"^local function (\w+)", text, re.MULTILINE)


# -- the scripts ---------------------------------------------------------------------------


def test_every_lua_file_is_a_script_or_a_library() -> None:
    scripts = sorted(p.name[:-4] for p in LUA.iterdir() if p.name.endswith(".lua"))
    assert scripts == sorted(SCRIPTS)
    assert libraries()


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_takes_the_keys_its_header_names_in_schema_order(script: str) -> None:
    keys = script_keys(script)
    assert keys == tuple(sorted(keys, key=KEY_NAMES.index))
    first, code = script_source(script).split("\n", 1)
    assert first == "-- " + ", ".join(f"{k.upper()} = KEYS[{i + 1}]" for i, k in enumerate(keys))
    for i, key in enumerate(keys, 1):  # each name written as its place in KEYS
        assert f"KEYS[{i}]" in code
        assert not re.search(rf"\b{key.upper()}\b", code), key


@pytest.mark.parametrize("script", SCRIPTS)
def test_a_script_has_each_library_once_and_its_headers(script: str) -> None:
    source = script_source(script)
    for lib in libraries():
        first = (LUA / "lib" / f"{lib}.lua").read_text(encoding="utf-8").splitlines()[0]
        assert source.count(f"\n{first}\n") <= 1, lib
    body = (LUA / f"{script}.lua").read_text(encoding="utf-8")
    assert body.startswith(f"-- {script}: ")
    for header in ("-- KEYS: ", "-- ARGV: ", "-- Returns "):
        assert header in body, header


def test_every_library_function_is_defined_once_and_used() -> None:
    everything = "\n".join(script_source(s) for s in SCRIPTS)
    names = [name for lib in libraries() for name in defined(lib)]
    assert len(names) == len(set(names))
    for name in names:
        assert re.search(rf"\b{name}\(", everything.replace(f"function {name}(", "")), name


def test_only_what_a_script_needs_goes_with_it() -> None:
    # renew and forget touch a few keys (and read no clock-driven promotion);
    # only the server limiter's scripts (and delete) get the endpoint buckets.
    assert script_keys("renew") == ("processing", "lease", "stats", "taken_back")
    assert script_keys("forget") == (
        "lease",
        "failures",
        "requeues",
        "stats",
        "taken_back",
        "failing",
        "stalls",
    )
    with_endpoints = {s for s in SCRIPTS if "endpoints" in script_keys(s)}
    assert with_endpoints == {"add_rate_limited", "retry", "delete"}  # delete removes them
    assert "promote()" not in script_source("renew")


def test_the_get_script_takes_a_prefix_of_the_queues_keys() -> None:
    # Then the client's get record (the driver appends it).
    keys = script_keys("get")
    assert keys == KEY_NAMES[: len(keys)]


# -- the operations, without a server ------------------------------------------------------


class Bare:
    """A client's parts with no driver: operations are run by hand."""

    def __init__(self, *, lease: float = 30.0, max_stalls: int = 1, **options: Any) -> None:
        self.cfg = configure(
            QueueOptions("q", **options),
            holder="h",
            lease=lease,
            max_stalls=max_stalls,
            unsent=lambda exc: False,
        )
        self.seen: list[tuple[EventKind, Any]] = []
        events = Subscribers("q", None)
        events.subscribe(lambda event: self.seen.append((event.kind, event.key)))
        self.renewals = 0
        self.holds = Holds(
            Reports("q", events, max_stalls),
            virtual=False,
            start_renewing=self.start_renewing,
            nothing_held=lambda: None,
        )
        self.getters = Getters(
            "q",
            self.holds.lock,
            lease=lease,
            block=1.0,
            wake_followers=lambda: None,
            arm=lambda due: None,
        )
        self.owner = object()  # the thread or task that calls

    def start_renewing(self) -> None:
        self.renewals += 1
        self.holds.renewer = object()

    def get(self, now: float = 0.0) -> Op[tuple[str | None, float | None]]:
        return holding.get(self.cfg, self.holds, self.getters, self.owner, now)


def run(op: Op[Any], reply: Any) -> tuple[tuple[str, list[str]], Any]:
    """``op``'s call, and what it returns given ``reply``."""
    call = next(op)
    return call, answer(op, reply)


def test_a_get_records_the_hold_and_its_events_and_starts_renewing() -> None:
    q = Bare(max_retries=3, max_stalls=2)
    (script, args), got = run(q.get(10.0), ["5.0", 1, b"k", 7, ["get", "k", "0.5"]])
    assert (script, args[1:3]) == ("get", ["30.0", "2"])  # reaps with max_stalls
    assert got == ("k", None)
    assert q.holds.token("k", q.owner) == 7
    assert q.renewals == 1
    assert q.seen == [(EventKind.GET, "k")]
    keys = Keys("q").scripts["get"]
    assert keys[:-1] == key_names("q")[: len(script_keys("get"))]
    assert keys[-1].startswith("keyqueue:{q}:got:")  # the client's get record


def test_a_get_whose_reply_was_lost_is_handed_back_by_the_next_get_in_its_slot() -> None:
    # ARGV [5] slot, [6] number, [7] the slot's lost get's number, [8] aging.
    q = Bare()
    first, second = q.get(), q.get()
    assert next(first)[1][4:7] == ["1", "1", ""]
    assert next(second)[1][4:7] == ["2", "2", ""]  # in flight at once: slots of their own
    with pytest.raises(ConnectionError):
        failed(first, ConnectionError("reply lost"))
    assert answer(second, ["1.0", 0, "", []]) == (None, None)
    third = q.get()
    assert next(third)[1][4:7] == ["1", "3", "1"]  # the lost one's slot, its number
    assert answer(third, ["1.0", 1, "k", 4, []]) == ("k", None)
    assert next(q.get())[1][4:7] == ["1", "4", ""]  # handed back once: free again


def test_a_get_names_every_get_of_its_slot_not_answered_since_the_last_that_was() -> None:
    # The one in the middle may never have reached the server: the record
    # then holds the first one's key, which the third hands back.
    q = Bare()
    for number, lost in (("1", ""), ("2", "1")):
        op = q.get()
        assert next(op)[1][4:7] == ["1", number, lost]
        with pytest.raises(ConnectionError):
            failed(op, ConnectionError("connection lost"))
    third = q.get()
    assert next(third)[1][4:7] == ["1", "3", "1 2"]
    assert answer(third, ["1.0", 0, "", []]) == (None, None)
    assert next(q.get())[1][4:7] == ["1", "4", ""]


def test_an_empty_get_says_when_to_look_again() -> None:
    q = Bare(lease=30.0)
    _, got = run(q.get(100.0), ["5.0", 0, "2.5", []])
    assert got == (None, 2.5)
    assert q.getters.look_at == 102.5


def test_a_fenced_outcome_carries_its_token_and_seq_and_asks_again_with_the_same() -> None:
    q = Bare()
    run(q.get(), ["1.0", 1, "k", 4, []])
    op = ops.retry(q.cfg, q.holds, q.owner, "k")
    script, args = next(op)
    assert (script, args[1:4]) == ("retry", ["4", "1", "k"])
    with pytest.raises(ConnectionError):
        failed(op, ConnectionError("reply lost"))
    assert q.holds["k"].unsure  # not renewed until a call on it answers
    again = ops.retry(q.cfg, q.holds, q.owner, "k")
    assert next(again)[1][1:4] == ["4", "1", "k"]  # the same request number
    assert answer(again, ["1.0", 1, [], "ok"]) is True
    assert not q.holds["k"].unsure


def test_a_fenced_outcome_whose_lease_was_taken_back_raises_and_marks_the_hold() -> None:
    q = Bare()
    run(q.get(), ["1.0", 1, "k", 4, []])
    op = ops.forget(q.cfg, q.holds, q.owner, "k")
    next(op)
    with pytest.raises(LeaseLost):
        answer(op, ["2.0", 0, [], "lost"])
    with pytest.raises(LeaseLost):  # known lost: raised before anything is sent
        next(ops.forget(q.cfg, q.holds, q.owner, "k"))
    done = holding.done(q.cfg, q.holds, q.owner, "k")
    with pytest.raises(LeaseLost):
        next(done)
    assert not q.holds


def test_a_done_releases_the_hold() -> None:
    q = Bare()
    run(q.get(), ["1.0", 1, "k", 4, []])
    done = holding.done(q.cfg, q.holds, q.owner, "k")
    (script, args), _ = run(done, ["2.0", "ok", ["done", "k", "1.0"]])
    assert (script, args[1:]) == ("done", ["k", "4", ""])
    assert not q.holds
    assert q.seen[-1] == (EventKind.DONE, "k")
    with pytest.raises(ValueError, match="not being processed"):
        next(holding.done(q.cfg, q.holds, q.owner, "k"))


def test_a_renewal_is_made_of_the_live_holds_and_ends_when_there_are_none() -> None:
    q = Bare()
    assert holding.renew(q.cfg, q.holds) is False
    run(q.get(), ["1.0", 1, "a", 1, []])
    run(q.get(), ["1.0", 1, "b", 2, []])
    op = holding.renew(q.cfg, q.holds)
    assert not isinstance(op, bool)
    (script, args), _ = run(op, ["2.0", ["b", "2"]])
    assert (script, args[1:]) == ("renew", ["30.0", "a", "1", "-", "b", "2", "-"])
    assert q.holds["b"].lost
    assert not q.holds["a"].lost


def test_add_many_checks_every_key_before_any_call() -> None:
    q = Bare()
    with pytest.raises(TypeError):
        list(ops.add_many(q.cfg, q.holds.reports, ["a", 1], 0))  # type: ignore[list-item]
    batches = list(ops.add_many(q.cfg, q.holds.reports, [f"k{i}" for i in range(1500)], 2))
    # The keys come after the clock, priority, aging and groups arguments.
    assert [len(next(op)[1]) - 4 for op in batches] == [1000, 500]
    fair = Bare(fair_by=lambda key: key[0])
    with pytest.raises(TypeError, match="fair_by must return a str"):
        list(ops.add_many(Bare(fair_by=lambda key: 1).cfg, fair.holds.reports, ["a"], 0))
    (op,) = ops.add_many(fair.cfg, fair.holds.reports, ["ab", "cd"], 0)
    assert next(op)[1][3:] == ['["a", "c"]', "ab", "cd"]  # the groups, then the keys


@pytest.mark.parametrize("front", [RedisWorkQueue, AsyncRedisWorkQueue])
def test_a_bad_constructor_call_names_the_class_called(front: type) -> None:
    with pytest.raises(TypeError, match=rf"^{front.__name__}\(\): too many positional"):
        front("x", "y")
    with pytest.raises(TypeError, match=rf"^{front.__name__}\(\): .*'colour'"):
        front("x", url="redis://localhost", colour="red")
