"""``keyqueue dashboard``: serve the live page of one or more Redis queues until Ctrl-C.

aiohttp and redis-py are imported only when the command runs, so
``keyqueue --help`` works without them.
"""

from __future__ import annotations

import asyncio
import webbrowser

import click

from ..lab._options import ctrl_c_taken, exit_interrupted, int_option
from ..lab.web.command import check_host, listen_error

__all__ = ["dashboard"]

INSTALL = "pip install 'keyqueue[lab]'"


@click.command(short_help="A live page of Redis queues: lists, rates, Retry now and Forget.")
@click.argument("names", metavar="NAME [NAME ...]", nargs=-1, required=True)
@click.option("--redis-url", required=True, help="The server, e.g. redis://localhost:6379/0.")
@int_option("--port", min=0, max=65535, default=8766, help="Port to listen on (0: any free port).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--no-open", is_flag=True, help="Do not open a browser; just print the URL.")
@click.option("--read-only", is_flag=True, help="No actions: the page only shows the queues.")
def dashboard(
    *, names: tuple[str, ...], redis_url: str, port: int, host: str, no_open: bool, read_only: bool
) -> None:
    """Serve a page that shows each queue NAME on the server live.

    Per queue: its counters and rates, a chart of depth and adds/dones per
    second over the last 10 minutes, the oldest wait and mean work time with
    a reading of whether the queue keeps up, and its waiting, held, delayed
    and failing keys (a held key with its holder and lease). Each key has
    two actions, each confirmed: Retry now (forget its failures, then add it)
    and Forget; --read-only removes them.

    An operator's tool, not a public page: it listens on 127.0.0.1, answers
    only its own Host and Origin, and its actions need the token the page
    came with. Ctrl-C stops it (exit status 130).
    """
    try:
        import redis  # noqa: PLC0415 (lazy: the lab extra)

        from .monitor import NoSuchQueue  # noqa: PLC0415
        from .server import serve  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise click.ClickException(f"needs {exc.name}: {INSTALL}") from None
    check_host(host, port)
    try:
        redis.Redis.from_url(redis_url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="'--redis-url'") from None

    def ready(url: str) -> None:
        click.echo(f"keyqueue dashboard: serving {', '.join(names)} on {url} (Ctrl-C to stop)")
        if not no_open:
            webbrowser.open(url)

    try:
        with ctrl_c_taken():  # even in a job started with SIGINT ignored
            asyncio.run(
                serve(names, redis_url, host=host, port=port, read_only=read_only, ready=ready)
            )
    except redis.exceptions.ConnectionError as exc:
        raise click.ClickException(f"cannot reach {redis_url}: {exc}") from None
    except NoSuchQueue as exc:
        raise click.ClickException(str(exc)) from None
    except OSError as exc:
        raise listen_error(host, port, exc) from None
    except KeyboardInterrupt:
        click.echo("keyqueue dashboard: stopped")
        exit_interrupted()
