"""keyqueue.redis end to end on two revisions of src/, in one run, as ratios.

    python benchmarks/versions.py BASE [HEAD] [--rounds N] [--workloads W,...]

Each revision's ``src/keyqueue`` is extracted with ``git archive`` into a
temporary folder (``.`` instead of a revision: this checkout's src/ as it is,
uncommitted changes included). One private valkey-server serves both. Each
round runs ``distributed.py --json URL keyqueue WORKLOAD...`` once per
revision, in a subprocess whose ``PYTHONPATH`` is that revision's src/, the
order alternating from round to round; the harness (this checkout's
``distributed.py`` and ``peers/keyqueue.py``), the server and the machine's
noise are the same for both. Both run the pure build (``KEYQUEUE_PURE=1``: an
extracted tree has no compiled modules). The workloads are
``distributed.py``'s, ``drain`` (end to end: keys/s, and from INFO
commandstats and stats the script calls, commands and round trips per key,
server and worker CPU per key) and ``coalesced_add`` by default.

Printed: each figure's median per revision and the median of the per-round
ratios HEAD / BASE, with their range. Counts per key hardly depend on the
machine's load; keys/s and CPU do, which is why the ratio is taken within
each round.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DISTRIBUTED = Path(__file__).resolve().parent / "distributed.py"
FIGURES = (  # (workload, field, how it prints)
    ("drain", "keys_per_second", "{:,.0f}/s"),
    ("drain", "scripts_per_key", "{:.3f}"),
    ("drain", "commands_per_key", "{:.2f}"),
    ("drain", "round_trips_per_key", "{:.3f}"),
    ("drain", "server_cpu_per_key", "{:.2e} s"),
    ("drain", "client_cpu_per_key", "{:.2e} s"),
    ("coalesced_add", "one", "{:,.0f}/s"),
    ("coalesced_add", "batched", "{:,.0f}/s"),
)


def source(rev: str, into: Path) -> Path:
    """The ``src`` folder of ``rev`` (``.``: this checkout's own), extracted under ``into``."""
    if rev == ".":
        return ROOT / "src"
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "src/keyqueue"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    where = into / rev.replace("/", "_")
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    return where / "src"


def _git(*args: str) -> str:
    return subprocess.run(
        ["git", *args], cwd=ROOT, check=True, capture_output=True, text=True
    ).stdout.strip()


def describe(rev: str) -> str:
    """``rev`` and the commit it names (``.``: this checkout, and whether src/ has changes)."""
    if rev == ".":
        dirty = ", with uncommitted changes" if _git("status", "--porcelain", "src") else ""
        return f". ({_git('rev-parse', '--short', 'HEAD')}{dirty})"
    return f"{rev} ({_git('rev-parse', '--short', rev)})"


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(src), "KEYQUEUE_PURE": "1"}


def check_import(src: Path) -> None:
    """Exit unless a subprocess with this ``PYTHONPATH`` imports keyqueue from ``src``."""
    where = subprocess.run(
        [sys.executable, "-c", "import keyqueue; print(keyqueue.__file__)"],
        env=_env(src),
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(where).resolve().is_relative_to(src.resolve()):
        sys.exit(f"PYTHONPATH={src} imports keyqueue from {where}, not from there")


def measure(src: Path, url: str, workloads: list[str]) -> dict[str, Any]:
    """``distributed.py``'s keyqueue workloads, on the keyqueue under ``src``."""
    done = subprocess.run(
        [sys.executable, str(DISTRIBUTED), "--json", url, "keyqueue", *workloads],
        env=_env(src),
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@contextmanager
def server() -> Iterator[str]:
    """A private valkey-server (``keyqueue.testing``, from this interpreter's keyqueue)."""
    from keyqueue.testing import local_valkey  # noqa: PLC0415

    with local_valkey() as url:
        yield url


def compare(base: str, head: str, rounds: int, workloads: list[str]) -> str:
    """Both revisions, ``rounds`` times each, interleaved; the summary table."""
    runs: dict[str, list[dict[str, Any]]] = {base: [], head: []}
    with tempfile.TemporaryDirectory(prefix="keyqueue-versions-") as tmp:
        srcs = {rev: source(rev, Path(tmp)) for rev in (base, head)}
        for src in srcs.values():
            check_import(src)
        with server() as url:
            for i in range(rounds):
                order = (base, head) if i % 2 == 0 else (head, base)
                for rev in order:
                    runs[rev].append(measure(srcs[rev], url, workloads))
                    drain = runs[rev][-1].get("drain")
                    if drain:
                        print(
                            f"round {i + 1} {rev}: {drain['keys_per_second']:,.0f} keys/s, "
                            f"{drain['scripts_per_key']:.3f} scripts, "
                            f"{drain['commands_per_key']:.2f} commands a key",
                            flush=True,
                        )
    lines = [
        f"base: {describe(base)}; head: {describe(head)}; {rounds} rounds, pure build, "
        f"one valkey-server",
        "",
        "| figure | base (median) | head (median) | head / base (median of rounds; range) |",
        "|---|---|---|---|",
    ]
    for workload, field, fmt in FIGURES:
        if workload not in workloads:
            continue
        old = [run[workload][field] for run in runs[base]]
        new = [run[workload][field] for run in runs[head]]
        ratios = [n / o for n, o in zip(new, old, strict=True) if o]
        ratio = (
            f"{statistics.median(ratios):.3f}x ({min(ratios):.3f} to {max(ratios):.3f})"
            if ratios
            else "-"
        )
        lines.append(
            f"| {workload} {field} | {fmt.format(statistics.median(old))} | "
            f"{fmt.format(statistics.median(new))} | {ratio} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("base", help="a git revision, or . for this checkout's src/")
    parser.add_argument("head", nargs="?", default="HEAD", help="the same (default: HEAD)")
    parser.add_argument("--rounds", type=int, default=5, help="runs of each revision")
    parser.add_argument(
        "--workloads",
        default="drain,coalesced_add",
        help="distributed.py's workloads, comma-separated (drain, coalesced_add, pickup, "
        "lost_updates)",
    )
    args = parser.parse_args()
    print(compare(args.base, args.head, args.rounds, args.workloads.split(",")))


if __name__ == "__main__":
    main()
