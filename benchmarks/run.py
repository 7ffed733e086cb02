"""``make bench``: run every workload in one session, print one table of ratios.

Timing uses pytest-benchmark (calibrated rounds, min/median/max, JSON out, and
the threaded and asyncio workloads are plain functions in one process).
Ratios are medians divided by medians from the same run; the machine is shared
and noisy, so only ratios and medians are quoted. Writes build/benchmarks.json
and docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RAW = ROOT / "build" / "benchmarks-raw.json"
OUT_JSON = ROOT / "build" / "benchmarks.json"
OUT_MD = ROOT / "docs" / "benchmarks.md"

sys.path.insert(0, str(Path(__file__).resolve().parent))


def run_pytest_benchmark() -> dict[str, Any]:
    RAW.parent.mkdir(exist_ok=True)
    cmd = [
        sys.executable, "-m", "pytest", "benchmarks/bench_queue.py", "-q",
        "-o", "python_files=bench_*.py", "-o", "filterwarnings=",
        "-p", "no:cacheprovider", "-p", "no:randomly",
        "--benchmark-only", "--benchmark-min-rounds=15", "--benchmark-max-time=2",
        "--benchmark-columns=min,median,max,rounds", "--benchmark-sort=name",
        f"--benchmark-json={RAW}",
    ]  # fmt: skip
    subprocess.run(cmd, cwd=ROOT, check=True)
    return json.loads(RAW.read_text())  # type: ignore[no-any-return]


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


def build(raw: dict[str, Any], memory: dict[str, float]) -> dict[str, Any]:
    b = stats_by_name(raw)
    rows: list[dict[str, Any]] = []

    def timing(workload: str, name: str, vs: list[tuple[str, str]], target: str, ok: Any) -> None:
        ours = b[name]
        row: dict[str, Any] = {
            "workload": workload,
            "min": per_op(ours, "min"),
            "median": per_op(ours, "median"),
            "max": per_op(ours, "max"),
            "ratios": {},
            "target": target,
        }
        for label, other in vs:
            row["ratios"][label] = per_op(ours, "median") / per_op(b[other], "median")
            row.setdefault("baselines", {})[label] = per_op(b[other], "median")
        row["met"] = bool(ok(row))
        rows.append(row)

    timing(
        "coalesced add",
        "coalesced_add_keyqueue",
        [("lock+set floor", "coalesced_add_floor_lock_set")],
        "≤ 2.0x floor",
        lambda r: r["ratios"]["lock+set floor"] <= 2.0,
    )
    timing(
        "add/get/done cycle, one thread",
        "cycle_keyqueue",
        [("bare set/set/deque", "cycle_floor_bare_structures"), ("queue.Queue", "cycle_stdlib_queue")],
        "≤ 1.5x bare, ≤ 1.0x queue.Queue",
        lambda r: r["ratios"]["bare set/set/deque"] <= 1.5 and r["ratios"]["queue.Queue"] <= 1.0,
    )
    thr, std = b["threads_keyqueue"], b["threads_stdlib_queue"]
    n = thr["extra_info"]["items"]
    rows.append({
        "workload": "producer → 4 worker threads, distinct keys",
        "min": n / thr["stats"]["max"], "median": n / thr["stats"]["median"],
        "max": n / thr["stats"]["min"], "unit": "keys/s",
        "ratios": {"queue.Queue (throughput)": std["stats"]["median"] / thr["stats"]["median"]},
        "baselines": {"queue.Queue": n / std["stats"]["median"]},
        "target": "reported (no target)", "met": True,
    })  # fmt: skip
    fh = b["firehose_keyqueue"]["extra_info"]
    rows.append({
        "workload": "firehose: 20 hot keys, 4 workers",
        "min": fh["adds_per_second_min"], "median": fh["adds_per_second_median"],
        "max": fh["adds_per_second_max"], "unit": "adds/s",
        "ratios": {}, "absorbed": fh["absorbed_median"],
        "target": "≥ 500,000 adds/s", "met": fh["adds_per_second_median"] >= 500_000,
    })  # fmt: skip
    timing(
        "add_after insert + fire, per key",
        "add_after_keyqueue",
        [("heapq push/pop", "add_after_floor_heapq")],
        "reported (no target)",
        lambda r: True,
    )
    rl = b["rate_limiter_default_when"]
    rows.append({
        "workload": "default controller limiter when()",
        "min": per_op(rl, "min"), "median": per_op(rl, "median"), "max": per_op(rl, "max"),
        "ratios": {}, "target": "reported (no target)", "met": True,
    })  # fmt: skip
    timing(
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
    timing(
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
    return {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "python": sys.version.split()[0],
        "implementation": platform.python_implementation(),
        "machine": f"{platform.machine()}, {os.cpu_count()} cores, {platform.platform()}",
        "cpu": raw.get("machine_info", {}).get("cpu", {}).get("brand_raw", "unknown"),
        "command": "make bench",
        "rows": rows,
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
        "| workload | min | median | max | ratio (median / median) | target | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in report["rows"]:
        ratios = "; ".join(f"{v:.2f}x {k}" for k, v in row["ratios"].items())
        if "absorbed" in row:
            ratios = f"{row['absorbed']:.1%} of adds absorbed"
        lines.append(
            f"| {row['workload']} | {fmt_value(row, 'min')} | {fmt_value(row, 'median')} | "
            f"{fmt_value(row, 'max')} | {ratios} | {row['target']} | "
            f"{'yes' if row['met'] else '**no**'} |"
        )
    return "\n".join(lines)


def main() -> None:
    from memory import measure

    raw = run_pytest_benchmark()
    memory = measure()
    report = build(raw, memory)
    OUT_JSON.write_text(json.dumps(report, indent=2))
    body = table(report)
    OUT_MD.parent.mkdir(exist_ok=True)
    OUT_MD.write_text(
        "# Benchmarks\n\n"
        f"Made by `{report['command']}` on {report['date']}: CPython {report['python']}, "
        f"{report['machine']}, CPU {report['cpu']}.\n\n"
        "Every ratio divides two medians measured in the same run (pytest-benchmark, "
        "calibrated rounds). Times are per operation; the machine is shared, so read "
        "the ratios, not the absolute figures. Workloads: `benchmarks/bench_queue.py`; "
        "memory: `benchmarks/memory.py` (tracemalloc, containers only, keys excluded).\n\n"
        f"{body}\n"
    )
    print()
    print(body)
    print(f"\nwrote {OUT_JSON.relative_to(ROOT)} and {OUT_MD.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
