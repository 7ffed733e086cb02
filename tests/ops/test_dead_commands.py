"""``keyqueue dead`` and ``keyqueue replay`` on a real valkey-server, in-process
(click's CliRunner), on one queue and on a sharded one."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import redis
from click.testing import CliRunner, Result

from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.redis import RedisWorkQueue
from tests.support import valkey_server

name = valkey_server.name


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue")


@pytest.fixture(params=[1, 3], ids=["one", "sharded"])
def buried(request: pytest.FixtureRequest, valkey_url: str, name: str) -> Iterator[RedisWorkQueue]:
    """A queue (unsharded, or of 3 shards) with two dead keys: "old" given up
    permanently, then "new" after its retries."""
    q = RedisWorkQueue(name, url=valkey_url, shards=request.param)
    q.add("alive")
    q.give_up("old", "permanent", ValueError("no such customer"))
    q.give_up("new", "retries", TimeoutError("upstream timed out"))
    yield q
    q.delete(force=True)
    q.close()


def test_dead_lists_the_dead_keys_newest_first(buried: RedisWorkQueue, valkey_url: str) -> None:
    result = invoke("dead", buried.name, "--redis-url", valkey_url, "--plain")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert "Dead: 2" in lines[0], result.output
    new, old = (line.strip() for line in lines if line.strip().startswith(("new ", "old ")))
    assert "retries" in new
    assert "TimeoutError: upstream timed out" in new
    assert "permanent" in old
    assert "ValueError: no such customer" in old
    assert " ago" in new


def test_dead_json_has_each_keys_fields(buried: RedisWorkQueue, valkey_url: str) -> None:
    result = invoke("dead", buried.name, "--redis-url", valkey_url, "--json", "--limit", "1")
    assert result.exit_code == 0, result.output
    shape = json.loads(result.output)
    assert shape["queue"] == buried.name
    (row,) = shape["dead"]
    assert {k: v for k, v in row.items() if k != "at"} == {
        "key": "new",
        "reason": "retries",
        "error_type": "TimeoutError",
        "error": "upstream timed out",
        "failures": 0,
    }
    assert isinstance(row["at"], float)


def test_replay_adds_one_dead_key_back(buried: RedisWorkQueue, valkey_url: str) -> None:
    result = invoke("replay", buried.name, "old", "--redis-url", valkey_url)
    assert result.exit_code == 0, result.output
    assert "replayed old" in result.output
    assert [d.key for d in buried.dead()] == ["new"]
    assert buried.stats().depth == 2  # alive and old

    again = invoke("replay", buried.name, "old", "--redis-url", valkey_url)
    assert again.exit_code == 1
    assert "not a dead key" in again.output


def test_replay_all_adds_every_dead_key_back(buried: RedisWorkQueue, valkey_url: str) -> None:
    result = invoke("replay", buried.name, "--all", "--redis-url", valkey_url)
    assert result.exit_code == 0, result.output
    assert "replayed 2 dead keys" in result.output
    assert buried.dead() == ()
    assert buried.stats().depth == 3


def test_replay_takes_a_key_or_all_not_both(valkey_url: str) -> None:
    for args in ((), ("k", "--all")):
        result = invoke("replay", "q", *args, "--redis-url", valkey_url)
        assert result.exit_code == 2
        assert "either KEY or --all" in result.output


@pytest.fixture(params=[1, 3], ids=["one", "sharded"])
def only_dead(
    request: pytest.FixtureRequest, valkey_url: str, name: str
) -> Iterator[RedisWorkQueue]:
    """A queue whose only state is one dead key: "a" added, handed out,
    given up and done, nothing else waiting, held or delayed."""
    q = RedisWorkQueue(name, url=valkey_url, shards=request.param)
    q.add("a")
    assert q.get_nowait() == "a"
    q.give_up("a", "permanent", ValueError("bad spec"))
    q.done("a")
    stats = q.stats()
    assert (stats.depth, stats.processing, stats.delayed) == (0, 0, 0)
    yield q
    q.delete(force=True)
    q.close()


@pytest.mark.parametrize("command", [["dead"], ["inspect"], ["replay", "a"], ["replay", "--all"]])
def test_a_queue_holding_only_dead_keys_exists_for_the_commands(
    only_dead: RedisWorkQueue, valkey_url: str, command: list[str]
) -> None:
    assert only_dead.exists()
    verb, *rest = command
    result = invoke(verb, only_dead.name, *rest, "--redis-url", valkey_url)
    assert result.exit_code == 0, result.output
    if verb == "replay":
        assert only_dead.dead() == ()
        assert only_dead.stats().depth == 1
    else:  # dead's table, and inspect's after its four lists
        assert "Dead: 1" in result.output
        assert "ValueError: bad spec" in result.output


def test_a_key_given_up_on_a_queue_never_used_makes_it_exist(valkey_url: str, name: str) -> None:
    q = RedisWorkQueue(name, url=valkey_url)
    try:
        assert not q.exists()
        q.give_up("k", "manual")  # the queue's first and only call
        assert q.exists()
        result = invoke("dead", name, "--redis-url", valkey_url, "--plain")
        assert result.exit_code == 0, result.output
        assert "manual" in result.output
        assert q.delete() is True
        assert not q.exists()
    finally:
        q.close()


def test_dead_keys_alone_make_a_queue_exist(valkey_url: str, name: str) -> None:
    """Dead keys without the queue's stats hash (left by a client that did
    not write it) still make the queue exist, for the commands and ``delete``."""
    q = RedisWorkQueue(name, url=valkey_url)
    raw = redis.Redis.from_url(valkey_url)
    try:
        q.give_up("k", "manual")
        raw.delete(f"keyqueue:{{{name}}}:stats")
        assert q.exists()
        result = invoke("replay", name, "k", "--redis-url", valkey_url)
        assert result.exit_code == 0, result.output
        assert q.delete(force=True) is True
    finally:
        raw.close()
        q.close()


@pytest.mark.parametrize("limit", ["0", "-1", "x"])
def test_dead_refuses_a_limit_below_one_or_not_an_integer(valkey_url: str, limit: str) -> None:
    result = invoke("dead", "q", "--limit", limit, "--redis-url", valkey_url)
    assert result.exit_code == 2
    assert "--limit" in result.output
