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
  It starts from the version it last wrote or read (as the real server's
  update starts from its watch cache's copy): one etcd transaction, guarded
  by that version's revision; only when the guard fails (someone else wrote)
  does it go on from the current value the transaction returned.

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

Lists and watches take the real server's options (checked in ``listing``):

- ``limit`` and ``continue``: a list of at most ``limit`` objects, with
  ``metadata.continue`` (and ``remainingItemCount`` without selectors) when
  more remain. Every page is an etcd range at the first page's revision, so
  the pages are one consistent snapshot; a token whose revision etcd has
  compacted is a 410 ``Expired`` Status carrying a fresh (inconsistent)
  token in its ``metadata.continue``, as the real server's.
- ``resourceVersionMatch=Exact`` lists at that revision (410 ``Expired`` once
  compacted, 504 ``Timeout`` if it is still in the future); ``NotOlderThan``,
  or a ``resourceVersion`` alone, lists the newest state, never older.
- ``labelSelector`` (equality-based) and ``fieldSelector``
  (``metadata.name``, ``metadata.namespace``) filter lists, initial events and
  watch events; an object that starts or stops matching is ADDED or DELETED
  for that watch. Set-based label selectors and other fields are a 400.
- ``allowWatchBookmarks=true``: a BOOKMARK (an object with only
  ``metadata.resourceVersion``) every ``bookmark_interval`` seconds (60), the
  revision moved or not, and when the watch's ``timeoutSeconds`` runs out, at
  a revision etcd's progress notification vouches for: every change up to it
  under the watched prefix was sent, so a client idle in a quiet namespace
  resumes from a recent revision and does not hit 410 after a compaction.
- ``sendInitialEvents=true`` with ``resourceVersionMatch=NotOlderThan`` (a
  streaming list, "WatchList"): the current objects as ADDED, read from etcd
  a page at a time at one revision, then a BOOKMARK at that revision
  annotated ``k8s.io/initial-events-end: "true"``, then the watch. With
  ``watch_list=False`` the server refuses it with 422, as one without the
  feature does.

Content types: create, replace and delete bodies are JSON, sent as
``application/json`` or with no ``Content-Type`` at all (the Python client
sends none); anything else is a 415. Patches are
``application/merge-patch+json`` (RFC 7386) or
``application/strategic-merge-patch+json``, which for a ConfigMap means the
same: maps (``data``, labels, annotations) merge, ``null`` deletes a key.
Strategic-merge directives (``$patch`` and friends) and JSON patches are
refused.

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
generator) are not affected (``keyqueue._web.guard`` decides for both lab
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from ..._web.guard import check_request
from .etcd import Compacted, Etcd, EtcdError, KeyValue, ProgressWatch, WatchEvent, prefix_end
from .listing import (
    INITIAL_EVENTS_END,
    ListOptions,
    OptionError,
    Selector,
    WatchOptions,
    encode_continue,
    list_options,
    watch_options,
)

__all__ = ["BOOKMARK_INTERVAL", "MAX_DEPTH", "PREFIX", "ApiServer", "TriggerRecord", "merge_patch"]

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
_PAGE = 500  # objects read from etcd at a time for a watch's initial events
_LAST_BOOKMARK_WAIT = 1.0  # seconds a watch whose time is up waits for its last bookmark
BOOKMARK_INTERVAL = 60.0
"""Seconds between a watch's bookmarks (when asked for), as the real server's ~1 minute."""


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
        self.metadata: dict[str, str] = {}  # the Status's metadata (a fresh continue token)


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
    status = _status(exc.code, exc.reason, exc.message, exc.details or None)
    status["metadata"] = dict(exc.metadata)
    return web.json_response(status, status=exc.code)


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
    ``bookmark_interval``: seconds between the BOOKMARKs of a watch that asked
    for them. ``watch_list=False`` answers a streaming list (``sendInitialEvents``)
    with 422, as a server without the WatchList feature does.
    """

    def __init__(
        self,
        etcd: Etcd,
        *,
        on_write: Callable[[int, float, float], None] | None = None,
        on_trigger: Callable[[TriggerRecord], None] | None = None,
        bookmark_interval: float = BOOKMARK_INTERVAL,
        watch_list: bool = True,
    ) -> None:
        self.etcd = etcd
        self.on_write = on_write
        self.on_trigger = on_trigger
        self.bookmark_interval = bookmark_interval
        self.watch_list = watch_list
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._watches: set[asyncio.Task[Any]] = set()
        self.watch_opened = asyncio.Event()  # set when the first watch opens
        self._triggered: dict[bytes, KeyValue] = {}  # key -> what /trigger last wrote there
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
        try:
            if query.get("watch", "").lower() in ("true", "t", "1"):  # Go's ParseBool
                options = watch_options(query)
                if options.send_initial_events and not self.watch_list:
                    raise _invalid(
                        "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for "
                        "watch unless the WatchList feature gate is enabled"
                    )
                return await self._watch(request, prefix, options)
            return await self._list(prefix, list_options(query))
        except OptionError as exc:
            raise _StatusError(exc.code, _REASONS[exc.code], exc.message) from None

    async def _list(self, prefix: str, options: ListOptions) -> web.Response:
        """One page (``limit``), or everything, of the objects under ``prefix`` that
        match the selector; every page of a list is read at its first page's revision."""
        start, end = (prefix + options.start).encode(), prefix_end(prefix.encode())
        revision, items = options.revision, []
        meta: dict[str, Any] = {}
        while True:
            try:
                page = await self.etcd.range_page(
                    start, end, limit=options.limit, revision=revision
                )
            except Compacted:
                raise await self._expired(prefix, options) from None
            except EtcdError as exc:
                if "future revision" not in str(exc):
                    raise
                current = await self.etcd.revision()
                raise _StatusError(
                    504,
                    "Timeout",
                    f"Too large resource version: {revision}, current: {current}",
                ) from None
            revision = page.revision
            for i, kv in enumerate(page.kvs):
                obj = _decode(kv)
                if options.selector and not options.selector.matches(obj):
                    continue
                del obj["kind"], obj["apiVersion"]
                items.append(obj)
                if len(items) == options.limit:
                    if i + 1 < len(page.kvs) or page.more:
                        meta["continue"] = encode_continue(revision, _after(kv.key, prefix))
                        if not options.selector:
                            meta["remainingItemCount"] = page.count - i - 1
                    break
            else:
                if page.more and page.kvs:
                    start = page.kvs[-1].key + b"\0"
                    continue
            break
        meta = {"resourceVersion": str(revision), **meta}
        return web.json_response(
            {"kind": "ConfigMapList", "apiVersion": "v1", "metadata": meta, "items": items}
        )

    async def _expired(self, prefix: str, options: ListOptions) -> _StatusError:
        """The 410 for a list at a compacted revision (an old continue token: with a
        token that continues, inconsistently, at the newest revision)."""
        if not options.start:
            return _StatusError(410, "Expired", f"too old resource version: {options.revision}")
        error = _StatusError(
            410,
            "Expired",
            "The provided continue parameter is too old to display a consistent list result. "
            "You can start a new list without the continue parameter, or use the continue "
            "token in this response to retrieve the remainder of the results. Continuing "
            "with the provided token results in an inconsistent list - objects that were "
            "created, modified, or deleted between the time the first chunk was returned "
            "and now may show up in the list.",
        )
        error.metadata["continue"] = encode_continue(await self.etcd.revision(), options.start)
        return error

    async def _initial(
        self, prefix: bytes, selector: Selector, write: Callable[[bytes], Awaitable[None]]
    ) -> int:
        """Send every object under ``prefix`` as ADDED, read a page at a time at one
        revision and written a page at a time; that revision."""
        start, end, revision = prefix, prefix_end(prefix), 0
        while True:
            page = await self.etcd.range_page(start, end, limit=_PAGE, revision=revision)
            revision = page.revision
            objs = (_decode(kv) for kv in page.kvs)
            lines = b"".join(_line("ADDED", o) for o in objs if selector.matches(o))
            if lines:
                await write(lines)
            if not (page.more and page.kvs):
                return revision
            start = page.kvs[-1].key + b"\0"

    async def _watch(
        self, request: web.Request, prefix: str, options: WatchOptions
    ) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)

        async def send(kind: str, obj: dict[str, Any]) -> None:
            await response.write(_line(kind, obj))

        task = asyncio.current_task()
        assert task is not None
        self._watches.add(task)
        self.watch_opened.set()
        loop = asyncio.get_running_loop()
        deadline = None if options.timeout is None else loop.time() + options.timeout
        selector, key_prefix = options.selector, prefix.encode()
        try:
            async with asyncio.timeout_at(deadline):
                last = options.revision
                if options.send_initial_events or not last:
                    last = await self._initial(key_prefix, selector, response.write)
                    if options.send_initial_events:
                        await send("BOOKMARK", _bookmark(last, initial_events_end=True))
            async with await self.etcd.watch_progress(key_prefix, last + 1) as watch:
                ticker = asyncio.create_task(self._tick(watch)) if options.bookmarks else None
                try:
                    final = False  # the watch's time is up; waiting for its last bookmark
                    while True:
                        try:
                            async with asyncio.timeout_at(deadline):
                                batch = await watch.next()
                        except TimeoutError:
                            if final or not options.bookmarks:
                                break
                            final, deadline = True, loop.time() + _LAST_BOOKMARK_WAIT
                            await watch.request_progress()
                            continue
                        if batch.progress:
                            if options.bookmarks:  # each interval, moved on or not
                                last = max(last, batch.revision)
                                await send("BOOKMARK", _bookmark(last))
                            if final:
                                break
                        for event in batch.events:
                            last = event.kv.mod_revision
                            change = _change(event, selector)
                            if change is not None:
                                await send(*change)
                finally:
                    if ticker is not None:
                        ticker.cancel()
                        with contextlib.suppress(asyncio.CancelledError, Exception):
                            await ticker
        except Compacted as exc:
            message = f"too old resource version: {options.revision} ({exc.compact_revision})"
            await send("ERROR", _status(410, "Expired", message))
        except TimeoutError:
            pass  # timeoutSeconds passed during the initial events: end the stream cleanly
        except (ConnectionResetError, asyncio.CancelledError):
            with contextlib.suppress(Exception):
                await response.write_eof()
            raise
        finally:
            self._watches.discard(task)
        await response.write_eof()
        return response

    async def _tick(self, watch: ProgressWatch) -> None:
        """Ask for progress every ``bookmark_interval``: each answer is a BOOKMARK."""
        while True:
            await asyncio.sleep(self.bookmark_interval)
            await watch.request_progress()

    async def _trigger(self, request: web.Request) -> web.Response:
        started = time.monotonic()
        name = request.match_info["name"]
        _check_name(name)
        key = _key("default", name)
        kv = self._triggered.get(key) or await self.etcd.get(key)
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
                self._triggered[key] = KeyValue(key, value, 0, revision, 0)  # revision: the guard
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


