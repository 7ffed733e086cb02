"""``keyqueue dashboard``: serve the live page of one or more Redis queues until Ctrl-C.

aiohttp and redis-py are imported only when the command runs, so
``keyqueue --help`` works without them. The server and the queues are
checked as the operator's commands check them (``ops.connect.open_queue``),
so the errors read alike.
"""

from __future__ import annotations

import asyncio
import webbrowser

import click

from .._console import OPS_INSTALL
from .._console.options import (
    ctrl_c_taken,
    durability_option,
    exit_interrupted,
    int_option,
    redis_url,
)
from .._web.listen import check_host, listen_error
from ..ops.connect import URL_ENV, URL_HELP, open_queue

__all__ = ["dashboard"]


@click.command(short_help="A live page of Redis queues: lists, rates, Retry now and Forget.")
@click.argument("names", metavar="NAME [NAME ...]", nargs=-1, required=True)
@click.option(
    "--redis-url",
    envvar=URL_ENV,
    required=True,
    metavar="URL",
    callback=redis_url,
    help=URL_HELP,
)
@durability_option
@int_option("--port", min=0, max=65535, default=8766, help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--no-open", is_flag=True, help="Do not open a browser; just print the URL.")
@click.option("--read-only", is_flag=True, help="No actions: the page only shows the queues.")
def dashboard(
    *,
    names: tuple[str, ...],
    redis_url: str,
    durability: str,
    port: int,
    host: str,
    no_open: bool,
    read_only: bool,
) -> None:
    """Serve a page that shows each queue NAME on the server live.

    Per queue: its counters and rates, a chart of depth and adds/dones per
    second over the last 10 minutes, the oldest wait, mean work time and
    longest backoff, its health (the verdict `keyqueue top` prints: keeping
    up, falling behind, retry debt, overdue keys, leases run out, no worker,
    read over the last minute), and its waiting, held, delayed and failing
    keys (a held key with its holder and lease). Each key has
    two actions, each confirmed: Retry now (forget its failures, then add it)
    and Forget; --read-only removes them.

    A sharded queue is one queue on the page (its map read from the server
    each second: no option), with a line of each shard's waiting and held
    keys and, on a Cluster, its primary.

    An operator's tool, not a public page: it listens on 127.0.0.1, answers
    only its own Host and Origin, and its actions need the token the page
    came with. Ctrl-C stops it (exit status 130).
    """
    try:
        from .server import serve  # noqa: PLC0415 (lazy: aiohttp may be missing)
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise click.ClickException(f"needs {exc.name}: {OPS_INSTALL}") from None
    check_host(host, port)
    for name in names:  # the operator's commands' one-line errors: no server, no queue
        with open_queue(name, redis_url, durability=durability):
            pass

    def ready(url: str) -> None:
        click.echo(f"keyqueue dashboard: serving {', '.join(names)} on {url} (Ctrl-C to stop)")
        if not no_open:
            webbrowser.open(url)

    try:
        with ctrl_c_taken():  # even in a job started with SIGINT ignored
            asyncio.run(
                serve(
                    names,
                    redis_url,
                    host=host,
                    port=port,
                    read_only=read_only,
                    ready=ready,
                    durability=durability,
                )
            )
    except OSError as exc:
        raise listen_error(host, port, exc) from None
    except KeyboardInterrupt:
        click.echo("keyqueue dashboard: stopped")
        exit_interrupted()
