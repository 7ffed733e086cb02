"""How ``keyqueue lab slowmo`` looks: its header, one coloured line per transition, the summary.

The summary points at the proof the run found (``run.find_proof``): the
lines where one key was marked while held, coalesced, redelivered once and
handed out once more.
"""

from __future__ import annotations

from rich.console import RenderableType
from rich.text import Text

from ..._console.format import count, counted, number, numbered
from .run import (
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

__all__ = ["slowmo_header", "slowmo_line", "slowmo_summary"]

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
