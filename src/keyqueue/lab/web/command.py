"""``keyqueue lab web``: serve the instrument page until Ctrl-C.

aiohttp is imported only when the command runs, so ``keyqueue lab --help``
works without it; without it the command prints the ``pip install`` line.
"""

from __future__ import annotations

import contextlib
import json
import threading
import webbrowser

import click

from ..._console import LAB_INSTALL
from ..._console.options import (
    ctrl_c_taken,
    exit_interrupted,
    int_option,
    json_option,
    plain_option,
)
from ..._web.listen import check_host, listen_error

__all__ = ["web"]


@click.command(short_help="The instrument in the browser: the fluid model, a live key trace.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@int_option("--port", min=0, max=65535, default=8765, help="Port to listen on (0: any free port).")
@click.option("--no-open", is_flag=True, help="Do not open a browser; just print the URL.")
@plain_option("No colour (this command's lines have none: accepted as every subcommand's).")
@json_option(
    'Write one JSON document, {"url": ..., "host": ..., "port": ...}, once serving '
    "(for scripts: --port 0 picks the port), and nothing else."
)
def web(*, host: str, port: int, no_open: bool, plain: bool, as_json: bool) -> None:
    """Serve the lab's page: the fluid model, a live key trace, and backoff.

    The page has three panels: the fluid model of arrivals λ against service μ
    (the same arithmetic as `keyqueue lab model`); a real AsyncWorkQueue
    running in this server, whose keys you add, burst, hold and fail while
    the page shows each key's state, the FIFO and the transition log live; and
    `keyqueue lab backoff`'s table and thundering herd. Everything the page
    loads comes from this server. Ctrl-C stops it (exit status 130).
    """
    try:
        from .server import WebServer  # noqa: PLC0415 (lazy: aiohttp may be missing)
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise click.ClickException(f"needs {exc.name}: {LAB_INSTALL}") from None
    check_host(host, port)
    with contextlib.ExitStack() as stack:
        stack.enter_context(ctrl_c_taken())  # even in a job started with SIGINT ignored
        try:
            server = stack.enter_context(WebServer(host, port))
        except OSError as exc:
            raise listen_error(host, port, exc) from None
        try:  # from the first line out: a Ctrl-C after it is "stopped"
            if as_json:
                where = {"url": server.url, "host": server.host, "port": server.port}
                click.echo(json.dumps(where))
            else:
                click.echo(f"keyqueue lab web: serving on {server.url} (Ctrl-C to stop)")
            if not no_open:
                webbrowser.open(server.url)
            threading.Event().wait()  # until Ctrl-C
        except KeyboardInterrupt:
            if not as_json:
                click.echo("keyqueue lab web: stopped")
            exit_interrupted()
