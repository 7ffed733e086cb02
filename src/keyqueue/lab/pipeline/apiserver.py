"""A small Kubernetes-shaped API server for ConfigMaps, on etcd.

Theory of operation
-------------------
It serves the ``core/v1`` ConfigMap routes the official clients call, in
Kubernetes' wire format, so ``kubernetes`` and ``kubernetes_asyncio`` work
against it unchanged (and so does ``keyqueue.informer``):

- ``GET/POST /api/v1/namespaces/{ns}/configmaps``: list, create; with
  ``?watch=true&resourceVersion=N[&timeoutSeconds=S]``: watch, streamed JSON
  lines ``{"type": "ADDED"|"MODIFIED"|"DELETED"|"ERROR", "object": ...}``;
- ``GET/PUT/PATCH/DELETE /api/v1/namespaces/{ns}/configmaps/{name}``;
- ``GET /api/v1/configmaps``: list or watch every namespace;
- ``POST /trigger/{name}``: create ConfigMap ``default/{name}`` or bump the
  counter in its data; answers ``{"action": "created"|"updated", "rv": N, "took_ms": x}``.

An object lives at ``/registry/configmaps/{ns}/{name}`` as JSON without its
``resourceVersion``, which is etcd's ``mod_revision`` of the key, filled in on
every read (as the real API server does). Every write is an etcd
transaction conditioned on the revision it read: a create fails with 409
AlreadyExists if the key exists; an update with a ``resourceVersion``
precondition fails with 409 Conflict if the object changed since; one without
re-reads and tries again. A watch maps etcd's PUT to ADDED (first version)
or MODIFIED and DELETE to DELETED (the last value, at the deletion's
revision); a watch without a resourceVersion (or "0") first sends the current
objects as ADDED. A watch from a compacted revision gets one ``ERROR`` event
with a 410 ``Expired`` Status and ends, as the real one does.

Content types: create, replace and delete bodies are JSON, sent as
``application/json`` or with no ``Content-Type`` at all (the Python client
sends none); anything else is a 415. Patches are
``application/merge-patch+json`` (RFC 7386) or
``application/strategic-merge-patch+json``, which for a ConfigMap means the
same: maps (``data``, labels, annotations) merge, ``null`` deletes a key.
Strategic-merge directives (``$patch`` and friends) and JSON patches are
refused. ``limit`` on a list is ignored (no chunking: everything comes at
once, which the API allows); label and field selectors are refused, not ignored.

Bodies are checked before anything is written, and every refusal is a
``Status``: not JSON, not an object, nested deeper than ``MAX_DEPTH``, or a
field of the wrong type is a 400 BadRequest (as the real server's decoder
says); a value that breaks a rule (a name, a map of strings, base64
binaryData, a DeleteOptions policy) or a metadata field this server does not
implement (finalizers, ownerReferences, ...: refused, not ignored) is a 422
Invalid. Unknown top-level fields are dropped, as the real server does. So
whatever is stored, the official clients can read back.

Other sites: the API server listens on loopback, but a web page can still
reach it. A request whose ``Host`` is not this server is a 421 (DNS
rebinding), one with an ``Origin`` that is not this server's own a 403;
clients that send no ``Origin`` (the official ones, curl, the load
generator) are not affected (``keyqueue.lab.web.guard`` decides for both lab
servers).

Hooks for the lab's stage timings: ``on_write(revision, started, finished)``
after every successful etcd write (monotonic seconds around the transaction)
and ``on_trigger(TriggerRecord)`` after every ``/trigger``.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import datetime
import json
import logging
import re
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from ..web.guard import check_request
from .etcd import Compacted, Etcd, EtcdError, KeyValue

__all__ = ["MAX_DEPTH", "PREFIX", "ApiServer", "TriggerRecord", "merge_patch"]

log = logging.getLogger(__name__)

PREFIX = "/registry/configmaps/"
JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"
_RETRIES = 50  # unconditional writes re-read and retry this often on a conflict
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_CONFIGMAP_FIELDS = ("data", "binaryData", "immutable")
MAX_DEPTH = 64
"""Deepest nesting of arrays and objects a body may have (a ConfigMap's is 3)."""
_META_STRINGS = ("name", "generateName", "namespace", "uid", "resourceVersion",
                 "creationTimestamp", "selfLink")  # fmt: skip
_META_MAPS = ("labels", "annotations")
_META_SERVER = ("resourceVersion", "selfLink")
"""Metadata fields a client may send (echoing what it read) that are never stored."""
_PROPAGATION = ("Orphan", "Background", "Foreground")
_DELETE_OPTION_TYPES: dict[str, tuple[type, str]] = {
    "apiVersion": (str, "a string"),
    "gracePeriodSeconds": (int, "an integer"),
    "propagationPolicy": (str, "a string"),
    "orphanDependents": (bool, "a boolean"),
    "dryRun": (list, "an array"),
    "preconditions": (dict, "an object"),
}
_REASONS = {400: "BadRequest", 403: "Forbidden", 421: "MisdirectedRequest", 422: "Invalid"}


@dataclass(frozen=True, slots=True)
class TriggerRecord:
    """One ``POST /trigger/{name}``, as the server saw it (monotonic seconds)."""

    name: str
    action: str
    """"created" or "updated"."""
    rv: int
    started: float
    finished: float

    @property
    def took(self) -> float:
        return self.finished - self.started


class _StatusError(Exception):
    """An error answered as a Kubernetes ``Status`` object."""

    def __init__(self, code: int, reason: str, message: str, **details: str) -> None:
        super().__init__(message)
        self.code, self.reason, self.message, self.details = code, reason, message, details


def _status(code: int, reason: str, message: str, details: dict[str, str] | None = None) -> Any:
    status: dict[str, Any] = {
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Success" if code < 400 else "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    }
    if details:
        status["details"] = details
    if code < 400:
        del status["message"], status["reason"]
    return status


def _not_found(name: str) -> _StatusError:
    return _StatusError(404, "NotFound", f'configmaps "{name}" not found', name=name)


def _conflict(name: str) -> _StatusError:
    return _StatusError(
        409,
        "Conflict",
        f'Operation cannot be fulfilled on configmaps "{name}": the object has been modified; '
        "please apply your changes to the latest version and try again",
        name=name,
    )


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch: objects merge recursively, ``null`` deletes a key,
    anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    result = dict(target) if isinstance(target, dict) else {}
    for name, value in patch.items():
        if value is None:
            result.pop(name, None)
        else:
            result[name] = merge_patch(result.get(name), value)
    return result


def _has_directive(patch: Any) -> bool:
    if isinstance(patch, dict):
        return any(str(k).startswith("$") or _has_directive(v) for k, v in patch.items())
    if isinstance(patch, list):
        return any(_has_directive(v) for v in patch)
    return False


def _bad(message: str) -> _StatusError:
    return _StatusError(400, "BadRequest", message)


def _invalid(message: str) -> _StatusError:
    return _StatusError(422, "Invalid", message)


def _type_name(value: Any) -> str:
    return {dict: "an object", list: "an array", str: "a string", bool: "a boolean",
            type(None): "null"}.get(type(value), "a number")  # fmt: skip


def _string_map(obj: Any, field: str) -> None:
    if obj is None:
        return
    if not isinstance(obj, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in obj.items()
    ):
        raise _invalid(f"{field}: must be a map of strings to strings")


def _metadata(obj: dict[str, Any]) -> dict[str, Any]:
    """``obj``'s metadata without its null fields, checked: an object (400), its string
    fields strings (400), labels and annotations maps of strings (422), and no
    field this server does not implement (422)."""
    meta = obj.get("metadata")
    if meta is None:
        return {}
    if not isinstance(meta, dict):
        raise _bad(f"metadata: must be an object, got {_type_name(meta)}")
    meta = {k: v for k, v in meta.items() if v is not None}
    for field, value in meta.items():
        if field in _META_STRINGS:
            if not isinstance(value, str):
                raise _bad(f"metadata.{field}: must be a string, got {_type_name(value)}")
        elif field in _META_MAPS:
            _string_map(value, f"metadata.{field}")
        else:
            kept = ", ".join((*_META_STRINGS, *_META_MAPS))
            raise _invalid(f"metadata.{field}: not supported by this server (it keeps {kept})")
    return meta


def _key(namespace: str, name: str) -> bytes:
    return f"{PREFIX}{namespace}/{name}".encode()


def _decode(kv: KeyValue, rv: int | None = None) -> dict[str, Any]:
    obj: dict[str, Any] = json.loads(kv.value)
    obj["metadata"]["resourceVersion"] = str(kv.mod_revision if rv is None else rv)
    return obj


def _now_rfc3339() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _stored(obj: dict[str, Any], namespace: str, name: str, uid: str, created: str) -> bytes:
    """The bytes kept in etcd: a checked ConfigMap without its resourceVersion."""
    if obj.get("kind", "ConfigMap") != "ConfigMap" or obj.get("apiVersion", "v1") != "v1":
        raise _bad("the body must be a v1 ConfigMap")
    meta = _metadata(obj)
    _string_map(obj.get("data"), "data")
    _string_map(obj.get("binaryData"), "binaryData")
    for key, value in (obj.get("binaryData") or {}).items():
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise _invalid(f"binaryData[{key!r}]: must be base64") from None
    if obj.get("immutable") is not None and not isinstance(obj["immutable"], bool):
        raise _invalid("immutable: must be a boolean")
    meta = {k: v for k, v in meta.items() if k not in _META_SERVER}
    meta.update(name=name, namespace=namespace, uid=uid, creationTimestamp=created)
    out: dict[str, Any] = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}
    for field in _CONFIGMAP_FIELDS:
        if obj.get(field) is not None:
            out[field] = obj[field]
    return json.dumps(out, separators=(",", ":")).encode()


