"""The pipeline's API server against what is not an official client: other sites' pages
(a foreign ``Host`` or ``Origin``), malformed bodies, and bodies a fuzzer shapes like
ConfigMaps and DeleteOptions.

Every refusal is a Kubernetes ``Status`` (kind Status, apiVersion v1, status
Failure, a one-line message, a reason, the code); no body gets a 500. The
official client, which sends no ``Origin``, keeps working (lab/test_pipeline.py
drives it through everything). Same session etcd and API server as
lab/test_pipeline.py (``etcd_server``); each test in its own namespace, the fuzz in one
of its own. The fuzz is derandomized (the same 150 examples per test on every run);
``pytest --hypothesis-show-statistics`` shows which answers they reached.
"""

from __future__ import annotations

import http.client
import json
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from kubernetes import client as k8s

from tests.support.etcd_server import ServerThread, api_server, etcd_url, namespace

__all__ = ["api_server", "etcd_url", "namespace"]  # fixtures, imported for pytest

MERGE = "application/merge-patch+json"
STRATEGIC = "application/strategic-merge-patch+json"


@pytest.fixture(scope="module")
def v1(api_server: ServerThread) -> Iterator[k8s.CoreV1Api]:
    config = k8s.Configuration()
    config.host = api_server.url
    with k8s.ApiClient(config) as api_client:
        yield k8s.CoreV1Api(api_client)


class Client:
    """Raw requests to the API server with exactly the headers given (``Host`` included)."""

    def __init__(self, server: ServerThread) -> None:
        self.host, port = server.url.removeprefix("http://").split(":")
        self.port = int(port)
        self.conn = http.client.HTTPConnection(self.host, self.port, timeout=10)

    def __call__(
        self, method: str, path: str, body: bytes = b"", **headers: str
    ) -> tuple[int, Any]:
        headers = {"Host": f"{self.host}:{self.port}", **headers}
        try:
            raw, status = self._send(method, path, body, headers)
        except ConnectionError:  # the server closed the kept-alive connection: once more
            self.conn.close()
            raw, status = self._send(method, path, body, headers)
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw

    def _send(
        self, method: str, path: str, body: bytes, headers: dict[str, str]
    ) -> tuple[bytes, int]:
        self.conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        for name, value in {**headers, "Content-Length": str(len(body))}.items():
            self.conn.putheader(name.replace("_", "-"), value)
        self.conn.endheaders(body)
        response = self.conn.getresponse()
        return response.read(), response.status

    def close(self) -> None:
        self.conn.close()


@pytest.fixture(scope="module")
def call(api_server: ServerThread) -> Iterator[Client]:
    client = Client(api_server)
    yield client
    client.close()


def assert_status(code: int, body: Any) -> None:
    """``body`` is a Kubernetes Failure Status for ``code``."""
    assert isinstance(body, dict), body
    assert (body.get("kind"), body.get("apiVersion"), body.get("status")) == (
        "Status",
        "v1",
        "Failure",
    ), body
    assert body.get("code") == code, body
    assert isinstance(body.get("reason"), str), body
    assert body["reason"], body
    message = body.get("message")
    assert isinstance(message, str), body
    assert message, body
    assert "\n" not in message, body


def configmaps(ns: str) -> str:
    return f"/api/v1/namespaces/{ns}/configmaps"


# -- other sites -------------------------------------------------------------------------


@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}", "localhost:1"])
def test_a_foreign_host_is_refused_with_a_status(
    call: Client, v1: k8s.CoreV1Api, namespace: str, host: str
) -> None:
    host = host.format(port=call.port)
    status, body = call("GET", configmaps(namespace), Host=host)
    assert status == 421
    assert_status(421, body)
    assert body["message"].startswith(f"Host {host!r} is not this server")
    status, body = call("POST", f"/trigger/{namespace}", Host=host)
    assert_status(421, body)
    with pytest.raises(k8s.ApiException) as missing:
        v1.read_namespaced_config_map(namespace, "default")
    assert missing.value.status == 404


def test_a_browser_request_from_a_foreign_origin_is_refused_and_changes_nothing(
    call: Client, v1: k8s.CoreV1Api, namespace: str
) -> None:
    name = f"x-{uuid.uuid4().hex[:8]}"
    cross_site = {"Origin": "http://attacker.example", "Content_Type": "text/plain;charset=UTF-8"}
    status, body = call("POST", f"/trigger/{name}", **cross_site)
    assert status == 403
    assert_status(403, body)
    assert body["reason"] == "Forbidden"
    assert body["message"].startswith("Origin 'http://attacker.example' is not this server's own")
    blob = json.dumps({"metadata": {"name": "evil"}}).encode()
    assert call("POST", configmaps(namespace), blob, Origin="null")[0] == 403
    assert call("GET", configmaps(namespace), Origin="http://attacker.example")[0] == 403
    assert v1.list_namespaced_config_map(namespace).items == []
    with pytest.raises(k8s.ApiException):
        v1.read_namespaced_config_map(name, "default")
    # A page the server itself served (same origin) is not another site.
    own = f"http://127.0.0.1:{call.port}"
    assert call("POST", f"/trigger/{name}", Origin=own)[0] == 200
    assert call("POST", configmaps(namespace), blob, Origin=own)[0] == 201


