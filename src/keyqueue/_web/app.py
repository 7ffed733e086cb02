"""The app a page is served by: who is answered, what a change must carry, how errors read.

``application(Guard(...))`` is an aiohttp app with one middleware, which
answers every request in this order:

1. a ``Host`` that is not this server is a 421 and an ``Origin`` that is not
   its own a 403 (``guard.check_request``: DNS rebinding, other sites' pages);
2. a request that may change something (any method but GET and HEAD) is a 403
   when the app is read-only, a 403 without the page's token when the app has
   one (``X-Keyqueue-Token``), and a 415 without ``Content-Type:
   application/json``. A cross-site form or ``text/plain`` POST cannot set
   that content type without a CORS preflight, which these servers never
   grant, so no other site's page changes anything;
3. the handler: a ``Refused`` it raises is its status, any other
   ``ValueError`` (bad input, named as the page names it) a 400; neither has
   changed anything.

Every error is ``{"error": "<one line>"}``, and every answer carries
``HEADERS``: a Content-Security-Policy that allows only this origin (the page
loads nothing from elsewhere and works offline), no MIME sniffing, no
referrer, no caching.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from .guard import check_request

__all__ = [
    "GUARD",
    "HEADERS",
    "JSON",
    "SHUTDOWN_TIMEOUT",
    "TOKEN_HEADER",
    "Guard",
    "Handler",
    "Refused",
    "application",
    "error",
    "json_body",
    "runner",
]

HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; img-src 'self' data:; base-uri 'none'; "
        "form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}
"""The security headers every answer of every page's app carries."""
JSON = "application/json"
TOKEN_HEADER = "X-Keyqueue-Token"
"""The header a state change carries the page's token in (an app with a token)."""

SHUTDOWN_TIMEOUT = 2.0
"""Seconds a page's server gives open requests to finish when it stops."""

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@dataclass(frozen=True, slots=True)
class Guard:
    """Which requests an app answers, beyond its own address and localhost.

    ``hosts``: other host names it answers to (``--host``). ``token``: the
    token every state change must carry in ``TOKEN_HEADER`` (None: none
    asked; the Origin and JSON rules still apply). ``read_only``: when set,
    every state change is refused (403) with this message.
    """

    hosts: tuple[str, ...] = ()
    token: str | None = None
    read_only: str | None = None


GUARD = web.AppKey("guard", Guard)


class Refused(ValueError):
    """Bad input answered with ``status`` instead of 400."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def error(message: str, status: int = 400) -> web.Response:
    """The one-line error answer: ``{"error": message}`` with ``HEADERS``."""
    return web.json_response({"error": message}, status=status, headers=HEADERS)


def _refusal(request: web.Request, guard: Guard) -> Refused | None:
    """Why the request is not handled (steps 1 and 2), or None."""
    refused = check_request(request, guard.hosts)
    if refused is not None:
        return Refused(refused.status, refused.message)
    if request.method in ("GET", "HEAD"):
        return None
    if guard.read_only is not None:
        return Refused(403, guard.read_only)
    if guard.token is not None:
        token = request.headers.get(TOKEN_HEADER, "")
        if not hmac.compare_digest(token.encode(), guard.token.encode()):
            return Refused(403, f"missing or wrong {TOKEN_HEADER}: reload the page")
    if request.content_type != JSON:
        sent = request.headers.get("Content-Type")
        return Refused(
            415,
            f"the request body must be JSON with Content-Type: {JSON}, got "
            + ("none" if sent is None else repr(sent)),
        )
    return None


@web.middleware
async def _answer(request: web.Request, handler: Handler) -> web.StreamResponse:
    refused = _refusal(request, request.app[GUARD])
    if refused is not None:
        return error(str(refused), refused.status)
    try:
        response = await handler(request)
    except Refused as exc:
        return error(str(exc), exc.status)
    except ValueError as exc:
        return error(str(exc))
    for name, value in HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def application(guard: Guard) -> web.Application:
    """An aiohttp app that answers as the module says; its routes are the caller's."""
    app = web.Application(middlewares=[_answer])
    app[GUARD] = guard
    return app


def runner(app: web.Application) -> web.AppRunner:
    """``app``'s runner as the pages' servers run it: no access log, and
    ``SHUTDOWN_TIMEOUT`` for open requests when it stops."""
    return web.AppRunner(app, access_log=None, shutdown_timeout=SHUTDOWN_TIMEOUT)


async def json_body(request: web.Request, shape: str = "") -> dict[str, Any]:
    """The request's body as a JSON object; else ``ValueError`` (a 400) saying
    so, followed by ``shape`` (what the object holds, as the page sends it)."""
    try:
        body = await request.json()
    except ValueError:
        body = None
    if not isinstance(body, dict):
        raise ValueError(" ".join(("the request body must be a JSON object", shape)).rstrip())
    return body
