"""The report of ``make bench``: from the measurements, plain data, to
build/benchmarks.md and the tables printed at the end of a run.

Nothing here measures; every figure comes from the report dictionary that
``run.py`` (and, for its own section, ``distributed.py``) fills in. Each
ratio divides two figures measured in the same run, and a row quoted over
several runs gives the median of the per-run ratios and their range. A
target is a bound on such a ratio, or on a count per key, written next to
the figure it bounds; ``met`` says whether this run's figure is within it.

Sections, in the document's order: the in-process table (``bench_queue.py``
and ``memory.py``), where a cycle's time goes (``breakdown.py``), workers
beside busy producers (``contention.py``), priorities against the code before
them (``priorities.py``), many processes on one server
(``distributed.py``, the libraries' adapters in ``peers/``), and each
durability mode on a replicated Sentinel set (``durability.py``).
"""

from __future__ import annotations

import os
import platform
import statistics
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from peers import name as lib_name
from peers.floor import BATCHED_NAME
from peers.floor import NAME as FLOOR_NAME


def _median(values: list[float]) -> float:
    return statistics.median(values)


# -- the in-process table: bench_queue.py's benchmarks against each other, per run ---------


def stats_by_name(raw: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {b["name"].removeprefix("test_"): b for b in raw["benchmarks"]}


def per_op(b: dict[str, Any], key: str) -> float:
    """Seconds per operation for this statistic (some calls do ``per`` operations)."""
    return float(b["stats"][key]) / float(b.get("extra_info", {}).get("per", 1))


def fmt_time(seconds: float) -> str:
    if seconds < 1e-6:
        return f"{seconds * 1e9:.0f} ns"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.2f} µs"
    return f"{seconds * 1e3:.1f} ms"


def fmt_spread(s: dict[str, float], fmt: Any) -> str:
    return f"{fmt(s['median'])} ({fmt(s['min'])} to {fmt(s['max'])})"


def _throughput(b: dict[str, Any], key: str) -> float:
    """Keys a second for this statistic (the call handles ``items`` keys)."""
    return float(b["extra_info"]["items"]) / float(b["stats"][key])


@dataclass(frozen=True)
class Ratios:
    """A row of the main table: benchmark ``name`` against others of the same
    session (``vs``: label, benchmark), each ratio the median over runs of
    median / median, the pure build's beside it. ``throughput`` rows compare
    keys a second, higher is better (the ratio is other / this, a time ratio
    like the rest)."""

    workload: str
    name: str
    vs: tuple[tuple[str, str], ...] = ()
    target: str = "reported (no target)"
    met: Callable[[dict[str, Any]], bool] = lambda row: True
    throughput: bool = False


THREADED_ROWS = (
    Ratios(
        "coalesced add",
        "coalesced_add_keyqueue",
        (("lock+set floor", "coalesced_add_floor_lock_set"),),
        "≤ 1.2x floor",
        lambda r: r["ratios"]["lock+set floor"] <= 1.2,
    ),
    Ratios(
        "add/get/done cycle, one thread",
        "cycle_keyqueue",
        (
            ("bare set/set/deque", "cycle_floor_bare_structures"),
            ("queue.Queue", "cycle_stdlib_queue"),
        ),
        "≤ 1.0x bare, ≤ 0.5x queue.Queue",
        lambda r: r["ratios"]["bare set/set/deque"] <= 1.0 and r["ratios"]["queue.Queue"] <= 0.5,
    ),
    Ratios(
        "add/get/done cycle, ranked (priority 5, aging)",
        "cycle_keyqueue_ranked",
        (("FIFO cycle", "cycle_keyqueue"),),
    ),
    Ratios(
        "producer → 4 worker threads, distinct keys",
        "threads_keyqueue",
        (("queue.Queue (time)", "threads_stdlib_queue"),),
        throughput=True,
    ),
)
"""The threaded front's rows, before the firehose and busy-producer rows."""

TIMER_AND_ASYNC_ROWS = (
    Ratios(
        "add_after insert + fire, per key",
        "add_after_keyqueue",
        (("heapq push/pop", "add_after_floor_heapq"),),
    ),
    Ratios("default controller limiter when()", "rate_limiter_default_when"),
    Ratios(
        "asyncio add/get_nowait/done cycle",
        "async_keyqueue_nowait",
        (
            ("asyncio.Queue", "async_stdlib_asyncio_queue"),
            ("aiok8s", "async_peer_aiok8s"),
            ("leasedkeyq", "async_peer_leasedkeyq"),
        ),
        "≤ 1.0x asyncio.Queue, < 1.0x aiok8s",
        lambda r: r["ratios"]["asyncio.Queue"] <= 1.0 and r["ratios"]["aiok8s"] < 1.0,
    ),
    Ratios(
        "asyncio add/await get/done cycle",
        "async_keyqueue_await_get",
        (("asyncio.Queue", "async_stdlib_asyncio_queue"), ("aiok8s", "async_peer_aiok8s")),
    ),
)
"""The timer, rate limiter and asyncio rows, after them."""


def ratio_row(
    spec: Ratios, runs: list[dict[str, Any]], pure_runs: list[dict[str, Any]]
) -> dict[str, Any]:
    """``spec``'s row from each run's benchmarks by name (both builds)."""
    value = _throughput if spec.throughput else per_op
    lo, mid, hi = ("max", "median", "min") if spec.throughput else ("min", "median", "max")

    def merged(name: str, key: str) -> list[float]:
        return [value(b[name], key) for b in runs]

    def ratio(b: dict[str, Any], other: str) -> float:
        this, that = value(b[spec.name], "median"), value(b[other], "median")
        return that / this if spec.throughput else this / that

    row: dict[str, Any] = {
        "workload": spec.workload,
        "min": min(merged(spec.name, lo)),
        "median": _median(merged(spec.name, mid)),
        "max": max(merged(spec.name, hi)),
        "ratios": {},
        "ratio_ranges": {},
        "baselines": {},
        "target": spec.target,
    }
    if spec.throughput:
        row["unit"] = "keys/s"
    for label, other in spec.vs:
        per_run = [ratio(b, other) for b in runs]
        row["ratios"][label] = _median(per_run)
        row["ratio_ranges"][label] = (min(per_run), max(per_run))
        row["baselines"][label] = _median(merged(other, "median"))
        row.setdefault("pure_ratios", {})[label] = _median([ratio(b, other) for b in pure_runs])
    row["met"] = bool(spec.met(row))
    return row


