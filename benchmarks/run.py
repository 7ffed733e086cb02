"""``make bench``: run every workload in one session, print one table of ratios.

Timing uses pytest-benchmark (calibrated rounds, min/median/max, JSON out, and
the threaded and asyncio workloads are plain functions in one process).
The whole session runs ``RUNS`` times, each time on the compiled build and then
on the pure one (``KEYQUEUE_PURE=1``); each ratio divides two medians from the
same session, and the table quotes the median of those per-run ratios (with
their range), because the machine is shared and noisy. The targets are the
compiled build's; the pure build's ratios stand beside them. Each run also
runs ``contention.py`` (busy producers beside workers) once on each build.
Writes build/benchmarks.json and build/benchmarks.md; ``make bench-docs``
copies the latter over the tracked docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "build" / "benchmarks-raw-{}-{}.json"
RUNS = int(os.environ.get("BENCH_RUNS", "3"))
OUT_JSON = ROOT / "build" / "benchmarks.json"
OUT_MD = ROOT / "build" / "benchmarks.md"

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run_pytest_benchmark(run: int, build: str) -> dict[str, Any]:
    """One session of bench_queue.py on ``build``: "compiled" or "pure"."""
    raw = Path(str(RAW).format(run, build))
    raw.parent.mkdir(exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", "benchmarks/bench_queue.py", "-q",
        "-o", "python_files=bench_*.py", "-o", "filterwarnings=",
        "-p", "no:cacheprovider", "-p", "no:randomly",
        "--benchmark-only", "--benchmark-min-rounds=15", "--benchmark-max-time=2",
        "--benchmark-columns=min,median,max,rounds", "--benchmark-sort=name",
        f"--benchmark-json={raw}",
    ]  # fmt: skip
    env = {**os.environ, "KEYQUEUE_PURE": "1" if build == "pure" else ""}
    subprocess.run(cmd, cwd=ROOT, check=True, env=env)
    return json.loads(raw.read_text())  # type: ignore[no-any-return]


def run_contention(build: str) -> dict[str, Any]:
    """One run of contention.py on ``build``: "compiled" or "pure"."""
    env = {**os.environ, "KEYQUEUE_PURE": "1" if build == "pure" else ""}
    out = subprocess.run(
        [sys.executable, "benchmarks/contention.py"],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    result: dict[str, Any] = json.loads(out)
    if result["compiled"] != (build == "compiled"):
        sys.exit(f"contention.py ran the wrong build (asked for {build}): run `make native`")
    return result


CONTENTION_FIELDS = ("adds_per_second", "reconciles_per_second", "mean_wait", "worker_cpu_share")


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


def contention_row(contention: dict[str, Any]) -> dict[str, Any]:
    """The main table's row for busy producers: compiled reconciles/s, ratios to the pure build."""
    keys = contention["ratios"]["reconciles_per_second"]
    wait = contention["ratios"]["mean_wait"]
    return {
        "workload": "busy producers: 3 threads adding onto 50 keys, 8 workers",
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
    "Why the fix was needed: a worker woken by `add`'s notify needs the GIL to take its key, "
    "and CPython hands the GIL over only when a thread blocks or when a waiter has waited a "
    "whole switch interval (`sys.getswitchinterval()`, 5 ms) and asks for it. A producer "
    "spinning on the compiled `add` never blocks (the lock is free whenever it holds the "
    "GIL) and `add` itself has no bytecode boundary, so each producer kept the GIL for whole "
    "intervals, and a GIL it was made to drop could go to one of the other two producers, "
    "who wait for it beside the woken workers. Measured before the fix (this workload, two "
    "runs of each build, commit 5aafdaf): the workers got 12 to 17% of the threads' CPU time "
    "on the compiled build (pure: 29 to 76%), it handed out 4,839 to 6,717 keys/s against "
    "the pure build's 10,463 to 14,458, and a key waited 6.8 to 9.7 ms (pure: 2.5 to 4.1 "
    "ms), while the compiled producers made 4.6 to 4.7 million adds/s, nearly all of them "
    "absorbed. With a 4 µs handler, a switch interval of 0.5 ms instead of 5 made the "
    "compiled build hand out 4.3x more keys, and its mean wait fell from 6.1 to 1.3 ms: the "
    "interval, not the queue, set the pace. The fix (`keyqueue/_threading.py`): while a "
    "getter is blocked and a key waits for it (the woken getter has not run yet), `add` "
    "counts its adds and yields the GIL (`time.sleep(0)`, outside the lock) every 1,000 of "
    "them, about 0.2 ms of compiled adds; with no getter blocked it does nothing more than "
    "before. The trade: "
    "producers make fewer adds (they were nearly all absorbed) while workers reconcile. "
    "The uncontended path is as fast as before (`bench_queue.py`, two runs of each build "
    "before and after, ratios of medians; pure in brackets): coalesced add 0.81x and 0.96x "
    "the lock+set floor before, 0.83x and 0.83x after (1.67x, 1.68x; 1.72x, 1.72x); the "
    "one-thread cycle 0.97x and 1.14x the bare structures, then 0.97x and 0.97x (1.76x, "
    "1.61x; 1.63x, 1.61x); producer → 4 workers 893k and 919k keys/s, then 834k and 894k "
    "(514k, 601k; 557k, 638k); firehose 6.9M and 5.8M adds/s, then 6.8M and 6.6M (3.46M, "
    "3.36M; 3.27M, 3.20M: the pure firehose's one slower figure, 5%)."
)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def build(
    raws: list[dict[str, Any]],
    pure_raws: list[dict[str, Any]],
    memory: dict[str, float],
    report_contention: dict[str, Any],
) -> dict[str, Any]:
    runs = [stats_by_name(raw) for raw in raws]
    pure_runs = [stats_by_name(raw) for raw in pure_raws]
    rows: list[dict[str, Any]] = []

    def merged(name: str, key: str, value: Any) -> list[float]:
        return [value(b[name], key) for b in runs]

    def add_row(
        workload: str,
        name: str,
        vs: list[tuple[str, str]],
        target: str,
        ok: Any,
        value: Any = per_op,
        unit: str | None = None,
        higher_is_better: bool = False,
    ) -> None:
        lo, mid, hi = ("max", "median", "min") if higher_is_better else ("min", "median", "max")
        row: dict[str, Any] = {
            "workload": workload,
            "min": min(merged(name, lo, value)),
            "median": _median(merged(name, mid, value)),
            "max": max(merged(name, hi, value)),
            "ratios": {},
            "ratio_ranges": {},
            "baselines": {},
            "target": target,
        }
        if unit:
            row["unit"] = unit
        for label, other in vs:
            per_run = [
                value(b[name], "median") / value(b[other], "median")
                if not higher_is_better
                else value(b[other], "median") / value(b[name], "median")
                for b in runs
            ]
            row["ratios"][label] = _median(per_run)
            row["ratio_ranges"][label] = (min(per_run), max(per_run))
            row["baselines"][label] = _median(merged(other, "median", value))
            pure = [
                value(b[name], "median") / value(b[other], "median")
                if not higher_is_better
                else value(b[other], "median") / value(b[name], "median")
                for b in pure_runs
            ]
            row.setdefault("pure_ratios", {})[label] = _median(pure)
        row["met"] = bool(ok(row))
        rows.append(row)

    def throughput(b: dict[str, Any], key: str) -> float:
        return float(b["extra_info"]["items"]) / float(b["stats"][key])

    add_row(
        "coalesced add",
        "coalesced_add_keyqueue",
        [("lock+set floor", "coalesced_add_floor_lock_set")],
        "≤ 1.2x floor",
        lambda r: r["ratios"]["lock+set floor"] <= 1.2,
    )
    add_row(
        "add/get/done cycle, one thread",
        "cycle_keyqueue",
        [
            ("bare set/set/deque", "cycle_floor_bare_structures"),
            ("queue.Queue", "cycle_stdlib_queue"),
        ],
        "≤ 1.0x bare, ≤ 0.5x queue.Queue",
        lambda r: r["ratios"]["bare set/set/deque"] <= 1.0 and r["ratios"]["queue.Queue"] <= 0.5,
    )
    add_row(
        "add/get/done cycle, ranked (priority 5, aging)",
        "cycle_keyqueue_ranked",
        [("FIFO cycle", "cycle_keyqueue")],
        "reported (no target)",
        lambda r: True,
    )
    add_row(
        "producer → 4 worker threads, distinct keys",
        "threads_keyqueue",
        [("queue.Queue (time)", "threads_stdlib_queue")],
        "reported (no target)",
        lambda r: True,
        value=throughput,
        unit="keys/s",
        higher_is_better=True,
    )
    firehose = [b["firehose_keyqueue"]["extra_info"] for b in runs]
    pure_firehose = [b["firehose_keyqueue"]["extra_info"] for b in pure_runs]
    speedups = [
        f["adds_per_second_median"] / p["adds_per_second_median"]
        for f, p in zip(firehose, pure_firehose, strict=True)
    ]
    rows.append({
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
    })  # fmt: skip
    rows.append(contention_row(report_contention))
    add_row(
        "add_after insert + fire, per key",
        "add_after_keyqueue",
        [("heapq push/pop", "add_after_floor_heapq")],
        "reported (no target)",
        lambda r: True,
    )
    add_row(
        "default controller limiter when()",
        "rate_limiter_default_when",
        [],
        "reported (no target)",
        lambda r: True,
    )
    add_row(
        "asyncio add/get_nowait/done cycle",
        "async_keyqueue_nowait",
        [
            ("asyncio.Queue", "async_stdlib_asyncio_queue"),
            ("aiok8s", "async_peer_aiok8s"),
            ("leasedkeyq", "async_peer_leasedkeyq"),
        ],
        "≤ 1.0x asyncio.Queue, < 1.0x aiok8s",
        lambda r: r["ratios"]["asyncio.Queue"] <= 1.0 and r["ratios"]["aiok8s"] < 1.0,
    )
    add_row(
        "asyncio add/await get/done cycle",
        "async_keyqueue_await_get",
        [("asyncio.Queue", "async_stdlib_asyncio_queue"), ("aiok8s", "async_peer_aiok8s")],
        "reported (no target)",
        lambda r: True,
    )
    rows.append({
        "workload": f"memory per waiting key ({memory['keys']:,} keys)",
        "median": memory["keyqueue_bytes_per_key"], "unit": "bytes",
        "ratios": {"set+deque floor": memory["ratio"]},
        "baselines": {"set+deque floor": memory["floor_bytes_per_key"]},
        "target": "≤ 2.0x floor", "met": memory["ratio"] <= 2.0,
    })  # fmt: skip
    first = raws[0]
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "cpu": first.get("machine_info", {}).get("cpu", {}).get("brand_raw", "unknown"),
        "runs": len(raws),
        "command": "make bench",
        "rows": rows,
        "contention": report_contention,
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


