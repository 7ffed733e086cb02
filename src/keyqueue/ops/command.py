"""The operator's click commands: ``inspect``, ``top``, ``add``, ``forget``,
``dead``, ``replay``, ``delete``.

Each opens the queue with ``connect.open_queue`` (one-line errors, exit 1;
bad options exit 2, as every ``keyqueue`` command), a sharded queue as one
(``connect.QueueAt``: its map read from the server). ``top`` redraws a rich
``Live`` frame each interval, or with ``--plain`` (or stdout not a
terminal) prints one line per interval; Ctrl-C ends it at once (exit 130,
the ``keyqueue`` group's rule), and so does a closed pipe (exit 1, quietly).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

import click

from keyqueue import DeadKey, Event, EventKind, HeldKey, Snapshot

from .._console.format import Mode, Output, counted
from .._console.options import float_option, int_option, output_options, plain_option
from . import probe, render
from .connect import QueueAt, open_queue, queue_arguments
from .health import Health, Reading, Verdict
from .shards import ShardRow

if TYPE_CHECKING:
    from keyqueue.redis import RedisWorkQueue

__all__ = ["COMMANDS", "add", "dead", "delete", "forget", "inspect", "replay", "top"]

TOP_ROWS = 5  # rows of each list in top's frame
HEALTH_ROWS = 100
"""Rows of each list read for the verdict (overdue and expired keys are counted among them)."""


@click.command(short_help="The keys of a Redis queue now: waiting, held, delayed, failing, dead.")
@queue_arguments
@int_option("--limit", min=0, max=10_000, default=100, help="Rows of each list (the first ones).")
@output_options
def inspect(
    *, name: str, url: str, durability: str, limit: int, as_json: bool, plain: bool
) -> None:
    """Show the queue NAME's snapshot: its counters and the first keys of its
    four lists (waiting in hand-out order, held with their holder and lease,
    delayed soonest first, failing most first), read in one step; and its
    dead keys, newest first, if it has any (keyqueue dead lists only those).

    With --json, the snapshot as one JSON document (Snapshot.as_dict: a
    stable shape; within its "version", fields are only ever added).

    A sharded queue (its map on the server says so: no option needed) is
    shown as one queue, its counters summed and its lists merged, with a
    table of its shards: each one's sizes and server (in JSON, "shards").
    """
    out = Output(Mode.choose(as_json, plain))
    with open_queue(name, url, durability=durability) as at:
        snap = at.queue.snapshot(limit=limit)
        shards = at.shard_rows()
    if out.quiet:
        shape = snap.as_dict()
        if shards:
            shape["shards"] = [row.as_dict() for row in shards]
        sys.stdout.write(json.dumps(shape, indent=2, allow_nan=False) + "\n")
        return
    out.print(render.title(name, at.where, snap, len(shards) or 1))
    if shards:
        out.print(render.shard_table(shards, out))
    out.print(*render.tables(snap, out))
    if snap.dead:
        out.print(render.dead_table(snap.dead, out, time.time(), limit))


@click.command(short_help="A live view of a Redis queue: health, sizes, rates, the first keys.")
@queue_arguments
@float_option("--interval", min=0.1, max=3600, default=1.0, help="Seconds between refreshes.")
@plain_option()
def top(*, name: str, url: str, durability: str, interval: float, plain: bool) -> None:
    """Watch the queue NAME live: its health (the dashboard's verdict: keeping
    up, falling behind, retry debt, overdue keys, leases run out, no worker),
    depth, processing, delayed and failing keys, adds/gets/dones/failures per
    second (from the counters' change over each interval; a counter that
    goes down is a reset, and rates restart from it), the oldest wait, the
    mean work time, and the first keys of each list. Ctrl-C quits.

    With --plain (or when stdout is not a terminal), one line per interval.
    A sharded queue is watched as one queue, with a line of each shard's
    waiting and held keys; its map is read again each interval.
    """
    out = Output(Mode.choose(False, plain))
    health = Health()
    with open_queue(name, url, durability=durability) as at:
        if not out.rich:
            while True:
                snap, verdict, shards = _read(at, health)
                print(render.plain_line(snap, verdict, shards), flush=True)
                time.sleep(interval)
        from rich.live import Live  # noqa: PLC0415 (rich mode only)

        with Live(console=out.console, auto_refresh=False, transient=False) as live:
            while True:
                snap, verdict, shards = _read(at, health)
                height = out.console.size.height
                live.update(
                    render.frame(name, at.where, snap, verdict, out, TOP_ROWS, height, shards),
                    refresh=True,
                )
                time.sleep(interval)


def _read(at: QueueAt, health: Health) -> tuple[Snapshot[str], Verdict, list[ShardRow]]:
    """One refresh: the map followed (a reshard opens the queue again), the
    snapshot, what the probe reads beside it, the verdict, each shard's sizes."""
    at.follow()
    snap = at.queue.snapshot(limit=HEALTH_ROWS)
    verdict = health.update(Reading.of(snap, probe.read(at.client, at.names)))
    return snap, verdict, at.shard_rows()


