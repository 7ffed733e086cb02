"""A TCP proxy that loses the replies of chosen script calls, for real.

``CuttingProxy(upstream)`` listens on a free loopback port and forwards every
connection to ``upstream`` (a real server), both ways, reading the Redis
protocol (RESP2 and RESP3) in each direction so that it knows which reply
answers which request. ``cut(sha, calls)`` arms it: the replies to those
calls of the script whose SHA-1 is ``sha`` (counted from 1, over every
connection, in the order the server answered them; ``EVALSHA`` of it, or
``EVAL`` of its source, and only replies that are not errors, so only runs
of the script count; optionally only those whose request a predicate takes)
are dropped, and the client's connection is closed at
once: the script ran on the server, its reply never reaches the client.
``cuts`` records each: the script's name, its request and the reply the
client never saw. A thread per direction per connection; ``stop`` closes
everything and joins them.
"""

from __future__ import annotations

import hashlib
import socket
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Cut", "CuttingProxy", "RespError"]


class _Incomplete(Exception):
    """More bytes are needed for a whole frame."""


@dataclass(frozen=True)
class RespError:
    """An error reply (``-ERR ...`` or a blob error)."""

    message: bytes


def _line(buf: bytes | bytearray, i: int) -> tuple[bytes, int]:
    end = buf.find(b"\r\n", i)
    if end < 0:
        raise _Incomplete
    return bytes(buf[i:end]), end + 2


def parse(buf: bytes | bytearray, i: int = 0) -> tuple[Any, int]:
    """One RESP2/RESP3 frame at ``i``: its value and where it ends
    (``_Incomplete`` if ``buf`` does not hold all of it yet)."""
    if i >= len(buf):
        raise _Incomplete
    kind = buf[i : i + 1]
    line, j = _line(buf, i + 1)
    if kind in (b"+", b"(", b","):
        return line, j
    if kind == b"-":
        return RespError(line), j
    if kind == b":":
        return int(line), j
    if kind == b"#":
        return line == b"t", j
    if kind == b"_":
        return None, j
    if kind in (b"$", b"!", b"="):
        n = int(line)
        if n < 0:
            return None, j
        if len(buf) < j + n + 2:
            raise _Incomplete
        data = bytes(buf[j : j + n])
        return (RespError(data) if kind == b"!" else data), j + n + 2
    if kind in (b"*", b"~", b">", b"%", b"|"):
        n = int(line)
        if n < 0:
            return None, j
        items = []
        for _ in range(2 * n if kind in (b"%", b"|") else n):
            item, j = parse(buf, j)
            items.append(item)
        return items, j
    raise ValueError(f"not RESP: {bytes(buf[i : i + 20])!r}")


@dataclass
class Cut:
    """A reply the proxy dropped (the connection closed): whose, what was asked."""

    script: str
    request: list[bytes]
    reply: Any


@dataclass
class _Target:
    name: str
    sha: str
    calls: set[int]
    when: Callable[[list[bytes]], bool]
    counted: int = 0  # runs whose request ``when`` took
    ran: int = 0  # every run


@dataclass
class _Link:
    client: socket.socket
    server: socket.socket
    # What each request sent and not answered yet was: a target, or None.
    pending: deque[tuple[_Target | None, list[bytes]]] = field(default_factory=deque)
    closed: bool = False


class CuttingProxy:
    """See the module's docstring. A context manager."""

    def __init__(self, upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._targets: dict[str, _Target] = {}
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._stopped = False
        self.cuts: list[Cut] = []
        self.connections = 0

    def start(self) -> CuttingProxy:
        self._spawn(self._accept)
        return self

    def cut(
        self,
        name: str,
        sha: str,
        calls: set[int],
        when: Callable[[list[bytes]], bool] = lambda request: True,
    ) -> None:
        """Drop the replies to these runs (1-based) of the script ``sha`` (``name``
        labels it in ``cuts``), counting only the runs whose request (the
        command's words) ``when`` takes."""
        with self._lock:
            self._targets[sha] = _Target(name, sha, set(calls), when)

    def ran(self, sha: str) -> int:
        """How many runs of ``sha`` the server answered since ``cut`` armed it."""
        with self._lock:
            return self._targets[sha].ran

    def stop(self) -> None:
        with self._lock:
            self._stopped = True
            links = list(self._links)
        try:
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept (close does not)
        except OSError:
            pass
        self._listener.close()
        for link in links:
            self._close(link)
        for thread in self._threads:
            thread.join(10)

    def __enter__(self) -> CuttingProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- the threads ---------------------------------------------------------------------

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True, name="cutting-proxy")
        with self._lock:
            self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # stopped
            try:
                server = socket.create_connection(self.upstream)
            except OSError:
                client.close()
                continue
            for sock in (client, server):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            link = _Link(client, server)
            with self._lock:
                if self._stopped:
                    client.close()
                    server.close()
                    return
                self._links.append(link)
                self.connections += 1
            self._spawn(self._requests, link)
            self._spawn(self._replies, link)

    def _close(self, link: _Link) -> None:
        link.closed = True
        for sock in (link.client, link.server):
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _target(self, request: list[bytes]) -> _Target | None:
        if len(request) < 2 or not isinstance(request[0], bytes):
            return None
        command = request[0].upper()
        if command == b"EVALSHA":
            sha = request[1].decode().lower()
        elif command == b"EVAL":
            sha = hashlib.sha1(request[1]).hexdigest()
        else:
            return None
        return self._targets.get(sha)

    def _requests(self, link: _Link) -> None:
        """Client to server: note what each whole request is, then pass the
        bytes on (a request is noted before the server can have all of it)."""
        buf = bytearray()
        while True:
            try:
                data = link.client.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._close(link)
                return
            buf += data
            start = 0
            with self._lock:
                while True:
                    try:
                        request, end = parse(buf, start)
                    except _Incomplete:
                        break
                    link.pending.append((self._target(request), request))
                    start = end
            del buf[:start]
            try:
                link.server.sendall(data)
            except OSError:
                self._close(link)
                return

    def _replies(self, link: _Link) -> None:
        """Server to client: pass each whole reply on, or drop it and cut."""
        buf = bytearray()
        while True:
            try:
                data = link.server.recv(65536)
            except OSError:
                data = b""
            if not data:
                self._close(link)
                return
            buf += data
            start = 0
            out = bytearray()
            cut = False
            while not cut:
                try:
                    reply, end = parse(buf, start)
                except _Incomplete:
                    break
                frame = buf[start:end]
                kind = buf[start : start + 1]
                start = end
                if kind in (b">", b"|"):
                    out += frame  # a push or an attribute answers no request
                    continue
                with self._lock:
                    target, request = link.pending.popleft()
                    if target is not None and not isinstance(reply, RespError):
                        target.ran += 1
                        if target.when(request):
                            target.counted += 1
                            if target.counted in target.calls:
                                self.cuts.append(Cut(target.name, request, reply))
                                cut = True
                if not cut:
                    out += frame
            try:
                if out:
                    link.client.sendall(bytes(out))
            except OSError:
                self._close(link)
                return
            if cut:  # the replies before it reached the client; it and the rest never do
                self._close(link)
                return
            del buf[:start]