def contention_section(report: dict[str, Any]) -> str:
    """docs/benchmarks.md's section on busy producers beside workers."""
    c = report["contention"]
    return (
        "## Workers beside busy producers\n\n"
        f"`benchmarks/contention.py`, same run, once per run on each build ("
        f"{report['runs']} runs, the builds in turn): three producer threads call `add` in a "
        "tight loop onto 50 keys for 3 s while 8 worker threads `get`, run a handler of about "
        "20 µs of Python and `done`. Reconciles/s is keys handed out (`Stats.gets`) per "
        "second of the producers' run; the mean wait is `Stats.queue_wait_seconds / gets`.\n\n"
        f"{contention_table(c)}\n\n"
        f"{CONTENTION_NOTE}\n\n"
    )


STABILITY_NOTE = (
    "The machine is shared with other work (the load average over the section is given "
    "above), and the end-to-end rows are the least stable figures here: every library "
    "meets the same load in one run, so read the ratios within the run, not the absolute "
    "rates."
)


def main() -> None:
    # Sibling scripts, found via sys.path.
    from breakdown import measure as measure_breakdown  # noqa: PLC0415
    from distributed import describe as describe_distributed  # noqa: PLC0415
    from distributed import measure as measure_distributed  # noqa: PLC0415
    from distributed import tables as distributed_tables  # noqa: PLC0415
    from memory import measure  # noqa: PLC0415
    from priorities import measure as measure_priorities  # noqa: PLC0415
    from priorities import tables as priorities_tables  # noqa: PLC0415

    raws, pure_raws = [], []
    busy: dict[str, list[dict[str, Any]]] = {"compiled": [], "pure": []}
    for run in range(RUNS):  # the two builds alternate, so both meet the same noise
        raws.append(run_pytest_benchmark(run, "compiled"))
        pure_raws.append(run_pytest_benchmark(run, "pure"))
        for b in ("compiled", "pure"):
            busy[b].append(run_contention(b))
    memory = measure()
    report = build(raws, pure_raws, memory, contention_summary(busy["compiled"], busy["pure"]))
    report["breakdown"] = measure_breakdown()
    report["priorities"] = measure_priorities()
    print("distributed: keyqueue.redis, BullMQ, streaq, SAQ, arq, rq on one valkey-server")
    distributed = measure_distributed()
    report["distributed"] = distributed
    OUT_JSON.write_text(json.dumps(report, indent=2))
    dt = distributed_tables(distributed)
    speed, lost, targets = dt["speed"], dt["lost"], dt["targets"]
    skipped = "".join(f"{lib} did not run: {why}. " for lib, why in distributed["skipped"].items())
    body = table(report)
    OUT_MD.parent.mkdir(exist_ok=True)
    OUT_MD.write_text(
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
        f"{body}\n\n"
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
        f"`benchmarks/distributed.py`, same run, once ({distributed['seconds']:.0f} s, load "
        f"average {distributed['load']} at its start and end): one private valkey-server "
        f"{distributed['server']} on loopback, flushed between workloads; every library but "
        f"BullMQ through redis-py {distributed['redis_py']} (arq pins it below 6). {skipped}"
        f"{describe_distributed()}\n\n"
        f"{speed}\n\n"
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
        "### Targets, from this run\n\n"
        f"{targets}\n\n"
        "### Lost updates\n\n"
        f"{distributed['lost_note']}\n\n"
        f"{lost}\n"
    )
    print()
    print(body)
    print()
    print(breakdown_table(report["breakdown"]))
    print()
    print(contention_table(report["contention"]))
    print()
    print(priorities_tables(report["priorities"]))
    print()
    print(speed)
    print()
    print(dt["scaling"])
    print()
    print(targets)
    print()
    print(lost)
    print(
        f"\nwrote {OUT_JSON.relative_to(ROOT)} and {OUT_MD.relative_to(ROOT)}; "
        "`make bench-docs` copies the latter to docs/benchmarks.md"
    )


if __name__ == "__main__":
    main()
