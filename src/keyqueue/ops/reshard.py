"""``keyqueue reshard NAME --shards M``: move a Redis queue's keys to M shards while it runs.

The command is a client of the queue (``RedisWorkQueue.reshard``): it
returns once every key is in its new shard, which takes at least the
longest hold (a held key moves once its holder is done). Interrupted, or
cut off from the server, it leaves the reshard under way: running it again
with the same ``--shards`` resumes it.
"""

from __future__ import annotations

import json

import click

from .._console.format import counted
from .._console.options import exit_interrupted, output_options
from . import render
from .connect import open_queue, queue_arguments

__all__ = ["reshard"]

MAX_SHARDS = 1024
"""The most shards ``--shards`` takes."""


@click.command(short_help="Move a Redis queue's keys to another number of shards, online.")
@queue_arguments
@click.option(
    "--shards",
    type=click.IntRange(1, MAX_SHARDS),
    required=True,
    metavar="M",
    help="How many shards the queue gets.",
)
@output_options
def reshard(
    *, name: str, url: str, durability: str, shards: int, as_json: bool, plain: bool
) -> None:
    """Move the keys of the queue NAME to --shards shards while producers and
    workers run (q.reshard): every client made with shards >= 2 follows the
    new map without restart; clients made with shards=1 are refused once the
    map changes. Waits for held keys (each moves once its holder is done).
    Run again to resume a reshard that was interrupted."""
    try:
        with open_queue(name, url, durability=durability) as at:
            moved = at.queue.reshard(shards)
    except KeyboardInterrupt:
        click.echo(
            f"interrupted: the reshard of {render.shown(name)} is under way; run the same "
            "command again to resume it",
            err=True,
        )
        exit_interrupted()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        click.echo(json.dumps({"queue": name, "shards": shards, "keys_moved": moved}))
        return
    shown = render.shown(name)
    click.echo(f"{shown} has {counted(shards, 'shard')}: {counted(moved, 'key')} moved")