_WHAT_ADD_DID = {
    EventKind.ENQUEUE: "waiting now",
    EventKind.COALESCE: "already waiting (or held and due again): nothing more to do",
    EventKind.MARK_WHILE_PROCESSING: "held by a worker: handed out again after its done",
}


@click.command(short_help="Hand a key of a Redis queue out again now.")
@queue_arguments
@click.argument("key")
@int_option(
    "--priority",
    min=-(2**31),
    max=2**31 - 1,
    default=0,
    help="Priority to add it with (higher is handed out first).",
)
def add(*, name: str, url: str, durability: str, key: str, priority: int) -> None:
    """Add KEY to the queue NAME now (q.add): it waits, even if it is in a
    backoff, unless it already waits or a worker holds it (then it is handed
    out again after that worker's done)."""
    seen: list[EventKind] = []
    with open_queue(name, url, durability=durability) as at:

        def on_event(event: Event[str]) -> None:
            if event.key == key:
                seen.append(event.kind)

        at.queue.subscribe(on_event)
        at.queue.add(key, priority=priority)
    what = next((_WHAT_ADD_DID[k] for k in seen if k in _WHAT_ADD_DID), "added")
    click.echo(f"added {render.shown(key)} to {render.shown(name)}: {what}")


@click.command(short_help="Clear a key's failures and backoff in a Redis queue.")
@queue_arguments
@click.argument("key")
def forget(*, name: str, url: str, durability: str, key: str) -> None:
    """Forget KEY's failures in the queue NAME (q.forget): its failure count
    and server backoff are cleared, so its next failure starts the backoff
    over. A key already delayed stays delayed: add it to hand it out now.
    Says how many failures it forgot, or that the key had none."""
    with open_queue(name, url, durability=durability) as at:
        failures = max(_failures(at.queue, key), at.queue.num_requeues(key))
        at.queue.forget(key)
    shown_key, shown_name = render.shown(key), render.shown(name)
    if failures:
        click.echo(
            f"forgot {counted(failures, 'failure')} of {shown_key} in {shown_name}: "
            "its next failure starts the backoff over"
        )
    else:
        click.echo(f"{shown_key} has no failures recorded in {shown_name}: nothing to forget")


@click.command(short_help="The keys a Redis queue gave up, newest first.")
@queue_arguments
@int_option("--limit", min=1, max=10_000, default=100, help="Rows (the newest ones).")
@output_options
def dead(*, name: str, url: str, durability: str, limit: int, as_json: bool, plain: bool) -> None:
    """List the keys the queue NAME gave up (q.dead), newest first: why
    (retries: max_retries failures; permanent: PermanentError; stalls: a
    poison key), the last error, the failures it had, and how long ago.
    A queue keeps at most 1,000 (per shard), none older than 7 days.
    `keyqueue replay NAME KEY` adds one back.

    With --json, {"queue": NAME, "dead": [...]}: each key's fields as
    Snapshot.as_dict writes its "dead" rows ("at": wall seconds).
    """
    out = Output(Mode.choose(as_json, plain))
    with open_queue(name, url, durability=durability) as at:
        rows = at.queue.dead(limit=limit)
    if out.quiet:
        out.json({"queue": name, "dead": [_dead_row(row) for row in rows]})
        return
    out.print(render.dead_table(rows, out, time.time(), limit))