# -- malformed bodies ----------------------------------------------------------------------

DEEP = b'{"a":' * 3000 + b"1" + b"}" * 3000
NOT_OBJECT = [b'"x"', b"[1]", b"5", b"null", b"true"]


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b'{"metadata":"x"}', 400),
        (b'{"metadata":{"name":5}}', 400),
        (b'{"metadata":{"name":["a"]}}', 400),
        (b'{"metadata":{"name":{"a":1}}}', 400),
        (b'{"metadata":{"generateName":5}}', 400),
        (b'{"metadata":{"name":"a","namespace":7}}', 400),
        (b'{"metadata":{"name":"a","resourceVersion":"5"}}', 400),
        (b'{"metadata":{"name":"a","resourceVersion":5}}', 400),
        (b'{"metadata":{"name":"a","uid":5}}', 400),
        (b'{"metadata":{"name":"a","labels":"x"}}', 422),
        (b'{"metadata":{"name":"a","labels":{"k":1}}}', 422),
        (b'{"metadata":{"name":"a","finalizers":["x"]}}', 422),
        (b'{"metadata":{"name":"a","ownerReferences":"x"}}', 422),
        (b'{"metadata":{"name":"Not_A_Name"}}', 422),
        (b'{"metadata":{"name":"a"},"data":{"k":NaN}}', 400),
        (b'{"metadata":{"name":"a"},"data":[]}', 422),
        (b'{"metadata":{"name":"a"},"binaryData":{"k":"not base64!"}}', 422),
        (b'{"metadata":{"name":"a"},"immutable":"yes"}', 422),
        (b'{"kind":5,"metadata":{"name":"a"}}', 400),
        (b'{"apiVersion":["v1"],"metadata":{"name":"a"}}', 400),
        (b"", 400),
        (b"not json", 400),
        (b"\xff\xfe", 400),
        (b'{"metadata": {"name": "a"}', 400),
        (b"1" * 5000, 400),
        (DEEP, 400),
        *((body, 400) for body in NOT_OBJECT),
    ],
)
def test_a_malformed_create_answers_a_status(
    call: Client, v1: k8s.CoreV1Api, namespace: str, body: bytes, code: int
) -> None:
    status, answer = call("POST", configmaps(namespace), body)
    assert status == code, answer
    assert_status(code, answer)
    assert v1.list_namespaced_config_map(namespace).items == []


@pytest.mark.parametrize(
    ("method", "body", "content_type", "code"),
    [
        ("PUT", b'{"metadata":"x"}', None, 400),
        ("PUT", b'{"metadata":{"name":"t","resourceVersion":5}}', None, 400),
        ("PUT", b'{"metadata":{"name":"t","finalizers":["x"]}}', None, 422),
        ("PUT", b"[1]", None, 400),
        ("PATCH", b'{"metadata":"x"}', MERGE, 400),
        ("PATCH", b'{"metadata":{"resourceVersion":5}}', MERGE, 400),
        ("PATCH", b'{"metadata":{"finalizers":["x"]}}', STRATEGIC, 422),
        ("PATCH", b'{"metadata":{"labels":"x"}}', MERGE, 422),
        ("PATCH", b'{"data":{"k":5}}', MERGE, 422),
        ("PATCH", b'{"$patch":"replace"}', STRATEGIC, 400),
        ("PATCH", b"[1]", MERGE, 400),
        ("PATCH", DEEP, MERGE, 400),
        ("PATCH", b'{"a":' * 200 + b"1" + b"}" * 200, MERGE, 400),
        ("DELETE", b'{"preconditions":["x"]}', None, 400),
        ("DELETE", b'{"preconditions":"x"}', None, 400),
        ("DELETE", b'{"preconditions":{"resourceVersion":5}}', None, 400),
        ("DELETE", b'{"preconditions":{"uid":["u"]}}', None, 400),
        ("DELETE", b'{"dryRun":["All"]}', None, 400),
        ("DELETE", b'{"dryRun":"All"}', None, 400),
        ("DELETE", b'{"gracePeriodSeconds":"x"}', None, 400),
        ("DELETE", b'{"propagationPolicy":"Sideways"}', None, 422),
        ("DELETE", b'{"orphanDependents":"no"}', None, 400),
        ("DELETE", b'{"kind":"Pod"}', None, 400),
        ("DELETE", b"not json", None, 400),
        *(("DELETE", body, None, 400) for body in NOT_OBJECT if body != b"null"),
    ],
)
def test_a_malformed_replace_patch_or_delete_answers_a_status_and_changes_nothing(
    call: Client,
    v1: k8s.CoreV1Api,
    namespace: str,
    method: str,
    body: bytes,
    content_type: str | None,
    code: int,
) -> None:
    before = v1.create_namespaced_config_map(
        namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="t"), data={"a": "1"})
    )
    headers = {} if content_type is None else {"Content_Type": content_type}
    status, answer = call(method, f"{configmaps(namespace)}/t", body, **headers)
    assert status == code, answer
    assert_status(code, answer)
    after = v1.read_namespaced_config_map("t", namespace)
    assert (after.data, after.metadata.resource_version) == (
        {"a": "1"},
        before.metadata.resource_version,
    )