def firehose_row(runs: list[dict[str, Any]], pure_runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Adds a second onto 20 hot keys beside 4 workers, against the pure build's."""
    firehose = [b["firehose_keyqueue"]["extra_info"] for b in runs]
    pure_firehose = [b["firehose_keyqueue"]["extra_info"] for b in pure_runs]
    speedups = [
        f["adds_per_second_median"] / p["adds_per_second_median"]
        for f, p in zip(firehose, pure_firehose, strict=True)
    ]
    return {
        "workload": "firehose: 20 hot keys, 4 workers",
        "min": min(f["adds_per_second_min"] for f in firehose),
        "median": _median([f["adds_per_second_median"] for f in firehose]),
        "max": max(f["adds_per_second_max"] for f in firehose),
        "unit": "adds/s",
        "ratios": {"the pure build's adds/s": _median(speedups)},
        "ratio_ranges": {"the pure build's adds/s": (min(speedups), max(speedups))},
        "pure_median": _median([p["adds_per_second_median"] for p in pure_firehose]),
        "absorbed": _median([f["absorbed_median"] for f in firehose]),
        "target": "≥ 1.5x the pure build",
        "met": _median(speedups) >= 1.5,
    }


def memory_row(memory: dict[str, float]) -> dict[str, Any]:
    """Bytes per waiting key against a bare set + deque holding the same keys."""
    return {
        "workload": f"memory per waiting key ({memory['keys']:,} keys)",
        "median": memory["keyqueue_bytes_per_key"],
        "unit": "bytes",
        "ratios": {"set+deque floor": memory["ratio"]},
        "baselines": {"set+deque floor": memory["floor_bytes_per_key"]},
        "target": "≤ 2.0x floor",
        "met": memory["ratio"] <= 2.0,
    }


def build(
    raws: list[dict[str, Any]],
    pure_raws: list[dict[str, Any]],
    memory: dict[str, float],
    contention: dict[str, Any],
) -> dict[str, Any]:
    """The report's head and main table, from pytest-benchmark's JSON of each run
    on each build, ``memory.py``'s measure and ``contention_summary`` by
    handler shape."""
    runs = [stats_by_name(raw) for raw in raws]
    pure_runs = [stats_by_name(raw) for raw in pure_raws]
    rows = [ratio_row(spec, runs, pure_runs) for spec in THREADED_ROWS]
    rows.append(firehose_row(runs, pure_runs))
    rows += [contention_row(contention[shape], shape) for shape in CONTENTION_SHAPES]
    rows += [ratio_row(spec, runs, pure_runs) for spec in TIMER_AND_ASYNC_ROWS]
    rows.append(memory_row(memory))
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "cpu": raws[0].get("machine_info", {}).get("cpu", {}).get("brand_raw", "unknown"),
        "runs": len(raws),
        "command": "make bench",
        "rows": rows,
        "contention": contention,
    }


def fmt_value(row: dict[str, Any], key: str) -> str:
    if key not in row:
        return ""
    value = row[key]
    unit = row.get("unit")
    if unit in ("keys/s", "adds/s"):
        return f"{value:,.0f} {unit}"
    if unit == "bytes":
        return f"{value:.1f} B"
    return fmt_time(value)


