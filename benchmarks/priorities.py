"""Priorities cost nothing on the FIFO path: today's queue against the one before them.

The code of ``BASELINE`` (the commit before priorities) is extracted with
``git archive`` into a temporary package, ``keyqueue_baseline``, and imported
next to today's ``keyqueue`` on its pure build (``builds.load_pure``: the
baseline has no compiled build, and the question is what priorities cost the
same Python); both run in this one process, interleaved (every
variant once per repeat, min and median over ``REPEATS`` repeats of ``NUMBER``
calls), so the machine's noise hits both alike. The ratio is today / baseline:
1.00 is "no slower". Below, the ranked path (a queue that has seen a priority)
and the same cycle with aging, and a queue with ``fair_by``, against today's
FIFO path.
"""

from __future__ import annotations

import asyncio
import importlib
import io
import itertools
import statistics
import subprocess
import sys
import tarfile
import tempfile
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any

from builds import load_pure
from report import priorities_tables

ROOT = Path(__file__).resolve().parent.parent
BASELINE = "fc2d81a"  # the last commit before priorities (c324734 added them)
NUMBER = 20_000
REPEATS = 21


class ConstantClock:
    """A clock read at C speed that never moves (as breakdown.py's)."""

    now = staticmethod(itertools.repeat(0.0).__next__)


def load_baseline(rev: str = BASELINE) -> Any:
    """``keyqueue`` as it was at ``rev``, as the package ``keyqueue_baseline``."""
    archive = subprocess.run(
        ["git", "archive", "--format=tar", rev, "src/keyqueue"],
        cwd=ROOT,
        check=True,
        capture_output=True,
    ).stdout
    where = Path(tempfile.mkdtemp(prefix="keyqueue-baseline-"))
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(where, filter="data")
    (where / "src" / "keyqueue").rename(where / "keyqueue_baseline")
    sys.path.insert(0, str(where))
    try:
        return importlib.import_module("keyqueue_baseline")
    finally:
        sys.path.remove(str(where))


def _cycle(add: Any, get: Any, done: Any, *args: Any) -> Callable[[], None]:
    def cycle() -> None:
        add(1, *args)
        done(get())

    return cycle


def _core_cycle(core: Any) -> Callable[[], None]:
    add, get, done = core.add, core.get, core.done

    def cycle() -> None:
        add(1, 0.0)
        done(get(0.0), 0.0)

    return cycle


def _coalesced(q: Any) -> Callable[[], None]:
    q.add(0)
    add = q.add
    return lambda: add(0)


def _variants(baseline: Any) -> dict[str, tuple[Callable[[], None], Callable[[], None]]]:
    """name -> (today's, the baseline's) for the FIFO path."""
    keyqueue = load_pure()
    Core = keyqueue._core.Core

    old_core = importlib.import_module("keyqueue_baseline._core").Core
    pairs: dict[str, tuple[Callable[[], None], Callable[[], None]]] = {
        "Core add/get/done (no front, constant now)": (
            _core_cycle(Core()),
            _core_cycle(old_core()),
        ),
    }
    for label, clock in (("", None), (", constant clock", ConstantClock())):
        new_q, old_q = keyqueue.WorkQueue(clock=clock), baseline.WorkQueue(clock=clock)
        pairs[f"WorkQueue add/get/done{label}"] = (
            _cycle(new_q.add, new_q.get, new_q.done),
            _cycle(old_q.add, old_q.get, old_q.done),
        )
        new_a, old_a = keyqueue.AsyncWorkQueue(clock=clock), baseline.AsyncWorkQueue(clock=clock)
        pairs[f"AsyncWorkQueue add/get_nowait/done{label}"] = (
            _cycle(new_a.add, new_a.get_nowait, new_a.done),
            _cycle(old_a.add, old_a.get_nowait, old_a.done),
        )
    pairs["WorkQueue coalesced add"] = (
        _coalesced(keyqueue.WorkQueue()),
        _coalesced(baseline.WorkQueue()),
    )
    return pairs


