"""Run the instrument's app on its own thread and event loop, as a context manager.

``with WebServer(host, port) as server:`` binds the socket in the caller's
thread (so "address in use" is an ``OSError`` right there), serves from a
daemon thread, and on exit (normal, exception or Ctrl-C) ends the page's
event streams, stops the live queue and joins the thread. ``port=0`` picks a
free port; ``server.url`` says which. The CLI and the tests use the same class.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from types import TracebackType

from aiohttp import web

from ..._web.app import SHUTDOWN_TIMEOUT, runner
from ..._web.listen import bind, url_for
from .app import create_app

__all__ = ["WebServer"]

STARTUP_TIMEOUT = 30.0


class WebServer:
    """Serve the instrument on ``host:port`` from a background thread while in ``with``."""

    def __init__(
        self, host: str = "127.0.0.1", port: int = 8765, *, workers: int = 2, reconcile: float = 0.8
    ) -> None:
        self.host = host
        self.port = port
        # Checks the options; the page is served at ``host`` (a name, or 0.0.0.0) too.
        self._app = create_app(workers=workers, reconcile=reconcile, hosts=(host,))
        self._thread: threading.Thread | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

    @property
    def url(self) -> str:
        return url_for(self.host, self.port)

    def __enter__(self) -> WebServer:
        sock = bind(self.host, self.port)
        self.port = sock.getsockname()[1]
        self._thread = threading.Thread(
            target=asyncio.run, args=(self._serve(sock),), name="keyqueue-lab-web", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(STARTUP_TIMEOUT):
            self.close()
            raise RuntimeError(f"the lab's web server did not start within {STARTUP_TIMEOUT:g}s")
        if self._error is not None:
            self.close()
            raise self._error
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop serving and wait for the thread (idempotent)."""
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(stop.set)
            except RuntimeError:  # the loop closed meanwhile
                pass
        if thread is not None:
            thread.join(SHUTDOWN_TIMEOUT + 10)
            if thread.is_alive():
                raise RuntimeError("the lab's web server did not stop")
        self._thread = None

    async def _serve(self, sock: socket.socket) -> None:
        served = runner(self._app)
        try:
            self._stop = asyncio.Event()
            self._loop = asyncio.get_running_loop()
            await served.setup()
            await web.SockSite(served, sock).start()
        except BaseException as exc:
            self._error = exc
            sock.close()
            self._ready.set()
            await served.cleanup()
            return
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await served.cleanup()
            sock.close()
