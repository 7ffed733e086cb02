"""The dashboard's aiohttp app: one page, its static files, the state and three actions.

- ``GET /``: the page (``static/index.html``, with this server's CSRF token
  and whether it is read-only written into it); ``GET /static/app.js|app.css``
  and the files every page shares (``keyqueue._web.static``).
- ``GET /api/state``: every queue's latest reading and its history;
  ``GET /api/events``: the same as Server-Sent Events, the history in the
  first event only, then one event per reading (each second).
- ``POST /api/retry``, ``POST /api/forget`` and ``POST /api/replay`` (a
  dead key), body ``{"queue", "key"}`` as ``application/json``, header
  ``X-Keyqueue-Token``: the three actions, answered ``{"ok": true,
  "message": what it did}``. Not served with ``read_only`` (403).

Who is answered, the token, the JSON content type, the error body and the
security headers are ``keyqueue._web.app``'s, as for the lab's page: a
``Host`` that is not this server 421, an ``Origin`` that is not its own 403,
a POST without the page's token 403, without JSON's content type 415; errors
are ``{"error": ...}``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable

from aiohttp import web

from .._web.app import GUARD, TOKEN_HEADER, Guard, application, json_body
from .._web.sse import event_stream
from .._web.static import StaticFiles
from .monitor import Monitor

__all__ = ["MONITOR", "TOKEN_HEADER", "create_app"]

MONITOR = web.AppKey("monitor", Monitor)
READ_ONLY = "this dashboard is read-only (started with --read-only)"
_FILES = StaticFiles(__package__ or "", ("app.js", "app.css"))
_BODY = '{"queue": ..., "key": ...}'


async def _page(request: web.Request) -> web.Response:
    guard = request.app[GUARD]
    html = _FILES.read("index.html").decode()
    html = html.replace("__TOKEN__", guard.token or "").replace(
        "__READ_ONLY__", "true" if guard.read_only is not None else "false"
    )
    return web.Response(text=html, content_type="text/html", charset="utf-8")


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[MONITOR].snapshot())


async def _events(request: web.Request) -> web.StreamResponse:
    return await event_stream(request, request.app[MONITOR])


async def _retry(request: web.Request) -> web.Response:
    body = await json_body(request, _BODY)
    message = await request.app[MONITOR].retry(body.get("queue"), body.get("key"))
    return web.json_response({"ok": True, "message": message})


async def _forget(request: web.Request) -> web.Response:
    body = await json_body(request, _BODY)
    message = await request.app[MONITOR].forget(body.get("queue"), body.get("key"))
    return web.json_response({"ok": True, "message": message})


async def _replay(request: web.Request) -> web.Response:
    body = await json_body(request, _BODY)
    message = await request.app[MONITOR].replay(body.get("queue"), body.get("key"))
    return web.json_response({"ok": True, "message": message})


def create_app(
    monitor: Monitor, *, token: str, read_only: bool = False, hosts: Iterable[str] = ()
) -> web.Application:
    """The dashboard for ``monitor``'s queues; actions need ``token`` (none when ``read_only``).

    It answers a ``Host`` that is the address the connection arrived at, one
    of ``hosts`` or localhost, with the connection's port (421 otherwise),
    and an ``Origin``, if any, that is one of those (403 otherwise).
    """

    async def monitor_ctx(app: web.Application) -> AsyncIterator[None]:
        monitor.start()
        yield
        await monitor.close()

    async def end_streams(app: web.Application) -> None:
        monitor.end_streams()

    app = application(
        Guard(
            tuple(hosts),
            token=None if read_only else token,
            read_only=READ_ONLY if read_only else None,
        )
    )
    app[MONITOR] = monitor
    app.cleanup_ctx.append(monitor_ctx)
    app.on_shutdown.append(end_streams)
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _FILES.serve)
    app.router.add_get("/api/state", _state)
    app.router.add_get("/api/events", _events)
    app.router.add_post("/api/retry", _retry)
    app.router.add_post("/api/forget", _forget)
    app.router.add_post("/api/replay", _replay)
    return app