def table(report: dict[str, Any]) -> str:
    lines = [
        "| workload | min | median | max | ratio (median / median) | pure build | target | met |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ranges = row.get("ratio_ranges", {})
        ratios = "; ".join(
            f"{v:.2f}x {k}"
            + (f" ({ranges[k][0]:.2f} to {ranges[k][1]:.2f})" if k in ranges else "")
            for k, v in row["ratios"].items()
        )
        pure = "; ".join(f"{v:.2f}x {k}" for k, v in row.get("pure_ratios", {}).items())
        if "absorbed" in row:
            ratios += f"; {row['absorbed']:.2%} of adds absorbed"
            pure = f"{row['pure_median']:,.0f} adds/s"
        pure = row.get("pure_text", pure)
        lines.append(
            f"| {row['workload']} | {fmt_value(row, 'min')} | {fmt_value(row, 'median')} | "
            f"{fmt_value(row, 'max')} | {ratios} | {pure} | {row['target']} | "
            f"{'yes' if row['met'] else '**no**'} |"
        )
    return "\n".join(lines)


# -- where a cycle's time goes (breakdown.py) ----------------------------------------------


def breakdown_table(rows: list[dict[str, Any]]) -> str:
    lines = ["| variant (one add/get/done cycle) | min | median |", "|---|---|---|"]
    for row in rows:
        lines.append(f"| {row['variant']} | {fmt_time(row['min'])} | {fmt_time(row['median'])} |")
    return "\n".join(lines)


BREAKDOWN_NOTE = (
    "Reading the compiled rows: the core alone is three calls from Python into C and "
    "the dict and deque work (mypyc knows neither `deque` nor `dict.pop`, so those calls "
    "still look their method up by name); the threading front adds a lock taken and "
    "released per call; the asyncio front adds, per call, a read of the queue's clock "
    "(the constant-clock rows drop it) and a check that it runs on the loop's thread "
    "(`threading.get_ident()`, about 40 ns; `asyncio.Queue` does neither)."
)


# -- workers beside busy producers (contention.py) -----------------------------------------


CONTENTION_FIELDS = ("adds_per_second", "reconciles_per_second", "mean_wait", "worker_cpu_share")
CONTENTION_SHAPES = {
    "blocking": "handlers that wait on I/O (sleep up to 1 ms)",
    "cpu": "handlers of about 20 µs of Python",
}
"""contention.py's handler shapes (its argument), and what each handler does."""


def contention_summary(
    compiled: list[dict[str, Any]], pure: list[dict[str, Any]]
) -> dict[str, Any]:
    """Medians and ranges across runs for each build; ratios from each run, compiled / pure."""

    def spread(runs: list[dict[str, Any]], field: str) -> dict[str, float]:
        values = [r[field] for r in runs]
        return {"median": _median(values), "min": min(values), "max": max(values)}

    def ratio(field: str) -> dict[str, float]:
        per_run = [c[field] / p[field] for c, p in zip(compiled, pure, strict=True)]
        return {"median": _median(per_run), "min": min(per_run), "max": max(per_run)}

    return {
        "compiled": {f: spread(compiled, f) for f in CONTENTION_FIELDS},
        "pure": {f: spread(pure, f) for f in CONTENTION_FIELDS},
        "ratios": {f: ratio(f) for f in CONTENTION_FIELDS},
        "runs": {"compiled": compiled, "pure": pure},
    }


def contention_row(contention: dict[str, Any], shape: str) -> dict[str, Any]:
    """The main table's row for busy producers beside one handler ``shape``:
    compiled reconciles/s, ratios to the pure build."""
    keys = contention["ratios"]["reconciles_per_second"]
    wait = contention["ratios"]["mean_wait"]
    return {
        "workload": (
            f"busy producers: 3 threads adding onto 50 keys, 8 workers, {CONTENTION_SHAPES[shape]}"
        ),
        "min": contention["compiled"]["reconciles_per_second"]["min"],
        "median": contention["compiled"]["reconciles_per_second"]["median"],
        "max": contention["compiled"]["reconciles_per_second"]["max"],
        "unit": "keys/s",
        "ratios": {"the pure build's keys/s": keys["median"], "its mean wait": wait["median"]},
        "ratio_ranges": {
            "the pure build's keys/s": (keys["min"], keys["max"]),
            "its mean wait": (wait["min"], wait["max"]),
        },
        "pure_text": f"{contention['pure']['reconciles_per_second']['median']:,.0f} keys/s",
        "target": "≥ 1.0x the pure build's keys/s, ≤ 1.0x its mean wait",
        "met": keys["median"] >= 1.0 and wait["median"] <= 1.0,
    }  # fmt: skip


def contention_table(c: dict[str, Any]) -> str:
    def rate(v: float) -> str:
        return f"{v:,.0f}/s"

    rows = [
        ("adds/s (all three producers)", "adds_per_second", rate),
        ("keys handed out (reconciles/s)", "reconciles_per_second", rate),
        ("mean wait of a key (queue_wait_seconds / gets)", "mean_wait", fmt_time),
        ("workers' share of the threads' CPU time", "worker_cpu_share", lambda v: f"{v:.0%}"),
    ]
    lines = [
        "| median (range) across runs | compiled | pure | compiled / pure (per run) |",
        "|---|---|---|---|",
    ]
    for label, field, fmt in rows:
        r = c["ratios"][field]
        lines.append(
            f"| {label} | {fmt_spread(c['compiled'][field], fmt)} | "
            f"{fmt_spread(c['pure'][field], fmt)} | "
            f"{r['median']:.2f}x ({r['min']:.2f} to {r['max']:.2f}) |"
        )
    return "\n".join(lines)


CONTENTION_NOTE = (
    "Why `add` yields: a consumer needs the GIL to go on, a getter woken for a key as much "
    "as a worker back from its handler to call `done`, and CPython hands the GIL over only "
    "when its holder blocks, or when a thread has waited a whole switch interval "
    "(`sys.getswitchinterval()`, 5 ms) and asks for it, and then to any thread that waits, "
    "another producer as likely as a worker. A producer spinning on the compiled `add` never "
    "blocks: `add` is one C call, so its lock is free whenever the producer holds the GIL "
    "(pure, a producer switched off inside `add` may hold the lock, and the threads that "
    "call the queue then block on it and pass the GIL on). So each worker back from a "
    "handler that blocked waited 5 ms or more for its turn. The rule "
    "(`keyqueue/_threading.py`, docs/DESIGN.md's 'Two builds'): while a key is held, or a "
    "getter is blocked while a key waits for it, `add` yields the GIL (`time.sleep(0)`, "
    "outside the lock) every 1,000 adds, about 0.2 ms of compiled adds; with no key held "
    "and no getter blocked it returns before counting. While it yielded to woken getters "
    "only (three runs of each build in turn, commit c92a955), beside the blocking handlers "
    "the compiled build handed out 1,278 to 2,086 keys in the 3 s, each having waited 73 to "
    "118 ms on average, against the pure build's 8,740 to 10,943 keys and 13.7 to 16.9 ms. "
    "The trade: the producers make fewer adds while workers hold keys (beside workers, "
    "nearly all adds are absorbed), the firehose row's producer too (its 4 workers sleep "
    "0.2 ms a key), and the uncontended paths are as fast (`bench_queue.py`, three runs of "
    "each build before and after, medians of the runs; pure in brackets): coalesced add "
    "0.82x the lock+set floor, then 0.82x (1.86x, 1.93x); the one-thread cycle 825 ns, "
    "then 823 ns (1.37 µs, 1.35 µs); producer → 4 workers 868k keys/s, then 948k (590k, "
    "441k); the firehose 6.6M adds/s with 0.02% of them handed out, then 3.1M with 0.32% "
    "(2.5M, 1.5M)."
)


def contention_tables(contention: dict[str, Any]) -> str:
    """One table per handler shape, each under its name."""
    return "\n\n".join(
        f"Beside {what}:\n\n{contention_table(contention[shape])}"
        for shape, what in CONTENTION_SHAPES.items()
    )


def contention_section(report: dict[str, Any]) -> str:
    """docs/benchmarks.md's section on busy producers beside workers."""
    return (
        "## Workers beside busy producers\n\n"
        f"`benchmarks/contention.py`, same run, once per run on each build for each handler "
        f"shape ({report['runs']} runs, the builds in turn): three producer threads call "
        "`add` in a tight loop onto 50 keys for 3 s while `run_workers` runs 8 workers, whose "
        "handler either waits on I/O (`time.sleep(random() * 0.001)`: it lets go of the GIL, "
        "and needs it back to go on) or runs about 20 µs of Python (it holds the GIL). "
        "Reconciles/s is keys handed out (`Stats.gets`) per second of the producers' run; "
        "the mean wait is `Stats.queue_wait_seconds / gets`.\n\n"
        f"{contention_tables(report['contention'])}\n\n"
        f"{CONTENTION_NOTE}\n\n"
    )


# -- priorities against the code before them (priorities.py) -------------------------------


def _ns_or_us(seconds: float) -> str:
    return f"{seconds * 1e9:.0f} ns" if seconds < 1e-6 else f"{seconds * 1e6:.2f} µs"


def priorities_tables(report: dict[str, Any]) -> str:
    """``priorities.py``'s tables: the FIFO path today and before priorities, the ranked path."""
    lines = [
        "| FIFO path (no priority ever given) | today | before priorities | ratio |",
        "|---|---|---|---|",
    ]
    for row in report["fifo"]:
        lines.append(
            f"| {row['variant']} | {_ns_or_us(row['today'])} | {_ns_or_us(row['baseline'])} | "
            f"{row['ratio']:.2f}x |"
        )
    lines += ["", "| priority path (ranked) | median | vs today's FIFO cycle |", "|---|---|---|"]
    for row in report["ranked"]:
        lines.append(f"| {row['variant']} | {_ns_or_us(row['median'])} | {row['vs_fifo']:.2f}x |")
    deep = report["deep"]
    lines += [
        "",
        "| get+done with 10,000 keys waiting | per call |",
        "|---|---|",
        f"| FIFO | {_ns_or_us(deep['FIFO'])} |",
        f"| ranked (heap) | {_ns_or_us(deep['ranked'])} |",
    ]
    return "\n".join(lines)


# -- many processes on one server (distributed.py) -----------------------------------------


def describe_distributed(report: dict[str, Any]) -> str:
    """How the distributed workloads run, from their parameters."""
    p = report["parameters"]
    return (
        f"Coalesced adds: one client adds a key that is already waiting, one call at a time "
        f"and {p['batch']} at a time (keyqueue: `add_many`; BullMQ: `addBulk`; streaq: "
        f"`enqueue_many`; arq and SAQ: {p['batch']} deduplicated enqueues under "
        f"`asyncio.gather`, as they have no batch call; rq: one at a time), "
        f"{p['rate_repeats']} runs of {p['rate_time']:g} s, median. End-to-end: "
        f"{p['drain_keys']:,} distinct keys waiting, then {p['processes']} worker processes "
        f"with {p['concurrency']} handlers each, timed from the first handler's start to the "
        f"last one's end, at most {p['drain_cap']:g} s; over that run the "
        "server's INFO: commandstats (commands inside scripts counted, and the script calls "
        "themselves), `used_cpu_user` + `used_cpu_sys`, and `total_reads_processed` (read "
        "events on client sockets: one per round trip), each divided by the keys handled; "
        "client CPU is the worker processes' own CPU time between their first and last "
        f"handler. Idle: one worker process with nothing to do, over {p['idle_seconds']:g} s: "
        "commands a second (commandstats; a blocking command counts when it returns) and "
        "requests a second (`total_reads_processed`, less our INFO calls). Pickup: that "
        "worker, idle; read the clock, add one key, the "
        f"handler writes its start time to shared memory; {p['pickup_samples']} times, "
        f"{p['pickup_gap'] * 1000:g} ms apart. Each library runs on its own fastest settings (the "
        "table below). "
        "BullMQ's Python port needs redis-py ≥ 6.2 and arq pins it below 6, so BullMQ runs "
        "from a virtualenv of its own (`.venv-bench-bullmq`), a subprocess against the same "
        "server."
    )


def lost_note(report: dict[str, Any]) -> str:
    """What the lost-update workload does and counts, from its parameters."""
    p = report["parameters"]
    return (
        f"{p['lost_keys']} keys (objects), {p['processes']} worker processes. A producer "
        f"bumps a random key's version in Redis and enqueues the key, {p['lost_rate']:g} "
        f"times a second for {p['lost_seconds']:g} s; each handler reads the key's current "
        f"version, works {p['lost_work'] * 1000:g} ms, and records the highest version it "
        "read. A key ends right when some handler read its final version. With a job id for "
        "deduplication, an enqueue while the job is *running* is dropped by arq, SAQ, rq and "
        "streaq alike, and by BullMQ's simple deduplication, so the change it carried is "
        "never processed; keyqueue marks the key and hands it out once more after `done`, "
        "and BullMQ's `keepLastIfActive` keeps the add made while the job is active and runs "
        "it after. Overlaps count handler runs of one key that ran at the same time."
    )


def _target(target: str, measured: str, met: bool) -> dict[str, Any]:
    return {"target": target, "measured": measured, "met": met}


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """The bounds keyqueue.redis is held to, each checked on this run's own figures:
    end-to-end keys/s, alone and against the fastest peer and the floor; the server's
    CPU, script calls and commands per key; pickup latency; coalesced adds against arq's."""
    r = report["results"]
    kq = r.get("keyqueue")
    if kq is None:
        return []
    d = kq["drain"]
    rate = d["keys_per_second"]
    peers = {lib: x["drain"]["keys_per_second"] for lib, x in r.items() if lib != "keyqueue"}
    out = [
        _target("end-to-end no-op keys/s, 4 processes ≥ 10,000/s", f"{rate:,.0f}/s", rate >= 1e4)
    ]
    if peers:
        best = max(peers, key=peers.__getitem__)
        ratio = rate / peers[best]
        out.append(
            _target(
                "≥ 3x the fastest Python peer, same run",
                f"{ratio:.2f}x (fastest peer: {lib_name(best)}, {peers[best]:,.0f}/s)",
                ratio >= 3,
            )
        )
    cpu = d["server_cpu_per_key"] * 1e6
    out += [
        _target("≤ 60 µs of server CPU per key", f"{cpu:.0f} µs", cpu <= 60),
        _target(
            "≤ 1.2 script calls per key",
            f"{d['scripts_per_key']:.2f}",
            d["scripts_per_key"] <= 1.2,
        ),
        _target(
            "≤ 10 server commands per key",
            f"{d['commands_per_key']:.1f}",
            d["commands_per_key"] <= 10,
        ),
    ]
    floor = report.get("floor")
    if floor:
        ratio = rate / floor["keys_per_second"]
        out.append(
            _target(
                "≥ 0.7x the floor (bare list, RPOP), same run",
                f"{ratio:.2f}x (floor {floor['keys_per_second']:,.0f}/s)",
                ratio >= 0.7,
            )
        )
    out += batched_floor_targets(report)
    p50, p99 = kq["pickup"]["p50"] * 1e3, kq["pickup"]["p99"] * 1e3
    out += [
        _target("pickup p50 ≤ 1 ms", f"{p50:.2f} ms", p50 <= 1),
        _target("pickup p99 ≤ 5 ms", f"{p99:.2f} ms", p99 <= 5),
    ]
    arq = r.get("arq")
    if arq:
        one = kq["coalesced_add"]["one"] / arq["coalesced_add"]["one"]
        arq_best = max(arq["coalesced_add"]["one"], arq["coalesced_add"]["batched"])
        many = kq["coalesced_add"]["batched"] / arq_best
        out += [
            _target("coalesced `add`, one at a time ≥ 2x arq's", f"{one:.1f}x", one >= 2),
            _target("`add_many` ≥ 20x arq's best", f"{many:.1f}x", many >= 20),
        ]
    return out


# keyqueue's ratio to the batched floor's figure: (row, field, bound, whether lower is better)
BATCHED_FLOOR_GOALS = (
    ("keys/s", "keys_per_second", 0.25, False),
    ("server CPU per key", "server_cpu_per_key", 3.0, True),
    ("worker processes' CPU per key", "client_cpu_per_key", 3.0, True),
)


def batched_floor_targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """keyqueue's keys/s, server and worker CPU per key as ratios to the batched
    floor's, each against its bound (none without that measurement)."""
    bf = report.get("batched_floor")
    if not bf:
        return []
    out = []
    for label, field, bound, lower in BATCHED_FLOOR_GOALS:
        ratio = bf["ratios"][field]
        target = f"{label} {'≤' if lower else '≥'} {bound:g}x the batched floor's, same run"
        out.append(_target(target, f"{ratio:.2f}x", ratio <= bound if lower else ratio >= bound))
    return out


def batched_floor_table(report: dict[str, Any]) -> str:
    """keyqueue's end-to-end run beside the batched floor's, and their ratios."""
    bf = report.get("batched_floor")
    if not bf:
        return ""
    kq, floor = bf["keyqueue"], bf["floor"]
    rows = [
        f"| | keyqueue | {BATCHED_NAME}, {bf['batch']} keys a pop, median of "
        f"{len(bf['floor_runs'])} runs | keyqueue / floor | goal |",
        "|---|---|---|---|---|",
    ]
    fmt = {
        "keys_per_second": lambda v: f"**{v:,.0f}/s**",
        "server_cpu_per_key": lambda v: f"{v * 1e6:.1f} µs",
        "client_cpu_per_key": lambda v: f"{v * 1e6:.1f} µs",
    }
    for label, field, bound, lower in BATCHED_FLOOR_GOALS:
        rows.append(
            f"| {label} | {fmt[field](kq[field])} | {fmt[field](floor[field])} | "
            f"{bf['ratios'][field]:.2f}x | {'≤' if lower else '≥'} {bound:g}x |"
        )
    for label, field, digits in (
        ("keys per LPOP (a claim's batch)", "keys_per_lpop", 1),
        ("server commands per key (inside scripts too)", "commands_per_key", 2),
        ("round trips per key", "round_trips_per_key", 2),
    ):
        rows.append(f"| {label} | {kq[field]:.{digits}f} | {floor[field]:.{digits}f} | | |")
    return "\n".join(rows)


def round_trip_ms(run: dict[str, Any], concurrency: int) -> float:
    """Wall time per round trip seen by one handler thread: its time per key (all
    threads busy) divided by the round trips a key takes."""
    threads = run["processes"] * concurrency
    return 1e3 * threads / run["keys_per_second"] / run["round_trips_per_key"]


def scaling_limit(report: dict[str, Any]) -> str:
    """Where keyqueue's rate stops growing, and why, from the scaling row (same run)."""
    rows = report.get("scaling") or []
    if len(rows) < 2:
        return ""
    cores = os.cpu_count() or 1
    threads = report["concurrency"]
    peak = max(rows, key=lambda x: x["keys_per_second"])
    rate = peak["keys_per_second"]
    server = peak["server_cpu_per_key"] * rate
    client = peak["client_cpu_per_key"] * rate
    per_key = peak["server_cpu_per_key"] + peak["client_cpu_per_key"]
    first, last = rows[0], rows[-1]
    steps = ", ".join(f"{x['processes']}: {x['keys_per_second']:,.0f}/s" for x in rows)
    if server + client >= 0.8 * cores:
        why = (
            f"so the machine's {cores} cores are the limit: at {per_key * 1e6:.0f} µs of "
            f"CPU a key (server and workers) they carry at most {cores / per_key:,.0f} keys/s"
        )
    else:
        why = (
            f"so the rest of the machine went to other work (load average "
            f"{report.get('load', '?')}); the rate is bound by the round trips a key takes "
            f"one after another ({peak['round_trips_per_key']:.1f}) times what each costs a "
            f"handler thread, {round_trip_ms(peak, threads):.1f} ms here, mostly waiting for a core"
        )
    return (
        f"Scaling (keys/s by worker processes: {steps}): the rate peaks at "
        f"{peak['processes']} process{'es' if peak['processes'] > 1 else ''}, {rate:,.0f} "
        f"keys/s. There the server uses {server:.0%} of one core and the worker processes "
        f"{client:.2f} cores: {server + client:.2f} of the machine's {cores} cores together, "
        f"{why}. More processes cost more per key: from {first['processes']} to "
        f"{last['processes']} processes the workers' CPU a key goes from "
        f"{first['client_cpu_per_key'] * 1e6:.0f} to {last['client_cpu_per_key'] * 1e6:.0f} µs "
        f"and the server's from {first['server_cpu_per_key'] * 1e6:.0f} to "
        f"{last['server_cpu_per_key'] * 1e6:.0f} µs, and a thread's wait per round trip "
        f"from {round_trip_ms(first, threads):.1f} to {round_trip_ms(last, threads):.1f} ms."
    )


def where_time_goes(report: dict[str, Any]) -> str:
    """A paragraph from this run's own counts: round trips and server time per key."""
    kq = report["results"].get("keyqueue")
    if kq is None:
        return ""
    d = kq["drain"]
    wall = 1 / d["keys_per_second"]
    return (
        "Where keyqueue's time goes (same run): a coalesced `add` is one round trip (one "
        "script); `add_many` sends 100 keys in one. Each key processed end to end takes "
        f"{d['scripts_per_key']:.1f} script calls and {d['round_trips_per_key']:.1f} round "
        f"trips, {d['server_cpu_per_key'] * 1e6:.0f} µs of server CPU and "
        f"{d['client_cpu_per_key'] * 1e6:.0f} µs of the worker processes' CPU; at "
        f"{d['keys_per_second']:,.0f} keys/s the server is "
        f"{d['server_cpu_per_key'] / wall:.0%} busy and the workers use "
        f"{d['client_cpu_per_key'] / wall:.2f} cores. {scaling_limit(report)}"
    )


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.0f} µs"


