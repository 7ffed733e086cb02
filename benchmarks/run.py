"""``make bench``: run every workload in one session, print one table of ratios.

Timing uses pytest-benchmark (calibrated rounds, min/median/max, JSON out, and
the threaded and asyncio workloads are plain functions in one process).
The whole session runs ``RUNS`` times, each time on the compiled build and then
on the pure one (``KEYQUEUE_PURE=1``); each ratio divides two medians from the
same session, and the table quotes the median of those per-run ratios (with
their range), because the machine is shared and noisy. The targets are the
compiled build's; the pure build's ratios stand beside them. Each run also
runs ``contention.py`` (busy producers beside workers) once on each build,
for each of its handler shapes.
Then the sections measured once: memory, where a cycle's time goes,
priorities against the code before them, many processes on one server
(``distributed.py``), each durability mode on a replicated Sentinel set
(``durability.py``), and one sharded queue over 1, 3 and 6 Valkey Cluster
primaries (``shard_cluster.py``). ``report.py`` turns the measurements into
build/benchmarks.json's report and build/benchmarks.md; ``make bench-docs``
copies the latter over the tracked docs/benchmarks.md.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
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


def run_contention(build: str, shape: str) -> dict[str, Any]:
    """One run of contention.py on ``build`` ("compiled" or "pure") with the
    handler ``shape`` ("blocking" or "cpu")."""
    env = {**os.environ, "KEYQUEUE_PURE": "1" if build == "pure" else ""}
    out = subprocess.run(
        [sys.executable, "benchmarks/contention.py", shape],
        cwd=ROOT, env=env, check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    result: dict[str, Any] = json.loads(out)
    if result["compiled"] != (build == "compiled"):
        sys.exit(f"contention.py ran the wrong build (asked for {build}): run `make native`")
    return result


def main() -> None:
    # Sibling modules, found via sys.path.
    import report as doc  # noqa: PLC0415
    from breakdown import measure as measure_breakdown  # noqa: PLC0415
    from distributed import measure as measure_distributed  # noqa: PLC0415
    from durability import measure as measure_durability  # noqa: PLC0415
    from memory import measure  # noqa: PLC0415
    from priorities import measure as measure_priorities  # noqa: PLC0415
    from shard_cluster import measure as measure_sharded  # noqa: PLC0415

    raws, pure_raws = [], []
    busy: dict[tuple[str, str], list[dict[str, Any]]] = {
        (s, b): [] for s in doc.CONTENTION_SHAPES for b in ("compiled", "pure")
    }
    for run in range(RUNS):  # the two builds alternate, so both meet the same noise
        raws.append(run_pytest_benchmark(run, "compiled"))
        pure_raws.append(run_pytest_benchmark(run, "pure"))
        for s in doc.CONTENTION_SHAPES:
            for b in ("compiled", "pure"):
                busy[s, b].append(run_contention(b, s))
    memory = measure()
    contention = {
        s: doc.contention_summary(busy[s, "compiled"], busy[s, "pure"])
        for s in doc.CONTENTION_SHAPES
    }
    report = doc.build(raws, pure_raws, memory, contention)
    report["breakdown"] = measure_breakdown()
    report["priorities"] = measure_priorities()
    print("distributed: keyqueue.redis, BullMQ, streaq, SAQ, arq, rq on one valkey-server")
    report["distributed"] = doc.summarize_distributed(measure_distributed())
    print("replicated: each durability mode on a Sentinel set (1 primary, 2 replicas)")
    report["replicated"] = measure_durability()
    print("sharded: one queue over 1, 3 and 6 Valkey Cluster primaries")
    report["sharded"] = measure_sharded()
    OUT_JSON.write_text(json.dumps(report, indent=2))
    OUT_MD.parent.mkdir(exist_ok=True)
    OUT_MD.write_text(doc.markdown(report))
    print()
    print(doc.console(report))
    print(
        f"\nwrote {OUT_JSON.relative_to(ROOT)} and {OUT_MD.relative_to(ROOT)}; "
        "`make bench-docs` copies the latter to docs/benchmarks.md"
    )


if __name__ == "__main__":
    main()
