"""``keyqueue lab fairness``: the click command (options, then ``run_fairness``, then its render).

The options are checked together before the run: a relist or a stream that
would take the one simulated worker past an hour, or ten million keys, is a
usage error.
"""

from __future__ import annotations

import click

from ..._console.format import Mode, Output
from ..._console.options import float_option, int_option, json_option, plain_option
from . import render
from .run import FairnessConfig, run_fairness

__all__ = ["fairness"]


@click.command(
    short_help="Priorities with aging, per-endpoint buckets, fair tenants, computed exactly."
)
@int_option(
    "--relist",
    min=1,
    max=1_000_000,
    default=10_000,
    help="Keys the relist adds at t=0, at priority 0.",
)
@float_option(
    "--service",
    "service_ms",
    above=0,
    max=60_000,
    default=1.0,
    help="Milliseconds the worker spends on each key.",
)
@float_option(
    "--edit-every",
    "edit_every_ms",
    above=0,
    max=3_600_000,
    default=50.0,
    help="Milliseconds between user edits during the relist.",
)
@float_option(
    "--aging",
    above=0,
    max=1e9,
    default=15.0,
    help="Seconds a waiting key takes to gain one priority step (the aging rows).",
)
@float_option(
    "--duration",
    above=0,
    max=3600,
    default=60.0,
    help="Seconds the sustained priority-1 stream runs.",
)
@int_option(
    "--failing",
    min=1,
    max=100_000,
    default=1_000,
    help="Keys that keep failing against endpoint A.",
)
@plain_option("No colour, no boxes (automatic when stdout is not a terminal).")
@json_option()
def fairness(
    *,
    relist: int,
    service_ms: float,
    edit_every_ms: float,
    aging: float,
    duration: float,
    failing: int,
    plain: bool,
    as_json: bool,
) -> None:
    """Fairness, exactly: priorities with aging, one bucket per endpoint, fair tenants.

    (a) A relist of --relist keys at priority 0, --service ms each, while a
    user edit arrives every --edit-every ms: edit latency p50/p99 with plain
    adds (FIFO), with the edits at priority 1 (strict), and with --aging.
    Then the relist under a sustained priority-1 stream at the worker's
    full capacity for --duration seconds: strict priorities starve it (its
    wait grows with the run); aging hands every key out within a bound it
    prints. (b) --failing keys keep failing against endpoint A while
    endpoint B's keys fail once each: B's backoff with per-key backoff
    only, with client-go's default (per-key and one bucket), and with a
    bucket per endpoint (EndpointRateLimiter). (c) The relist from one
    tenant beside another tenant's edits, all at priority 0: edit latency
    with plain adds and with fair_by the namespace (the tenants take turns).
    (d) (c) beside a third tenant's priority-1 stream at full capacity, with
    --aging: aging alone, then with fair_by too (the edits take turns in the
    priority aging serves, within a bound it prints).
    One simulated worker on a FakeClock: instant and exact.
    """
    service = service_ms / 1000
    if relist * service > 3600:
        raise click.BadParameter(
            f"the relist would take {relist * service:,.0f} s (--relist x --service); "
            "keep it within an hour",
            param_hint="'--relist'",
        )
    if duration / service > 10_000_000:
        raise click.BadParameter(
            f"the stream would be {duration / service:,.0f} keys (--duration / --service); "
            "keep it within ten million",
            param_hint="'--duration'",
        )
    combined = (aging + 2 * relist * service) / service
    if combined > 10_000_000:
        raise click.BadParameter(
            f"(d)'s stream would be {combined:,.0f} keys ((--aging + 2 x --relist x --service) "
            "/ --service); keep it within ten million",
            param_hint="'--aging'",
        )
    out = Output(Mode.choose(as_json, plain))
    config = FairnessConfig(
        relist=relist,
        service=service,
        edit_every=edit_every_ms / 1000,
        aging=aging,
        duration=duration,
        failing=failing,
    )
    result = run_fairness(config)
    out.show(result, render.render_fairness)
