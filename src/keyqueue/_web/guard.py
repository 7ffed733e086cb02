"""Which requests a local server answers: its own ``Host``, its own ``Origin``.

Theory of operation
-------------------
Our servers (``keyqueue dashboard``, ``lab web``'s page and API, ``lab pipeline``'s API server)
listen on loopback, but any web page the user visits can still reach them:

- **DNS rebinding** makes ``attacker.example`` resolve to 127.0.0.1, so the
  attacker's page reads our answers as its own origin. The browser still
  sends ``Host: attacker.example``: we answer only a ``Host`` that names this
  server, i.e. the address the connection arrived at, a name it was told to
  serve (``--host``), or localhost/127.0.0.1/[::1], each with *its* port
  (another port on localhost is another origin). Anything else gets 421.
- **Cross-site requests** (a ``text/plain`` POST needs no CORS preflight) carry
  an ``Origin`` naming the page that sent them; every browser sends one on a
  cross-origin request that is not a plain GET. An ``Origin`` present and not
  ``http://`` plus an authority the Host rule accepts gets 403, whatever the
  method. A request without ``Origin`` does not come from another site's page
  (curl, the official Kubernetes clients, the tests): it is served.

A missing ``Host`` (HTTP/1.0) passes: browsers always send one. This module
decides; each server's middleware turns a ``Refusal`` into its own error body
(``{"error": ...}`` for the pages' apps, ``keyqueue._web.app``; a Kubernetes
``Status`` for the lab's API server).
Only ``check_request`` touches an aiohttp request (and imports nothing from aiohttp).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

__all__ = ["LOOPBACK_NAMES", "Refusal", "authority", "check_request", "refusal"]

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
"""Names that always mean this machine, whatever address the server listens on."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a request is not answered: ``status`` (421 or 403) and a one-line ``message``."""

    status: int
    message: str


def _normal(host: str) -> str:
    """One spelling per host: an IP address canonical (IPv4-mapped as IPv4), a name lowercase."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host.lower()
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return str(address)


def authority(value: str) -> tuple[str, int] | None:
    """``host[:port]`` or ``[v6]:port`` as (normal host, port), port 80 when absent;
    None when it is not one (no host, a bad port, a bracketed non-address)."""
    if value.startswith("["):
        host, bracket, rest = value[1:].partition("]")
        if not bracket or rest[:1] not in ("", ":"):
            return None
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return None
        port = rest[1:]
    else:
        host, _, port = value.partition(":")  # a second colon stays in the port: refused
    if not host:
        return None
    if not port:
        return _normal(host), 80
    if not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        return None
    return _normal(host), int(port)


def refusal(
    host: str | None, origin: str | None, local: tuple[str, int], names: Iterable[str] = ()
) -> Refusal | None:
    """None to serve the request, else why not.

    ``host`` and ``origin`` are the request's headers (None when absent);
    ``local`` is the (address, port) the connection arrived at; ``names`` are
    other host names the server was told to answer to.
    """
    address, port = _normal(local[0]), local[1]
    ours = {address, *LOOPBACK_NAMES, *(_normal(name) for name in names)}

    def served(value: str) -> bool:
        parsed = authority(value)
        return parsed is not None and parsed[0] in ours and parsed[1] == port

    if host is not None and not served(host):
        shown = f"[{address}]" if ":" in address else address
        return Refusal(
            421,
            f"Host {host!r} is not this server (it answers to {shown}:{port} or localhost:{port})",
        )
    if origin is not None:
        scheme, sep, rest = origin.partition("://")
        if not (sep and scheme.lower() == "http" and served(rest)):
            return Refusal(
                403,
                f"Origin {origin!r} is not this server's own: other sites' requests are refused",
            )
    return None


def check_request(request: web.BaseRequest, names: Iterable[str] = ()) -> Refusal | None:
    """``refusal`` for an aiohttp request, with the address its connection arrived at."""
    transport = request.transport
    sockname = transport.get_extra_info("sockname") if transport is not None else None
    if not sockname:  # the client has gone: nobody reads the answer
        return Refusal(421, "the connection is closed")
    headers = request.headers
    return refusal(headers.get("Host"), headers.get("Origin"), (sockname[0], sockname[1]), names)
