"""Serve the dashboard on this thread's event loop until cancelled (Ctrl-C).

``serve`` reads every queue once first (the command has checked that the
server answers and that each queue exists), binds the socket (so "address in
use" is an ``OSError`` right there), then serves; ``ready(url)`` is called
once it does. On the way out (Ctrl-C cancels it) the page's event streams
end, the monitor stops and its clients close.
"""

from __future__ import annotations

import asyncio
import secrets
import socket
from collections.abc import Callable, Sequence

from aiohttp import web

from .._web.listen import url_for
from .app import create_app
from .monitor import Monitor

__all__ = ["SHUTDOWN_TIMEOUT", "serve"]

SHUTDOWN_TIMEOUT = 2.0
"""Seconds the server gives open requests to finish when it stops."""


async def serve(
    names: Sequence[str],
    redis_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8766,
    read_only: bool = False,
    ready: Callable[[str], None] = lambda url: None,
) -> None:
    """Serve the dashboard of ``names`` on ``host:port`` (0: a free port) until cancelled."""
    monitor = Monitor(names, redis_url)
    try:
        await monitor.first_reading()
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family)
    except BaseException:
        await monitor.close()
        raise
    app = create_app(monitor, token=secrets.token_urlsafe(32), read_only=read_only, hosts=(host,))
    runner = web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)
    try:
        await runner.setup()
        await web.SockSite(runner, sock).start()
        ready(url_for(host, sock.getsockname()[1]))
        await asyncio.Event().wait()
    finally:
        await runner.cleanup()
        sock.close()