def _check_name(name: str) -> None:
    if len(name) > 253 or not _NAME.match(name):
        raise _StatusError(
            422, "Invalid", f"metadata.name: Invalid value: {name!r}: must be a DNS subdomain"
        )


def _check_namespace(namespace: str) -> None:
    if len(namespace) > 63 or not _LABEL.match(namespace):
        raise _StatusError(
            422, "Invalid", f"namespace: Invalid value: {namespace!r}: must be a DNS label"
        )


def _not_json(constant: str) -> Any:
    raise ValueError(f"{constant} is not JSON")


def _depth(value: Any) -> int:
    """How deeply arrays and objects nest in ``value`` (a scalar: 0), without recursion."""
    deepest, level = 0, [(value, 0)]
    while level:
        item, depth = level.pop()
        if isinstance(item, dict | list):
            depth += 1
            deepest = max(deepest, depth)
            if depth <= MAX_DEPTH:
                children = item.values() if isinstance(item, dict) else item
                level.extend((child, depth) for child in children)
    return deepest


async def _json_body(
    request: web.Request, media_types: tuple[str, ...] = (JSON,), *, typed: bool = False
) -> Any:
    """The body as JSON (None when empty). Its ``Content-Type`` must be one of
    ``media_types``, or absent unless ``typed`` (the Python client sends none on
    create, replace and delete): else 415. Not JSON, or nested deeper than
    ``MAX_DEPTH``: 400."""
    sent = request.headers.get(aiohttp.hdrs.CONTENT_TYPE)
    if (sent is not None or typed) and request.content_type not in media_types:
        raise _StatusError(
            415,
            "UnsupportedMediaType",
            f"the content type {sent!r} is not supported here (use {' or '.join(media_types)})",
        )
    raw = await request.read()
    if not raw:
        return None
    try:
        body = json.loads(raw, parse_constant=_not_json)
    except RecursionError:
        raise _bad(f"the body is nested more than {MAX_DEPTH} levels deep") from None
    except ValueError as exc:
        raise _bad(f"the body is not JSON: {exc}") from None
    if _depth(body) > MAX_DEPTH:
        raise _bad(f"the body is nested more than {MAX_DEPTH} levels deep")
    return body


