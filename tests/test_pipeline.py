"""The pipeline lab on a real etcd: the launcher, the API server against the official
``kubernetes`` client (no special casing), and ``keyqueue lab pipeline`` end to end.

One etcd and one API server serve the whole session (see ``etcd_server``); each
test works in its own namespace or on its own object names.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from etcd_server import ServerThread, api_server, etcd_url, namespace
from keyqueue.lab.pipeline.etcd import Etcd, EtcdError, local_etcd

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
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _children(pid: int) -> list[int]:
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return [int(p) for p in path.read_text().split()] if path.exists() else []


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
    status, body = _send(urllib.request.Request(f"{url}?labelSelector=app%3Dt"))
    assert (status, body["reason"]) == (400, "BadRequest")
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
