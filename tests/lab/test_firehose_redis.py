"""``keyqueue lab firehose --backend redis``: the firehose in several processes on one queue.

Short runs on a small rate, on the session's valkey-server (``--redis-url``)
or on the private server the command starts itself. As in lab/test_commands.py, only
bookkeeping is asserted, never speed. The Ctrl-C test runs the real command
in a process group of its own and interrupts the whole group, as a terminal
does.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import redis
from click.testing import CliRunner, Result

from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.lab.firehose import redis as firehose_redis
from keyqueue.lab.firehose.common import FirehoseConfig
from keyqueue.lab.firehose.redis import child_share
from keyqueue.lab.firehose.run import run_firehose
from keyqueue.testing import free_port
from tests.support.foreground import FOREGROUND, first_line

SHORT = [
    "--backend", "redis",
    "--processes", "2",
    "--rate", "2000",
    "--keys", "5",
    "--duration", "0.5",
    "--workers", "3",
    "--reconcile-ms", "1",
    "--failure-rate", "0.1",
    "--seed", "7",
]  # fmt: skip


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, list(args), prog_name="keyqueue")


def lab_keys(url: str) -> list[bytes]:
    """Keys any firehose run left on the server."""
    client = redis.Redis.from_url(url)
    try:
        return list(client.scan_iter(match="keyqueue:{lab-firehose-*"))
    finally:
        client.close()


def check_adds_up(data: dict[str, Any]) -> None:
    s = data["stats"]
    assert data["events"] > 0
    assert data["events"] <= s["adds"] <= data["events"] + s["rate_limited"]
    assert s["adds"] == s["enqueued"] + s["coalesced"] + s["marked_while_processing"]
    assert (s["depth"], s["processing"]) == (0, 0)  # drained
    # Each child's own GET and DONE events, added up: every hand-out of the queue.
    assert data["queue_wait"]["count"] == s["gets"]
    assert data["reconcile"]["count"] == s["dones"] == s["gets"]


def test_redis_firehose_in_two_processes_adds_up_and_leaves_no_keys(valkey_url: str) -> None:
    result = invoke("lab", "firehose", *SHORT, "--redis-url", valkey_url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert (data["config"]["backend"], data["config"]["processes"]) == ("redis", 2)
    check_adds_up(data)
    ticks = data["ticks"]
    assert ticks
    assert ticks[-1]["events"] == data["events"]
    for field in ("events", "adds", "processed"):
        totals = [tick[field] for tick in ticks]
        assert totals == sorted(totals), f"{field} went down between ticks"
    for tick in ticks:
        assert tick["adds"] >= tick["events"]  # the children's counts come first
    assert lab_keys(valkey_url) == []


def test_redis_firehose_plain_summary_names_the_backend_and_processes(valkey_url: str) -> None:
    result = invoke("lab", "firehose", *SHORT, "--redis-url", valkey_url, "--plain")
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0].endswith("backend redis (one queue shared by 2 processes)")
    assert "3 workers in 2 processes" in lines[0]
    assert any(line.startswith("[STATS] ") for line in lines)
    summary = result.output.split("Summary")[1]
    assert "backend redis: 2 processes sharing one queue" in summary
    assert "reconciles by 3 workers in 2 processes" in summary
    assert "absorbed" in summary


@contextmanager
def recording_servers(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The URLs of the private servers the firehose starts."""
    urls: list[str] = []
    real = firehose_redis.local_valkey

    @contextmanager
    def recorded() -> Iterator[str]:
        with real() as url:
            urls.append(url)
            yield url

    monkeypatch.setattr(firehose_redis, "local_valkey", recorded)
    yield urls


def refuses(url: str) -> bool:
    client = redis.Redis.from_url(url, socket_connect_timeout=1)
    try:
        client.ping()
    except redis.exceptions.ConnectionError:
        return True
    finally:
        client.close()
    return False


def test_redis_firehose_without_a_url_runs_a_private_server_and_stops_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with recording_servers(monkeypatch) as urls:
        config = FirehoseConfig(
            rate=1000, keys=3, duration=0.3, workers=2, reconcile=0.0, seed=1, backend="redis",
            processes=2,
        )  # fmt: skip
        result = run_firehose(config)
    assert len(urls) == 1
    assert refuses(urls[0])
    assert result.stats.dones == result.stats.gets > 0
    assert result.events <= result.stats.adds


