"""How ``keyqueue lab backoff`` looks: the per-key table, then the herd's re-adds per second."""

from __future__ import annotations

from rich.text import Text

from ..._console.format import DASH, Output, count, counted, duration, left, number
from .run import BackoffResult

__all__ = ["render_backoff"]


def render_backoff(result: BackoffResult, out: Output) -> None:
    title = f"Per-key exponential backoff: base {duration(result.base)}, cap {duration(result.cap)}"
    table = out.table("attempt", "delay", "seconds", "waited so far", left(""), title=title)
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
    table = out.table("second", "re-adds", left(""))
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
