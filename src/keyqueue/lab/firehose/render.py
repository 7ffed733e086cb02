"""How ``keyqueue lab firehose`` looks: the live panel, the [STATS] and [DRAIN] lines, the summary.

The same words for both backends; the redis backend's header and summary
add how the load was spread over processes.
"""

from __future__ import annotations

import math

from rich.console import RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from keyqueue import Stats

from ..._console.format import count, counted, duration, number, numbered, percent, roughly
from ..._console.format import duration as _duration  # firehose_panel has a parameter duration
from .._percentiles import Percentiles
from .common import KEEP_UP, FirehoseConfig, FirehoseResult, FirehoseTick

__all__ = [
    "drain_line",
    "firehose_header",
    "firehose_headline",
    "firehose_panel",
    "firehose_stats_line",
    "firehose_summary",
]


def _roughly(x: float, one: str) -> str:
    """``roughly(x)`` and the noun that agrees with it: 'one event', 'less than
    one reconcile', 'about a thousand reconciles'."""
    words = roughly(x)
    if words == "none":
        return f"no {one}s"
    return f"{words} {one if words.endswith('one') else one + 's'}"


def _ms(p: float | None) -> str:
    return "-" if p is None else f"{p * 1000:,.1f}"


def _s(p: float | None) -> str:
    return "-" if p is None else f"{p:,.2f}"


def _pcts(p: Percentiles) -> str:
    """'41.1/62.4/77.7ms'; in seconds once the slowest is past one: '0.91/1.77/1.85s'."""
    if p.p99 is not None and p.p99 >= 1:
        return f"{_s(p.p50)}/{_s(p.p95)}/{_s(p.p99)}s"
    return f"{_ms(p.p50)}/{_ms(p.p95)}/{_ms(p.p99)}ms"


def firehose_header(c: FirehoseConfig) -> Text:
    """The run's settings, in plain mode's first line."""
    return Text(
        f"keyqueue lab firehose: {numbered(c.rate, 'event')}/s onto {counted(c.keys, 'key')} for "
        f"{number(c.duration)}s, {_workers(c)}, reconcile ~{number(c.reconcile * 1000)} ms, "
        f"failure rate {number(c.failure_rate)}, seed {c.seed}"
        + (
            f", backend redis (one queue shared by {_processes(c)})"
            if c.backend != "memory"
            else ""
        )
    )


def _processes(c: FirehoseConfig) -> str:
    return counted(c.processes, "process", "processes")


def _workers(c: FirehoseConfig) -> str:
    """'4 workers', or '4 workers in 2 processes' (the redis backend)."""
    if c.backend == "memory":
        return counted(c.workers, "worker")
    return f"{counted(c.workers, 'worker')} in {_processes(c)}"


def _backend(c: FirehoseConfig) -> str:
    """The redis backend's summary line."""
    return (
        f"backend redis: {_processes(c)} sharing one queue, each firing its share of "
        "the rate and running its share of the workers"
    )


def firehose_stats_line(tick: FirehoseTick) -> str:
    """``[STATS] ...`` while firing; ``[DRAIN] ...`` after the last event."""
    if tick.draining:
        return (
            f"[DRAIN] t={tick.t:,.1f}s waiting={count(tick.depth)} "
            f"held={count(tick.processing)} processed={count(tick.processed)} "
            f"wait p50/p95/p99={_pcts(tick.queue_wait)} "
            f"reconcile p50/p95/p99={_pcts(tick.reconcile)}"
        )
    line = (
        f"[STATS] t={tick.t:,.1f}s events={count(tick.events)} ({count(tick.event_rate)}/s) "
        f"adds={count(tick.adds)} enqueued={count(tick.enqueued)} "
        f"coalesced={count(tick.coalesced)} "
        f"marked={count(tick.marked_while_processing)} processed={count(tick.processed)} "
        f"rate-limited={count(tick.rate_limited)} depth={count(tick.depth)} "
        f"max-depth={count(tick.max_depth)} absorbed={percent(tick.absorbed)} "
        f"wait p50/p95/p99={_pcts(tick.queue_wait)} "
        f"reconcile p50/p95/p99={_pcts(tick.reconcile)}"
    )
    if tick.drain_eta is not None and tick.drain_eta >= 1:
        line += f"\n{drain_line(tick)}"
    return line


def drain_line(tick: FirehoseTick) -> str:
    """As firing ends, when what is left takes a while: the estimate, up front."""
    assert tick.drain_eta is not None
    return (
        f"[DRAIN] t={tick.t:,.1f}s firing done; {counted(tick.depth, 'key')} waiting and "
        f"{count(tick.processing)} held: the drain will take about {duration(tick.drain_eta)}"
    )