def test_redis_firehose_stops_its_server_when_the_run_fails(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def broken(*args: Any) -> None:
        raise RuntimeError("printing failed")

    with recording_servers(monkeypatch) as urls:
        config = FirehoseConfig(
            rate=1000, keys=3, duration=5, workers=1, reconcile=0.0, tick=0.1, backend="redis",
            processes=2,
        )  # fmt: skip
        with pytest.raises(RuntimeError, match="printing failed"):
            run_firehose(config, on_tick=broken)
    assert refuses(urls[0])


def test_processes_or_url_without_the_redis_backend_is_a_usage_error() -> None:
    for option in (["--processes", "2"], ["--redis-url", "redis://127.0.0.1:6379/0"]):
        result = invoke("lab", "firehose", *option)
        assert result.exit_code == 2
        assert "needs --backend redis" in result.output
        assert len(result.output.strip().splitlines()) == 1


def test_redis_firehose_with_an_unreachable_server_is_one_line() -> None:
    port = free_port()  # free a moment ago: nothing listens there
    result = invoke("lab", "firehose", *SHORT, "--redis-url", f"redis://127.0.0.1:{port}/0")
    assert result.exit_code == 1
    assert "cannot reach the server at 127.0.0.1:" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize(("total", "processes"), [(4, 2), (3, 2), (1, 3), (7, 4)])
def test_workers_are_shared_out_as_evenly_as_can_be(total: int, processes: int) -> None:
    shares = [child_share(total, processes, i) for i in range(processes)]
    assert sum(shares) == total
    assert max(shares) - min(shares) <= 1


# -- Ctrl-C ------------------------------------------------------------------------------


def descendants(pid: int) -> set[int]:
    """Every process below ``pid`` (Linux /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parents[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    found: set[int] = set()
    frontier = {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="process groups and /proc")
def test_ctrl_c_stops_the_children_and_the_private_server() -> None:
    command = ["lab", "firehose", "--backend", "redis", "--processes", "2", "--plain"]
    command += ["--duration", "60", "--rate", "1000", "--keys", "5"]
    proc = subprocess.Popen(
        [sys.executable, "-c", FOREGROUND, *command],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
        start_new_session=True,  # a process group of its own, as a terminal's job
    )
    watchdog = threading.Timer(60, lambda: os.killpg(proc.pid, signal.SIGKILL))
    watchdog.start()
    try:
        first_line(proc, "[STATS]")
        below = descendants(proc.pid)
        assert len(below) >= 3  # two children and the server, at least
        os.killpg(proc.pid, signal.SIGINT)  # the whole group, as Ctrl-C in a terminal
        out, err = proc.communicate(timeout=45)
    finally:
        watchdog.cancel()
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    assert proc.returncode == 130, err
    assert "Summary (interrupted)" in out
    assert "backend redis: 2 processes" in out
    assert "Traceback" not in err
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in below) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [pid for pid in below if alive(pid)] == []


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:6379/0", "garbage", "redis://127.0.0.1:99999/0", "redis://h/x"]
)
def test_a_redis_url_that_is_not_one_is_a_one_line_usage_error(url: str) -> None:
    result = invoke("lab", "firehose", *SHORT, "--redis-url", url)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keyqueue lab firehose: error: Invalid value for '--redis-url'")
    assert "Traceback" not in result.stderr


def test_a_server_error_says_which_server(valkey_url: str) -> None:
    url = valkey_url.rsplit("/", 1)[0] + "/99999"  # a database the server does not have
    result = invoke("lab", "firehose", *SHORT, "--redis-url", url)
    assert result.exit_code == 1, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("keyqueue lab firehose: error: ")
    assert url in lines[0]
    assert "DB index is out of range" in lines[0]


def test_the_redis_firehose_says_up_front_how_long_the_drain_will_take(valkey_url: str) -> None:
    result = invoke(
        "lab", "firehose", "--backend", "redis", "--redis-url", valkey_url, "--plain",
        "--rate", "1000", "--duration", "1", "--keys", "1000000", "--workers", "1",
        "--failure-rate", "0",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    (line,) = [line for line in result.output.splitlines() if "the drain will take" in line]
    assert line.startswith("[DRAIN] t=1.")
    assert "drained in" in result.output
