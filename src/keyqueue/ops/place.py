"""``keyqueue place NAME``: put each shard of a queue on a Cluster primary of its own, online.

The command is ``placement.place_shards`` on the queue's Cluster: it moves
the slots of shards that share a primary, keys and all, while producers and
workers run (their calls answered ``ASK`` or ``TRYAGAIN`` for the moment a
slot's keys cross, and asked again). ``--dry-run`` prints the plan and moves
nothing. Interrupted, a slot may be left migrating: running the command
again completes it.
"""

from __future__ import annotations

import json

import click

from .._console.format import counted
from .._console.options import exit_interrupted, output_options
from . import render
from .connect import open_queue, queue_arguments
from .placement import NotACluster, place_shards

__all__ = ["place"]


@click.command(short_help="Put each shard of a queue on a Cluster primary of its own, online.")
@queue_arguments
@click.option("--dry-run", is_flag=True, help="Print the moves; move nothing.")
@output_options
def place(
    *, name: str, url: str, durability: str, dry_run: bool, as_json: bool, plain: bool
) -> None:
    """Move the Cluster slots of the queue NAME's shards that share a primary
    to the primaries with fewest of its shards, keys and all, while producers
    and workers run. Only the queue's own slots move. Run again to complete a
    placement that was interrupted."""
    shown = render.shown(name)
    try:
        with open_queue(name, url, durability=durability) as at:
            moves = place_shards(at.client, name, dry_run=dry_run)
    except NotACluster as exc:
        raise click.ClickException(str(exc)) from None
    except KeyboardInterrupt:
        click.echo(
            f"interrupted: a slot of {shown} may be migrating; run the same command again",
            err=True,
        )
        exit_interrupted()
    if as_json:
        doc = {"queue": name, "dry_run": dry_run, "moves": [m.as_dict() for m in moves]}
        click.echo(json.dumps(doc))
        return
    if not moves:
        click.echo(f"{shown}: each shard is on a primary of its own (or as spread as it can be)")
        return
    verb = "would move" if dry_run else "moved"
    for move in moves:
        shards = ", ".join(str(s) for s in move.shards)
        click.echo(f"slot {move.slot} (shard {shards}): {move.source} -> {move.target}")
    click.echo(f"{shown}: {verb} {counted(len(moves), 'slot')}")