def _dead_row(row: DeadKey[str]) -> dict[str, object]:
    return {field.name: getattr(row, field.name) for field in dataclasses.fields(row)}


@click.command(short_help="Add keys a Redis queue gave up back to it.")
@queue_arguments
@click.argument("key", required=False)
@click.option("--all", "every", is_flag=True, help="Replay every dead key (oldest first).")
def replay(*, name: str, url: str, durability: str, key: str | None, every: bool) -> None:
    """Add KEY, a key the queue NAME gave up, back to it (q.replay), its
    failures and backoff cleared; or with --all every dead key
    (q.replay_all). A key waiting or held meanwhile is not added twice (as
    `keyqueue add`). Exits 1 if KEY is not dead."""
    if every == (key is not None):
        raise click.UsageError("give either KEY or --all")
    with open_queue(name, url, durability=durability) as at:
        if key is None:
            replayed = at.queue.replay_all()
            click.echo(f"replayed {counted(replayed, 'dead key')} of {render.shown(name)}")
            return
        if not at.queue.replay(key):
            raise click.ClickException(
                f"{render.shown(key)} is not a dead key of {render.shown(name)}: "
                "nothing replayed (keyqueue dead lists them)"
            )
    click.echo(f"replayed {render.shown(key)} to {render.shown(name)}: its failures cleared")


@click.command(short_help="Remove a Redis queue and all its server state.")
@queue_arguments
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.option("--force", is_flag=True, help="Delete it even while workers hold keys.")
def delete(*, name: str, url: str, durability: str, yes: bool, force: bool) -> None:
    """Delete the queue NAME: every key of its state on the server (q.delete).

    Refused while any key is held, unless --force (the holders' done then
    fails with LeaseLost). Asks first, unless --yes.
    """
    with open_queue(name, url, durability=durability) as at:
        snap = at.queue.snapshot(limit=3)
        held = snap.stats.processing
        if held and not force:
            raise click.ClickException(_held_message(snap.processing, held))
        if not yes:
            _confirm(f"Delete {render.title(name, at.where, snap, at.queue.shards)}?")
        try:
            at.queue.delete(force=force)
        except RuntimeError:  # a key was taken meanwhile
            raise click.ClickException(
                _held_message((), at.queue.snapshot(limit=0).stats.processing)
            ) from None
    click.echo(f"deleted queue {render.shown(name)} at {at.where}")


FAILING_SCAN = 10_000
"""The most failing keys ``forget`` reads to find the one it forgets."""


def _failures(queue: RedisWorkQueue, key: str) -> int:
    """The failures the server has recorded for ``key`` (0 if none), read from
    the snapshot's failing keys (the first ``FAILING_SCAN``)."""
    failing = queue.snapshot(limit=0).failing_keys
    if not failing:
        return 0
    rows = queue.snapshot(limit=min(failing, FAILING_SCAN)).failing
    return next((row.failures for row in rows if row.key == key), 0)


def _confirm(question: str) -> None:
    """Ask ``question`` on the terminal; anything but y or yes is a one-line
    refusal (exit 1), and so is no answer at all (stdin at its end, as with
    ``</dev/null``), saying --yes. Ctrl-C is the group's: interrupted, 130."""
    click.echo(f"{question} [y/N]: ", nl=False)
    answer = sys.stdin.readline()
    if not answer:
        click.echo()
        raise click.ClickException(
            "no answer (stdin is closed): nothing deleted; --yes deletes without asking"
        )
    if answer.strip().lower() not in ("y", "yes"):
        raise click.ClickException("not deleted")


def _held_message(rows: Sequence[HeldKey[str]], held: int) -> str:
    holders = sorted({render.shown(row.holder) for row in rows})
    by = f" (by {', '.join(holders)}{', ...' if held > len(holders) else ''})" if holders else ""
    return f"{held} key(s) are held{by}; not deleted (--force deletes it anyway)"


COMMANDS = (inspect, top, add, forget, dead, replay, delete)
"""The commands, in the order ``keyqueue --help`` lists them."""
