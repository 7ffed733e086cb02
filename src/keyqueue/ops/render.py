"""A ``Snapshot`` for a person: ``inspect``'s tables, ``top``'s frame and its
one-line plain form, and the rates ``top`` takes from counter deltas.

Keys and holders are shown as text only: one that is not printable (an
escape sequence, a newline) is shown as its ``repr``, so a key cannot move
the cursor or recolour the terminal. Times go through the lab's ``duration``
(``1.5s``, ``16m40s``); a negative one (a delayed key due but not yet
released, a lease run out but not yet taken back) reads ``overdue``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from keyqueue import Snapshot, Stats

from .._cli.format import Output, count, duration, left, number

__all__ = ["Rates", "frame", "plain_line", "rates", "shown", "tables", "title"]


def shown(text: str | None) -> str:
    """A key or holder as it is safe to print: itself if printable, else its repr."""
    if text is None:
        return "-"
    return text if text.isprintable() else repr(text)


def ahead(seconds: float | None) -> str:
    """Seconds ahead of the snapshot (``-`` for none, ``overdue`` if past)."""
    if seconds is None:
        return "-"
    return "overdue" if seconds < 0 else duration(seconds)


def title(name: str, where: str, snap: Snapshot[str]) -> str:
    """One line: the queue, the server, its sizes and its oldest wait."""
    s = snap.stats
    return (
        f"queue {shown(name)} at {where}: {count(s.depth)} waiting, "
        f"{count(s.processing)} processing, {count(s.delayed)} delayed, "
        f"{count(snap.failing_keys)} failing; oldest wait {duration(s.oldest_wait_seconds)}"
    )


def _caption(rows: int, total: int, what: str) -> str:
    if rows < total:
        return f"{what}: first {count(rows)} of {count(total)}"
    return f"{what}: {count(total)}"


def tables(snap: Snapshot[str], out: Output, rows: int | None = None) -> list[Table]:
    """The four lists as tables (the first ``rows`` of each, default all shown):
    waiting keys next out first, held keys, delayed keys soonest first,
    failing keys most failures first."""
    s = snap.stats
    lists: list[tuple[str, int, tuple[str, ...], list[tuple[str, ...]]]] = [
        (
            "Waiting",
            s.depth,
            ("priority", "waited"),
            [(shown(w.key), count(w.priority), duration(w.waited)) for w in snap.waiting],
        ),
        (
            "Processing",
            s.processing,
            ("holder", "token", "held", "lease left"),
            [
                (
                    shown(h.key),
                    shown(h.holder),
                    "-" if h.token is None else str(h.token),
                    duration(h.held),
                    ahead(h.lease_left),
                )
                for h in snap.processing
            ],
        ),
        (
            "Delayed",
            s.delayed,
            ("due in", "priority"),
            [(shown(d.key), ahead(d.due_in), count(d.priority)) for d in snap.delayed],
        ),
        (
            "Failing",
            snap.failing_keys,
            ("failures", "comes back in"),
            [(shown(f.key), count(f.failures), ahead(f.comes_back_in)) for f in snap.failing],
        ),
    ]
    made = []
    for what, total, columns, every in lists:
        cells = every[:rows]
        words = [left(c) if c == "holder" else c for c in columns]
        table = out.table(left("key"), *words, title=_caption(len(cells), total, what))
        for row in cells:
            table.add_row(*row)
        made.append(table)
    return made


@dataclass(frozen=True, slots=True)
class Rates:
    """Per second over the last interval, from two snapshots' counters."""

    adds: float
    gets: float
    dones: float
    failures: float
    """Failed keys coming back through the rate limiter (``retry``,
    ``add_rate_limited``, expired leases): the ``rate_limited`` counter."""
    mean_work: float | None
    """Mean seconds held per ``done`` in the interval (None: no done)."""


def rates(before: Stats, after: Stats, seconds: float) -> Rates:
    """The rates between two readings ``seconds`` apart (server time)."""
    span = seconds if seconds > 0 else float("inf")
    dones = after.dones - before.dones
    worked = after.work_seconds - before.work_seconds
    return Rates(
        adds=(after.adds - before.adds) / span,
        gets=(after.gets - before.gets) / span,
        dones=dones / span,
        failures=(after.rate_limited - before.rate_limited) / span,
        mean_work=worked / dones if dones > 0 else None,
    )


def _rate(value: float | None) -> str:
    return "-" if value is None else number(value, 3)


def _now() -> str:
    return time.strftime("%H:%M:%S")


def plain_line(snap: Snapshot[str], per_second: Rates | None) -> str:
    """``top --plain``: one line per interval, ``name=value`` pairs, to grep."""
    s = snap.stats
    r = per_second
    fields: list[tuple[str, Any]] = [
        ("depth", s.depth),
        ("processing", s.processing),
        ("delayed", s.delayed),
        ("failing", snap.failing_keys),
        ("adds/s", "-" if r is None else _rate(r.adds)),
        ("gets/s", "-" if r is None else _rate(r.gets)),
        ("dones/s", "-" if r is None else _rate(r.dones)),
        ("failures/s", "-" if r is None else _rate(r.failures)),
        ("oldest_wait", duration(s.oldest_wait_seconds)),
        ("mean_work", "-" if r is None or r.mean_work is None else duration(r.mean_work)),
    ]
    return _now() + " " + " ".join(f"{k}={v}" for k, v in fields)


def frame(
    name: str, where: str, snap: Snapshot[str], per_second: Rates | None, out: Output, rows: int
) -> RenderableType:
    """``top``'s live frame: the title, the rates, and the first ``rows`` of each list."""
    r = per_second
    if r is None:
        line = "rates from the next refresh on"
    else:
        work = "-" if r.mean_work is None else duration(r.mean_work)
        line = (
            f"per second: {_rate(r.adds)} adds, {_rate(r.gets)} gets, {_rate(r.dones)} dones, "
            f"{_rate(r.failures)} failures; mean work time {work}"
        )
    return Group(
        Text(f"{_now()}  {title(name, where, snap)}", style="bold"),
        Text(line),
        *tables(snap, out, rows),
        Text("Ctrl-C to quit", style="dim"),
    )
