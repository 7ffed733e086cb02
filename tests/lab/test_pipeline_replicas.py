"""``keyqueue lab pipeline --replicas N``: N controller processes on one Redis queue, one killed.

Runs the command briefly (a private etcd and a private Valkey, as a user's
first run) and checks that the summary's figures are real: every replica
reconciled, the killed replica held keys when it died and they are named,
they were reconciled again by the others within the lease plus a bound, and
every object reached its final version.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import redis
from click.testing import CliRunner, Result
from rich.console import Console

from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.lab.pipeline.render import failover_lines
from keyqueue.lab.pipeline.stages import STAGES

LEASE = 1.0
RECOVERY_BOUND = LEASE + 1.5
"""As tests/lab/test_controller_e2e.py: the lease runs out at most LEASE after the
kill, the others' claims reap it (an idle getter within one more lease), then
one reconcile; the rest is margin for a shared machine."""


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, ["lab", "pipeline", *args], prog_name="keyqueue")


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def test_replicas_share_the_load_and_the_killed_replicas_keys_fail_over() -> None:
    result = invoke(
        *("--replicas", "3", "--kill-replica-at", "1", "--lease", str(LEASE)),
        *("--requests", "600", "--objects", "60", "--concurrency", "4", "--json"),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verified"] is True
    assert data["triggers"] == 600
    for name in (s.name for s in STAGES):
        assert data["stages"][name]["count"] > 0, name
    replicas = data["replicas"]
    assert replicas["replicas"] == 3
    assert replicas["redis"].startswith("redis://127.0.0.1:")
    # Every replica reconciled, the killed one before it died.
    assert sorted(replicas["reconciles"]) == ["r0", "r1", "r2"]
    assert all(count > 0 for count in replicas["reconciles"].values())
    # The kill happened while r0 held keys, and they are named.
    (fault,) = replicas["faults"]
    assert (fault["kind"], fault["replica"]) == ("kill", "r0")
    assert fault["at"] >= 1.0
    assert fault["held"], "the killed replica held no key"
    assert all(re.fullmatch(r"default/obj-\d+", key) for key in fault["held"])
    shown = replicas["failover"]
    assert shown["held_keys"] == len(fault["held"])
    assert shown["unrecovered"] == []
    assert shown["unreconciled"] == []
    assert 0 < shown["recovery"] <= LEASE + RECOVERY_BOUND
    assert shown["during_writes"] > 0
    assert shown["held_writes"] + shown["other_writes"] == 600
    # Each replica was its own process, r0 killed, and none is left.
    processes = data["processes"]
    pids = {processes[f"replica r{i}"]["pid"] for i in range(3)}
    assert len(pids) == 3
    assert processes["replica r0"]["killed_at"] >= 1.0
    assert processes["valkey"]["pid"] is not None
    assert not any(_alive(pid) for pid in pids | {processes["valkey"]["pid"]})
    # The summary says it in words, with the same figures.
    console = Console(width=300, no_color=True, record=True)
    for line in failover_lines(replicas):
        console.print(line)
    text = console.export_text()
    held = len(fault["held"])
    assert f"replica r0 killed at {fault['at']:.1f}s holding {held} key" in text, text
    assert "the writes it held up" in text, text
    assert f"meanwhile every other write ({shown['during_writes']:,})" in text, text


@pytest.mark.parametrize(
    ("args", "error"),
    [
        (["--kill-replica-at", "1"], "need --replicas >= 1"),
        (["--replicas", "1", "--kill-replica-at", "1"], "needs --replicas >= 2"),
        (["--replicas", "2", "--no-load"], "needs the load generator"),
        (["--redis-url", "http://127.0.0.1:6379"], "is not a redis://"),
    ],
)
def test_replica_options_that_cannot_work_together_are_one_line_errors(
    args: list[str], error: str
) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1, result.output
    assert error in result.output


def test_replicas_use_the_queue_server_redis_url_names(valkey_url: str) -> None:
    client = redis.Redis.from_url(valkey_url)
    before = {k for k in client.scan_iter("*pipeline-*")}
    result = invoke(
        *("--replicas", "2", "--redis-url", valkey_url),
        *("--requests", "60", "--objects", "10", "--concurrency", "2", "--json"),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verified"] is True
    assert data["replicas"]["redis"] == valkey_url
    assert data["processes"]["valkey"] == {"pid": None, "holds": ["the queue"], "url": valkey_url}
    assert data["replicas"]["faults"] == []
    assert sum(data["replicas"]["reconciles"].values()) > 0
    # The queue lived on that server: its keys are there now.
    after = {k for k in client.scan_iter("*pipeline-*")} - before
    client.close()
    assert after, "no key of the run's queue on --redis-url's server"