def distributed_tables(report: dict[str, Any]) -> dict[str, str]:
    """The section's tables, in Markdown: speed (every library and the floor), scaling,
    settings, lost updates and targets."""
    libs = report["libs"]
    r = report["results"]
    floor = report.get("floor")
    rule = "|---" * (len(libs) + 1 + bool(floor)) + "|"
    head = (
        "| | "
        + " | ".join(lib_name(lib) for lib in libs)
        + (f" | {FLOOR_NAME} |" if floor else " |")
    )

    def row(label: str, cell: Callable[[dict[str, Any]], str], on_floor: bool = False) -> str:
        cells = [cell(r[lib]) for lib in libs]
        if floor:
            cells.append(cell({"drain": floor}) if on_floor else "")
        return f"| {label} | " + " | ".join(cells) + " |"

    def drained(field: str, fmt: Callable[[float], str]) -> Callable[[dict[str, Any]], str]:
        return lambda x: fmt(x["drain"][field])

    speed = [
        head,
        rule,
        row("coalesced add, one at a time", lambda x: f"{x['coalesced_add']['one']:,.0f}/s"),
        row(
            f"coalesced add, {report['parameters']['batch']} at a time",
            lambda x: f"{x['coalesced_add']['batched']:,.0f}/s",
        ),
        row(
            f"end-to-end no-op keys/s, {report['processes']} worker processes x "
            f"{report['concurrency']}",
            drained("keys_per_second", lambda v: f"**{v:,.0f}/s**"),
            on_floor=True,
        ),
        row("pickup latency p50 (one idle worker)", lambda x: _ms(x["pickup"]["p50"])),
        row("pickup latency p99", lambda x: _ms(x["pickup"]["p99"])),
        row(
            "end-to-end: server commands per key (inside scripts too)",
            drained("commands_per_key", lambda v: f"{v:.1f}"),
            on_floor=True,
        ),
        row("end-to-end: script calls per key", drained("scripts_per_key", lambda v: f"{v:.2f}")),
        row(
            "end-to-end: round trips per key (server reads)",
            drained("round_trips_per_key", lambda v: f"{v:.2f}"),
            on_floor=True,
        ),
        row("end-to-end: server CPU per key", drained("server_cpu_per_key", _us), on_floor=True),
        row(
            "end-to-end: worker processes' CPU per key",
            drained("client_cpu_per_key", _us),
            on_floor=True,
        ),
        row(
            "idle worker: commands a second (completed)",
            lambda x: f"{x['pickup']['idle_commands_per_second']:.1f}",
        ),
        row(
            "idle worker: requests a second (server reads)",
            lambda x: f"{x['pickup'].get('idle_requests_per_second', 0):.1f}",
        ),
    ]
    scaling = [
        "| worker processes | "
        + " | ".join(str(x["processes"]) for x in report.get("scaling", []))
        + " |"
    ]
    scaling.append("|---" * (len(report.get("scaling", [])) + 1) + "|")
    for label, cell in (
        ("keys/s", lambda x: f"**{x['keys_per_second']:,.0f}/s**"),
        ("worker processes' CPU per key", lambda x: _us(x["client_cpu_per_key"])),
        (
            "worker processes' cores busy",
            lambda x: f"{x['client_cpu_per_key'] * x['keys_per_second']:.2f}",
        ),
        ("server CPU per key", lambda x: _us(x["server_cpu_per_key"])),
        (
            "server: share of one core",
            lambda x: f"{x['server_cpu_per_key'] * x['keys_per_second']:.0%}",
        ),
        ("round trips per key", lambda x: f"{x['round_trips_per_key']:.2f}"),
        (
            "a handler thread's wait per round trip",
            lambda x: f"{round_trip_ms(x, report['concurrency']):.1f} ms",
        ),
    ):
        scaling.append(
            f"| {label} | " + " | ".join(cell(x) for x in report.get("scaling", [])) + " |"
        )
    settings = ["| library | settings |", "|---|---|"] + [
        f"| {lib_name(lib)} | {report['settings'][lib]} |" for lib in libs
    ]
    lost_libs = [
        lib for lib in libs for lib in ((lib, "bullmq-simple") if lib == "bullmq" else (lib,))
    ]

    def lost_of(lib: str) -> dict[str, Any]:
        return (
            r["bullmq"]["lost_updates_simple"] if lib == "bullmq-simple" else r[lib]["lost_updates"]
        )

    lost = [
        "| | " + " | ".join(lib_name(lib) for lib in lost_libs) + " |",
        "|---" * (len(lost_libs) + 1) + "|",
    ]
    for label, cell in (
        (
            "keys whose final version a handler read",
            lambda x: f"**{x['final_seen']} of {x['keys']}**",
        ),
        ("handler runs", lambda x: f"{x['runs']:,}"),
        ("runs that overlapped another run of the same key", lambda x: f"{x['overlaps']:,}"),
    ):
        lost.append(f"| {label} | " + " | ".join(cell(lost_of(lib)) for lib in lost_libs) + " |")
    targets_table = ["| target | measured | met |", "|---|---|---|"] + [
        f"| {t['target']} | {t['measured']} | {'yes' if t['met'] else '**no**'} |"
        for t in report["targets"]
    ]
    return {
        "speed": "\n".join(speed),
        "scaling": "\n".join(scaling),
        "settings": "\n".join(settings),
        "lost": "\n".join(lost),
        "targets": "\n".join(targets_table),
        "batched_floor": batched_floor_table(report),
    }


