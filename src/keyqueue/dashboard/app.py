"""The dashboard's aiohttp app: one page, its two static files, the state and two actions.

- ``GET /``: the page (``static/index.html``, with this server's CSRF token
  and whether it is read-only written into it); ``GET /static/app.js|app.css``.
  Everything comes from the package; the Content-Security-Policy allows only
  this origin, so the page works offline and loads nothing from elsewhere.
- ``GET /api/state``: every queue's latest reading and its history;
  ``GET /api/events``: the same as Server-Sent Events, the history in the
  first event only, then one event per reading (each second).
- ``POST /api/retry`` and ``POST /api/forget``, body ``{"queue", "key"}``
  as ``application/json``, header ``X-Keyqueue-Token``: the two actions,
  answered ``{"ok": true, "message": what it did}``. Not served with
  ``read_only`` (403).

Refusals, before any handler: a ``Host`` that is not this server 421 and an
``Origin`` that is not its own 403 (the lab's ``guard``: DNS rebinding,
cross-site requests); a POST without the page's token 403, without JSON's
content type 415 (no cross-site form gets in). Errors are ``{"error": ...}``.
"""

from __future__ import annotations

import hmac
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from importlib import resources
from typing import Any

from aiohttp import web

from .._cli.guard import check_request
from .._cli.sse import event_stream
from .monitor import Monitor

__all__ = ["MONITOR", "TOKEN_HEADER", "create_app"]

MONITOR = web.AppKey("monitor", Monitor)
_CONFIG: web.AppKey[dict[str, Any]] = web.AppKey("config")
TOKEN_HEADER = "X-Keyqueue-Token"
JSON = "application/json"

_STATIC = {"app.js": "text/javascript", "app.css": "text/css"}
_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _static(name: str) -> bytes:
    return resources.files(__package__).joinpath("static", name).read_bytes()


def _error(message: str, status: int) -> web.Response:
    return web.json_response({"error": message}, status=status, headers=_HEADERS)


@web.middleware
async def _guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    config = request.app[_CONFIG]
    refused = check_request(request, config["hosts"])
    if refused is not None:
        return _error(refused.message, refused.status)
    if request.method not in ("GET", "HEAD"):
        if config["read_only"]:
            return _error("this dashboard is read-only (started with --read-only)", 403)
        token = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode(), config["token"].encode()):
            return _error(f"missing or wrong {TOKEN_HEADER}: reload the page", 403)
        if request.content_type != JSON:
            return _error(f"the request body must be JSON with Content-Type: {JSON}", 415)
    try:
        response = await handler(request)
    except ValueError as exc:
        return _error(str(exc), 400)
    for name, value in _HEADERS.items():
        response.headers.setdefault(name, value)
    return response


async def _page(request: web.Request) -> web.Response:
    config = request.app[_CONFIG]
    html = _static("index.html").decode()
    html = html.replace("__TOKEN__", config["token"]).replace(
        "__READ_ONLY__", "true" if config["read_only"] else "false"
    )
    return web.Response(text=html, content_type="text/html", charset="utf-8")


async def _file(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    return web.Response(body=_static(name), content_type=_STATIC[name], charset="utf-8")


async def _state(request: web.Request) -> web.Response:
    return web.json_response(request.app[MONITOR].snapshot())


async def _events(request: web.Request) -> web.StreamResponse:
    return await event_stream(request, request.app[MONITOR])


async def _body(request: web.Request) -> dict[str, Any]:
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ValueError('the request body must be a JSON object {"queue": ..., "key": ...}')
    return body


async def _retry(request: web.Request) -> web.Response:
    body = await _body(request)
    message = await request.app[MONITOR].retry(body.get("queue"), body.get("key"))
    return web.json_response({"ok": True, "message": message})


async def _forget(request: web.Request) -> web.Response:
    body = await _body(request)
    message = await request.app[MONITOR].forget(body.get("queue"), body.get("key"))
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

    app = web.Application(middlewares=[_guard])
    app[MONITOR] = monitor
    app[_CONFIG] = {
        "token": "" if read_only else token,
        "read_only": read_only,
        "hosts": tuple(hosts),
    }
    app.cleanup_ctx.append(monitor_ctx)
    app.on_shutdown.append(end_streams)
    app.router.add_get("/", _page)
    app.router.add_get("/static/{name}", _file)
    app.router.add_get("/api/state", _state)
    app.router.add_get("/api/events", _events)
    app.router.add_post("/api/retry", _retry)
    app.router.add_post("/api/forget", _forget)
    return app