@pytest.mark.parametrize(
    ("method", "content_type"),
    [
        ("POST", "text/plain"),
        ("POST", "application/x-www-form-urlencoded"),
        ("POST", "multipart/form-data; boundary=x"),
        ("POST", "application/yaml"),
        ("PUT", "text/plain"),
        ("DELETE", "text/plain"),
        ("PATCH", "application/json"),
        ("PATCH", "text/plain"),
    ],
)
def test_a_body_of_the_wrong_content_type_is_415(
    call: Client, v1: k8s.CoreV1Api, namespace: str, method: str, content_type: str
) -> None:
    v1.create_namespaced_config_map(namespace, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name="t")))
    body = json.dumps({"metadata": {"name": "t"}, "data": {"b": "2"}}).encode()
    path = configmaps(namespace) + ("" if method == "POST" else "/t")
    status, answer = call(method, path, body, Content_Type=content_type)
    assert status == 415, answer
    assert_status(415, answer)
    assert answer["reason"] == "UnsupportedMediaType"
    assert v1.read_namespaced_config_map("t", namespace).data is None


def test_json_with_a_charset_and_no_content_type_are_both_json(
    call: Client, namespace: str
) -> None:
    path = configmaps(namespace)
    one = json.dumps({"metadata": {"name": "one"}}).encode()
    two = json.dumps({"metadata": {"name": "two"}}).encode()
    assert call("POST", path, one, Content_Type="application/json; charset=utf-8")[0] == 201
    assert call("POST", path, two)[0] == 201


def test_unknown_routes_and_methods_answer_a_status(call: Client, namespace: str) -> None:
    assert_status(404, call("GET", "/api/v1/namespaces/x/pods")[1])
    assert_status(405, call("POST", f"{configmaps(namespace)}/t", b"{}")[1])


# -- bodies a fuzzer shapes like the real ones ---------------------------------------------

FUZZ_NAMESPACE = f"fuzz-{uuid.uuid4().hex[:8]}"
TARGET = "target"

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)


Shape = Callable[[st.SearchStrategy[Any]], st.SearchStrategy[Any]]