def firehose_panel(
    tick: FirehoseTick | None, elapsed: float, duration: float, rate: float
) -> Panel:
    """The live status panel: a progress bar, then the latest sample."""
    shown = min(elapsed, duration)
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold", min_width=10)
    grid.add_column(min_width=56)
    progress = Table.grid(padding=(0, 1))
    progress.add_row(
        ProgressBar(total=duration, completed=shown, width=40),
        Text(f"{shown:,.1f}s of {number(duration)}s"),
    )
    grid.add_row("time", progress)
    if tick is None:
        grid.add_row("events", "starting…")
        return Panel(grid, title="keyqueue lab firehose", expand=False)
    if tick.draining or tick.drain_eta is not None:
        eta = f"; about {_duration(tick.drain_eta)} in all" if tick.drain_eta is not None else ""
        grid.add_row(
            "draining",
            Text(
                f"{count(tick.depth)} waiting, {count(tick.processing)} held "
                f"({number(max(0.0, tick.t - duration), 3)}s after the last event{eta})",
                style="bold yellow",
            ),
        )
    behind = tick.event_rate < KEEP_UP * rate
    grid.add_row(
        "events",
        Text(
            f"{count(tick.events)}  ({count(tick.event_rate)}/s of {count(rate)}/s"
            + (": the machine is not keeping up)" if behind else ")"),
            style="bold yellow" if behind else "",
        ),
    )
    grid.add_row(
        "adds",
        f"{count(tick.adds)} = {count(tick.enqueued)} enqueued + {count(tick.coalesced)} "
        f"coalesced + {count(tick.marked_while_processing)} marked while processing",
    )
    grid.add_row("absorbed", Text(percent(tick.absorbed), style="bold green"))
    grid.add_row("processed", f"{count(tick.processed)}   rate-limited {count(tick.rate_limited)}")
    grid.add_row("depth", f"{count(tick.depth)}   max {count(tick.max_depth)}")
    grid.add_row("queue wait", f"p50/p95/p99 {_pcts(tick.queue_wait)}")
    grid.add_row("reconcile", f"p50/p95/p99 {_pcts(tick.reconcile)}")
    return Panel(grid, title="keyqueue lab firehose", expand=False)


def firehose_summary(result: FirehoseResult) -> list[RenderableType]:
    c, s = result.config, result.stats
    out: list[RenderableType] = []
    head = "Summary (interrupted)" if result.interrupted else "Summary"
    out.append(Text(f"\n{head}", "bold"))
    if result.interrupted:
        out.append(
            Text(
                f"  Interrupted after {result.elapsed:,.1f}s of the {c.duration:,.1f}s asked: "
                "the counts below are that much of a run, too little to judge its rates by.",
                "bold yellow",
            )
        )
    if c.backend != "memory":
        out.append(Text(f"  {_backend(c)}"))
    out.append(
        Text(
            f"  {counted(result.events, 'event')} onto {counted(c.keys, 'key')} in "
            f"{result.elapsed:,.1f}s: "
            f"target {count(c.rate)}/s, achieved {count(result.achieved_rate)}/s"
        )
    )
    if not result.kept_up and not result.interrupted:  # a cut-short run proves no rate
        share = math.floor(100 * result.achieved_rate / c.rate)
        out.append(
            Text(
                f"  This machine could not keep up: the producer fired only "
                f"{counted(result.achieved_rate, 'event')} a second, {share}% of the "
                f"{count(c.rate)} asked.",
                "bold yellow",
            )
        )
    out.append(
        Text(
            f"  {counted(s.adds, 'add')} = {count(s.enqueued)} enqueued + {count(s.coalesced)} "
            f"coalesced + {count(s.marked_while_processing)} marked while processing"
        )
    )
    were = "was" if result.failures == 1 else "were"
    failed = f"{count(result.failures)} failed and {were} rate-limited for a retry"
    if result.gave_up:
        failed = (
            f"{count(result.failures)} failed: {count(result.failures - result.gave_up)} "
            f"rate-limited for a retry, {count(result.gave_up)} given up in the drain "
            "(a queue that is shutting down takes no retries)"
        )
    out.append(
        Text(
            f"  {counted(s.dones, 'reconcile')} by {_workers(c)} ({_handed_out(s)}), {failed}; "
            f"max depth {count(s.max_depth)}"
        )
    )
    if result.drained_in:
        out.append(Text(f"  drained in {result.drained_in:,.1f}s after the last event"))
    out.append(
        Text(
            f"  queue wait p50/p95/p99 {_pcts(result.queue_wait)}, "
            f"reconcile time p50/p95/p99 {_pcts(result.reconcile)}"
        )
    )
    out.append(Text(firehose_headline(result), "bold green"))
    return out


def _handed_out(s: Stats) -> str:
    """Where the reconciles came from, adding up however the run ended: every
    enqueued or redelivered key was handed out, or was still waiting when the
    run stopped; every key handed out was reconciled, or was still held."""
    queued = f"{count(s.enqueued)} enqueued + {count(s.redeliveries)} redelivered keys"
    waiting, held = s.enqueued + s.redeliveries - s.gets, s.gets - s.dones
    if waiting == 0 and held == 0:
        return f"{queued} handed out"
    parts = [f"{count(s.gets)} handed out"]
    if waiting:
        parts.append(f"{count(waiting)} still waiting")
    text = f"{queued} = {' + '.join(parts)}"
    if held:
        text += f"; {count(held)} still held when the run stopped"
    return text


def firehose_headline(result: FirehoseResult) -> str:
    """'half a million events, 99.0% absorbed, about a thousand reconciles a second.'

    An interrupted run says so and gives counts, not rates: nine reconciles
    in 0.3 s are not "about thirty a second"."""
    if result.interrupted:
        return (
            f"Interrupted: {counted(result.events, 'event')}, {percent(result.absorbed)} "
            f"absorbed, {counted(result.stats.dones, 'reconcile')} in {result.elapsed:,.1f}s."
        )
    return (
        f"{_roughly(result.events, 'event').capitalize()}, {percent(result.absorbed)} absorbed, "
        f"{_roughly(result.reconciles_per_second, 'reconcile')} a second."
    )
