"""The pipeline lab on a real etcd: the launcher, the API server against the official
``kubernetes`` client (no special casing), and ``keyqueue lab pipeline`` end to end.

One etcd and one API server serve the whole session (see ``etcd_server``); each
test works in its own namespace or on its own object names.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from keyqueue.cli import keyqueue as keyqueue_cli
from keyqueue.lab.pipeline.etcd import Etcd, EtcdError
from keyqueue.lab.pipeline.run import PipelineConfig, run_pipeline
from keyqueue.lab.pipeline.stages import STAGES, Percentiles, Timings, format_duration, percentiles
from keyqueue.testing import local_etcd
from tests.support.etcd_server import ServerThread, api_server, etcd_url, namespace

__all__ = ["api_server", "etcd_url", "namespace"]  # fixtures, imported for pytest

WATCH_SECONDS = 2  # server-side timeout: a watch that misses its event ends, it never hangs


@pytest.fixture
def v1(api_server: ServerThread) -> Iterator[k8s.CoreV1Api]:
    config = k8s.Configuration()
    config.host = api_server.url
    with k8s.ApiClient(config) as api_client:
        yield k8s.CoreV1Api(api_client)


def configmap(name: str, **data: str) -> k8s.V1ConfigMap:
    return k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=name, labels={"app": "t"}), data=data)


def post(url: str, body: bytes = b"", content_type: str | None = None) -> tuple[int, Any]:
    request = urllib.request.Request(url, data=body, method="POST")
    if content_type:
        request.add_header("Content-Type", content_type)
    return _send(request)


def _send(request: urllib.request.Request) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, json.load(error)


# -- the launcher ----------------------------------------------------------------------


def _alive(pid: int) -> bool:
    """The process exists and is not a zombie waiting to be reaped."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rpartition(")")[2].split()[0] != "Z"


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


def _roles(pid: int) -> dict[str, int]:
    """The pipeline's processes under ``pid``, by what they run: "etcd", and the
    children ``keyqueue.lab.pipeline.processes`` runs ("apiserver", "load")."""
    roles = {}
    for child in _children(pid):
        try:
            argv = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")
        except FileNotFoundError:
            continue
        if Path(argv[0].decode()).name == "etcd":
            roles["etcd"] = child
        elif b"keyqueue.lab.pipeline.processes" in argv:
            roles[argv[argv.index(b"keyqueue.lab.pipeline.processes") + 1].decode()] = child
    return roles


def _listener(port: int) -> set[int]:
    """The pids holding the socket that listens on 127.0.0.1:``port`` (Linux /proc)."""
    inodes = set()
    for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].split(":")[1], 16) == port:  # LISTEN
            inodes.add(f"socket:[{fields[9]}]")
    pids = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            fds = list((proc / "fd").iterdir())
        except (PermissionError, FileNotFoundError):
            continue
        for fd in fds:
            try:
                if os.readlink(fd) in inodes:
                    pids.add(int(proc.name))
            except OSError:
                continue
    return pids


def test_local_etcd_is_stopped_and_its_data_removed_when_ctrl_c_leaves_the_block() -> None:
    before = set(_children(os.getpid()))
    with pytest.raises(KeyboardInterrupt), local_etcd() as url:  # noqa: PT012
        with urllib.request.urlopen(f"{url}/health", timeout=5) as response:
            assert json.load(response)["health"] == "true"
        (etcd_pid,) = set(_children(os.getpid())) - before
        data_dir = Path(f"/proc/{etcd_pid}/cmdline").read_bytes().split(b"--data-dir=")[1]
        data_dir = data_dir.split(b"\0")[0]
        assert Path(data_dir.decode()).is_dir()
        raise KeyboardInterrupt
    assert not _alive(etcd_pid)
    assert not Path(data_dir.decode()).exists()