STABILITY_NOTE = (
    "The machine is shared with other work (the load average over the section is given "
    "above), and the end-to-end rows are the least stable figures here: every library "
    "meets the same load in one run, so read the ratios within the run, not the absolute "
    "rates."
)


def summarize_distributed(measured: dict[str, Any]) -> dict[str, Any]:
    """``distributed.measure``'s report with what this module reads in it: the
    lost-update note, the targets and where keyqueue's time goes."""
    report = {**measured, "lost_note": lost_note(measured)}
    report["targets"] = targets(report)
    report["where_time_goes"] = where_time_goes(report)
    return report


def distributed_console(report: dict[str, Any]) -> str:
    """The distributed section's tables and closing lines, as ``distributed.py`` prints them."""
    tables = "".join(f"{text}\n\n" for text in distributed_tables(report).values())
    return f"{tables}{report['where_time_goes']}\nload average: {report['load']}"


# -- each durability mode on a Sentinel set (durability.py) --------------------------------


def replicated_table(r: dict[str, Any]) -> str:
    """``durability.measure``'s figures, a row per mode: the drain's keys a second and
    their ratio to the default mode's, round trips, commands and ``WAIT``s per key,
    and the serial adds' latency and rate; an idle pool's commands a second and the
    pickup latency (when the dict has them), and the same two on one plain server."""
    modes: dict[str, dict[str, float]] = r["modes"]
    base = modes["primary"]["keys_per_second"]
    idle = "unreplicated" in r
    head = (
        "| mode | keys/s | vs `primary` | round trips / key | commands / key | `WAIT`s / key "
        "| add p50 | add p99 | adds/s, one client in series |"
    )
    rule = "|---|---:|---:|---:|---:|---:|---:|---:|---:|"
    if idle:
        head += " idle commands/s | pickup p50 | pickup p99 |"
        rule += "---:|---:|---:|"
    lines = [head, rule]
    for mode, f in modes.items():
        line = (
            f"| `{mode}` | {f['keys_per_second']:,.0f} | {f['keys_per_second'] / base:.2f} "
            f"| {f['round_trips_per_key']:.3f} | {f['commands_per_key']:.3f} "
            f"| {f['waits_per_key']:.3f} | {f['add_p50_ms']:.2f} ms | {f['add_p99_ms']:.2f} ms "
            f"| {f['adds_per_second']:,.0f} |"
        )
        lines.append(line + (f" {_idle_cells(f)} |" if idle else ""))
    if idle:
        lines.append(
            f"| `primary`, one plain server |{' |' * 8} {_idle_cells(r['unreplicated'])} |"
        )
    return "\n".join(lines)