def _ranked_variants() -> dict[str, Callable[[], None]]:
    """Today's queue once ranked (it has seen a priority), strict and with aging."""
    keyqueue = load_pure()

    out: dict[str, Callable[[], None]] = {}
    for label, aging in (("strict", None), ("aging=1s", 1.0)):
        q: keyqueue.WorkQueue[int] = keyqueue.WorkQueue(aging=aging)
        q.add(-1, 1)  # the first priority: ranked from now on
        q.done(q.get())
        out[f"WorkQueue ranked ({label}), add at priority 0"] = _cycle(q.add, q.get, q.done)
        r: keyqueue.WorkQueue[int] = keyqueue.WorkQueue(aging=aging)
        r.add(-1, 1)
        r.done(r.get())
        out[f"WorkQueue ranked ({label}), add at priority 5"] = _cycle(r.add, r.get, r.done, 5)
    f: keyqueue.WorkQueue[int] = keyqueue.WorkQueue(fair_by=_parity)
    out["WorkQueue fair_by, add at priority 0"] = _cycle(f.add, f.get, f.done)
    return out


def _parity(key: int) -> str:
    """A key's group for the fair_by row: two groups."""
    return "odd" if key % 2 else "even"


def _deep_ranked(n: int = 10_000) -> dict[str, float]:
    """get+done with ``n`` keys waiting (a relist), FIFO and ranked: per call."""
    keyqueue = load_pure()

    out: dict[str, float] = {}
    for label, priority in (("FIFO", 0), ("ranked", 1)):
        times = []
        for _ in range(5):
            q: keyqueue.WorkQueue[int] = keyqueue.WorkQueue(clock=ConstantClock())
            for i in range(n):
                q.add(i, priority if i == 0 else 0)
            get, done = q.get, q.done
            start = timeit.default_timer()
            for _ in range(n):
                done(get())
            times.append((timeit.default_timer() - start) / n)
        out[label] = min(times)
    return out


def measure() -> dict[str, Any]:
    baseline = load_baseline()

    async def run() -> tuple[dict[str, Any], dict[str, Any], dict[str, list[float]]]:
        # On a running loop, as an AsyncWorkQueue is used: one made and called
        # outside any loop takes the unbound path, which asks for a loop on
        # every call.
        pairs = _variants(baseline)
        ranked = _ranked_variants()
        fifo_now = pairs["WorkQueue add/get/done"][0]
        times: dict[str, list[float]] = {}
        for _ in range(REPEATS):
            for name, (new, old) in pairs.items():
                times.setdefault(f"{name} | today", []).append(timeit.timeit(new, number=NUMBER))
                times.setdefault(f"{name} | baseline", []).append(timeit.timeit(old, number=NUMBER))
            times.setdefault("fifo", []).append(timeit.timeit(fifo_now, number=NUMBER))
            for name, fn in ranked.items():
                times.setdefault(name, []).append(timeit.timeit(fn, number=NUMBER))
        return pairs, ranked, times

    pairs, ranked, times = asyncio.run(run())

    def med(name: str) -> float:
        return statistics.median(times[name]) / NUMBER

    fifo = [
        {
            "variant": name,
            "today": med(f"{name} | today"),
            "baseline": med(f"{name} | baseline"),
            "ratio": statistics.median(
                new / old
                for new, old in zip(
                    times[f"{name} | today"], times[f"{name} | baseline"], strict=True
                )
            ),
        }
        for name in pairs
    ]
    ranked_rows = [
        {"variant": name, "median": med(name), "vs_fifo": med(name) / med("fifo")}
        for name in ranked
    ]
    return {
        "baseline": BASELINE,
        "fifo": fifo,
        "ranked": ranked_rows,
        "deep": _deep_ranked(),
    }


if __name__ == "__main__":
    print(priorities_tables(measure()))
