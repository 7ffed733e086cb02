"""A ``Snapshot`` for a person: ``inspect``'s tables, ``top``'s frame and its
one-line plain form, and each row's cells as the dashboard's page shows them.

Keys and holders are shown as text only: one that is not printable (an
escape sequence, a newline) is shown as its ``repr``, so a key cannot move
the cursor or recolour the terminal. Every time goes through ``duration``
(``1.5s``, ``16m40s``) or ``due`` (``in 4.5s``; a time past, such as a
delayed key due but not yet released or a lease run out but not yet taken
back, ``overdue 4m18s``). ``cells`` writes a row for both the tables and the
page, so ``inspect``, ``top`` and the dashboard show one row alike. The
health verdict is ``keyqueue.ops.health``'s, for ``top`` and the page alike.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from keyqueue import DeadKey, DelayedKey, FailingKey, HeldKey, Snapshot, WaitingKey

from .._console.format import Output, count, due, duration, left, number
from .health import Rates, Verdict
from .shards import ShardRow

__all__ = [
    "COLUMNS",
    "STYLES",
    "cells",
    "dead_cells",
    "dead_table",
    "frame",
    "health_lines",
    "plain_line",
    "shard_line",
    "shard_table",
    "shown",
    "tables",
    "title",
]


def shown(text: str | None) -> str:
    """A key or holder as it is safe to print: itself if printable, else its repr."""
    if text is None:
        return "-"
    return text if text.isprintable() else repr(text)


def title(name: str, where: str, snap: Snapshot[str], shards: int = 1) -> str:
    """One line: the queue (and its shards, if more than one), the server,
    its sizes and its oldest wait."""
    s = snap.stats
    sharded = f" ({shards} shards)" if shards > 1 else ""
    return (
        f"queue {shown(name)}{sharded} at {where}: {count(s.depth)} waiting, "
        f"{count(s.processing)} processing, {count(s.delayed)} delayed, "
        f"{count(snap.failing_keys)} failing; oldest wait {duration(s.oldest_wait_seconds)}"
    )


def _caption(rows: int, total: int, what: str) -> str:
    if rows < total:
        return f"{what}: first {count(rows)} of {count(total)}"
    return f"{what}: {count(total)}"


COLUMNS = {
    "waiting": ("priority", "waited"),
    "processing": ("holder", "token", "held", "lease ends"),
    "delayed": ("due", "priority"),
    "failing": ("failures", "comes back"),
}
"""Each list's columns after the key, as the tables and the page head them."""

Row = WaitingKey[Any] | HeldKey[Any] | DelayedKey[Any] | FailingKey[Any]


def cells(row: Row) -> tuple[str, ...]:
    """A row's cells after its key, in ``COLUMNS`` order, as the tables and the page show them."""
    if isinstance(row, WaitingKey):
        return (count(row.priority), duration(row.waited))
    if isinstance(row, HeldKey):
        token = "-" if row.token is None else str(row.token)
        return (shown(row.holder), token, duration(row.held), due(row.lease_left))
    if isinstance(row, DelayedKey):
        return (due(row.due_in), count(row.priority))
    back = "not delayed" if row.comes_back_in is None else due(row.comes_back_in)
    return (count(row.failures), back)


def tables(snap: Snapshot[str], out: Output, rows: int | None = None) -> list[Table]:
    """The four lists as tables (the first ``rows`` of each, default all shown):
    waiting keys next out first, held keys, delayed keys soonest first,
    failing keys most failures first."""
    s = snap.stats
    lists: list[tuple[str, str, int, Sequence[Row]]] = [
        ("Waiting", "waiting", s.depth, snap.waiting),
        ("Processing", "processing", s.processing, snap.processing),
        ("Delayed", "delayed", s.delayed, snap.delayed),
        ("Failing", "failing", snap.failing_keys, snap.failing),
    ]
    made = []
    for what, kind, total, every in lists:
        shown_rows = every[:rows]
        words = [left(c) if c == "holder" else c for c in COLUMNS[kind]]
        table = out.table(left("key"), *words, title=_caption(len(shown_rows), total, what))
        for row in shown_rows:
            table.add_row(shown(row.key), *cells(row))
        made.append(table)
    return made


DEAD_COLUMNS = ("reason", "error", "failures", "given up")
"""The dead keys' columns after the key, as ``keyqueue dead`` and the page head them."""


def dead_cells(row: DeadKey[Any], now: float) -> tuple[str, ...]:
    """A dead key's cells after its key, in ``DEAD_COLUMNS`` order (``now``:
    wall seconds, which its ``at`` is measured against)."""
    error = "-" if row.error_type is None else f"{row.error_type}: {row.error or ''}".rstrip(": ")
    return (shown(row.reason), shown(error), count(row.failures), duration(now - row.at) + " ago")


def dead_table(
    rows: Sequence[DeadKey[str]], out: Output, now: float, limit: int | None = None
) -> Table:
    """``keyqueue dead``'s and ``inspect``'s table: the dead keys, newest
    first (``limit``: the most that were asked for, so that a full list says
    it may be the newest of more)."""
    words = [left(c) if c in ("reason", "error") else c for c in DEAD_COLUMNS]
    caption = f"Dead: {count(len(rows))}"
    if limit is not None and rows and len(rows) >= limit:
        caption = f"Dead: the newest {count(len(rows))}"
    table = out.table(left("key"), *words, title=caption)
    for row in rows:
        table.add_row(shown(row.key), *dead_cells(row, now))
    return table


