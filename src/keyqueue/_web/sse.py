"""One live picture as Server-Sent Events: ``lab web``'s trace and ``keyqueue dashboard``.

``event_stream(request, source)`` sends ``source.snapshot(seen)`` (as one
``data:`` event) each time ``source.rev`` moves past what the page has seen,
and a comment every ``KEEPALIVE`` seconds of quiet (so a closed page is
found); it ends when ``source.closing`` (the server is stopping) or the page
goes away. The first snapshot is asked with ``seen = -1``: a source can send
more in it (the dashboard's history).
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from aiohttp import web

__all__ = ["KEEPALIVE", "Source", "event_stream"]

KEEPALIVE = 15.0
"""Seconds between comments on an idle event stream (finds closed pages)."""


class Source(Protocol):
    """What an event stream reads: a revision, a picture and a way to wait for the next."""

    @property
    def rev(self) -> int: ...

    @property
    def closing(self) -> bool: ...

    def snapshot(self, since: int = -1) -> dict[str, Any]:
        """The picture, with its ``"rev"``, for a page that has seen ``since``."""
        ...

    async def wait_change(self, rev: int, timeout: float) -> None:
        """Return once ``rev`` is passed, the source is closing, or ``timeout`` passes."""
        ...


async def event_stream(request: web.Request, source: Source) -> web.StreamResponse:
    """Stream ``source`` to the page that asked, until it closes or the page goes away."""
    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    seen = -1
    try:
        while not source.closing:
            if source.rev > seen:
                snapshot = source.snapshot(seen)
                seen = snapshot["rev"]
                await response.write(f"data: {json.dumps(snapshot)}\n\n".encode())
            else:
                await response.write(b": keepalive\n\n")
            await source.wait_change(seen, KEEPALIVE)
    except ConnectionError:
        pass  # the page went away
    return response