def _idle_cells(f: dict[str, float]) -> str:
    """An idle pool's commands a second and the pickup p50 and p99, as table cells."""
    return (
        f"{f['idle_commands_per_second']:.1f} | {f['pickup_p50_ms']:.2f} ms "
        f"| {f['pickup_p99_ms']:.2f} ms"
    )


def replicated_section(r: dict[str, Any]) -> str:
    """The "Replicated" section of build/benchmarks.md."""
    return (
        "## Replicated: each durability mode on a Sentinel set\n\n"
        "`benchmarks/durability.py`, same run, once; every section above ran on one "
        f"unreplicated server; this one on a {r['topology']}, every client through "
        "`Sentinel(...).master_for(...)`. Per mode, "
        f"{r['keys']:,} keys with a no-op handler drained by `run_workers` ({r['workers']} "
        "threads): keys a second, and from the primary's `INFO commandstats` the commands "
        "the clients sent per key and the round trips (a `WAIT` travels with its script, "
        f"so it costs a command, not a round trip); then {r['adds']:,} adds of distinct "
        "keys from one client, one after the other: their latency. `primary`, the default, "
        "is the same scripts as on one server (the primary feeds its replicas but waits "
        "for none); `replicated` waits for every replica after each write, "
        '`replicas=1` for one (weaker: docs/DESIGN.md, "What each mode promises"). '
        f"{_idle_text(r)}Medians of {r['rounds']} round(s).\n\n"
        f"{replicated_table(r)}\n\n"
    )