SHARD_COLUMNS = ("waiting", "processing", "delayed", "failing")
"""The shards table's columns after the shard, its queue name and its server."""


def shard_table(rows: Sequence[ShardRow], out: Output) -> Table:
    """``inspect``'s table of a sharded queue's shards: each one's sizes and server."""
    table = out.table(
        "shard", left("queue"), left("server"), *SHARD_COLUMNS, title=f"Shards: {len(rows)}"
    )
    for r in rows:
        table.add_row(
            str(r.index),
            shown(r.name),
            r.server,
            *(count(n) for n in (r.depth, r.processing, r.delayed, r.failing)),
        )
    return table


def shard_line(rows: Sequence[ShardRow]) -> str:
    """``top``'s and the page's line of a sharded queue's shards: each one's
    waiting and held keys, and its server when they are not all on one (a Cluster)."""
    apart = len({r.server for r in rows}) > 1
    return "shards (waiting/held): " + ", ".join(
        f"{r.index}: {count(r.depth)}/{count(r.processing)}" + (f" on {r.server}" if apart else "")
        for r in rows
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else number(value, 3)


def _now() -> str:
    return time.strftime("%H:%M:%S")


def _per_second(r: Rates | None, field: str) -> str:
    return "-" if r is None else _rate(getattr(r, field))


def _mean_work(verdict: Verdict) -> str:
    w = verdict.window
    return "-" if w is None or w.mean_work is None else duration(w.mean_work)


def plain_line(snap: Snapshot[str], verdict: Verdict, shards: Sequence[ShardRow] = ()) -> str:
    """``top --plain``: one line per interval, ``name=value`` pairs, to grep.

    Rates are over the last interval (``-`` on the first line and across a
    counter reset); ``mean_work`` over the verdict's window; ``health`` is
    every finding's state, worst first (``keyqueue.ops.health``). A sharded
    queue's line ends with each shard's waiting and held keys
    (``shard_waiting=5,3,4 shard_held=1,0,0``, shard 0 first)."""
    s = snap.stats
    r = verdict.rates
    backoff = verdict.longest_backoff
    fields: list[tuple[str, Any]] = [
        ("depth", s.depth),
        ("processing", s.processing),
        ("delayed", s.delayed),
        ("failing", snap.failing_keys),
        ("adds/s", _per_second(r, "adds")),
        ("gets/s", _per_second(r, "gets")),
        ("dones/s", _per_second(r, "dones")),
        ("failures/s", _per_second(r, "failures")),
        ("oldest_wait", duration(s.oldest_wait_seconds)),
        ("mean_work", _mean_work(verdict)),
        ("longest_backoff", "-" if backoff is None else duration(backoff)),
        ("health", ",".join(verdict.states)),
    ]
    if shards:
        fields.append(("shard_waiting", ",".join(str(r.depth) for r in shards)))
        fields.append(("shard_held", ",".join(str(r.processing) for r in shards)))
    return _now() + " " + " ".join(f"{k}={v}" for k, v in fields)


STYLES = {
    "error": "bold red",
    "expired-leases": "bold red",
    "no-workers": "bold red",
    "overdue": "bold red",
    "stalled": "bold red",
    "behind": "bold red",
    "retry-debt": "bold yellow",
    "starting": "",
    "keeping-up": "green",
    "idle": "",
}
"""How ``top`` colours each finding (the page's colours are the same, in app.css)."""


def health_lines(verdict: Verdict) -> list[Text]:
    """The verdict's findings, one line each, the headline first."""
    return [Text(f.text, style=STYLES.get(f.state, "")) for f in verdict.findings]


def frame(
    name: str,
    where: str,
    snap: Snapshot[str],
    verdict: Verdict,
    out: Output,
    rows: int,
    height: int | None = None,
    shards: Sequence[ShardRow] = (),
) -> RenderableType:
    """``top``'s live frame: the title (and a sharded queue's ``shard_line``),
    the health, the rates, the first ``rows`` of each list; an empty list is
    one line. With ``height`` (the terminal's lines) the lists show fewer
    rows, down to none, until the frame fits, so no list is pushed below the
    bottom of the screen (rich would crop it to a "...")."""
    r = verdict.rates
    if r is None:
        line = "rates from the next refresh on"
    else:
        line = (
            f"per second: {_rate(r.adds)} adds, {_rate(r.gets)} gets, {_rate(r.dones)} dones, "
            f"{_rate(r.failures)} failures; mean work time {_mean_work(verdict)}"
        )
    head = [Text(f"{_now()}  {title(name, where, snap, len(shards) or 1)}", style="bold")]
    if shards:
        head.append(Text(shard_line(shards)))
    head += health_lines(verdict)
    for shown_rows in range(rows, -1, -1):
        lists: list[RenderableType] = []
        for table in tables(snap, out, shown_rows):
            table.show_edge = False  # no blank line above and below each list
            lists.append(table if table.row_count else Text(str(table.title)))
        made = Group(*head, Text(line), *lists, Text("Ctrl-C to quit", style="dim"))
        if height is None or _lines(out, made) <= height:
            break
    return made


def _lines(out: Output, renderable: RenderableType) -> int:
    """How many lines ``renderable`` takes on ``out``'s console at its width."""
    options = out.console.options.update(height=None)
    return len(out.console.render_lines(renderable, options, pad=False))
