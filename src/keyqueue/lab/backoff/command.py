"""``keyqueue lab backoff``: the click command (options, then ``run_backoff``, then its render)."""

from __future__ import annotations

import click

from ..._console.format import Mode, Output
from ..._console.options import float_option, int_option, output_options
from . import render
from .run import MAX_AUTO_ATTEMPTS, run_backoff

__all__ = ["backoff"]


@click.command(short_help="Per-key backoff table and a thundering herd, computed exactly.")
@float_option(
    "--base",
    "base_ms",
    above=0,
    max=1e12,
    default=5.0,
    help="Per-key base delay in milliseconds (client-go's default: 5).",
)
@float_option(
    "--cap",
    above=0,
    max=1e9,
    default=1000.0,
    help="Per-key maximum delay in seconds (client-go's default: 1000).",
)
@int_option(
    "--attempts",
    min=1,
    max=1000,
    default=None,
    help=f"Rows in the table [default: two past the cap, at most {MAX_AUTO_ATTEMPTS}].",
)
@int_option(
    "--herd",
    min=1,
    max=100_000,
    default=500,
    help="Distinct keys failing at once in the thundering-herd run.",
)
@output_options
def backoff(
    *, base_ms: float, cap: float, attempts: int | None, herd: int, as_json: bool, plain: bool
) -> None:
    """Backoff, exactly: the per-key exponential table and a thundering herd.

    The table asks a real ItemExponentialFailureRateLimiter(base, cap) for each
    attempt's delay. The herd makes --herd distinct keys fail at once on a
    WorkQueue with the default controller limiter (per-key 5 ms doubling, and a
    10/s token bucket with burst 100), and counts the re-adds per second. Both
    run on a FakeClock: instant and exact.
    """
    base = base_ms / 1000
    if cap < base:
        raise click.BadParameter(
            f"the cap ({cap:g} s) must be at least the base ({base_ms:g} ms)",
            param_hint="'--cap'",
        )
    out = Output(Mode.choose(as_json, plain))
    result = run_backoff(base, cap, attempts, herd)
    out.show(result, render.render_backoff)