def _line(kind: str, obj: dict[str, Any]) -> bytes:
    """One watch event as the stream carries it: a JSON line."""
    return json.dumps({"type": kind, "object": obj}, separators=(",", ":")).encode() + b"\n"


def _after(key: bytes, prefix: str) -> str:
    """Where the page after ``key`` starts, relative to the list's ``prefix``."""
    return key.decode()[len(prefix) :] + "\0"


def _bookmark(revision: int, *, initial_events_end: bool = False) -> dict[str, Any]:
    """A BOOKMARK's object: only ``metadata.resourceVersion`` (and the annotation
    that ends a streaming list's initial events)."""
    meta: dict[str, Any] = {"resourceVersion": str(revision)}
    if initial_events_end:
        meta["annotations"] = {INITIAL_EVENTS_END: "true"}
    return {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta}


def _change(event: WatchEvent, selector: Selector) -> tuple[str, dict[str, Any]] | None:
    """The watch event for an etcd event, as a client with ``selector`` sees it: an
    object that starts matching is ADDED, one that stops matching DELETED."""
    if event.type == "DELETE":
        last = _decode(event.prev or _tombstone(event.kv), event.kv.mod_revision)
        return ("DELETED", last) if not selector or selector.matches(last) else None
    obj = _decode(event.kv)
    first = event.kv.create_revision == event.kv.mod_revision
    if not selector:
        return ("ADDED" if first else "MODIFIED"), obj
    now = selector.matches(obj)
    before = not first and event.prev is not None and selector.matches(_decode(event.prev))
    if now:
        return ("MODIFIED" if before else "ADDED"), obj
    return ("DELETED", obj) if before else None


def _tombstone(kv: KeyValue) -> KeyValue:
    """A deleted object whose last value etcd no longer has: its name, no data."""
    _, namespace, name = kv.key.decode().rsplit("/", 2)
    value = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": {}}
    value["metadata"] = {"name": name, "namespace": namespace}
    return KeyValue(kv.key, json.dumps(value).encode(), 0, kv.mod_revision, 0)
