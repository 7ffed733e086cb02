"""etcd for the pipeline: a client for its JSON gateway (the launcher is ``keyqueue.testing``'s).

Theory of operation
-------------------
The pipeline starts its etcd with ``keyqueue.testing.local_etcd`` (unless
given ``--etcd``). This client raises that module's ``EtcdError`` (re-exported
here) when etcd answers with an error, as the launcher does when etcd does not
start, so one ``except`` covers etcd however it fails.

``Etcd`` talks to etcd's own JSON gateway (the v3 API over HTTP:
``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/watch`` as a stream of JSON lines)
through aiohttp, which the API server and the load generator use anyway: no
gRPC, no generated protobuf modules. The gateway spells bytes as base64 and
64-bit integers as strings, and leaves out fields at their default (a PUT
event has no ``type``). The price is one more hop inside etcd (gateway to its
own gRPC server), about half a millisecond per write on a small machine.

``range_page`` reads one page of a range (``limit``, at a pinned revision:
the API server's paginated lists); a page at a compacted revision raises
``Compacted``. ``watch_progress`` opens a watch over the gateway's websocket
(``/v3/watch`` upgraded), the one way through it to etcd's bidirectional
watch stream: there ``request_progress()`` asks etcd for a progress
notification, an empty batch whose revision says every change under the
prefix up to it has been delivered. That revision is what the API server's
BOOKMARK events carry, so a watch of an idle namespace still moves forward
while other namespaces are written. etcd (3.5) answers a progress request only
while the watch is caught up; an unanswered one just means no bookmark yet.

Every write is a transaction guarded by a revision, so the API server gets
Kubernetes' optimistic concurrency: create succeeds only if the key does not
exist, update and delete only if its ``mod_revision`` is still the one read.
A watch from a compacted revision raises ``Compacted``.
"""

from __future__ import annotations

import base64
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp

from keyqueue.testing import EtcdError

__all__ = [
    "Compacted",
    "Etcd",
    "EtcdError",
    "KeyValue",
    "ProgressWatch",
    "RangePage",
    "WatchBatch",
    "WatchEvent",
    "prefix_end",
]

CONNECT_TIMEOUT = 3.0
"""Seconds a connection to etcd may take to open (an address that drops SYNs)."""
REQUEST_TIMEOUT = 10.0
"""Seconds a unary call (put, txn, range) may take before it is an error."""
_UNARY = aiohttp.ClientTimeout(total=REQUEST_TIMEOUT, connect=CONNECT_TIMEOUT)
_READ_BUFFER = 1 << 22  # one watch line can carry many events
_MAX_TXN_OPS = 128  # etcd's default --max-txn-ops


class Compacted(EtcdError):
    """A watch asked for a revision etcd has already compacted away."""

    def __init__(self, requested: int, compact_revision: int = 0) -> None:
        oldest = f" (the oldest available is {compact_revision})" if compact_revision else ""
        super().__init__(f"revision {requested} is compacted{oldest}")
        self.requested = requested
        self.compact_revision = compact_revision


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def prefix_end(prefix: bytes) -> bytes:
    """The ``range_end`` that makes a range or watch cover every key starting with ``prefix``."""
    end = bytearray(prefix)
    while end:
        if end[-1] < 0xFF:
            end[-1] += 1
            return bytes(end)
        end.pop()
    return b"\0"  # every key


@dataclass(frozen=True, slots=True)
class KeyValue:
    key: bytes
    value: bytes
    create_revision: int
    mod_revision: int
    version: int

    @classmethod
    def from_json(cls, kv: dict[str, Any]) -> KeyValue:
        return cls(
            key=base64.b64decode(kv.get("key", "")),
            value=base64.b64decode(kv.get("value", "")),
            create_revision=int(kv.get("create_revision", 0)),
            mod_revision=int(kv.get("mod_revision", 0)),
            version=int(kv.get("version", 0)),
        )


@dataclass(frozen=True, slots=True)
class WatchEvent:
    """One change: ``PUT`` (``kv`` is the new value) or ``DELETE`` (``kv.mod_revision``
    is the deletion's revision, ``prev`` the value before it)."""

    type: str
    kv: KeyValue
    prev: KeyValue | None


@dataclass(frozen=True, slots=True)
class RangePage:
    """One page of a range: ``kvs`` in key order as of ``revision``; ``more`` if keys
    past the last one remain; ``count`` keys in the whole range from its start."""

    revision: int
    kvs: list[KeyValue]
    more: bool
    count: int


@dataclass(frozen=True, slots=True)
class WatchBatch:
    """What one watch response brought: ``events`` (none for a progress
    notification) and etcd's revision when it sent them. For a progress
    notification every change up to ``revision`` has been delivered."""

    events: list[WatchEvent]
    revision: int

    @property
    def progress(self) -> bool:
        return not self.events


def _watch_request(prefix: bytes, start_revision: int) -> dict[str, Any]:
    return {
        "create_request": {
            "key": _b64(prefix),
            "range_end": _b64(prefix_end(prefix)),
            "start_revision": str(start_revision),
            "prev_kv": True,
        }
    }