def _answer(exc: _StatusError) -> web.Response:
    return web.json_response(
        _status(exc.code, exc.reason, exc.message, exc.details or None), status=exc.code
    )


@web.middleware
async def _errors(request: web.Request, handler: Any) -> web.StreamResponse:
    """Other sites refused; every error a ``Status``, an unexpected one a 500 InternalError."""
    refused = check_request(request)
    if refused is not None:
        return _answer(_StatusError(refused.status, _REASONS[refused.status], refused.message))
    try:
        response: web.StreamResponse = await handler(request)
        return response
    except _StatusError as exc:
        return _answer(exc)
    except EtcdError as exc:
        return web.json_response(_status(500, "InternalError", str(exc)), status=500)
    except (aiohttp.ClientError, OSError) as exc:
        message = f"etcd is unreachable: {exc}"
        return web.json_response(_status(503, "ServiceUnavailable", message), status=503)
    except web.HTTPException as exc:  # aiohttp's: no route (404), method (405), size (413)
        if exc.status < 400:
            raise
        message = f"{exc.reason}: {request.method} {request.path}"
        return _answer(_StatusError(exc.status, exc.reason.replace(" ", ""), message))
    except Exception as exc:
        log.exception("%s %s", request.method, request.path)
        message = f"internal error: {type(exc).__name__}: {exc}".splitlines()[0]
        return web.json_response(_status(500, "InternalError", message), status=500)


