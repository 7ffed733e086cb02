"""How ``keyqueue lab pipeline`` looks: trace lines, the stage table, the summary."""

from __future__ import annotations

import math
from typing import Any

from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from ..._console.format import counted
from .run import PipelineResult
from .stages import format_duration

__all__ = ["failover_lines", "headline", "processes", "stage_table", "summary", "trace_line"]

_STYLES = {
    "TRIGGER": "cyan",
    "ENQUEUE": "magenta",
    "WORKER": "green",
    "STATS": "bold",
    "FAULT": "bold red",
}

# The stages a change passes one after another (the trigger's round trip
# contains the etcd write; trigger → reconciled spans them all).
_SEQUENCE = ("trigger", "write_to_event", "event_to_add", "add_to_get", "reconcile")


def trace_line(tag: str, text: str) -> Text:
    """``[ENQUEUE] key=... ← 63µs after the write``, the tag coloured."""
    label, _, rest = text.partition("]")
    line = Text(label + "]", style=_STYLES.get(tag, ""))
    line.append(rest)
    return line


def stage_table(result: PipelineResult, boxed: object) -> Table:
    table = Table(
        title="Where the milliseconds live (this run)",
        box=boxed,  # type: ignore[arg-type]
        title_justify="left",
    )
    table.add_column("stage")
    for column in ("p50", "p95", "p99", "samples"):
        table.add_column(column, justify="right")
    table.add_column("what it covers")
    for stage in result.stages:
        p = stage.latency
        table.add_row(
            stage.label,
            format_duration(p.p50),
            format_duration(p.p95),
            format_duration(p.p99),
            f"{p.count:,}",
            stage.what,
        )
    return table


def headline(result: PipelineResult) -> str:
    """The seed's point, with this run's numbers: which stage dominates, and that
    the queue's share is microseconds."""
    p50 = {s.name: s.latency.p50 for s in result.stages}
    timed = [(p50[name], name) for name in _SEQUENCE if p50[name] is not None]
    add, wait, total = p50["add_call"], p50["add_to_get"], p50["end_to_end"]
    if not timed or add is None or wait is None or total is None:
        return "Not enough samples for the stage comparison."
    labels = {s.name: s.label for s in result.stages}
    _, top = max(timed)
    text = f"{labels[top]} dominates (p50 {format_duration(p50[top])})"
    write = p50["etcd_write"]
    if top == "trigger" and write is not None:
        text += f", the etcd write {format_duration(write)} of it"
    ratio = total / add if add > 0 else math.inf
    # Orders of magnitude to the nearest (the seed's "four orders": 5,000x and up).
    magnitude = round(math.log10(ratio)) if 10 <= ratio < math.inf else 0
    orders = {0: "far", 1: "an order of magnitude"}.get(
        magnitude, f"{magnitude} orders of magnitude"
    )
    if result.replicas is not None:  # a round trip to the queue's server, not microseconds
        return (
            f"{text}. An add to the Redis queue takes {format_duration(add)} (a round trip), "
            f"{orders} less than the {format_duration(total)} from trigger to reconciled; a key "
            f"then waits {format_duration(wait)} from add to get, for a free worker in any replica."
        )
    return (
        f"{text}. The queue itself costs microseconds: an add takes {format_duration(add)}, "
        f"{orders} less than the {format_duration(total)} from trigger to reconciled; a key "
        f"then waits {format_duration(wait)} from add to get, for a free worker."
    )


_ROLES = (
    ("controller", "controller"),
    ("apiserver", "API server"),
    ("load", "load generator"),
    ("etcd", "etcd"),
)


def processes(result: PipelineResult) -> str:
    """``Processes: controller 12 (informer, queue, workers), API server 13, ...``;
    with replicas, each one's pid (and ``killed``) and the queue's Valkey."""
    parts = []
    roles = [*_ROLES, ("valkey", "Valkey")]
    roles += [(role, role) for role in result.processes if role.startswith("replica ")]
    for role, label in roles:
        held = result.processes.get(role)
        if held is None:
            continue
        pid = held.get("pid")
        where = f"pid {pid}" if pid is not None else held.get("url", "not this run's")
        what = f" ({', '.join(held['holds'])})" if role == "controller" else ""
        if "killed_at" in held:
            what += f" (killed at {held['killed_at']:.1f}s)"
        parts.append(f"{label} {where}{what}")
    return (
        "Processes: "
        + ", ".join(parts)
        + "; every time is time.monotonic() (CLOCK_MONOTONIC: one clock for all of them)"
    )