def test_local_etcd_dies_with_its_owner_even_when_the_owner_is_killed(tmp_path: Path) -> None:
    # The killed owner cannot remove etcd's temp dir: keep it under tmp_path.
    owner = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import os, time\n"
            "from keyqueue.testing import local_etcd\n"
            "with local_etcd():\n"
            "    me = os.getpid()\n"
            "    print(open(f'/proc/{me}/task/{me}/children').read(), flush=True)\n"
            "    time.sleep(60)\n",
        ],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "TMPDIR": str(tmp_path)},
    )
    try:
        assert owner.stdout is not None
        (etcd_pid,) = map(int, owner.stdout.readline().split())
        assert _alive(etcd_pid)
    finally:
        owner.kill()  # SIGKILL: no cleanup runs in the owner
        owner.wait()
        assert owner.stdout is not None
        owner.stdout.close()
    deadline = time.monotonic() + 10
    while _alive(etcd_pid):
        assert time.monotonic() < deadline, "etcd outlived its killed owner"
        time.sleep(0.01)


def test_local_etcd_reports_a_binary_that_cannot_start(tmp_path: Path) -> None:
    fake = tmp_path / "etcd"
    fake.write_text("#!/bin/sh\necho 'etcd: bad flag' >&2\nexit 3\n")
    fake.chmod(0o755)
    with (
        pytest.raises(EtcdError, match="exited at start-up 2 times"),
        local_etcd(binary=str(fake), attempts=2),
    ):
        pass  # pragma: no cover


# -- the API server against the official client ----------------------------------------


def test_official_client_creates_reads_patches_replaces_lists_and_deletes(
    v1: k8s.CoreV1Api, namespace: str
) -> None:
    created = v1.create_namespaced_config_map(namespace, configmap("app", a="1"))
    assert created.metadata.namespace == namespace
    assert created.metadata.uid
    assert created.metadata.creation_timestamp
    rv = int(created.metadata.resource_version)

    read = v1.read_namespaced_config_map("app", namespace)
    assert (read.data, read.metadata.resource_version) == ({"a": "1"}, str(rv))

    # A dict body is sent as a strategic merge patch: data merges, null deletes.
    patched = v1.patch_namespaced_config_map("app", namespace, {"data": {"b": "2"}})
    assert patched.data == {"a": "1", "b": "2"}
    assert int(patched.metadata.resource_version) > rv
    merged = v1.patch_namespaced_config_map(
        "app",
        namespace,
        {"data": {"a": None, "c": "3"}},
        _content_type="application/merge-patch+json",
    )
    assert merged.data == {"b": "2", "c": "3"}
    assert merged.metadata.labels == {"app": "t"}
    assert merged.metadata.uid == created.metadata.uid

    merged.data = {"only": "this"}
    replaced = v1.replace_namespaced_config_map("app", namespace, merged)
    assert replaced.data == {"only": "this"}
    assert replaced.metadata.creation_timestamp == created.metadata.creation_timestamp

    v1.create_namespaced_config_map(namespace, configmap("other"))
    listed = v1.list_namespaced_config_map(namespace)
    assert [item.metadata.name for item in listed.items] == ["app", "other"]
    assert int(listed.metadata.resource_version) >= int(replaced.metadata.resource_version)

    status = v1.delete_namespaced_config_map("app", namespace)
    assert status["status"] == "Success"
    with pytest.raises(k8s.ApiException) as gone:
        v1.read_namespaced_config_map("app", namespace)
    assert gone.value.status == 404
    assert [i.metadata.name for i in v1.list_namespaced_config_map(namespace).items] == ["other"]