class ApiServer:
    """The API server over ``etcd``. ``await start()`` serves, ``await close()`` stops.

    ``on_write`` and ``on_trigger`` are called on the event loop; keep them short.
    """

    def __init__(
        self,
        etcd: Etcd,
        *,
        on_write: Callable[[int, float, float], None] | None = None,
        on_trigger: Callable[[TriggerRecord], None] | None = None,
    ) -> None:
        self.etcd = etcd
        self.on_write = on_write
        self.on_trigger = on_trigger
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._watches: set[asyncio.Task[Any]] = set()
        app = web.Application(middlewares=[_errors])
        ns = "/api/v1/namespaces/{namespace}/configmaps"
        app.router.add_get(ns, self._list_or_watch)
        app.router.add_post(ns, self._create)
        app.router.add_get(ns + "/{name}", self._get)
        app.router.add_put(ns + "/{name}", self._replace)
        app.router.add_patch(ns + "/{name}", self._patch)
        app.router.add_delete(ns + "/{name}", self._delete)
        app.router.add_get("/api/v1/configmaps", self._list_or_watch)
        app.router.add_post("/trigger/{name}", self._trigger)
        app.router.add_get("/healthz", self._healthz)
        self.app = app

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen on ``host:port`` (0: a free port); returns the URL, ``http://host:port``."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((host, port))
        except OSError:
            sock.close()
            raise
        runner = web.AppRunner(
            self.app, handler_cancellation=True, access_log=None, shutdown_timeout=1.0
        )
        await runner.setup()
        await web.SockSite(runner, sock).start()
        self._runner = runner
        self.url = f"http://{host}:{sock.getsockname()[1]}"
        return self.url

    @property
    def watches(self) -> int:
        """Watch streams open right now."""
        return len(self._watches)

    async def close(self) -> None:
        """Stop serving: open watches end, then the listener closes."""
        for task in list(self._watches):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

    # -- writes ------------------------------------------------------------------

    async def _timed(self, write: Any) -> tuple[int | None, KeyValue | None]:
        started = time.monotonic()
        revision, kv = await write
        if revision is not None and self.on_write is not None:
            self.on_write(revision, started, time.monotonic())
        return revision, kv

    async def _update(
        self,
        namespace: str,
        name: str,
        change: Callable[[dict[str, Any]], dict[str, Any]],
        precondition: str | None,
    ) -> dict[str, Any]:
        """Read, ``change``, write back if nothing moved meanwhile; the written object."""
        key = _key(namespace, name)
        kv = await self.etcd.get(key)
        for _ in range(_RETRIES):
            if kv is None:
                raise _not_found(name)
            if precondition is not None and precondition != str(kv.mod_revision):
                raise _conflict(name)
            current = _decode(kv)
            new = change(current)
            meta = _metadata(new)
            if meta.get("name", name) != name or meta.get("namespace", namespace) != namespace:
                raise _bad("metadata.name and namespace cannot change")
            cur_meta = current["metadata"]
            value = _stored(new, namespace, name, cur_meta["uid"], cur_meta["creationTimestamp"])
            revision, now = await self._timed(self.etcd.update(key, value, kv.mod_revision))
            if revision is not None:
                return _decode(KeyValue(key, value, kv.create_revision, revision, kv.version + 1))
            if precondition is not None:
                raise _conflict(name) if now is not None else _not_found(name)
            kv = now
        raise _conflict(name)

    # -- handlers ----------------------------------------------------------------

    async def _healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _create(self, request: web.Request) -> web.Response:
        namespace = request.match_info["namespace"]
        _check_namespace(namespace)
        _check_dry_run(request)
        body = _object(await _json_body(request), "a ConfigMap")
        meta = _metadata(body)
        name = meta.get("name") or ""
        if not name and meta.get("generateName"):
            name = f"{meta['generateName']}{uuid.uuid4().hex[:5]}"
        _check_name(name)
        if meta.get("namespace", namespace) != namespace:
            raise _bad("the namespace of the object does not match the request")
        if meta.get("resourceVersion"):  # the real server says 500 InternalError
            raise _bad("resourceVersion should not be set on objects to be created")
        key = _key(namespace, name)
        value = _stored(body, namespace, name, str(uuid.uuid4()), _now_rfc3339())
        revision, _ = await self._timed(self.etcd.create(key, value))
        if revision is None:
            raise _StatusError(
                409, "AlreadyExists", f'configmaps "{name}" already exists', name=name
            )
        return web.json_response(_decode(KeyValue(key, value, revision, revision, 1)), status=201)

    async def _get(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        kv = await self.etcd.get(_key(namespace, name))
        if kv is None:
            raise _not_found(name)
        return web.json_response(_decode(kv))

    async def _replace(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        _check_dry_run(request)
        body = _object(await _json_body(request), "a ConfigMap")
        meta = _metadata(body)
        if meta.get("name") != name:
            raise _StatusError(
                400, "BadRequest", "the name of the object does not match the name in the URL"
            )
        precondition = meta.get("resourceVersion") or None
        updated = await self._update(namespace, name, lambda current: body, precondition)
        return web.json_response(updated)

    async def _patch(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        _check_dry_run(request)
        patch = await _json_body(request, (MERGE_PATCH, STRATEGIC_MERGE_PATCH), typed=True)
        if not isinstance(patch, dict):
            raise _bad("a merge patch must be a JSON object")
        if _has_directive(patch):
            raise _bad("strategic-merge directives ($patch, ...) are not supported")
        meta = patch.get("metadata")
        precondition = meta.get("resourceVersion") if isinstance(meta, dict) else None
        if precondition is not None and not isinstance(precondition, str):
            raise _bad(
                f"metadata.resourceVersion: must be a string, got {_type_name(precondition)}"
            )
        updated = await self._update(
            namespace, name, lambda current: merge_patch(current, patch), precondition
        )
        return web.json_response(updated)

    async def _delete(self, request: web.Request) -> web.Response:
        namespace, name = request.match_info["namespace"], request.match_info["name"]
        _check_dry_run(request)
        rv, uid = _delete_options(await _json_body(request))
        key = _key(namespace, name)
        kv = await self.etcd.get(key)
        for _ in range(_RETRIES):
            if kv is None:
                raise _not_found(name)
            current = _decode(kv)
            if (rv and rv != str(kv.mod_revision)) or (uid and uid != current["metadata"]["uid"]):
                raise _conflict(name)
            revision, now = await self._timed(self.etcd.delete(key, kv.mod_revision))
            if revision is not None:
                details = {"name": name, "kind": "configmaps", "uid": current["metadata"]["uid"]}
                return web.json_response(_status(200, "", "", details))
            kv = now
        raise _conflict(name)

    async def _list_or_watch(self, request: web.Request) -> web.StreamResponse:
        namespace = request.match_info.get("namespace")
        prefix = f"{PREFIX}{namespace}/" if namespace else PREFIX
        query = request.query
        for selector in ("labelSelector", "fieldSelector"):
            if query.get(selector):
                raise _StatusError(400, "BadRequest", f"{selector} is not supported here")
        if query.get("resourceVersionMatch"):
            raise _StatusError(400, "BadRequest", "resourceVersionMatch is not supported here")
        if query.get("watch", "").lower() in ("true", "t", "1"):  # Go's ParseBool
            return await self._watch(request, prefix.encode())
        revision, kvs = await self.etcd.range(prefix.encode(), prefix=True)
        items = []
        for kv in kvs:
            obj = _decode(kv)
            del obj["kind"], obj["apiVersion"]
            items.append(obj)
        return web.json_response(
            {
                "kind": "ConfigMapList",
                "apiVersion": "v1",
                "metadata": {"resourceVersion": str(revision)},
                "items": items,
            }
        )

    async def _watch(self, request: web.Request, prefix: bytes) -> web.StreamResponse:
        rv = request.query.get("resourceVersion", "")
        timeout: float | None = None
        try:
            start = int(rv) + 1 if rv not in ("", "0") else 0
            if "timeoutSeconds" in request.query:
                timeout = float(int(request.query["timeoutSeconds"]))
        except ValueError:
            raise _StatusError(
                400, "BadRequest", "resourceVersion and timeoutSeconds must be integers"
            ) from None
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            line = json.dumps({"type": kind, "object": obj}, separators=(",", ":"))
            await response.write(line.encode() + b"\n")

        task = asyncio.current_task()
        assert task is not None
        self._watches.add(task)
        try:
            async with asyncio.timeout(timeout):
                if not start:
                    revision, kvs = await self.etcd.range(prefix, prefix=True)
                    for kv in kvs:
                        await send("ADDED", _decode(kv))
                    start = revision + 1
                try:
                    async for batch in self.etcd.watch(prefix, start):
                        for event in batch:
                            if event.type == "DELETE":
                                last = event.prev or _tombstone(event.kv)
                                await send("DELETED", _decode(last, event.kv.mod_revision))
                            else:
                                first = event.kv.create_revision == event.kv.mod_revision
                                await send("ADDED" if first else "MODIFIED", _decode(event.kv))
                except Compacted as exc:
                    message = f"too old resource version: {rv} ({exc.compact_revision})"
                    await send("ERROR", _status(410, "Expired", message))
        except TimeoutError:
            pass  # timeoutSeconds passed: end the stream cleanly
        except (ConnectionResetError, asyncio.CancelledError):
            with contextlib.suppress(Exception):
                await response.write_eof()
            raise
        finally:
            self._watches.discard(task)
        await response.write_eof()
        return response

    async def _trigger(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        name = request.match_info["name"]
        _check_name(name)
        key = _key("default", name)
        kv = await self.etcd.get(key)
        for _ in range(_RETRIES):
            if kv is None:
                value = _stored(
                    {"metadata": {}, "data": {"counter": "1"}},
                    "default",
                    name,
                    str(uuid.uuid4()),
                    _now_rfc3339(),
                )
                action = "created"
                revision, kv = await self._timed(self.etcd.create(key, value))
            else:
                obj = json.loads(kv.value)
                data = obj.setdefault("data", {})
                try:
                    data["counter"] = str(int(data.get("counter", "0")) + 1)
                except ValueError:
                    data["counter"] = "1"
                action = "updated"
                value = json.dumps(obj, separators=(",", ":")).encode()
                revision, kv = await self._timed(self.etcd.update(key, value, kv.mod_revision))
            if revision is not None:
                record = TriggerRecord(name, action, revision, started, time.monotonic())
                if self.on_trigger is not None:
                    self.on_trigger(record)
                return web.json_response(
                    {"action": action, "rv": revision, "took_ms": round(record.took * 1000, 3)}
                )
        raise _conflict(name)


def _check_dry_run(request: web.Request) -> None:
    if request.query.get("dryRun"):
        raise _bad("dryRun is not supported here")


def _object(body: Any, what: str) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise _bad(f"the body must be {what} object, got {_type_name(body)}")
    return body


def _delete_options(body: Any) -> tuple[str | None, str | None]:
    """A DeleteOptions body checked (none at all: the defaults); its preconditions'
    resourceVersion and uid. Propagation and grace periods mean nothing here (no
    dependents, no graceful deletion of a ConfigMap), so they are only checked."""
    options = {} if body is None else _object(body, "a DeleteOptions")
    if options.get("kind", "DeleteOptions") != "DeleteOptions":
        raise _bad("the body must be a DeleteOptions object")
    for field, (kind, what) in _DELETE_OPTION_TYPES.items():
        value = options.get(field)
        if value is None:
            continue
        if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
            raise _bad(f"{field}: must be {what}, got {_type_name(value)}")
    if options.get("dryRun"):
        raise _bad("dryRun is not supported here")
    policy = options.get("propagationPolicy")
    if policy is not None and policy not in _PROPAGATION:
        allowed = ", ".join(_PROPAGATION)
        raise _invalid(f"propagationPolicy: Unsupported value: {policy!r}: must be {allowed}")
    preconditions = options.get("preconditions") or {}
    rv, uid = preconditions.get("resourceVersion"), preconditions.get("uid")
    for field, value in (("resourceVersion", rv), ("uid", uid)):
        if value is not None and not isinstance(value, str):
            raise _bad(f"preconditions.{field}: must be a string, got {_type_name(value)}")
    return rv or None, uid or None


def _tombstone(kv: KeyValue) -> KeyValue:
    """A deleted object whose last value etcd no longer has: its name, no data."""
    _, namespace, name = kv.key.decode().rsplit("/", 2)
    value = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {}}
    value["metadata"] = {"name": name, "namespace": namespace}
    return KeyValue(kv.key, json.dumps(value).encode(), 0, kv.mod_revision, 0)