def summary(result: PipelineResult) -> list[RenderableType]:
    s = result.stats
    out: list[RenderableType] = []
    head = "Summary (interrupted)" if result.interrupted else "Summary"
    out.append(Text(f"\n{head}: {result.elapsed:.1f}s, API server {result.url}", "bold"))
    updated = result.triggers - result.created
    failed = f", {result.failed:,} failed" if result.failed else ""
    out.append(
        Text(
            f"  {counted(result.triggers, 'trigger')} onto {counted(result.objects, 'object')} "
            f"({result.created:,} created, {updated:,} updated{failed}) → "
            f"{counted(result.watch_events, 'watch event')} → {counted(s.adds, 'add')} → "
            f"{counted(s.gets, 'reconcile')}"
        )
    )
    out.append(
        Text(
            f"  The queue coalesced {result.absorbed:.1f}% of the adds: {s.coalesced:,} "
            f"absorbed by a waiting key, {s.marked_while_processing:,} marked while a worker "
            f"held the key → {counted(s.redeliveries, 'redelivery', 'redeliveries')}"
        )
    )
    if result.processes:
        out.append(Text(f"  {processes(result)}"))
    if result.replicas is not None:
        out += failover_lines(result.replicas)
    if result.objects and not result.interrupted:
        if result.verified:
            out.append(
                Text(
                    (
                        "  The one object was"
                        if result.objects == 1
                        else f"  Every one of the {result.objects:,} objects was"
                    )
                    + " reconciled at its final version.",
                    "green",
                )
            )
        else:
            stale = ", ".join(result.stale[:10]) + (" ..." if len(result.stale) > 10 else "")
            out.append(
                Text(
                    f"  NOT reconciled at their final version: {stale or '-'}"
                    + (f" ({counted(result.failed, 'trigger')} failed)" if result.failed else ""),
                    "bold red",
                )
            )
    return out


def failover_lines(replicas: dict[str, Any]) -> list[RenderableType]:
    """What a killed replica cost: its keys' wait against everyone else's."""
    shown = replicas.get("failover")
    counts = ", ".join(f"{n} {c:,}" for n, c in sorted(replicas["reconciles"].items()))
    out: list[RenderableType] = [
        Text(
            f"  {replicas['replicas']} controller replicas on one queue ({replicas['redis']}, "
            f"lease {replicas['lease']:g}s); reconciles: {counts or '-'}"
        )
    ]
    if shown is None:
        return out
    others = (
        f"meanwhile every other write ({shown['during_writes']:,}) waited at most "
        f"{format_duration(shown['during_gap'])} from write to reconcile (all run long: "
        f"{format_duration(shown['other_gap'])})"
    )
    kills = [f for f in replicas["faults"] if f["kind"] == "kill"]
    if not kills:
        out.append(
            Text(
                f"  No replica was killed: the longest write → reconcile gap was "
                f"{format_duration(shown['other_gap'])} ({shown['other_writes']:,} writes)."
            )
        )
        return out
    for fault in kills:
        held = len(fault["held"])
        out.append(
            Text(
                f"  Failover: replica {fault['replica']} killed at {fault['at']:.1f}s holding "
                f"{held} key{'s' if held != 1 else ''}; they were reconciled again after at most "
                f"{format_duration(shown['recovery'])}, the writes it held up "
                f"({shown['held_writes']:,}) waited at most {format_duration(shown['held_gap'])}; "
                f"{others}.",
                "bold",
            )
        )
    if shown["unrecovered"] or shown["unreconciled"]:
        out.append(
            Text(
                f"  NOT reconciled again: {', '.join(shown['unrecovered'][:10]) or '-'}; "
                f"writes never reconciled: {len(shown['unreconciled'])}",
                "bold red",
            )
        )
    return out