def _idle_text(r: dict[str, Any]) -> str:
    """What the idle and pickup columns measure, if the dict has them."""
    if "unreplicated" not in r:
        return ""
    return (
        f"Idle: an empty queue under `run_workers` ({r['idle_workers']} threads) over "
        f"{r['idle_seconds']:g} s, the commands its client made the primary run a second "
        "(`INFO commandstats`; ours and the sentinels' and replicas' own left out). Pickup: "
        f"those idle workers, {r['pickup_samples']} keys added one at a time "
        f"{r['pickup_gap'] * 1000:g} ms apart, from `add` returning to the handler starting. "
        "The last row: the same two on one plain server. "
    )


# -- one queue over a Valkey Cluster's primaries (shard_cluster.py) --------------------------


def sharded_table(r: dict[str, Any]) -> str:
    """``shard_cluster.measure``'s runs, a row per N (shards = primaries): keys a second,
    server CPU per key and each primary's share, client CPU per key, commands and round
    trips per key, the overhead against N = 1 and the projection to N primary cores."""
    lines = [
        "| primaries = shards | keys/s here | server CPU / key | each primary's share "
        "| max share x N | client CPU / key | commands / key | round trips / key "
        "| server overhead / key | client overhead / key | projected keys/s (N cores) "
        "| client cores it needs |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for run in r["runs"]:
        shares = " / ".join(f"{s:.0%}" for s in run["shares"])
        lines.append(
            f"| {run['primaries']} | {run['keys_per_second']:,.0f} "
            f"| {_us1(run['server_cpu_per_key'])} | {shares} | {run['max_share_times_n']:.2f} "
            f"| {_us1(run['client_cpu_per_key'])} | {run['commands_per_key']:.2f} "
            f"| {run['round_trips_per_key']:.2f} "
            f"| {_overhead(run, 'server_overhead_per_key')} "
            f"| {_overhead(run, 'client_overhead_per_key')} "
            f"| {run['projected_keys_per_second']:,.0f} | {run['projected_client_cores']:.1f} |"
        )
    return "\n".join(lines)


def _us1(seconds: float) -> str:
    return f"{seconds * 1e6:.1f} µs"


def _overhead(run: dict[str, Any], field: str) -> str:
    """A run's overhead against N = 1, signed, or "-" without an N = 1 run."""
    return f"{run[field] * 1e6:+.1f} µs" if field in run else "-"


def unsharded_table(r: dict[str, Any]) -> str:
    """A 1-shard queue on one plain server, this run, beside the last report's figures."""
    now, last = r["one_server"], r.get("last_report")
    fields = (
        ("keys/s", "keys_per_second", lambda v: f"{v:,.0f}"),
        ("server CPU / key", "server_cpu_per_key", _us1),
        ("client CPU / key", "client_cpu_per_key", _us1),
        ("round trips / key", "round_trips_per_key", lambda v: f"{v:.2f}"),
        ("commands / key", "commands_per_key", lambda v: f"{v:.2f}"),
    )
    lines = ["| one server, 1 shard | this run | last report | ratio |", "|---|---:|---:|---:|"]
    for label, field, fmt in fields:
        if last is None:
            lines.append(f"| {label} | {fmt(now[field])} | - | - |")
        else:
            ratio = now[field] / last[field] if last.get(field) else float("nan")
            lines.append(f"| {label} | {fmt(now[field])} | {fmt(last[field])} | {ratio:.2f} |")
    return "\n".join(lines)


def sharded_section(r: dict[str, Any]) -> str:
    """The "Sharded" section of build/benchmarks.md."""
    runs = r["runs"]
    over = [run for run in runs if run["primaries"] > 1]
    goal = all(run["max_share_times_n"] <= r["share_goal"] for run in over)
    return (
        "## Sharded: one queue over a Valkey Cluster's primaries\n\n"
        "`benchmarks/shard_cluster.py`, same run, once "
        f"({r['seconds']:.0f} s, load average {r['load']}). Per N, a `ValkeyCluster` "
        "of N primaries and no replicas on loopback, and `RedisWorkQueue(name, shards=N)` "
        "on it, shard i's slot placed on primary i (`ValkeyCluster.move_slot`: with "
        "`{name/i}` hash tags no name spreads 6 shards over 6 evenly split primaries); "
        f"{r['keys']:,} distinct keys waiting, then {r['processes']} worker processes of "
        f"`run_workers` ({r['threads']} threads each, a no-op handler) through a "
        "`RedisCluster` client, timed from the first handler's start to the last one's end. "
        "Server CPU is each primary's `INFO cpu` (user + sys) over the drain, less its own "
        f"idle rate (measured over {r['idle_window']:g} s just before: the cluster bus, the "
        "cron), per key of the whole queue; the share is each primary's part of the total "
        f"(goal: none above {r['share_goal']:g}/N: "
        f"{'met' if goal else 'not met'}). Client CPU is the worker processes' own. "
        "The overhead is a key's CPU at N less at N = 1 (the 1-primary Cluster). "
        f"**This machine has {r['cores']} cores for the primaries and the workers "
        "together, so the keys/s here are capped by them**; the projection is what N "
        "primaries on cores of their own would carry: each primary saturates at keys / its "
        "CPU, so the queue at the busiest one's (N primary cores' keys a second, the "
        "overhead and the imbalance included), with the client cores that rate needs "
        "(a projection, not a measurement).\n\n"
        f"{sharded_table(r)}\n\n"
        "The price for a user who does not shard: the same workload (a 1-shard queue, "
        "one plain valkey-server) against the last report's end-to-end figures "
        "(docs/benchmarks.md, before this run). The counts a key hardly depend on the "
        "machine's load; CPU a key and keys/s do, so compare those with the load average "
        "of each run (`benchmarks/versions.py` measures two revisions in one run).\n\n"
        f"{unsharded_table(r)}\n\n"
    )


# -- the document and the console ----------------------------------------------------------


def markdown(report: dict[str, Any]) -> str:
    """build/benchmarks.md (``make bench-docs`` copies it to docs/benchmarks.md)."""
    distributed = report["distributed"]
    dt = distributed_tables(distributed)
    skipped = "".join(f"{lib} did not run: {why}. " for lib, why in distributed["skipped"].items())
    return (
        "# Benchmarks\n\n"
        f"Made by `{report['command']}` on {report['date']}: CPython {report['python']}, "
        f"{report['machine']}, CPU {report['cpu']}.\n\n"
        f"The suite ran {report['runs']} times on each build (pytest-benchmark, calibrated "
        "rounds), the compiled build (mypyc, `keyqueue.COMPILED`) and the pure one "
        "(`KEYQUEUE_PURE=1`) in turn. The targets are the compiled build's; the pure "
        "column gives the same ratios on the pure build, which platforms without a "
        "wheel run. Every ratio divides two medians measured in the same run; the table gives the "
        "median of the per-run ratios and, in brackets, their range. Times are per "
        "operation (min/median/max over all runs); for the producer row a ratio above "
        "1 means keyqueue took longer. The machine is shared, so read the ratios, not "
        "the absolute figures. Workloads: `benchmarks/bench_queue.py`; "
        "memory: `benchmarks/memory.py` (tracemalloc, containers only, keys excluded).\n\n"
        f"{table(report)}\n\n"
        "## Where a cycle's time goes\n\n"
        "`benchmarks/breakdown.py`, same run, interleaved timeit in one process, both "
        "builds side by side (the pure one is the same source imported as `keyqueue_pure`; "
        "each variant once per repeat; min and median of 21 repeats of 20,000 cycles). A "
        "constant clock is read at C speed and never moves, which isolates what the real "
        "clock reads cost.\n\n"
        f"{breakdown_table(report['breakdown'])}\n\n"
        f"{BREAKDOWN_NOTE}\n\n"
        f"{contention_section(report)}"
        "## Priorities: the FIFO path against the code before them\n\n"
        "`benchmarks/priorities.py`, same run: today's queues (the pure build) next to "
        "those of commit "
        f"{report['priorities']['baseline']} (the last before priorities, extracted with "
        "`git archive` into a package of its own), interleaved timeit in one process "
        "(median of 21 repeats of 20,000 calls; the ratio is the median of the per-repeat "
        "ratios, today / before). Then the ranked path: a queue that has seen a priority "
        "keeps its waiting keys in a heap.\n\n"
        f"{priorities_tables(report['priorities'])}\n\n"
        "## Many processes: keyqueue.redis beside BullMQ, streaq, SAQ, arq and rq\n\n"
        "`benchmarks/distributed.py` (each library behind its adapter in `benchmarks/peers/`), "
        f"same run, once ({distributed['seconds']:.0f} s, load "
        f"average {distributed['load']} at its start and end): one private valkey-server "
        f"{distributed['server']} on loopback, flushed between workloads; every library but "
        f"BullMQ through redis-py {distributed['redis_py']} (arq pins it below 6). {skipped}"
        f"{describe_distributed(distributed)}\n\n"
        f"{dt['speed']}\n\n"
        "Each library's settings:\n\n"
        f"{dt['settings']}\n\n"
        f"{STABILITY_NOTE}\n\n"
        "### Scaling: keyqueue with 1, 2, 4 and 8 worker processes\n\n"
        f"The end-to-end workload above, run again with 1, 2, 4 and 8 worker processes "
        f"({distributed['concurrency']} handlers each), one after another, same run; a "
        "handler thread's wait per round trip is its time per key (every thread busy) "
        "divided by the round trips a key takes.\n\n"
        f"{dt['scaling']}\n\n"
        f"{distributed['where_time_goes']}\n\n"
        f"{batched_floor_section(distributed, dt)}"
        "### Targets, from this run\n\n"
        f"{dt['targets']}\n\n"
        "### Lost updates\n\n"
        f"{distributed['lost_note']}\n\n"
        f"{dt['lost']}\n\n"
        f"{replicated_section(report['replicated'])}"
        f"{sharded_section(report['sharded']) if 'sharded' in report else ''}"
    )


def batched_floor_section(distributed: dict[str, Any], dt: dict[str, str]) -> str:
    """The subsection on keyqueue against the batched floor ('' if not measured)."""
    bf = distributed.get("batched_floor")
    if not bf:
        return ""
    top = sorted(bf["keyqueue"]["by_command"].items(), key=lambda item: -item[1][1])[:6]
    spent = ", ".join(f"{name} {usec * 1e6:.1f} µs" for name, (_, usec) in top)
    return (
        "### Against a batched floor\n\n"
        "The end-to-end workload, keyqueue with "
        f"{distributed['processes']} worker processes and then, at once after it, the "
        f"batched floor: {distributed['parameters']['batched_floor_keys']:,} keys on a bare "
        "list (its server CPU per key falls as its rate rises, so it runs long enough to "
        "reach it; each of its figures the median of "
        f"{distributed['parameters']['batched_floor_runs']} runs, as its server CPU per key "
        "spreads 2x from run to run here), the same processes and handler "
        f"threads, each process popping {bf['batch']} keys a round trip (`LPOP key n`, n "
        "the keys keyqueue's claims took per `LPOP` in its run, rounded) and handing them "
        "to its threads; no lease, no token, no coalescing. The ratios divide keyqueue's "
        "figure by the floor's, same run. `python benchmarks/distributed.py --only "
        "floor-ratios [RUNS]` runs only this, RUNS times. keyqueue's server time per key "
        f"by command (commandstats' wall time; a script's includes its commands'): {spent}.\n\n"
        f"{dt['batched_floor']}\n\n"
    )


def console(report: dict[str, Any]) -> str:
    """The tables ``make bench`` prints at its end."""
    dt = distributed_tables(report["distributed"])
    return "\n\n".join(
        (
            table(report),
            breakdown_table(report["breakdown"]),
            contention_tables(report["contention"]),
            priorities_tables(report["priorities"]),
            dt["speed"],
            dt["scaling"],
            *((dt["batched_floor"],) if dt["batched_floor"] else ()),
            dt["targets"],
            dt["lost"],
            replicated_table(report["replicated"]),
            *((sharded_table(report["sharded"]),) if "sharded" in report else ()),
        )
    )
