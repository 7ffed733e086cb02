"""The web instrument's aiohttp app: one page, its static files, and a small JSON API.

- ``GET /``, ``/static/app.js``, ``/static/app.css``: the page, from the package
  (no CDN, no build step; the Content-Security-Policy allows only this origin).
- ``GET /api/model?arrival=&service=&backlog=&t=``: one step of ``lab model``'s
  fluid model from the page's current state (``run_model(..., steps=1)``), its
  prediction in words and the M/M/1 estimate. The page holds only ``t`` and the
  backlog; every number it shows comes from here.
- ``GET /api/backoff?base_ms=&cap=&herd=``: ``lab backoff``'s table and herd.
- ``GET /api/live``: the live queue's snapshot; ``GET /api/live/events``: the
  same, streamed (Server-Sent Events) on every change.
- ``POST /api/live/{add,burst,hold,release,fail,config}``: JSON bodies.

Bad input is a 400 with ``{"error": "..."}`` naming the problem and the page's field
(``λ (arrival)``, ``base (ms)``, never a query parameter's name), and changes nothing.
Other sites are refused before any handler runs, and every answer carries the
same security headers, as on ``keyqueue dashboard`` (``keyqueue._web.app``): a
``Host`` that is not this server is a 421 (DNS rebinding), an ``Origin`` that
is not the page's own a 403 (cross-site requests), and a POST body without
``Content-Type: application/json`` a 415 (no cross-site form or ``text/plain``
POST gets in).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator, Callable, Iterable
from typing import Any

from aiohttp import web

from ..._web.app import Guard, Handler, application, json_body
from ..._web.sse import event_stream
from ..._web.static import StaticFiles
from ..backoff.run import run_backoff
from ..model.run import prediction, run_model
from .live import LiveLab

__all__ = ["LIVE", "MAX_HERD", "create_app"]

LIVE = web.AppKey("live", LiveLab)
MAX_HERD = 10_000

_FILES = StaticFiles(__package__ or "", ("index.html", "app.js", "app.css"))

_NAMES = {
    "arrival": "λ (arrival)",
    "service": "μ (service)",
    "backlog": "initial backlog",
    "base_ms": "base (ms)",
    "cap": "cap (s)",
    "herd": "herd (keys)",
}
"""Each query parameter's field, as the page labels it: error messages say these."""


def _number(request: web.Request, name: str, default: float) -> float:
    """Query parameter ``name`` as a finite float (``default`` when it is absent)."""
    raw = request.query.get(name)
    if raw is None:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"{_NAMES.get(name, name)} must be a finite number, got {raw!r}")
    return value


async def _model(request: web.Request) -> web.Response:
    arrival = _number(request, "arrival", 4)
    service = _number(request, "service", 3)
    backlog = _number(request, "backlog", 4)
    t = _number(request, "t", 0)
    if arrival < 0:
        raise ValueError(f"{_NAMES['arrival']} must be >= 0, got {arrival:g}")
    if not service > 0:
        raise ValueError(f"{_NAMES['service']} must be > 0, got {service:g}")
    if backlog < 0:
        raise ValueError(f"{_NAMES['backlog']} must be >= 0, got {backlog:g}")
    if t < 0 or t != int(t):
        raise ValueError(f"t must be a whole number >= 0, got {t:g}")
    result = run_model(arrival, service, backlog, steps=1)
    nxt = result.steps[1]
    mm1 = result.mm1
    return web.json_response(
        {
            "t": int(t),
            "backlog": result.backlog,
            "next": {
                "t": int(t) + 1,
                "backlog": nxt.backlog,
                "served": nxt.served,
                "utilisation": nxt.utilisation,
            },
            "utilisation": result.utilisation,
            "growth_per_step": result.growth_per_step,
            "prediction": prediction(result, int(t)),
            "mm1": None
            if mm1 is None
            else {
                "rho": mm1.rho,
                "mean_in_system": mm1.mean_in_system,
                "mean_time_in_system": mm1.mean_time_in_system,
                "mean_waiting": mm1.mean_waiting,
                "mean_wait": mm1.mean_wait,
            },
            "warnings": list(result.warnings),
        }
    )


async def _backoff(request: web.Request) -> web.Response:
    base_ms = _number(request, "base_ms", 5)
    cap = _number(request, "cap", 1000)
    herd = _number(request, "herd", 500)
    if not base_ms > 0:
        raise ValueError(f"{_NAMES['base_ms']} must be > 0, got {base_ms:g}")
    if cap < base_ms / 1000:
        raise ValueError(
            f"{_NAMES['cap']} must be at least the base: got {cap:g} s, under {base_ms:g} ms"
        )
    if herd != int(herd) or not 1 <= herd <= MAX_HERD:
        raise ValueError(
            f"{_NAMES['herd']} must be a whole number from 1 to {MAX_HERD}, got {herd:g}"
        )
    result = await asyncio.to_thread(run_backoff, base_ms / 1000, cap, None, int(herd))
    return web.json_response(result.to_json())


async def _live(request: web.Request) -> web.Response:
    return web.json_response(request.app[LIVE].snapshot())


async def _events(request: web.Request) -> web.StreamResponse:
    return await event_stream(request, request.app[LIVE])


def _action(apply: Callable[[LiveLab, dict[str, Any]], None]) -> Handler:
    async def handle(request: web.Request) -> web.StreamResponse:
        apply(request.app[LIVE], await json_body(request))
        return web.json_response({"ok": True})

    return handle


async def _on_shutdown(app: web.Application) -> None:
    """Let open event streams end before the server waits for its handlers."""
    lab = app.get(LIVE)
    if lab is not None:
        lab.end_streams()


def create_app(
    *, workers: int = 2, reconcile: float = 0.8, hosts: Iterable[str] = ()
) -> web.Application:
    """The instrument's app; its live queue starts with ``workers`` and ``reconcile`` seconds.

    It answers a request whose ``Host`` is the address the connection arrived
    at, one of ``hosts`` or localhost, each with the connection's port (421
    otherwise), and whose ``Origin``, if any, is one of those (403 otherwise).
    """
    LiveLab.check_options(workers, reconcile)

    async def live_ctx(app: web.Application) -> AsyncIterator[None]:
        lab = app[LIVE] = LiveLab(workers=workers, reconcile=reconcile)
        lab.start()
        yield
        await lab.close()

    app = application(Guard(tuple(hosts)))
    app.cleanup_ctx.append(live_ctx)
    app.on_shutdown.append(_on_shutdown)
    app.router.add_get("/", _FILES.serve)
    app.router.add_get("/static/{name}", _FILES.serve)
    app.router.add_get("/api/model", _model)
    app.router.add_get("/api/backoff", _backoff)
    app.router.add_get("/api/live", _live)
    app.router.add_get("/api/live/events", _events)
    actions: dict[str, Callable[[LiveLab, dict[str, Any]], None]] = {
        "add": lambda lab, b: lab.add(b.get("key")),
        "burst": lambda lab, b: lab.burst(b.get("key"), b.get("n")),
        "hold": lambda lab, b: lab.hold(b.get("key")),
        "release": lambda lab, b: lab.release(b.get("key")),
        "fail": lambda lab, b: lab.fail(b.get("key"), b.get("n")),
        "config": lambda lab, b: lab.configure(b.get("workers"), b.get("reconcile_ms")),
    }
    for name, apply in actions.items():
        app.router.add_post(f"/api/live/{name}", _action(apply))
    return app
