"""``keyqueue lab slowmo``: the click command (options, then ``run_slowmo``, then its render).

A spinner shows the script's progress in rich mode; each trace line is printed
as it happens (nothing but the JSON document with ``--json``).
"""

from __future__ import annotations

from collections.abc import Callable

import click
from rich.status import Status

from ..._console.format import Mode, Output
from ..._console.options import exit_interrupted, float_option, int_option, output_options
from . import render
from .run import SlowmoConfig, TraceLine, run_slowmo

__all__ = ["slowmo"]


@click.command(short_help="Every transition of a few keys, one line each, in slow motion.")
@float_option(
    "--speed",
    min=0.01,
    max=10_000,
    default=1.0,
    help="Play this many times faster (2 = twice as fast; 0.5 = slower still).",
)
@int_option(
    "--workers",
    min=1,
    max=16,
    default=2,
    help="Worker threads.",
)
@float_option(
    "--hold",
    "hold_ms",
    min=0,
    max=60_000,
    default=300.0,
    help="Milliseconds a worker holds each key (at speed 1).",
)
@float_option(
    "--rate",
    min=0.01,
    max=1000,
    default=4.0,
    help="Events per second the generator fires (at speed 1).",
)
@output_options
def slowmo(
    *, speed: float, workers: int, hold_ms: float, rate: float, as_json: bool, plain: bool
) -> None:
    """A slow-motion run: every transition of a few keys, one line each.

    A generator fires a few events a second at four keys; workers hold each key
    for --hold milliseconds; default/db fails twice. Watch for default/web:
    added while a worker holds it (REQUEUE-WHILE-PROCESSING), added again
    (COALESCED), then handed out exactly once more (REDELIVERY, Get). The
    summary points at those lines.

    Each of the queue's tags names the Stats counter it adds one to: ENQUEUE
    enqueued, COALESCED coalesced, REQUEUE-WHILE-PROCESSING
    marked_while_processing, REDELIVERY redeliveries, RATELIMIT rate_limited.
    Times are wall seconds since the start, --speed applied.
    """
    out = Output(Mode.choose(as_json, plain))
    config = SlowmoConfig(speed=speed, workers=workers, hold=hold_ms / 1000, rate=rate)
    on_line: Callable[[TraceLine], None] | None = None
    status: Status | None = None
    if not out.quiet:
        out.print(render.slowmo_header(config))

        def on_line(line: TraceLine) -> None:
            out.print(render.slowmo_line(line))

    on_step: Callable[[int, int], None] | None = None
    if out.rich:
        status = out.console.status("slowmo: starting", spinner="dots")
        status.start()

        def on_step(done: int, total: int) -> None:
            assert status is not None
            status.update(f"slowmo: script step {done:,}/{total:,}")

    try:
        result = run_slowmo(config, on_line=on_line, on_step=on_step)
    finally:
        if status is not None:
            status.stop()
    if out.quiet:
        out.json(result.to_json())
    else:
        out.print(*render.slowmo_summary(result))
    if result.interrupted:
        exit_interrupted()