def test_official_client_gets_kubernetes_errors_for_conflicts_and_missing_objects(
    v1: k8s.CoreV1Api, namespace: str
) -> None:
    stale = v1.create_namespaced_config_map(namespace, configmap("c", v="1"))
    with pytest.raises(k8s.ApiException) as exists:
        v1.create_namespaced_config_map(namespace, configmap("c"))
    assert (exists.value.status, json.loads(exists.value.body)["reason"]) == (409, "AlreadyExists")

    v1.patch_namespaced_config_map("c", namespace, {"data": {"v": "2"}})
    stale.data = {"v": "lost update"}
    with pytest.raises(k8s.ApiException) as conflict:
        v1.replace_namespaced_config_map("c", namespace, stale)
    assert (conflict.value.status, json.loads(conflict.value.body)["reason"]) == (409, "Conflict")
    assert v1.read_namespaced_config_map("c", namespace).data == {"v": "2"}

    for call in (
        lambda: v1.read_namespaced_config_map("missing", namespace),
        lambda: v1.patch_namespaced_config_map("missing", namespace, {"data": {}}),
        lambda: v1.delete_namespaced_config_map("missing", namespace),
    ):
        with pytest.raises(k8s.ApiException) as missing:
            call()
        assert missing.value.status == 404
        assert json.loads(missing.value.body)["reason"] == "NotFound"


def test_official_client_watches_added_modified_deleted_from_a_resource_version(
    v1: k8s.CoreV1Api, namespace: str
) -> None:
    start = v1.list_namespaced_config_map(namespace).metadata.resource_version
    created = v1.create_namespaced_config_map(namespace, configmap("w", n="1"))
    patched = v1.patch_namespaced_config_map("w", namespace, {"data": {"n": "2"}})
    v1.delete_namespaced_config_map("w", namespace)

    seen = []
    for event in k8s_watch.Watch().stream(
        v1.list_namespaced_config_map,
        namespace,
        resource_version=start,
        timeout_seconds=WATCH_SECONDS,
    ):
        obj = event["object"]
        seen.append((event["type"], obj.metadata.name, obj.data, obj.metadata.resource_version))
        if event["type"] == "DELETED":
            break
    rv_created, rv_patched = created.metadata.resource_version, patched.metadata.resource_version
    assert seen[:2] == [
        ("ADDED", "w", {"n": "1"}, rv_created),
        ("MODIFIED", "w", {"n": "2"}, rv_patched),
    ]
    assert seen[2][:3] == ("DELETED", "w", {"n": "2"})
    assert int(seen[2][3]) > int(rv_patched)


def test_official_client_watch_from_a_compacted_revision_raises_410(
    v1: k8s.CoreV1Api, api_server: ServerThread, namespace: str
) -> None:
    old = v1.create_namespaced_config_map(namespace, configmap("old")).metadata.resource_version
    v1.create_namespaced_config_map(namespace, configmap("mid"))
    latest = v1.create_namespaced_config_map(namespace, configmap("new")).metadata.resource_version
    # A watch from `old` starts at old + 1 (mid's revision): compacted away.
    api_server.call(api_server.etcd.compact(int(latest)))
    with pytest.raises(k8s.ApiException) as expired:
        for _ in k8s_watch.Watch().stream(
            v1.list_namespaced_config_map,
            namespace,
            resource_version=old,
            timeout_seconds=WATCH_SECONDS,
        ):
            pass  # pragma: no cover - the first event is the error
    assert expired.value.status == 410
    assert "Expired" in expired.value.reason


def test_unsupported_patch_types_and_selectors_are_refused_not_ignored(
    api_server: ServerThread, v1: k8s.CoreV1Api, namespace: str
) -> None:
    v1.create_namespaced_config_map(namespace, configmap("p", a="1"))
    url = f"{api_server.url}/api/v1/namespaces/{namespace}/configmaps"
    request = urllib.request.Request(
        f"{url}/p", data=b'[{"op": "remove", "path": "/data/a"}]', method="PATCH"
    )
    request.add_header("Content-Type", "application/json-patch+json")
    assert _send(request)[0] == 415
    # Equality-based selectors are served; set-based ones are refused.
    status, body = _send(urllib.request.Request(f"{url}?labelSelector=app%20in%20%28t%29"))
    assert (status, body["reason"]) == (400, "BadRequest")
    status, body = _send(urllib.request.Request(f"{url}?fieldSelector=data.a%3D1"))
    assert (status, body["reason"], body["message"]) == (
        400,
        "BadRequest",
        "field label not supported: data.a",
    )
    assert v1.read_namespaced_config_map("p", namespace).data == {"a": "1"}


