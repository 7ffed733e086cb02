"""How the lab's results look: rich (colour, live panels), plain text, or JSON.

The subcommands' logic returns result objects; everything about presentation
lives here. Plain mode (``--plain``, or stdout not a terminal) uses the same
words without colour, boxes or redraw, one line per update, so it can be piped
and grepped. ``--json`` prints only ``result.to_json()``.
"""

from __future__ import annotations

import math

from rich.console import RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from keyqueue import Stats

from ._format import (
    DASH,
    RHO,
    Mode,
    Output,
    count,
    counted,
    duration,
    number,
    numbered,
    percent,
    roughly,
)
from ._format import duration as _duration  # firehose_panel has a parameter named duration
from .backoff import BackoffResult
from .fairness import FairnessResult
from .firehose import KEEP_UP, FirehoseConfig, FirehoseResult, FirehoseTick, Percentiles
from .model import ModelResult
from .slowmo import (
    COALESCED,
    ENQUEUE,
    MARK,
    RATELIMIT,
    REDELIVERY,
    WORKER,
    SlowmoConfig,
    SlowmoResult,
    TraceLine,
)

__all__ = [
    "Mode",
    "Output",
    "count",
    "firehose_header",
    "firehose_panel",
    "firehose_stats_line",
    "firehose_summary",
    "percent",
    "roughly",
    "render_backoff",
    "render_fairness",
    "render_model",
    "slowmo_header",
    "slowmo_line",
    "slowmo_summary",
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


# -- slowmo -------------------------------------------------------------------

_STYLES = {
    ENQUEUE: "cyan",
    COALESCED: "bright_black",
    MARK: "bold magenta",
    REDELIVERY: "bold yellow",
    RATELIMIT: "bold red",
    WORKER: "green",
}


def slowmo_header(config: SlowmoConfig) -> Text:
    """What the run does, in the trace's unit (wall seconds, speed applied)."""
    speed = config.speed
    return Text(
        f"keyqueue lab slowmo at speed {number(speed)}: 4 keys, "
        f"{counted(config.workers, 'worker')}, "
        f"{numbered(config.rate * speed, 'event', digits=3)}/s, each key held "
        f"{number(config.hold / speed, 3)}s; times are seconds since the start",
        "bold",
    )


def slowmo_line(line: TraceLine) -> Text:
    """``  12    1.25s [COALESCED] key=default/web (...)``: number and time dim,
    the tag coloured, the rest plain."""
    text = Text()
    text.append(f"{line.n:>4,} {line.t:8,.2f}s", style="dim")
    text.append(" ")
    label, _, rest = line.text.partition("]")
    style = _STYLES.get(line.tag, "")
    if line.tag == WORKER and line.ok is False:
        style = "red"
    text.append(label + "]", style=style)
    text.append(rest)
    return text


def slowmo_summary(result: SlowmoResult) -> list[RenderableType]:
    s = result.stats
    out: list[RenderableType] = []
    head = "Summary (interrupted)" if result.interrupted else "Summary"
    speed = number(result.config.speed)
    out.append(Text(f"\n{head}: {result.elapsed:,.2f}s at speed {speed}", "bold"))
    due = s.adds - result.events
    out.append(
        Text(
            f"  {counted(result.events, 'event')} from the generator"
            + (f" and {counted(due, 'retry coming due', 'retries coming due')}" if due else "")
            + f" = {counted(s.adds, 'add')}: {count(s.enqueued)} enqueued [{ENQUEUE}], "
            f"{count(s.coalesced)} coalesced [{COALESCED}], {count(s.marked_while_processing)} "
            f"marked while processing [{MARK}] → "
            f"{counted(s.redeliveries, 'redelivery', 'redeliveries')} [{REDELIVERY}]"
        )
    )
    out.append(
        Text(
            f"  {counted(s.dones, 'reconcile')} by {counted(result.config.workers, 'worker')}, "
            f"{count(result.failures)} failed and {'was' if result.failures == 1 else 'were'} "
            f"retried with backoff [{RATELIMIT}]"
        )
    )
    proof = result.proof
    if proof is None:
        out.append(
            Text(
                "  No key completed REQUEUE-WHILE-PROCESSING → REDELIVERY → Get yet"
                + (" (interrupted)." if result.interrupted else "."),
                "yellow",
            )
        )
        return out
    held = f" (held as Get seq={proof.held_seq:,})" if proof.held_seq is not None else ""
    out.append(Text(f"\nThe proof, key {proof.key}{held}:", "bold"))
    rows = [(f"line {proof.mark.n:,}", MARK, "added while a worker held it: marked, not queued")]
    if proof.coalesced:
        nums = ", ".join(f"{line.n:,}" for line in proof.coalesced)
        plural = "s" if len(proof.coalesced) > 1 else ""
        rows.append(
            (
                f"line{plural} {nums}",
                COALESCED,
                f"{count(len(proof.coalesced))} more add{plural} while held: coalesced",
            )
        )
    rows.append((f"line {proof.redelivery.n:,}", REDELIVERY, "after Done: queued exactly once"))
    get_seq = f"{proof.get.seq:,}" if proof.get.seq is not None else "?"
    rows.append((f"line {proof.get.n:,}", WORKER, f"Get seq={get_seq}: the one more Get"))
    for where, tag, what in rows:
        line = Text(f"  {where:<14} ")
        label = tag if tag != WORKER else proof.get.text.split("]")[0][1:]
        line.append(f"[{label}]", style=_STYLES[tag])
        line.append(f" {what}")
        out.append(line)
    adds = 1 + len(proof.coalesced)
    out.append(
        Text(
            f"  {counted(adds, 'add')} while held → exactly 1 more reconcile, never 2 at once.",
            "bold",
        )
    )
    return out


# -- firehose -----------------------------------------------------------------


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
    if c.backend != "memory":
        out.append(Text(f"  {_backend(c)}"))
    out.append(
        Text(
            f"  {counted(result.events, 'event')} onto {counted(c.keys, 'key')} in "
            f"{result.elapsed:,.1f}s: "
            f"target {count(c.rate)}/s, achieved {count(result.achieved_rate)}/s"
        )
    )
    if not result.kept_up:
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
    """'half a million events, 99.0% absorbed, about a thousand reconciles a second.'"""
    return (
        f"{_roughly(result.events, 'event').capitalize()}, {percent(result.absorbed)} absorbed, "
        f"{_roughly(result.reconciles_per_second, 'reconcile')} a second."
    )


# -- backoff ------------------------------------------------------------------


def render_backoff(result: BackoffResult, out: Output) -> None:
    table = Table(
        title=f"Per-key exponential backoff: base {duration(result.base)}, "
        f"cap {duration(result.cap)}",
        box=out.box(),
        title_justify="left",
    )
    table.add_column("attempt", justify="right")
    table.add_column("delay", justify="right")
    table.add_column("seconds", justify="right")
    table.add_column("waited so far", justify="right")
    table.add_column("")
    for row in result.rows:
        marker = "← cap" if row.attempt == result.cap_attempt else ("capped" if row.capped else "")
        table.add_row(
            count(row.attempt),
            duration(row.delay),
            number(row.delay),
            duration(row.total),
            Text(marker, style="bold red" if row.capped else ""),
        )
    out.print(table)
    if result.cap_attempt is not None:
        out.print(
            Text(
                f"Attempt {result.cap_attempt:,} is the first to hit the cap; every failure "
                f"after it waits {duration(result.cap)}."
            )
        )
    else:
        out.print(Text(f"The cap is not reached within {counted(len(result.rows), 'attempt')}."))

    herd = result.herd
    out.print(
        Text(
            f"\nThundering herd: {counted(herd.keys, 'key')} "
            f"{'fails' if herd.keys == 1 else 'fail'} "
            "at once through the default "
            f"controller limiter (per-key 5ms doubling, bucket {number(herd.qps)}/s, "
            f"burst {count(herd.burst)})",
            "bold",
        )
    )
    table = Table(box=out.box())
    table.add_column("second", justify="right")
    table.add_column("re-adds", justify="right")
    table.add_column("")
    scale = max(herd.readds_per_second) or 1
    rows: list[tuple[int, int, int]] = []  # first second, last second, count
    for second, n in enumerate(herd.readds_per_second):
        if rows and rows[-1][2] == n and second == rows[-1][1] + 1:
            rows[-1] = (rows[-1][0], second, n)
        else:
            rows.append((second, second, n))
    bar_char = "█" if out.rich else "#"
    for first, last, n in rows:
        span = f"{first:,}{DASH}{last + 1:,}"
        note = " each" if first != last else ""
        table.add_row(span, f"{n:,}{note}", bar_char * max(1 if n else 0, round(40 * n / scale)))
    out.print(table)
    rest = herd.keys - herd.within_burst
    text = (
        f"{counted(herd.within_burst, 'key')} came back after only "
        f"{'its' if herd.within_burst == 1 else 'their'} per-key delay "
        f"({duration(herd.first_readd)}): the bucket's burst."
    )
    if rest:
        text += (
            f" The other {count(rest)} {'was' if rest == 1 else 'were'} spread "
            f"{duration(1 / herd.qps)} apart, "
            f"{number(herd.qps)} a second, the last at {duration(herd.last_readd)}."
        )
    out.print(Text(text))


# -- model --------------------------------------------------------------------


def _num(x: float) -> str:
    return number(x)


def _per_step(x: float) -> str:
    """'1 key/step', '2.5 keys/step'."""
    return f"{numbered(x, 'key')}/step"


def _steps(x: float) -> str:
    return f"{number(x, 3)} step" if x == 1 else f"{number(x, 3)} steps"


def _percent(fraction: float) -> str:
    return f"{count(100 * fraction)}%"


def render_model(result: ModelResult, out: Output) -> None:
    b = _num(result.backlog)
    table = Table(
        title=f"Fluid model: λ={_per_step(result.arrival)} arrive, μ={_per_step(result.service)} "
        f"served, backlog {b} at t=0",
        box=out.box(),
        title_justify="left",
    )
    table.add_column("t", justify="right")
    table.add_column("backlog", justify="right")
    table.add_column("served", justify="right")
    table.add_column("utilisation", justify="right")
    for step in result.steps:
        table.add_row(
            count(step.t),
            _num(step.backlog),
            "" if step.t == 0 else _num(step.served),
            "" if step.t == 0 else _percent(step.utilisation),
        )
    out.print(table)
    util = _percent(result.utilisation)
    growth = result.growth_per_step
    if growth > 0:
        out.print(
            Text(
                f"Overloaded: λ/μ = {util}. The backlog grows by λ-μ = {_num(growth)} per "
                f"step (backlog(t) = {b} + {_num(growth)}·t) and never clears.",
                "bold red",
            )
        )
    elif result.clears_at is not None:
        how = f"backlog / (μ-λ) = {b} / {_num(-growth)}" if growth < 0 else "nothing to clear"
        out.print(
            Text(f"λ/μ = {util}. The backlog clears at t = {_num(result.clears_at)} ({how}).")
        )
    else:
        out.print(Text(f"λ = μ: λ/μ = {util}. The backlog stays at {b}: it never clears."))
    if result.mm1 is not None:
        m = result.mm1
        out.print(
            Text(
                f"M/M/1 with {RHO} = λ/μ = {number(m.rho, 3)}: on average L = {RHO}/(1-{RHO}) = "
                f"{numbered(m.mean_in_system, 'key', digits=3)} in the system "
                f"(Lq = {number(m.mean_waiting, 3)} waiting), "
                f"and each spends W = 1/(μ-λ) = {_steps(m.mean_time_in_system)} from ready "
                f"to done (Wq = {_steps(m.mean_wait)} waiting)."
            )
        )
    else:
        out.print(Text("No M/M/1 estimates: they need λ < μ (otherwise there is no steady state)."))
    for warning in result.warnings:
        out.print(Text(warning, "yellow"))


# -- fairness -----------------------------------------------------------------


def render_fairness(result: FairnessResult, out: Output) -> None:
    c = result.config
    each = duration(c.service)
    table = Table(
        title=f"(a) A relist of {counted(c.relist, 'key')} ({each} each) at priority {result.low}, "
        f"with a user edit every {duration(c.edit_every)}",
        box=out.box(),
        title_justify="left",
    )
    table.add_column("edits added", justify="left")
    table.add_column("edits", justify="right")
    table.add_column("edit p50", justify="right")
    table.add_column("edit p99", justify="right")
    table.add_column("relist done", justify="right")
    for row in result.latency:
        how = {
            "FIFO (no priorities)": "plainly (FIFO)",
            "strict priorities": f"at priority {result.high}, strict",
            "aging": f"at priority {result.high}, aging {duration(c.aging)}",
        }[row.mode]
        table.add_row(
            how,
            count(row.edits),
            duration(row.edit_p50),
            duration(row.edit_p99),
            duration(row.relist_done),
        )
    out.print(table)
    fifo, strict = result.latency[0], result.latency[1]
    out.print(
        Text(
            f"Plain adds wait behind the relist (p99 {duration(fifo.edit_p99)}); with a "
            f"priority an edit waits only for the key in hand ({duration(strict.edit_p99)})."
        )
    )

    table = Table(
        title=f"\nThe same relist under a sustained priority-{result.high} stream at the "
        f"worker's full capacity (one key every {each})",
        box=out.box(),
        title_justify="left",
    )
    table.add_column("priorities", justify="left")
    table.add_column("after", justify="right")
    table.add_column("relist served", justify="right")
    table.add_column("oldest relist wait", justify="right")
    table.add_column("stream p99", justify="right")
    table.add_column("bound", justify="right")
    for stream in result.stream:
        mode = "strict" if stream.mode == "strict priorities" else f"aging {duration(c.aging)}"
        table.add_row(
            mode,
            duration(stream.at),
            f"{count(stream.relist_served)} of {count(c.relist)}",
            duration(stream.relist_tail),
            duration(stream.stream_p99),
            "" if stream.bound is None else duration(stream.bound),
        )
    out.print(table)
    strict_rows = [row for row in result.stream if row.mode == "strict priorities"]
    aging_rows = [row for row in result.stream if row.mode == "aging"]
    out.print(
        Text(
            "Strict: the relist starves, and its wait grows with the run ("
            + ", ".join(f"{duration(r.relist_tail)} after {duration(r.at)}" for r in strict_rows)
            + ")."
        )
    )
    last = aging_rows[-1]
    if last.bound is not None:
        waiting = round((last.bound - result.aging_wait_part) / c.service)
        out.print(
            Text(
                f"Aging: every relist key is handed out within {number(last.relist_tail)}s, "
                f"however long the stream runs. The bound: (P_max - p) x aging = "
                f"({result.high} - {result.low}) x {duration(c.aging)} after a key arrives, "
                f"no newer key ranks ahead of it; what waited at that time and the key in "
                f"hand ({counted(waiting, 'key')} x {each}) are served first: "
                f"{number(last.bound)}s. The price: stream keys arriving meanwhile wait "
                f"behind the relist (p99 {duration(last.stream_p99)})."
            )
        )

    table = Table(
        title=f"\n(b) {counted(c.failing, 'key')} {'keeps' if c.failing == 1 else 'keep'} failing "
        f"against endpoint A; endpoint B's "
        f"keys fail once each, one a second ({duration(c.endpoint_duration)})",
        box=out.box(),
        title_justify="left",
    )
    table.add_column("rate limiter", justify="left")
    table.add_column("calls to A, first second", justify="right")
    table.add_column("calls to A", justify="right")
    table.add_column("B's backoff p50", justify="right")
    table.add_column("B's backoff max", justify="right")
    for endpoint in result.endpoints:
        table.add_row(
            endpoint.limiter,
            count(endpoint.a_calls_first_second),
            count(endpoint.calls_to_a),
            duration(endpoint.b_delay_p50),
            duration(endpoint.b_delay_max),
        )
    out.print(table)
    per_key, shared, per_endpoint = result.endpoints
    out.print(
        Text(
            f"Per-key backoff alone lets the failing keys hammer A together "
            f"({counted(per_key.a_calls_first_second, 'call')} in the first second). One bucket "
            f"({number(result.failing_endpoint_qps)}/s, burst "
            f"{count(result.failing_endpoint_burst)}) protects A, but A's debt makes B's "
            f"retries wait {duration(shared.b_delay_p50)}. A bucket per endpoint protects A "
            f"as well and B waits only its own backoff ({duration(per_endpoint.b_delay_p50)})."
        )
    )
