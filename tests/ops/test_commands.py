"""The operator's commands on a real valkey-server: ``keyqueue inspect``, ``top``,
``add``, ``forget``, ``delete``.

The one-shot commands run in-process (click's CliRunner); ``top`` runs as a
real process, since it ends only by Ctrl-C or a closed pipe.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner, Result

from keyqueue import ItemExponentialFailureRateLimiter
from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.redis import RedisWorkQueue
from tests.support import valkey_server
from tests.support.foreground import FOREGROUND, first_line, interrupt, running_top, top_line

name = valkey_server.name
OPERATOR_COMMANDS = ("inspect", "top", "add", "forget", "dead", "replay", "delete")


def invoke(*args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue", input=stdin)


@pytest.fixture
def busy(valkey_url: str, name: str) -> Iterator[RedisWorkQueue]:
    """A queue with keys waiting, one held by another client, one failing in backoff."""
    q = RedisWorkQueue(
        name,
        url=valkey_url,
        holder="worker-1",
        rate_limiter=ItemExponentialFailureRateLimiter(60, 600),
    )
    q.add_many(["fail", "held", "a", "b", "c"])
    assert q.get_nowait() == "fail"
    assert q.retry("fail") is True  # back in 60 s
    q.done("fail")
    assert q.get_nowait() == "held"
    q.add("vip", priority=5)
    yield q
    q.close()


def test_every_operator_command_has_help() -> None:
    for command in OPERATOR_COMMANDS:
        result = invoke(command, "--help")
        assert result.exit_code == 0, result.output
        assert "--redis-url" in result.output
        assert f"Usage: keyqueue {command}" in result.output
    assert all(c in invoke("--help").output for c in OPERATOR_COMMANDS)


def test_inspect_json_is_the_snapshot_with_each_key_its_numbers(
    busy: RedisWorkQueue, valkey_url: str
) -> None:
    result = invoke("inspect", busy.name, "--redis-url", valkey_url, "--json")
    assert result.exit_code == 0, result.output
    shape = json.loads(result.output)
    assert shape["version"] == 1
    assert shape["limit"] == 100
    assert [(w["key"], w["priority"]) for w in shape["waiting"]] == [
        ("vip", 5),
        ("a", 0),
        ("b", 0),
        ("c", 0),
    ]
    (held,) = shape["processing"]
    assert (held["key"], held["holder"], held["token"]) == ("held", "worker-1", busy.token("held"))
    assert 0 < held["lease_left"] <= 30.0
    (delayed,) = shape["delayed"]
    assert delayed["key"] == "fail"
    assert 55 < delayed["due_in"] <= 60
    assert [(f["key"], f["failures"]) for f in shape["failing"]] == [("fail", 1)]
    assert 55 < shape["failing"][0]["comes_back_in"] <= 60
    assert shape["stats"]["depth"] == 4
    assert shape["stats"]["processing"] == 1
    limited = json.loads(
        invoke("inspect", busy.name, "--redis-url", valkey_url, "--json", "--limit", "1").output
    )
    assert [w["key"] for w in limited["waiting"]] == ["vip"]


def test_inspect_shows_the_four_lists_as_tables(busy: RedisWorkQueue, valkey_url: str) -> None:
    result = invoke("inspect", busy.name, "--redis-url", valkey_url)
    assert result.exit_code == 0, result.output
    out = result.output
    assert f"queue {busy.name} at " in out
    assert "4 waiting, 1 processing, 1 delayed, 1 failing" in out
    for heading in ("Waiting: 4", "Processing: 1", "Delayed: 1", "Failing: 1"):
        assert heading in out
    assert "worker-1" in out


def test_inspect_shows_an_unprintable_key_as_its_repr(valkey_url: str, name: str) -> None:
    with RedisWorkQueue(name, url=valkey_url) as q:
        q.add("evil\x1b[2Jkey")
    out = invoke("inspect", name, "--redis-url", valkey_url).output
    assert "\x1b" not in out
    assert "'evil\\x1b[2Jkey'" in out


def test_top_plain_prints_one_line_per_interval_with_rates(
    busy: RedisWorkQueue, valkey_url: str
) -> None:
    with running_top(valkey_url, busy.name, "--interval", "0.2") as proc:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        busy.add_many([f"new-{i}" for i in range(10)])
        lines = [proc.stdout.readline() for _ in range(3)]
        started = time.monotonic()
        err = interrupt(proc)
        assert time.monotonic() - started < 5  # Ctrl-C ends it at once
    assert proc.returncode == 130, err
    fields = dict(pair.split("=", 1) for pair in first.split()[1:])
    assert (fields["depth"], fields["processing"], fields["delayed"], fields["failing"]) == (
        "4",
        "1",
        "1",
        "1",
    )
    assert fields["adds/s"] == "-"  # no interval yet
    later = [dict(pair.split("=", 1) for pair in line.split()[1:]) for line in lines]
    assert later[-1]["depth"] == "14"
    assert any(float(f["adds/s"]) > 0 for f in later)


def test_top_ends_quietly_when_its_pipe_closes(busy: RedisWorkQueue, valkey_url: str) -> None:
    shell = (
        f"{sys.executable} -c '{FOREGROUND}' top {busy.name} --redis-url {valkey_url} "
        "--interval 0.1 | head -n 2"
    )
    started = time.monotonic()
    done = subprocess.run(
        ["sh", "-c", shell],
        check=False,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert time.monotonic() - started < 10
    assert done.stdout.count("depth=") == 2
    assert "Traceback" not in done.stderr, done.stderr
    assert "BrokenPipe" not in done.stderr, done.stderr


def test_add_hands_a_key_out_again_now_and_says_what_it_did(
    busy: RedisWorkQueue, valkey_url: str
) -> None:
    result = invoke("add", busy.name, "fail", "--redis-url", valkey_url, "--priority", "9")
    assert result.exit_code == 0, result.output
    assert "waiting now" in result.output
    assert busy.get_nowait() == "fail"  # out of its 60 s backoff, first by its priority
    busy.done("fail")
    held = invoke("add", busy.name, "held", "--redis-url", valkey_url)
    assert "handed out again after its done" in held.output
    again = invoke("add", busy.name, "a", "--redis-url", valkey_url)
    assert "already waiting" in again.output


def test_forget_clears_a_keys_failures(busy: RedisWorkQueue, valkey_url: str) -> None:
    assert [f.key for f in busy.snapshot().failing] == ["fail"]
    result = invoke("forget", busy.name, "fail", "--redis-url", valkey_url)
    assert result.exit_code == 0, result.output
    assert result.output == (
        f"forgot 1 failure of fail in {busy.name}: its next failure starts the backoff over\n"
    )
    snap = busy.snapshot()
    assert (snap.failing, snap.failing_keys) == ((), 0)
    assert [d.key for d in snap.delayed] == ["fail"]  # still in its backoff: add hands it out


def test_forget_of_a_key_without_failures_says_so(busy: RedisWorkQueue, valkey_url: str) -> None:
    result = invoke("forget", busy.name, "nosuchkey", "--redis-url", valkey_url)
    assert result.exit_code == 0, result.output
    assert (
        result.output == f"nosuchkey has no failures recorded in {busy.name}: nothing to forget\n"
    )
    assert [f.key for f in busy.snapshot().failing] == ["fail"]  # the others are untouched


def test_delete_is_refused_while_a_key_is_held_and_asks_first(
    busy: RedisWorkQueue, valkey_url: str
) -> None:
    refused = invoke("delete", busy.name, "--redis-url", valkey_url, "--yes")
    assert refused.exit_code == 1
    assert "1 key(s) are held (by worker-1); not deleted (--force deletes it anyway)" in (
        refused.output
    )
    assert busy.exists()
    busy.done("held")
    no = invoke("delete", busy.name, "--redis-url", valkey_url, stdin="n\n")
    assert no.exit_code == 1
    assert no.output.endswith("[y/N]: keyqueue delete: error: not deleted\n")
    assert busy.exists()
    yes = invoke("delete", busy.name, "--redis-url", valkey_url, stdin="y\n")
    assert yes.exit_code == 0, yes.output
    assert "deleted queue" in yes.output
    assert not busy.exists()


def test_delete_force_removes_a_queue_whose_keys_are_held(
    busy: RedisWorkQueue, valkey_url: str
) -> None:
    result = invoke("delete", busy.name, "--redis-url", valkey_url, "--force", "--yes")
    assert result.exit_code == 0, result.output
    assert not busy.exists()


@pytest.mark.parametrize(
    "command",
    [
        ["inspect"],
        ["top", "--plain"],
        ["add", "k"],
        ["forget", "k"],
        ["delete", "--yes"],
        ["dead"],
        ["replay", "k"],
        ["replay", "--all"],
    ],
)
def test_a_queue_that_does_not_exist_is_a_one_line_error(
    valkey_url: str, name: str, command: list[str]
) -> None:
    verb, *rest = command
    result = invoke(verb, name, *rest, "--redis-url", valkey_url)
    assert result.exit_code == 1
    assert result.output == (
        f"keyqueue {verb}: error: no queue {name!r} at {valkey_url.removeprefix('redis://')} "
        "(a queue exists once a client has used it)\n"
    )


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize(
    "command",
    [
        ["inspect"],
        ["top", "--plain"],
        ["add", "k"],
        ["forget", "k"],
        ["delete", "--yes"],
        ["dead"],
        ["replay", "k"],
        ["replay", "--all"],
    ],
)
def test_an_unreachable_server_is_a_one_line_error_within_seconds(command: list[str]) -> None:
    verb, *rest = command
    url = f"redis://127.0.0.1:{_closed_port()}/0"
    started = time.monotonic()
    result = invoke(verb, "q", *rest, "--redis-url", url)
    assert time.monotonic() - started < 5
    assert result.exit_code == 1
    lines = result.output.splitlines()
    assert len(lines) == 1
    assert lines[0].startswith(f"keyqueue {verb}: error: cannot reach the server at 127.0.0.1:")


@pytest.mark.parametrize(
    "args",
    [
        ["inspect", "q"],  # no --redis-url
        ["inspect", "q", "--redis-url", "http://x"],
        ["inspect", "q", "--redis-url", "redis://127.0.0.1:1/0", "--limit", "-1"],
        ["top", "q", "--redis-url", "redis://127.0.0.1:1/0", "--interval", "0"],
        ["add", "q", "--redis-url", "redis://127.0.0.1:1/0"],  # no KEY
        ["add", "q", "k", "--redis-url", "redis://127.0.0.1:1/0", "--priority", "x"],
        ["delete", "q", "--redis-url", "redis://127.0.0.1:1/0", "--bogus"],
    ],
)
def test_usage_errors_exit_2_with_one_line(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2, result.output
    assert len(result.output.splitlines()) == 1
    assert result.output.startswith(f"keyqueue {args[0]}: error: ")


# Every command that takes --redis-url, as far as the URL (each parses it alike).
URL_COMMANDS = (
    ["inspect", "q"],
    ["top", "q", "--plain"],
    ["add", "q", "k"],
    ["forget", "q", "k"],
    ["delete", "q", "--yes"],
    ["dashboard", "q", "--no-open"],
    ["lab", "firehose", "--backend", "redis", "--duration", "1"],
    ["lab", "pipeline", "--replicas", "2"],
)


@pytest.mark.parametrize("command", URL_COMMANDS, ids=lambda c: " ".join(c[:2]))
@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("redis://127.0.0.1:1/abc", "the database 'abc' is not a number"),  # was: db 0, quietly
        ("redis://127.0.0.1:1?db=x", "the database 'x' is not a number"),
        ("http://127.0.0.1:1/0", "is not a redis://host:port/db, rediss://, unix://, redis+"),
        ("redis://127.0.0.1:99999/0", "Port out of range"),
        ("redis+sentinel://127.0.0.1:1", "no service name"),
        ("redis+sentinel://127.0.0.1:1/svc/x", "the database 'x' is not a number"),
        ("redis+sentinel://127.0.0.1:x/svc", "the port 'x' of '127.0.0.1:x' is not a number"),
        ("redis+cluster://127.0.0.1:1/2", "a Cluster has database 0 only"),
    ],
)
def test_every_command_reads_a_redis_url_with_one_parser(
    command: list[str], url: str, why: str
) -> None:
    result = invoke(*command, "--redis-url", url)
    assert result.exit_code == 2, result.output
    lines = result.output.splitlines()
    assert len(lines) == 1, result.output
    path = " ".join(command[:2] if command[0] == "lab" else command[:1])
    assert lines[0].startswith(f"keyqueue {path}: error: Invalid value for '--redis-url'")
    assert why in lines[0]


def test_delete_without_yes_and_nobody_to_answer_deletes_nothing(
    valkey_url: str, name: str
) -> None:
    with RedisWorkQueue(name, url=valkey_url) as q:
        q.add("k")
    done = subprocess.run(
        [sys.executable, "-c", FOREGROUND, "delete", name, "--redis-url", valkey_url],
        check=False,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=30,
        env={**os.environ},
    )
    assert done.returncode == 1
    assert done.stderr == (
        "keyqueue delete: error: no answer (stdin is closed): nothing deleted; "
        "--yes deletes without asking\n"
    )
    assert "Delete" in done.stdout  # the question was asked
    with RedisWorkQueue(name, url=valkey_url) as q:
        assert q.exists()


def test_top_plain_after_a_delete_and_re_create_prints_no_negative_rate(
    valkey_url: str, name: str
) -> None:
    """Before: ``adds/s=-496`` once the counters started again from 0. A counter
    that goes down is a reset: that interval has no rate (``-``), the next ones do."""
    q = RedisWorkQueue(name, url=valkey_url)
    q.add_many([f"k{i}" for i in range(500)])
    lines = []
    try:
        with running_top(valkey_url, name, "--interval", "0.2", seconds=60) as proc:
            assert proc.stdout is not None
            lines.append(first_line(proc, ""))
            q.add_many([f"more-{i}" for i in range(100)])
            lines += [proc.stdout.readline() for _ in range(2)]
            q.delete(force=True)
            q.add_many(["again-1", "again-2"])  # the same name, made again: counters from 0
            lines += [proc.stdout.readline() for _ in range(5)]
            q.add_many([f"again-more-{i}" for i in range(20)])
            lines += [proc.stdout.readline() for _ in range(3)]
            err = interrupt(proc)
    finally:
        q.close()
    assert proc.returncode == 130, err
    fields = [dict(pair.split("=", 1) for pair in line.split()[1:]) for line in lines]
    rates = [f[k] for f in fields for k in ("adds/s", "gets/s", "dones/s", "failures/s")]
    assert not [r for r in rates if r.startswith("-") and r != "-"], lines
    adds = [f["adds/s"] for f in fields]
    assert adds[0] == "-"  # no interval yet
    assert adds[1:].count("-") == 1, adds  # the reset's interval
    assert any(a not in ("-", "0") for a in adds[adds.index("-", 1) + 1 :]), adds


def test_retry_debt_on_a_real_server_reads_the_shared_bucket_and_the_longest_backoff(
    valkey_url: str, name: str
) -> None:
    """Failures outrun the server limiter's shared bucket (10 a second, 100 at
    most): 150 retries at once leave it about 50 tokens in debt, so the last
    retried key waits about 5 s, not its own 5 ms backoff. top reads the bucket
    and the last delayed key beside the snapshot (ops/probe.py), as the
    dashboard does."""
    with RedisWorkQueue(name, url=valkey_url) as q:
        for i in range(150):
            q.retry(f"k{i}")
        fields = top_line(valkey_url, name)
    # No worker runs, so the first tokens' keys may be past due too ("overdue").
    assert "retry-debt" in fields["health"].split(","), fields
    # The first 100 (and what the bucket refilled meanwhile) took a token each and
    # came due in 5 ms (a later retry's script released them); the rest wait for tokens.
    assert int(fields["depth"]) + int(fields["delayed"]) == 150
    assert 40 <= int(fields["delayed"]) <= 50, fields
    backoff = fields["longest_backoff"]  # top starts in about a second: less is left
    seconds = float(backoff[:-2]) / 1000 if backoff.endswith("ms") else float(backoff[:-1])
    assert 0.5 <= seconds <= 5.1, fields  # the bucket's wait: a key's own backoff is 5 ms
