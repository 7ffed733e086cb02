"""How ``keyqueue lab fairness`` looks: (a)'s two tables on priorities, (b)'s on
endpoints, (c)'s on tenants (``fair_by``), (d)'s on ``fair_by`` with aging."""

from __future__ import annotations

from rich.text import Text

from ..._console.format import Output, count, counted, duration, left, number
from .run import FairnessResult

__all__ = ["render_fairness"]


def render_fairness(result: FairnessResult, out: Output) -> None:
    c = result.config
    each = duration(c.service)
    title = (
        f"(a) A relist of {counted(c.relist, 'key')} ({each} each) at priority {result.low}, "
        f"with a user edit every {duration(c.edit_every)}"
    )
    table = out.table(
        left("edits added"), "edits", "edit p50", "edit p99", "relist done", title=title
    )
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

    title = (
        f"\nThe same relist under a sustained priority-{result.high} stream at the "
        f"worker's full capacity (one key every {each})"
    )
    table = out.table(
        left("priorities"),
        "after",
        "relist served",
        "oldest relist wait",
        "stream p99",
        "bound",
        title=title,
    )
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

    title = (
        f"\n(b) {counted(c.failing, 'key')} {'keeps' if c.failing == 1 else 'keep'} failing "
        f"against endpoint A; endpoint B's "
        f"keys fail once each, one a second ({duration(c.endpoint_duration)})"
    )
    table = out.table(
        left("rate limiter"),
        "calls to A, first second",
        "calls to A",
        "B's backoff p50",
        "B's backoff max",
        title=title,
    )
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

    title = (
        f"\n(c) One tenant's relist ({counted(c.relist, 'key')}, namespace default) beside "
        f"another tenant's edits (team-b, one every {duration(c.edit_every)}), all at "
        f"priority {result.low}"
    )
    table = out.table(
        left("keys added"),
        "edits",
        "edit p50",
        "edit p99",
        "edit max",
        "relist done",
        "bound",
        title=title,
    )
    for tenant in result.tenants:
        table.add_row(
            "plainly (FIFO)" if tenant.mode == "plain (FIFO)" else "fair_by=namespace",
            count(tenant.edits),
            duration(tenant.edit_p50),
            duration(tenant.edit_p99),
            duration(tenant.edit_max),
            duration(tenant.relist_done),
            "" if tenant.bound is None else duration(tenant.bound),
        )
    out.print(table)
    plain, fair = result.tenants
    out.print(
        Text(
            f"Plainly, team-b's edits wait behind default's relist (p99 "
            f"{duration(plain.edit_p99)}). With fair_by the tenants take turns within the "
            f"priority: an edit waits for at most one relist key and the key in hand (max "
            f"{duration(fair.edit_max)}, bound {duration(fair.bound or 0.0)}); the relist "
            f"finishes as late as it would with the edits at a higher priority "
            f"({duration(fair.relist_done)})."
        )
    )

    title = (
        f"\n(d) (c) beside a third tenant's priority-{result.high} stream at the worker's full "
        f"capacity (team-c, one key every {each}), aging {duration(c.aging)}"
    )
    table = out.table(
        left("keys added"),
        "edits",
        "edit p50",
        "edit max",
        "last edit out",
        "relist done",
        "bound",
        title=title,
    )
    for combined in result.combined:
        table.add_row(
            "aging" if combined.mode == "aging" else "aging + fair_by=namespace",
            count(combined.edits),
            duration(combined.edit_p50),
            duration(combined.edit_max),
            duration(combined.edits_done),
            duration(combined.relist_done),
            "" if combined.bound is None else duration(combined.bound),
        )
    out.print(table)
    aged, fair_aged = result.combined
    out.print(
        Text(
            f"Aging serves priority {result.low} once the relist has waited "
            f"{duration(result.aging_wait_part)}, but team-b's edits arrived after the relist: "
            f"they wait behind all of it, then behind the stream keys still ranked ahead of them "
            f"(last edit out at {duration(aged.edits_done)}). With fair_by "
            f"too, the priority aging chose is served in turns: the last edit is out at "
            f"{duration(fair_aged.edits_done)}, within the bound (P_max - p) x aging, the stream "
            f"keys waiting then and the key in hand, then a relist key and an edit per edit "
            f"({duration(fair_aged.bound or 0.0)})."
        )
    )