def test_trigger_creates_the_object_then_bumps_its_counter(
    api_server: ServerThread, v1: k8s.CoreV1Api
) -> None:
    name = f"trigger-{uuid.uuid4().hex[:8]}"
    status, first = post(f"{api_server.url}/trigger/{name}")
    assert status == 200
    assert first["action"] == "created"
    assert first["took_ms"] > 0
    status, second = post(f"{api_server.url}/trigger/{name}")
    assert (status, second["action"]) == (200, "updated")
    assert second["rv"] > first["rv"]
    read = v1.read_namespaced_config_map(name, "default")
    assert (read.data, read.metadata.resource_version) == ({"counter": "2"}, str(second["rv"]))
    assert post(f"{api_server.url}/trigger/Not_A_Name")[0] == 422


async def test_etcd_client_watch_reports_compaction(api_server: ServerThread) -> None:
    prefix = f"/t/{uuid.uuid4().hex}/".encode()
    async with Etcd(api_server.etcd_url) as etcd:
        first, _ = await etcd.create(prefix + b"a", b"1")
        assert first is not None
        second, _ = await etcd.update(prefix + b"a", b"2", first)
        assert second is not None
        await etcd.compact(second)
        with pytest.raises(EtcdError, match=f"revision {first} is compacted"):
            async for _ in etcd.watch(prefix, first):
                pass  # pragma: no cover
        async for batch in etcd.watch(prefix, second):
            assert [(e.type, e.kv.value, e.kv.mod_revision) for e in batch] == [
                ("PUT", b"2", second)
            ]
            break


# -- the stage timings -------------------------------------------------------------------


def test_timings_pair_each_trigger_with_the_first_reconcile_that_saw_its_version() -> None:
    timings = Timings()
    timings.trigger_answered("a", revision=5, sent=1.0, answered=1.002)
    timings.trigger_answered("a", revision=7, sent=1.001, answered=1.003)
    timings.trigger_answered("b", revision=6, sent=1.0, answered=1.002)  # never reconciled
    timings.reconciled("default/a", revision=4, finished=1.004)  # too old for either
    timings.reconciled("default/a", revision=5, finished=1.010)  # covers rv 5 only
    timings.reconciled("default/a", revision=7, finished=1.020)  # covers rv 7
    assert timings.end_to_end() == pytest.approx([0.010, 0.019])
    summary = timings.summary()
    assert summary["end_to_end"].count == 2
    assert summary["trigger"].p50 == pytest.approx(0.002)


def test_write_to_watch_event_is_timed_from_the_write_sent_never_clamped() -> None:
    # Timed from the write's answer, the first sample was -1 ms, shown as 0
    # (a "p50 0µs" that measured nothing); from the write sent it is 100 ms.
    timings = Timings()
    timings.event_at[10] = 2.0  # the event reached the informer before the answer
    timings.on_write(10, started=1.9, finished=2.001)
    timings.event_at[11] = 3.0005
    timings.on_write(11, started=2.999, finished=3.0)
    timings.event_at[12] = 4.0  # a write the API server did not make: not paired
    assert sorted(timings.write_to_event()) == pytest.approx([0.0015, 0.1])
    summary = timings.summary()["write_to_event"]
    assert (summary.count, summary.p50) == (2, pytest.approx(0.0015))
    stage = next(s for s in STAGES if s.name == "write_to_event")
    assert "sent" in stage.what
    assert percentiles([3.0, 1.0, 2.0]) == Percentiles(3, 2.0, 3.0, 3.0)
    assert format_duration(63e-6) == "63µs"
    assert format_duration(0.002209) == "2.209ms"


