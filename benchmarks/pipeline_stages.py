"""``keyqueue lab pipeline``'s stage table, run after run, at concurrency 10 and 1.

    .venv/bin/python benchmarks/pipeline_stages.py [--runs 3] [--concurrency 10,1] [-- ARGS]

Runs ``keyqueue lab pipeline --json`` (its defaults: 200 triggers, 20 objects,
8 workers, 5 ms reconcile; ARGS are passed on) ``--runs`` times per
concurrency, each a fresh set of processes and a fresh etcd, and prints per
run the p50 of every stage and the two ratios the pipeline is judged by (trigger /
etcd write; trigger → reconciled / queue.add), then the medians over the runs, with
the machine's cores and its load average before and after. One JSON document
on stdout with ``--json``. Not part of ``make bench`` (it needs the lab extra).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any

STAGES = (
    "trigger",
    "etcd_write",
    "write_to_event",
    "event_to_add",
    "add_call",
    "add_to_get",
    "reconcile",
    "end_to_end",
)


def _load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} {five:.2f} {fifteen:.2f}"


def _run(concurrency: int, extra: list[str]) -> dict[str, Any]:
    command = [sys.executable, "-m", "keyqueue", "lab", "pipeline", "--json"]
    command += ["--concurrency", str(concurrency), *extra]
    done = subprocess.run(command, check=True, capture_output=True, text=True)
    data: dict[str, Any] = json.loads(done.stdout)
    p50 = {name: data["stages"][name]["p50"] for name in STAGES}
    return {
        "p50": p50,
        "p95": {name: data["stages"][name]["p95"] for name in STAGES},
        "trigger_over_write": p50["trigger"] / p50["etcd_write"],
        "end_to_end_over_add": p50["end_to_end"] / p50["add_call"],
        "verified": data["verified"],
        "processes": data["processes"],
    }


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.3f}" if seconds >= 1e-4 else f"{seconds * 1e6:.1f}µs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--concurrency", default="10,1")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("extra", nargs="*", help="passed on to keyqueue lab pipeline")
    args = parser.parse_args()
    report: dict[str, Any] = {"cores": os.cpu_count(), "load_before": _load(), "runs": {}}
    for concurrency in (int(c) for c in args.concurrency.split(",")):
        runs = [_run(concurrency, args.extra) for _ in range(args.runs)]
        medians = {name: statistics.median(r["p50"][name] for r in runs) for name in STAGES}
        report["runs"][concurrency] = {
            "each": runs,
            "median_p50": medians,
            "median_trigger_over_write": statistics.median(r["trigger_over_write"] for r in runs),
            "median_end_to_end_over_add": statistics.median(r["end_to_end_over_add"] for r in runs),
        }
        if not args.json:
            print(f"concurrency {concurrency} (p50 ms; µs where marked), load {_load()}")
            print("  " + " ".join(f"{name:>14}" for name in STAGES) + "  trig/write  e2e/add")
            for r in runs:
                cells = " ".join(f"{_ms(r['p50'][name]):>14}" for name in STAGES)
                print(
                    f"  {cells}  {r['trigger_over_write']:10.2f}  {r['end_to_end_over_add']:7.0f}"
                )
            cells = " ".join(f"{_ms(medians[name]):>14}" for name in STAGES)
            runs_c = report["runs"][concurrency]
            print(
                f"  {cells}  {runs_c['median_trigger_over_write']:10.2f}  "
                f"{runs_c['median_end_to_end_over_add']:7.0f}  (medians)"
            )
    report["load_after"] = _load()
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(
            f"cores {report['cores']}, load average before {report['load_before']}, after "
            f"{report['load_after']}"
        )


if __name__ == "__main__":
    main()