def right(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return good


def sometimes_wrong(good: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """The field's own shape, or any JSON value."""
    return good | json_values


names = st.from_regex(r"\A[a-z0-9]([-a-z0-9.]{0,12}[a-z0-9])?\Z")
string_maps = st.dictionaries(st.text(max_size=6), st.text(max_size=6), max_size=3)
base64ish = st.sampled_from(["", "YQ==", "aGk=", "x", "YQ"])


def configmaps_named(
    name: st.SearchStrategy[str],
) -> Callable[[Shape], st.SearchStrategy[dict[str, Any]]]:
    return lambda field: configmaps_shaped(field, name)


def configmaps_shaped(
    field: Shape, name: st.SearchStrategy[str] = names
) -> st.SearchStrategy[dict[str, Any]]:
    """ConfigMap bodies named ``name``, each field drawn through ``field`` (``right``:
    all valid)."""
    metadata = st.fixed_dictionaries(
        {"name": field(name)},
        optional={
            "generateName": field(st.just("gen-")),
            "namespace": field(st.just(FUZZ_NAMESPACE)),
            "labels": field(string_maps),
            "annotations": field(string_maps),
            "resourceVersion": field(st.just("")),
            "uid": field(st.text(max_size=8)),
            "creationTimestamp": field(st.just("2024-01-01T00:00:00Z")),
            "selfLink": field(st.just("/api/v1/x")),
            "finalizers": field(st.none()),
            "ownerReferences": field(st.none()),
        },
    )
    return st.fixed_dictionaries(
        {"metadata": field(metadata)},
        optional={
            "kind": field(st.just("ConfigMap")),
            "apiVersion": field(st.just("v1")),
            "data": field(string_maps),
            "binaryData": field(st.dictionaries(st.text(max_size=6), base64ish, max_size=2)),
            "immutable": field(st.just(False)),
            "other": json_values,
        },
    )


def delete_options_shaped(field: Shape) -> st.SearchStrategy[dict[str, Any]]:
    """DeleteOptions bodies, each field drawn through ``field``."""
    preconditions = st.fixed_dictionaries(
        {},
        optional={
            "resourceVersion": field(st.sampled_from(["1", "999999999"])),
            "uid": field(st.text(max_size=8)),
        },
    )
    return st.fixed_dictionaries(
        {},
        optional={
            "kind": field(st.just("DeleteOptions")),
            "apiVersion": field(st.just("v1")),
            "preconditions": field(preconditions),
            "gracePeriodSeconds": field(st.integers(0, 30)),
            "propagationPolicy": field(st.sampled_from(["Orphan", "Background", "Foreground"])),
            "orphanDependents": field(st.booleans()),
            "dryRun": field(st.lists(st.just("All"), max_size=1)),
        },
    )


def bodies(shaped: Callable[[Shape], st.SearchStrategy[Any]]) -> st.SearchStrategy[bytes]:
    """Valid bodies, bodies with some fields of any JSON value, any JSON value, raw bytes."""
    values = shaped(right) | shaped(sometimes_wrong) | json_values
    return values.map(lambda v: json.dumps(v).encode()) | st.binary(max_size=12)


def ensure_target(v1: k8s.CoreV1Api) -> None:
    """ConfigMap ``TARGET`` exists (a fuzzed delete may have removed it)."""
    names = [item.metadata.name for item in v1.list_namespaced_config_map(FUZZ_NAMESPACE).items]
    if TARGET not in names:
        v1.create_namespaced_config_map(
            FUZZ_NAMESPACE, k8s.V1ConfigMap(metadata=k8s.V1ObjectMeta(name=TARGET), data={"a": "1"})
        )


def check_answer(v1: k8s.CoreV1Api, status: int, body: Any) -> None:
    """Never a 500; a Status when refused; what was accepted, the official client reads."""
    what = body.get("message", "")[:40] if isinstance(body, dict) and status >= 400 else ""
    event(f"answered {status} {what}")
    assert status < 500, body
    if status >= 400:
        assert_status(status, body)
    elif isinstance(body, dict) and body.get("kind") == "ConfigMap":
        name = body["metadata"]["name"]
        read = v1.read_namespaced_config_map(name, FUZZ_NAMESPACE)
        assert read.metadata.resource_version == body["metadata"]["resourceVersion"]
        v1.list_namespaced_config_map(FUZZ_NAMESPACE)


FUZZ = settings(
    max_examples=150,
    derandomize=True,
    database=None,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)


@FUZZ
@given(body=bodies(configmaps_shaped), content_type=st.sampled_from([None, "application/json"]))
def test_fuzzed_creates_never_get_a_500(
    call: Client, v1: k8s.CoreV1Api, body: bytes, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"Content_Type": content_type}
    status, answer = call("POST", configmaps(FUZZ_NAMESPACE), body, **headers)
    check_answer(v1, status, answer)


@FUZZ
@given(
    body=bodies(configmaps_named(st.just(TARGET))),
    content_type=st.sampled_from([None, "application/json"]),
)
def test_fuzzed_replaces_never_get_a_500(
    call: Client, v1: k8s.CoreV1Api, body: bytes, content_type: str | None
) -> None:
    ensure_target(v1)
    headers = {} if content_type is None else {"Content_Type": content_type}
    status, answer = call("PUT", f"{configmaps(FUZZ_NAMESPACE)}/{TARGET}", body, **headers)
    check_answer(v1, status, answer)


@FUZZ
@given(
    body=bodies(configmaps_named(st.just(TARGET))),
    content_type=st.sampled_from([MERGE, STRATEGIC]),
)
def test_fuzzed_patches_never_get_a_500(
    call: Client, v1: k8s.CoreV1Api, body: bytes, content_type: str
) -> None:
    ensure_target(v1)
    path = f"{configmaps(FUZZ_NAMESPACE)}/{TARGET}"
    status, answer = call("PATCH", path, body, Content_Type=content_type)
    check_answer(v1, status, answer)


@FUZZ
@given(body=bodies(delete_options_shaped), content_type=st.sampled_from([None, "application/json"]))
def test_fuzzed_delete_options_never_get_a_500(
    call: Client, v1: k8s.CoreV1Api, body: bytes, content_type: str | None
) -> None:
    ensure_target(v1)
    headers = {} if content_type is None else {"Content_Type": content_type}
    status, answer = call("DELETE", f"{configmaps(FUZZ_NAMESPACE)}/{TARGET}", body, **headers)
    check_answer(v1, status, answer)