def _watch_result(message: dict[str, Any], start_revision: int) -> dict[str, Any]:
    """A watch response's result; raises ``Compacted``, or ``EtcdError`` if etcd
    ended the watch."""
    if "error" in message:
        raise EtcdError(f"etcd /v3/watch: {message['error']}")
    result: dict[str, Any] = message.get("result", {})
    compacted = int(result.get("compact_revision", 0))
    if compacted:
        raise Compacted(start_revision, compacted)
    if result.get("canceled"):
        raise EtcdError(f"etcd cancelled the watch: {result.get('cancel_reason')}")
    return result


def _events(result: dict[str, Any]) -> list[WatchEvent]:
    return [
        WatchEvent(
            type=event.get("type", "PUT"),
            kv=KeyValue.from_json(event["kv"]),
            prev=KeyValue.from_json(event["prev_kv"]) if "prev_kv" in event else None,
        )
        for event in result.get("events") or ()
    ]


class ProgressWatch:
    """A watch on etcd's websocket gateway: ``await next()`` for each batch,
    ``await request_progress()`` for a progress notification; ``close()`` ends it
    (or use ``async with``). Made by ``Etcd.watch_progress``."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse, start_revision: int) -> None:
        self._ws = ws
        self._start = start_revision

    async def request_progress(self) -> None:
        """Ask etcd for a progress notification (answered only while caught up)."""
        await self._ws.send_str('{"progress_request":{}}')

    async def next(self) -> WatchBatch:
        """The next batch. Cancelling this wait loses nothing. Raises ``Compacted``
        if the start revision is compacted away, ``EtcdError`` if etcd ends the
        watch."""
        while True:
            message = await self._ws.receive()
            if message.type is not aiohttp.WSMsgType.TEXT:
                raise EtcdError(f"etcd closed the watch stream ({message.type.name})")
            result = _watch_result(json.loads(message.data), self._start)
            if result.get("created") and not result.get("events"):
                continue
            return WatchBatch(_events(result), int(result.get("header", {}).get("revision", 0)))

    async def close(self) -> None:
        await self._ws.close()

    async def __aenter__(self) -> ProgressWatch:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Etcd:
    """A client for etcd's JSON gateway at ``url`` (``http://host:port``).

    Call its coroutines on one event loop; ``close()`` when done (or use
    ``async with``). Errors from etcd raise ``EtcdError``; connection errors
    are aiohttp's.
    """

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")
        self._session: aiohttp.ClientSession | None = None

    @property
    def session(self) -> aiohttp.ClientSession:  # no total timeout: the watch streams
        if self._session is None:
            self._session = aiohttp.ClientSession(
                read_bufsize=_READ_BUFFER,
                timeout=aiohttp.ClientTimeout(total=None, connect=CONNECT_TIMEOUT),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> Etcd:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _call(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        async with self.session.post(f"{self.url}{path}", json=body, timeout=_UNARY) as response:
            data: dict[str, Any] = await response.json(content_type=None)
        if response.status != 200 or "error" in data or "code" in data:
            raise EtcdError(f"etcd {path}: {data.get('message') or data.get('error') or data}")
        return data

    async def revision(self) -> int:
        """The store's current revision."""
        data = await self._call("/v3/kv/range", {"key": _b64(b"\0"), "count_only": True})
        return int(data["header"]["revision"])

    async def range(
        self, key: bytes, *, prefix: bool = False, revision: int = 0
    ) -> tuple[int, list[KeyValue]]:
        """``(revision, kvs)``: the value of ``key`` (or every key under it with
        ``prefix=True``) in key order, as of ``revision`` (0: now)."""
        body: dict[str, Any] = {"key": _b64(key)}
        if prefix:
            body["range_end"] = _b64(prefix_end(key))
        if revision:
            body["revision"] = str(revision)
        data = await self._call("/v3/kv/range", body)
        kvs = [KeyValue.from_json(kv) for kv in data.get("kvs", ())]
        return int(data["header"]["revision"]), kvs

    async def range_page(
        self, start: bytes, end: bytes, *, limit: int = 0, revision: int = 0
    ) -> RangePage:
        """The keys in ``[start, end)``, at most ``limit`` of them (0: all), as of
        ``revision`` (0: now; the page's ``revision`` says which that was). Raises
        ``Compacted`` if ``revision`` is compacted away."""
        body: dict[str, Any] = {"key": _b64(start), "range_end": _b64(end)}
        if limit:
            body["limit"] = str(limit)
        if revision:
            body["revision"] = str(revision)
        range_url = f"{self.url}/v3/kv/range"
        async with self.session.post(range_url, json=body, timeout=_UNARY) as response:
            data: dict[str, Any] = await response.json(content_type=None)
        if response.status != 200 or "error" in data or "code" in data:
            message = str(data.get("message") or data.get("error") or data)
            if "compacted" in message:
                raise Compacted(revision)
            raise EtcdError(f"etcd /v3/kv/range: {message}")
        kvs = [KeyValue.from_json(kv) for kv in data.get("kvs", ())]
        at = revision or int(data["header"]["revision"])
        return RangePage(at, kvs, bool(data.get("more", False)), int(data.get("count", 0)))

    async def put_all(self, items: list[tuple[bytes, bytes]]) -> int:
        """Put every ``(key, value)``, unconditionally, ``_MAX_TXN_OPS`` to a
        transaction (loading test data); the last transaction's revision."""
        revision = 0
        for i in range(0, len(items), _MAX_TXN_OPS):
            puts = [
                {"request_put": {"key": _b64(key), "value": _b64(value)}}
                for key, value in items[i : i + _MAX_TXN_OPS]
            ]
            data = await self._call("/v3/kv/txn", {"success": puts})
            revision = int(data["header"]["revision"])
        return revision

    async def watch_progress(self, prefix: bytes, start_revision: int) -> ProgressWatch:
        """A ``ProgressWatch`` of every change under ``prefix`` from ``start_revision``
        (close it, or use ``async with``)."""
        url = self.url.replace("http", "ws", 1) + "/v3/watch"
        ws = await self.session.ws_connect(url, max_msg_size=0, autoping=True)
        body = _watch_request(prefix, start_revision)
        try:
            await ws.send_str(json.dumps(body))
        except BaseException:
            await ws.close()
            raise
        return ProgressWatch(ws, start_revision)

    async def get(self, key: bytes) -> KeyValue | None:
        """The value of ``key``, or None."""
        kvs = (await self.range(key))[1]
        return kvs[0] if kvs else None

    async def _txn(
        self, compare: dict[str, Any], success: dict[str, Any], key: bytes
    ) -> tuple[bool, int, KeyValue | None, KeyValue | None]:
        """``(succeeded, revision, current, deleted)``: on failure ``current`` is the
        key's value now (None if absent); on a successful delete ``deleted`` is the
        value it removed."""
        body = {
            "compare": [compare],
            "success": [success],
            "failure": [{"request_range": {"key": _b64(key)}}],
        }
        data = await self._call("/v3/kv/txn", body)
        revision = int(data["header"]["revision"])
        responses = data.get("responses", [{}])
        if not data.get("succeeded", False):
            kvs = responses[0].get("response_range", {}).get("kvs", ())
            return False, revision, (KeyValue.from_json(kvs[0]) if kvs else None), None
        prev = responses[0].get("response_delete_range", {}).get("prev_kvs", ())
        return True, revision, None, (KeyValue.from_json(prev[0]) if prev else None)

    async def create(self, key: bytes, value: bytes) -> tuple[int | None, KeyValue | None]:
        """Put ``key`` only if it does not exist: ``(revision, None)``, or
        ``(None, current)`` if it does."""
        ok, revision, current, _ = await self._txn(
            {"target": "CREATE", "key": _b64(key), "create_revision": "0", "result": "EQUAL"},
            {"request_put": {"key": _b64(key), "value": _b64(value)}},
            key,
        )
        return (revision, None) if ok else (None, current)

    async def update(
        self, key: bytes, value: bytes, mod_revision: int
    ) -> tuple[int | None, KeyValue | None]:
        """Put ``key`` only if its mod revision is still ``mod_revision``:
        ``(revision, None)``, or ``(None, current)`` (current is None if absent)."""
        ok, revision, current, _ = await self._txn(
            {"target": "MOD", "key": _b64(key), "mod_revision": str(mod_revision)},
            {"request_put": {"key": _b64(key), "value": _b64(value)}},
            key,
        )
        return (revision, None) if ok else (None, current)

    async def delete(self, key: bytes, mod_revision: int) -> tuple[int | None, KeyValue | None]:
        """Delete ``key`` only if its mod revision is still ``mod_revision``:
        ``(revision, deleted)``, or ``(None, current)``."""
        ok, revision, current, deleted = await self._txn(
            {"target": "MOD", "key": _b64(key), "mod_revision": str(mod_revision)},
            {"request_delete_range": {"key": _b64(key), "prev_kv": True}},
            key,
        )
        return (revision, deleted) if ok else (None, current)

    async def compact(self, revision: int) -> None:
        """Discard history before ``revision`` (watches from older revisions fail)."""
        await self._call("/v3/kv/compaction", {"revision": str(revision), "physical": True})

    async def watch(self, prefix: bytes, start_revision: int) -> AsyncIterator[list[WatchEvent]]:
        """Every change under ``prefix`` from ``start_revision`` on, a batch at a time.

        Runs until the caller stops iterating (which cancels the watch in etcd).
        Raises ``Compacted`` if ``start_revision`` is compacted away, ``EtcdError``
        if etcd cancels the watch for another reason.
        """
        body = _watch_request(prefix, start_revision)
        async with self.session.post(f"{self.url}/v3/watch", json=body) as response:
            if response.status != 200:
                raise EtcdError(f"etcd /v3/watch: HTTP {response.status}")
            async for line in response.content:
                if not line.strip():
                    continue
                result = _watch_result(json.loads(line), start_revision)
                events = _events(result)
                if events:
                    yield events
        raise EtcdError("etcd closed the watch stream")