# -- keyqueue lab pipeline ---------------------------------------------------------------

SMALL = ["--requests", "40", "--concurrency", "5", "--objects", "6", "--reconcile-ms", "1"]


def invoke(*args: str) -> Result:
    return CliRunner().invoke(keyqueue_cli, ["lab", "pipeline", *args], prog_name="keyqueue")


def test_pipeline_reconciles_every_triggered_object_at_its_final_version(etcd_url: str) -> None:
    lines: list[tuple[str, str]] = []
    config = PipelineConfig(
        requests=40, concurrency=5, objects=6, reconcile=0.001, workers=3, etcd=etcd_url
    )
    result = run_pipeline(config, on_line=lambda tag, text: lines.append((tag, text)))
    assert (result.triggers, result.failed, result.interrupted) == (40, 0, False)
    assert 1 <= result.objects <= 6
    assert result.stale == ()
    assert result.verified
    assert result.watch_events == 40
    assert result.stats.adds >= 40
    assert result.stats.gets == result.stats.dones
    for stage in result.stages:
        assert stage.latency.count > 0, stage.name
        assert stage.latency.p50 is not None
    assert result.stage("trigger").latency.count == 40
    assert result.stage("end_to_end").latency.count == 40
    # The trace follows obj-0 and obj-1 only, each line in the seed's shape.
    assert {tag for tag, _ in lines} >= {"TRIGGER", "ENQUEUE", "WORKER"}
    keys = {re.search(r"(?:key=default/|/trigger/)(\S+)", text) for tag, text in lines}
    assert {m.group(1) for m in keys if m} <= {"obj-0", "obj-1"}
    trigger = next(text for tag, text in lines if tag == "TRIGGER")
    assert re.fullmatch(
        r"\[TRIGGER\] POST /trigger/obj-[01] action=(created|updated) rv=\d+ took=[\d.]+(µs|ms)",
        trigger,
    )


STATS = (
    r"\[STATS\] t=\d+\.\ds (final )?triggers=(?P<triggers>\d+) watch-events=\d+ adds=\d+ "
    r"coalesced=\d+ marked=\d+ reconciles=\d+ depth=\d+ absorbed=\d+\.\d% \| "
    r"/trigger reqs=(?P<reqs>\d+) p50=(?P<p50>\S+) p95=\S+ p99=\S+"
)


def test_a_run_shorter_than_a_tick_ends_with_a_final_stats_line(etcd_url: str) -> None:
    lines: list[tuple[str, str]] = []
    config = PipelineConfig(
        requests=3, concurrency=1, objects=2, reconcile=0, workers=1, etcd=etcd_url, tick=60.0
    )
    result = run_pipeline(config, on_line=lambda tag, text: lines.append((tag, text)))
    stats = [text for tag, text in lines if tag == "STATS"]
    assert len(stats) == 1, lines  # no tick in this run: only the closing line
    assert lines[-1] == ("STATS", stats[0])
    final = re.fullmatch(STATS, stats[0])
    assert final is not None, stats[0]
    assert " final " in stats[0]
    assert (final["triggers"], final["reqs"]) == ("3", "3")  # the whole run's percentiles
    assert final["p50"] != "-"
    assert result.ticks == (stats[0],)
    assert f"t={result.elapsed:.1f}s" in stats[0]


def test_stats_lines_come_every_tick_and_the_last_one_covers_the_run(etcd_url: str) -> None:
    lines: list[str] = []
    config = PipelineConfig(
        requests=40, concurrency=5, objects=6, reconcile=0.001, workers=3, etcd=etcd_url,
        tick=0.001,
    )  # fmt: skip
    run_pipeline(config, on_line=lambda tag, text: lines.append(text) if tag == "STATS" else None)
    assert len(lines) >= 2, lines
    ticks = [re.fullmatch(STATS, line) for line in lines]
    assert all(ticks), lines
    assert [" final " in line for line in lines] == [False] * (len(lines) - 1) + [True]
    # A tick's percentiles cover the triggers since the previous tick; the final line, all.
    assert sum(int(t["reqs"]) for t in ticks[:-1] if t) <= 40
    assert ticks[-1] is not None
    assert ticks[-1]["reqs"] == "40"


