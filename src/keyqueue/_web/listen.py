"""Listening on a port for a person's browser: ``keyqueue dashboard`` and ``keyqueue lab web``.

``check_host`` makes a ``--host`` that names no address a usage error before
anything listens; ``bind`` makes the listening socket (so a bad address is an
``OSError`` right there); ``listen_error`` says what went wrong binding and
which option to change; ``url_for`` writes the address to open.
"""

from __future__ import annotations

import errno
import os
import socket

import click

__all__ = ["bind", "check_host", "listen_error", "url_for"]


def check_host(host: str, port: int) -> None:
    """A --host that names no address is a usage error, before anything listens."""
    try:
        socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise click.BadParameter(
            f"cannot resolve {host!r} ({exc.strerror or exc}); give a name or address of "
            "this machine, such as 127.0.0.1",
            param_hint="'--host'",
        ) from None


def bind(host: str, port: int) -> socket.socket:
    """A socket listening on ``host:port`` (port 0: a free one; IPv6 for an IPv6
    address); ``OSError`` when it cannot (``listen_error`` says it for a person)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    return socket.create_server((host, port), family=family)


def listen_error(host: str, port: int, exc: OSError) -> click.ClickException:
    """What went wrong binding ``host:port``, and which option to change."""
    reason = os.strerror(exc.errno) if exc.errno and exc.errno > 0 else str(exc)
    where = f"cannot listen on {host}:{port}: {reason}"
    if exc.errno in (errno.EADDRINUSE, errno.EACCES):
        return click.ClickException(f"{where} (try another --port)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return click.ClickException(f"{where} (--host must be an address of this machine)")
    return click.ClickException(where)


def url_for(host: str, port: int) -> str:
    """``http://host:port/``, with brackets around an IPv6 address."""
    return f"http://[{host}]:{port}/" if ":" in host else f"http://{host}:{port}/"
