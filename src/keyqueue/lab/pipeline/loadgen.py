"""The load generator's HTTP client: one keep-alive HTTP/1.1 connection, one request at a time.

The seed's load generator is k6 or curl, compiled clients whose own cost is a
few microseconds; a general Python client (aiohttp's: a session, a connector,
a response object, a stream reader) adds a good part of a millisecond on this
path, which would be counted as the API server's. This one writes the request
line and reads the answer straight from an ``asyncio.Protocol``: the status
line, ``Content-Length``, the body (JSON: ``{"action", "rv", "took_ms"}``).
It speaks only what the lab's ``/trigger`` answers (no chunked bodies).
"""

from __future__ import annotations

import asyncio
import json
from types import TracebackType
from typing import cast
from urllib.parse import urlsplit

__all__ = ["Client"]

TIMEOUT = 30.0
"""Seconds one request may take."""


class _Protocol(asyncio.Protocol):
    def __init__(self) -> None:
        self.buffer = bytearray()
        self.waiter: asyncio.Future[tuple[int, bytes]] | None = None
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is no subclass

    def data_received(self, data: bytes) -> None:
        buffer = self.buffer
        buffer += data
        end = buffer.find(b"\r\n\r\n")
        if end < 0 or self.waiter is None:
            return
        head = bytes(buffer[:end]).decode("latin-1").split("\r\n")
        length = 0
        for line in head[1:]:
            name, _, value = line.partition(":")
            if name.lower() == "content-length":
                length = int(value)
        if len(buffer) < end + 4 + length:
            return
        body = bytes(buffer[end + 4 : end + 4 + length])
        del buffer[: end + 4 + length]
        waiter, self.waiter = self.waiter, None
        if not waiter.done():
            waiter.set_result((int(head[0].split(" ", 2)[1]), body))

    def connection_lost(self, exc: Exception | None) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_exception(exc or ConnectionResetError("the server closed"))
        self.waiter = None


class Client:
    """``async with Client(url) as c: rv = await c.trigger("obj-7")``."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.protocol: _Protocol | None = None

    async def __aenter__(self) -> Client:
        loop = asyncio.get_running_loop()
        _, self.protocol = await loop.create_connection(_Protocol, self.host, self.port)
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.protocol is not None and self.protocol.transport is not None:
            self.protocol.transport.close()

    async def post(self, path: str) -> tuple[int, bytes]:
        """``POST path`` (no body); the status and the body."""
        protocol = self.protocol
        assert protocol is not None
        assert protocol.transport is not None
        if protocol.transport.is_closing():
            raise ConnectionResetError("the server closed")
        waiter: asyncio.Future[tuple[int, bytes]] = asyncio.get_running_loop().create_future()
        protocol.waiter = waiter
        protocol.transport.write(
            f"POST {path} HTTP/1.1\r\nHost: {self.host}:{self.port}\r\n"
            "Content-Length: 0\r\n\r\n".encode("latin-1")
        )
        async with asyncio.timeout(TIMEOUT):
            return await waiter

    async def trigger(self, name: str) -> int | None:
        """``POST /trigger/NAME``; the written resourceVersion, None if not a 200."""
        status, body = await self.post(f"/trigger/{name}")
        if status != 200:
            return None
        return int(json.loads(body)["rv"])