def test_pipeline_command_prints_the_stage_table_and_the_point(etcd_url: str) -> None:
    result = invoke(*SMALL, "--etcd", etcd_url, "--plain")
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Where the milliseconds live" in out, out
    for stage in STAGES:
        assert re.search(rf"^ ?{re.escape(stage.label)}\s+[\d.]+(µs|ms|s)\s", out, re.M), out
    assert re.search(r"reconciled at its\s+final version", out), out
    assert "dominates" in out, out
    assert "The queue itself costs microseconds" in out, out
    assert "The queue coalesced" in out, out
    layout = r"Processes: controller pid \d+ \(informer, queue, workers\), API server pid \d+, "
    layout += r"load generator pid \d+, etcd http://\S+; every time is time\.monotonic\(\)"
    assert re.search(layout, out), out
    final = re.search(r"^\[STATS\] t=\S+ final triggers=40 .* /trigger reqs=40 ", out, re.M)
    assert final is not None, out
    assert final.start() < out.index("Summary"), out


def test_pipeline_command_json_is_one_document(etcd_url: str) -> None:
    result = invoke(*SMALL, "--etcd", etcd_url, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["verified"] is True
    assert data["triggers"] == 40
    assert data["stages"]["add_to_get"]["count"] > 0
    assert set(data["stages"]) == {s.name for s in STAGES}


def test_pipeline_json_has_every_stage_the_concurrency_and_the_process_layout(
    etcd_url: str,
) -> None:
    result = invoke(*SMALL, "--etcd", etcd_url, "--json", "--concurrency", "3")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["concurrency"] == 3
    for name, stage in data["stages"].items():
        assert set(stage) >= {"p50", "p95", "p99", "count"}, name
        assert stage["p50"] <= stage["p95"] <= stage["p99"], name
    processes = data["processes"]
    assert set(processes) == {"controller", "apiserver", "load", "etcd"}
    assert processes["controller"] == {
        "pid": os.getpid(),
        "holds": ["informer", "queue", "workers"],
    }
    assert processes["apiserver"]["holds"] == ["API server"]
    assert processes["load"]["holds"] == ["load generator"]
    assert processes["etcd"]["pid"] is None  # --etcd: not this run's
    pids = [processes[role]["pid"] for role in ("controller", "apiserver", "load")]
    assert len(set(pids)) == 3
    assert not any(_alive(pid) for pid in pids[1:])  # the children are gone
    assert "CLOCK_MONOTONIC" in data["clock"]


def test_each_part_runs_in_the_process_the_layout_names(etcd_url: str) -> None:
    seen: list[tuple[dict[str, int], set[int], set[int]]] = []

    def on_url(url: str, etcd: str, existing: int) -> None:  # called while the run is up
        api_port = int(url.rpartition(":")[2])
        etcd_port = int(etcd.rpartition(":")[2])
        seen.append((_roles(os.getpid()), _listener(api_port), _listener(etcd_port)))

    config = PipelineConfig(requests=5, concurrency=2, objects=2, reconcile=0, etcd=etcd_url)
    result = run_pipeline(config, on_url=on_url)
    ((roles, api_holders, etcd_holders),) = seen
    assert set(roles) >= {"apiserver", "load"}  # (etcd, if any: the fixture's, in this process)
    assert api_holders == {roles["apiserver"]}  # the API server listens there, only there
    assert len(etcd_holders) == 1
    assert not etcd_holders & {roles["apiserver"], roles["load"], os.getpid()}
    assert result.processes["apiserver"]["pid"] == roles["apiserver"]
    assert result.processes["load"]["pid"] == roles["load"]
    assert result.verified
    assert not _alive(roles["apiserver"])
    assert not _alive(roles["load"])


@pytest.mark.parametrize(
    "args",
    [
        ["--reconcile-ms", "nan"],
        ["--reconcile-ms", "inf"],
        ["--requests", "0"],
        ["--concurrency", "-1"],
        ["--etcd", "127.0.0.1:2379"],
        ["--port", "70000"],
    ],
)
def test_pipeline_bad_options_are_one_line_errors(args: list[str]) -> None:
    result = invoke(*args)
    assert result.exit_code == 2
    assert len(result.output.strip().splitlines()) == 1
    assert "error: Invalid value" in result.output


# A shell without job control starts `cmd &` with SIGINT ignored, and exec keeps it
# ignored: a script's background job, or a test suite run in the background (where
# this test waited its 30 s for an exit that never came, load or no load).
_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@pytest.mark.parametrize("started", ["as-is", "sigint-ignored"])
def test_pipeline_without_load_serves_until_ctrl_c_and_leaves_no_etcd_behind(started: str) -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    python = [sys.executable]
    if started == "sigint-ignored":
        python += ["-c", _SIGINT_IGNORED]
        shown = "import signal; print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN)"
        probe = subprocess.run([*python, "-c", shown], check=True, capture_output=True, text=True)
        assert probe.stdout == "True\n"  # the child below starts as such a job does
    child = subprocess.Popen(
        [*python, "-m", "keyqueue", "lab", "pipeline", "--no-load", "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert child.stdout is not None
        lines = _read_until(child, "serving http://")
        url = re.search(r"serving (http://127\.0\.0\.1:\d+)", lines[-1])
        assert url is not None, lines
        roles = _roles(child.pid)
        assert set(roles) == {"etcd", "apiserver"}, roles  # no load generator: no "load"
        status, body = post(f"{url.group(1)}/trigger/obj-7")
        assert (status, body["action"]) == (200, "created")
        lines += _read_until(child, "Done seq=")
        child.send_signal(signal.SIGINT)
        rest, _ = child.communicate(timeout=30)
    finally:
        if child.poll() is None:  # pragma: no cover - only when an assert above failed
            child.kill()
            child.wait()
    out = "\n".join([*lines, rest])
    assert child.returncode == 130, out
    assert not any(_alive(pid) for pid in roles.values()), roles
    assert f"[TRIGGER] POST /trigger/obj-7 action=created rv={body['rv']}" in out
    assert re.search(r"\[ENQUEUE\] key=default/obj-7 \(informer: ADDED\)", out)
    assert re.search(r"\[WORKER-\d+\] key=default/obj-7 Get seq=\d+ ← \d", out)
    assert "Summary (interrupted)" in out
    assert "Where the milliseconds live" in out
    final = re.search(
        r"^\[STATS\] t=\S+ final triggers=1 .*\n\s*Summary \(interrupted\)", out, re.M
    )
    assert final is not None, out  # the closing line comes on Ctrl-C too, before the summary
    # the triggers came from outside: it says the round trips were not timed
    # (it said "triggers=1 ... /trigger reqs=0" side by side)
    assert "/trigger reqs=" not in out
    assert "/trigger round trips: not timed (--no-load)" in final.group(0)


def test_killing_the_controller_takes_the_api_server_and_etcd_with_it(tmp_path: Path) -> None:
    # The killed controller cannot remove etcd's temp dir: keep it under tmp_path.
    child = subprocess.Popen(
        [sys.executable, "-m", "keyqueue", "lab", "pipeline", "--no-load", "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path)},
    )
    try:
        _read_until(child, "serving http://")
        roles = _roles(child.pid)
        assert set(roles) == {"etcd", "apiserver"}, roles
    finally:
        child.kill()  # SIGKILL: no cleanup runs in the controller
        child.communicate()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in roles.values()):
        assert time.monotonic() < deadline, f"outlived their killed controller: {roles}"
        time.sleep(0.01)


def _read_until(child: subprocess.Popen[str], marker: str) -> list[str]:
    """Lines from the child up to the first containing ``marker`` (bounded by the
    child itself: if it dies, readline returns '' and the assert fails)."""
    assert child.stdout is not None
    lines = []
    while True:
        line = child.stdout.readline()
        assert line, f"the child exited before printing {marker!r}: {lines}"
        lines.append(line.rstrip("\n"))
        if marker in line:
            return lines


def test_run_pipeline_takes_an_ignored_sigint_for_the_run_and_leaves_it_ignored(
    etcd_url: str,
) -> None:
    during: list[object] = []
    config = PipelineConfig(requests=1, concurrency=1, objects=1, reconcile=0, etcd=etcd_url)
    before = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        run_pipeline(config, on_url=lambda *_: during.append(signal.getsignal(signal.SIGINT)))
        after = signal.getsignal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGINT, before)
    (handler,) = during
    assert handler not in (signal.SIG_IGN, signal.SIG_DFL, None)  # asyncio.run's: cancels the run
    assert after is signal.SIG_IGN


def test_pipeline_on_a_port_in_use_says_so(etcd_url: str) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = invoke("--etcd", etcd_url, "--port", str(port), "--requests", "1")
    assert result.exit_code == 1
    assert f"cannot listen on 127.0.0.1:{port}" in result.output


def test_pipeline_against_an_etcd_that_never_answers_is_a_one_line_error_in_seconds() -> None:
    # A real server on a free loopback port: it accepts every connection and
    # never sends a byte (a wrong port, a hung etcd, a firewall that proxies).
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        result = invoke("--etcd", url, "--requests", "1", "--plain")
        took = time.monotonic() - started
    assert result.exit_code == 1, result.output
    lines = result.output.strip().splitlines()
    assert len(lines) == 1, result.output
    assert url in lines[0]
    assert "did not answer" in lines[0]
    assert "Traceback" not in result.output
    assert took < 15, took


def test_ctrl_c_while_etcd_starts_is_one_line_and_exit_130() -> None:
    bootstrap = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from keyqueue.cli import main; main(sys.argv[1:])"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", bootstrap, "lab", "pipeline", "--plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while "etcd" not in _roles(child.pid):  # etcd is starting: the run is not up yet
            assert child.poll() is None, child.communicate()
            assert time.monotonic() < deadline, "no etcd started"
            time.sleep(0.005)
        roles = _roles(child.pid)
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:  # pragma: no cover - only when an assert above failed
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert "Traceback" not in err
    assert "interrupted" in out + err
    assert not any(_alive(pid) for pid in roles.values()), roles


def test_the_interrupted_pipeline_summary_counts_the_same_adds_everywhere() -> None:
    bootstrap = (
        "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
        "from keyqueue.cli import main; main(sys.argv[1:])"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", bootstrap, "lab", "pipeline", "--plain", "--requests", "100000"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        _read_until(child, "[STATS]")  # the load is running
        roles = _roles(child.pid)
        assert set(roles) == {"etcd", "apiserver", "load"}, roles
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        if child.poll() is None:  # pragma: no cover - only when an assert above failed
            child.kill()
            child.wait()
    assert child.returncode == 130, err
    assert "Summary (interrupted)" in out
    flow = re.search(r"→ ([\d,]+) watch events → ([\d,]+) adds →", out)
    assert flow is not None, out
    events, adds = (int(g.replace(",", "")) for g in flow.groups())
    samples = {
        stage: int(m.group(1).replace(",", ""))
        for stage in ("watch event → queue.add", "queue.add call")
        if (m := re.search(rf"^ {re.escape(stage)} .* ([\d,]+)  ", out, re.M))
    }
    assert events == adds == samples["watch event → queue.add"] == samples["queue.add call"], out
    assert not any(_alive(pid) for pid in roles.values()), roles  # nothing left behind
