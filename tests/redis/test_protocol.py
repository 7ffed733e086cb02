"""The Redis client's structure: the scripts as assembled, the protocol without a server.

``_schema`` assembles each script from its body and the libraries it
includes, with the keys its header names; ``_protocol``'s operations are
generators driven here by hand, with replies written out, as a driver drives
them with a server's.
"""

from __future__ import annotations

import re
from importlib.resources import files
from typing import Any

import pytest

from keyqueue import EventKind
from keyqueue.redis import LeaseLost
from keyqueue.redis._protocol import Op, RedisProtocol, answer, failed
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
    first = script_source(script).splitlines()[0]
    names = ", ".join(k.upper() for k in keys)
    assert first == f"local {names} = " + ", ".join(f"KEYS[{i + 1}]" for i in range(len(keys)))


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


# -- the protocol, without a server ---------------------------------------------------------


class _Client:
    """Just enough of a redis-py client for construction: no connection."""

    def get_connection_kwargs(self) -> dict[str, Any]:
        return {"socket_timeout": 5.0}

    def register_script(self, source: str) -> object:
        return source


class Bare(RedisProtocol[_Client]):
    """A protocol with no driver: operations are run by hand."""

    _client_kinds = (_Client,)
    _client_wanted = "a _Client"
    renewals = 0

    def _connect(self) -> None:
        pass

    def _start_renewing(self) -> None:
        self.renewals += 1
        self._renewer = object()

    def _nothing_held(self) -> None:
        pass

    def _wake_followers(self) -> None:
        pass


def run(op: Op[Any], reply: Any) -> tuple[tuple[str, list[str]], Any]:
    """``op``'s call, and what it returns given ``reply``."""
    call = next(op)
    return call, answer(op, reply)


def bare(**options: Any) -> Bare:
    q = Bare("q", client=_Client(), **options)
    seen: list[tuple[EventKind, Any]] = []
    q.subscribe(lambda event: seen.append((event.kind, event.key)))
    q.seen = seen  # type: ignore[attr-defined]
    return q


def test_a_get_records_the_hold_and_its_events_and_starts_renewing() -> None:
    q = bare(max_retries=3, max_stalls=2)
    (script, args), got = run(q._op_get(10.0), ["5.0", 1, b"k", 7, ["get", "k", "0.5"]])
    assert (script, args[1:3]) == ("get", ["30.0", "2"])  # reaps with max_stalls
    assert got == ("k", None)
    assert q.token("k") == 7
    assert q.renewals == 1
    assert q.seen == [(EventKind.GET, "k")]  # type: ignore[attr-defined]
    keys = q._script_keys["get"]
    assert keys[:-1] == key_names("q")[: len(script_keys("get"))]
    assert keys[-1].startswith("keyqueue:{q}:got:")  # the client's get record


def test_a_get_whose_reply_was_lost_is_handed_back_by_the_next_get_in_its_slot() -> None:
    # ARGV [5] slot, [6] number, [7] the slot's lost get's number, [8] aging.
    q = bare()
    first, second = q._op_get(0.0), q._op_get(0.0)
    assert next(first)[1][4:7] == ["1", "1", ""]
    assert next(second)[1][4:7] == ["2", "2", ""]  # in flight at once: slots of their own
    with pytest.raises(ConnectionError):
        failed(first, ConnectionError("reply lost"))
    assert answer(second, ["1.0", 0, "", []]) == (None, None)
    third = q._op_get(0.0)
    assert next(third)[1][4:7] == ["1", "3", "1"]  # the lost one's slot, its number
    assert answer(third, ["1.0", 1, "k", 4, []]) == ("k", None)
    assert next(q._op_get(0.0))[1][4:7] == ["1", "4", ""]  # handed back once: free again


def test_a_get_names_every_get_of_its_slot_not_answered_since_the_last_that_was() -> None:
    # The one in the middle may never have reached the server: the record
    # then holds the first one's key, which the third hands back.
    q = bare()
    for number, lost in (("1", ""), ("2", "1")):
        op = q._op_get(0.0)
        assert next(op)[1][4:7] == ["1", number, lost]
        with pytest.raises(ConnectionError):
            failed(op, ConnectionError("connection lost"))
    third = q._op_get(0.0)
    assert next(third)[1][4:7] == ["1", "3", "1 2"]
    assert answer(third, ["1.0", 0, "", []]) == (None, None)
    assert next(q._op_get(0.0))[1][4:7] == ["1", "4", ""]


def test_an_empty_get_says_when_to_look_again() -> None:
    q = bare(lease=30.0)
    _, got = run(q._op_get(100.0), ["5.0", 0, "2.5", []])
    assert got == (None, 2.5)
    assert q._waiting.look_at == 102.5


def test_a_fenced_outcome_carries_its_token_and_seq_and_asks_again_with_the_same() -> None:
    q = bare()
    run(q._op_get(0.0), ["1.0", 1, "k", 4, []])
    op = q._op_retry("k")
    script, args = next(op)
    assert (script, args[1:4]) == ("retry", ["4", "1", "k"])
    with pytest.raises(ConnectionError):
        failed(op, ConnectionError("reply lost"))
    assert q._holds["k"].unsure  # not renewed until a call on it answers
    again = q._op_retry("k")
    assert next(again)[1][1:4] == ["4", "1", "k"]  # the same request number
    assert answer(again, ["1.0", 1, [], "ok"]) is True
    assert not q._holds["k"].unsure


def test_a_fenced_outcome_whose_lease_was_taken_back_raises_and_marks_the_hold() -> None:
    q = bare()
    run(q._op_get(0.0), ["1.0", 1, "k", 4, []])
    op = q._op_forget("k")
    next(op)
    with pytest.raises(LeaseLost):
        answer(op, ["2.0", 0, [], "lost"])
    with pytest.raises(LeaseLost):  # known lost: raised before anything is sent
        next(q._op_forget("k"))
    done = q._op_done("k")
    with pytest.raises(LeaseLost):
        next(done)
    assert not q._holds


def test_a_done_releases_the_hold() -> None:
    q = bare()
    run(q._op_get(0.0), ["1.0", 1, "k", 4, []])
    (script, args), _ = run(q._op_done("k"), ["2.0", "ok", ["done", "k", "1.0"]])
    assert (script, args[1:]) == ("done", ["k", "4", ""])
    assert not q._holds
    assert q.seen[-1] == (EventKind.DONE, "k")  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="not being processed"):
        next(q._op_done("k"))


def test_a_renewal_is_made_of_the_live_holds_and_ends_when_there_are_none() -> None:
    q = bare()
    assert q._op_renew() is False
    run(q._op_get(0.0), ["1.0", 1, "a", 1, []])
    run(q._op_get(0.0), ["1.0", 1, "b", 2, []])
    op = q._op_renew()
    assert not isinstance(op, bool)
    (script, args), _ = run(op, ["2.0", ["b", "2"]])
    assert (script, args[1:]) == ("renew", ["30.0", "a", "1", "-", "b", "2", "-"])
    assert q._holds["b"].lost
    assert not q._holds["a"].lost


def test_add_many_checks_every_key_before_any_call() -> None:
    q = bare()
    with pytest.raises(TypeError):
        list(q._op_add_many(["a", 1], 0))  # type: ignore[list-item]
    batches = list(q._op_add_many([f"k{i}" for i in range(1500)], 2))
    assert [len(next(op)[1]) - 3 for op in batches] == [1000, 500]
