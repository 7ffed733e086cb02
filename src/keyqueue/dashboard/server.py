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
from collections.abc import Callable, Sequence

from aiohttp import web

from .._web.app import runner
from .._web.listen import bind, url_for
from .app import create_app
from .monitor import Monitor

__all__ = ["serve"]


async def serve(
    names: Sequence[str],
    redis_url: str,
    *,
    host: str = "127.0.0.1",
    port: int = 8766,
    read_only: bool = False,
    ready: Callable[[str], None] = lambda url: None,
    durability: str = "primary",
) -> None:
    """Serve the dashboard of ``names`` on ``host:port`` (0: a free port) until
    cancelled; its actions write with ``durability`` (the queues')."""
    monitor = Monitor(names, redis_url, durability=durability)
    try:
        await monitor.first_reading()
        sock = bind(host, port)
    except BaseException:
        await monitor.close()
        raise
    app = create_app(monitor, token=secrets.token_urlsafe(32), read_only=read_only, hosts=(host,))
    served = runner(app)
    try:
        await served.setup()
        await web.SockSite(served, sock).start()
        ready(url_for(host, sock.getsockname()[1]))
        await asyncio.Event().wait()
    finally:
        await served.cleanup()
        sock.close()
