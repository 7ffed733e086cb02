"""The distributed section of ``make bench``: keyqueue.redis beside BullMQ, streaq, SAQ, arq, rq.

Everything runs against one private valkey-server (``keyqueue.testing``),
flushed between workloads, in one run, so ratios compare like with like:

- coalesced adds/s, one client: a key already waiting added again, one call
  at a time (``add``) and batched (``add_many``, 100 keys a call); each peer
  does the closest thing it offers, a deduplicated enqueue (a job id or a
  deduplication id that is already queued), one at a time and 100 at once
  (BullMQ ``addBulk`` and streaq ``enqueue_many``, one pipeline each; arq and
  SAQ ``asyncio.gather``, as they have no batch call; rq one at a time);
- end-to-end no-op keys/s: ``DRAIN_KEYS`` distinct keys waiting, then
  ``PROCESSES`` worker processes with ``CONCURRENCY`` handlers each, from the
  first handler's start to the last one's end; the server's commands (those
  inside scripts too), script calls, CPU and client reads over the run, and
  the worker processes' own CPU between their first and last handler;
- the floor: the same keys LPUSHed onto a bare list, the same processes and
  threads, each thread popping one key per round trip (``RPOP``);
- the batched floor, beside keyqueue's end-to-end run, back to back
  (``floor_ratios``): the same keys on a bare list, the same processes and
  threads, each process popping as many keys a round trip (``LPOP key n``) as
  keyqueue's claims took in that run, and handing them to its threads; keyqueue's
  keys/s, server CPU and worker CPU per key as ratios to it
  (``--only floor-ratios [RUNS]`` runs only this);
- scaling: keyqueue's end-to-end run with 1, 2, 4 and 8 worker processes;
- idle: one worker process with nothing to do, commands it makes the server
  run per second over ``IDLE_SECONDS``;
- pickup latency: that same idle worker; the producer reads the clock, adds
  one key and waits until the handler has started (its start time is
  written to shared memory); ``PICKUP_SAMPLES`` times;
- lost updates: ``LOST_KEYS`` keys, a producer bumping a key's version in
  Redis and enqueueing it, ``LOST_RATE`` a second for ``LOST_SECONDS``; the
  handler reads the key's version, works ``LOST_WORK`` seconds, and records
  the highest version it read. Counted: keys whose final version was read by
  a handler, handler runs, and runs that overlapped another of the same key.

The libraries are behind one interface, an adapter each in ``peers/``; this
module holds the workloads, which drive them, and ``report.py`` makes the
tables. BullMQ's Python port needs redis-py 6.2 or later and arq pins it
below 6, so BullMQ runs in a virtualenv of its own (``BULLMQ_PYTHON``, made by
``make bench``): this script runs itself there as a subprocess for BullMQ's
workloads (``distributed.py --json URL bullmq``), against the same server.
``distributed.py --json URL LIB WORKLOAD...`` runs only those workloads
(``versions.py`` runs ``drain`` and ``coalesced_add`` that way).

Clocks are ``time.monotonic`` (system-wide on Linux, so comparable across
processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import multiprocessing
import os
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import redis
import redis.asyncio

sys.path.insert(0, str(Path(__file__).resolve().parent))  # peers, report: this folder's

from peers import BATCH, CONCURRENCY, LIBS, Handler, adapter, producer
from report import distributed_console, summarize_distributed

PROCESSES = 4
SCALING = (1, 2, 4, 8)  # worker processes for keyqueue's scaling row
DRAIN_KEYS = 20_000  # keyqueue and the floor drain them in about a second: long enough to measure
BATCHED_FLOOR_KEYS = 100_000  # the batched floor drains them in one to two seconds
BATCHED_FLOOR_RUNS = 3  # its server CPU per key spreads 2x across runs: each figure the median
DRAIN_CAP = 2.5  # seconds: a slower library is measured on what it did by then
PICKUP_SAMPLES = 200
PICKUP_GAP = 0.003
IDLE_SECONDS = 5.0  # BullMQ blocks 5 s at a time (drainDelay): one whole cycle
LOST_KEYS = 50
LOST_RATE = 500.0
LOST_SECONDS = 2.0
LOST_WORK = 0.02
RATE_TIME = 0.3  # seconds per rate measurement
RATE_REPEATS = 3
ROOT = Path(__file__).resolve().parent.parent
BULLMQ_PYTHON = Path(
    os.environ.get("BULLMQ_PYTHON", ROOT / ".venv-bench-bullmq" / "bin" / "python")
)
PARAMETERS = {
    "batch": BATCH,
    "processes": PROCESSES,
    "concurrency": CONCURRENCY,
    "drain_keys": DRAIN_KEYS,
    "batched_floor_keys": BATCHED_FLOOR_KEYS,
    "batched_floor_runs": BATCHED_FLOOR_RUNS,
    "drain_cap": DRAIN_CAP,
    "pickup_samples": PICKUP_SAMPLES,
    "pickup_gap": PICKUP_GAP,
    "idle_seconds": IDLE_SECONDS,
    "lost_keys": LOST_KEYS,
    "lost_rate": LOST_RATE,
    "lost_seconds": LOST_SECONDS,
    "lost_work": LOST_WORK,
    "rate_time": RATE_TIME,
    "rate_repeats": RATE_REPEATS,
}


def now() -> float:
    return time.monotonic()


# -- what the handlers record (set in each worker process) --------------------------------

_mode = ""
_shared: Any = None
_index = 0
_aredis: Any = None  # redis.asyncio client for the lost-update handler
_sredis: Any = None  # redis.Redis, for the threaded handlers
_count_lock = threading.Lock()


def _record(key: str) -> bool:
    """The no-op and pickup handlers' whole work; False for the lost-update mode."""
    t = now()
    if _mode == "noop":
        counts, first, last, cpu_first, cpu_last = _shared
        cpu = time.process_time()
        with _count_lock:  # handlers may run in threads: no lost increment
            counts[_index] += 1
            if not first[_index]:
                first[_index] = t
                cpu_first[_index] = cpu
            last[_index] = t
            cpu_last[_index] = cpu
        return True
    if _mode == "pickup":
        _shared[int(key.rsplit("-", 1)[1])] = t
        return True
    return False


async def _ahandle(key: str) -> None:
    """The handler of the asyncio workers (BullMQ's, streaq's, SAQ's, arq's)."""
    if _record(key):
        return
    r = _aredis
    version = int(await r.get(f"ver:{key}") or 0)
    if await r.incr(f"active:{key}") > 1:
        await r.incr("overlaps")
    await r.incr("runs")
    await asyncio.sleep(LOST_WORK)
    await r.zadd("seen", {key: version}, gt=True)
    await r.decr(f"active:{key}")


def _handle(key: str) -> None:
    """The handler of the threaded workers (keyqueue's ``run_workers``, rq's, the floor's)."""
    if _record(key):
        return
    r = _sredis
    version = int(r.get(f"ver:{key}") or 0)
    if r.incr(f"active:{key}") > 1:
        r.incr("overlaps")
    r.incr("runs")
    time.sleep(LOST_WORK)
    r.zadd("seen", {key: version}, gt=True)
    r.decr(f"active:{key}")


HANDLER = Handler(sync=_handle, aio=_ahandle)


# -- worker processes ----------------------------------------------------------------------


def _serve(
    lib: str,
    url: str,
    queue: str,
    mode: str,
    shared: Any,
    index: int,
    ready: Any,
    go: Any,
    options: dict[str, Any],
) -> None:
    """A worker process: this library's worker, forever (the parent kills it), its
    ``serve`` given ``options``. It starts when every process of the run is ready
    (``go``), so all run at once."""
    global _mode, _shared, _index, _sredis, _aredis
    _mode, _shared, _index = mode, shared, index
    _sredis = redis.Redis.from_url(url)  # the lost-update handler's; both connect on first use
    _aredis = redis.asyncio.Redis.from_url(url)

    def start() -> None:
        ready.set()
        go.wait()

    adapter(lib).serve(url, queue, HANDLER, start, **options)


@contextlib.contextmanager
def workers(
    lib: str,
    url: str,
    queue: str,
    mode: str,
    shared: Any,
    n: int,
    options: dict[str, Any] | None = None,
    on_ready: Callable[[], None] = lambda: None,
) -> Iterator[list[Any]]:
    """``n`` worker processes of ``lib`` for the ``with`` block; killed after it (they
    are disposable, and some libraries wait seconds for a graceful stop). ``on_ready``
    runs once every process is set up, just before they all start."""
    context = multiprocessing.get_context("spawn")
    processes = []
    go = context.Event()
    try:
        for i in range(n):
            ready = context.Event()
            process = context.Process(
                target=_serve,
                args=(lib, url, queue, mode, shared, i, ready, go, options or {}),
                daemon=True,
            )
            process.start()
            processes.append((process, ready))
        for process, ready in processes:
            if not ready.wait(60):
                raise RuntimeError(f"{lib} worker process {process.pid} did not start")
        on_ready()
        go.set()
        yield [process for process, _ in processes]
    finally:
        for process, _ in processes:
            process.kill()
        for process, _ in processes:
            process.join()


# -- the workloads -------------------------------------------------------------------------


async def _rate(call: Callable[[], Awaitable[None]], per_call: int) -> float:
    """Operations a second: the median of ``RATE_REPEATS`` runs of ``RATE_TIME`` seconds."""
    rates = []
    for _ in range(RATE_REPEATS):
        calls = 0
        start = now()
        while (elapsed := now() - start) < RATE_TIME:
            for _ in range(10):
                await call()
            calls += 10
        rates.append(calls * per_call / elapsed)
    return statistics.median(rates)


async def coalesced_adds(lib: str, url: str) -> dict[str, float]:
    """Adds a second of a key that is already waiting: one at a time, and batched."""
    client = await producer(lib, url, f"coalesce-{lib}")
    try:
        await client.add("hot")
        batch = ["hot"] * BATCH
        one = await _rate(lambda: client.add("hot"), 1)
        many = await _rate(lambda: client.add_batch(batch), BATCH)
    finally:
        await client.close()
    return {"one": one, "batched": many}


def drain(
    lib: str, url: str, processes: int = PROCESSES, batch: int = 0, total: int = DRAIN_KEYS
) -> dict[str, float]:
    """No-op keys a second through ``processes`` worker processes, ``total`` waiting
    (``lib`` "floor": a bare list, RPOP one key per round trip, or with ``batch`` n
    ``LPOP`` n keys per round trip for the process's threads). The server's usage is
    counted from the moment every process is ready; ``keys_per_lpop`` is the keys
    handled per ``LPOP`` the server ran (inside scripts too: a claim that takes keys
    pops them with one), 0 if none ran."""
    context = multiprocessing.get_context("spawn")
    shared = tuple(context.Array(kind, processes, lock=False) for kind in ("q", "d", "d", "d", "d"))
    counts, first, last, cpu_first, cpu_last = shared
    queue = f"drain-{lib}"
    keys = [f"key-{i}" for i in range(total)]
    admin = redis.Redis.from_url(url)

    async def load() -> None:
        client = await producer(lib, url, queue)
        try:
            await client.load(keys)
        finally:
            await client.close()

    asyncio.run(load())
    usage: list[Usage] = []
    options = {"batch": batch} if batch else {}
    with workers(
        lib,
        url,
        queue,
        "noop",
        shared,
        processes,
        options,
        lambda: usage.append(_server_usage(admin)),
    ):
        deadline = now() + DRAIN_CAP + 30  # start-up included
        while sum(counts) < total and now() < deadline:
            started = [t for t in first if t]
            if started and now() - min(started) > DRAIN_CAP:
                break
            time.sleep(0.01)
        done = sum(counts)
        began = min(t for t in first if t)
        ended = max(last)
        after = _server_usage(admin)
    admin.close()
    commands, scripts, cpu, reads, lpops = (
        a - b for a, b in zip(after[:5], usage[0][:5], strict=True)
    )
    by_command = {
        name.removeprefix("cmdstat_"): (
            (calls - usage[0].by_command.get(name, (0, 0))[0]) / done,
            (usec - usage[0].by_command.get(name, (0, 0))[1]) / 1e6 / done,
        )
        for name, (calls, usec) in after.by_command.items()
        if name != "cmdstat_info" and calls > usage[0].by_command.get(name, (0, 0))[0]
    }
    client_cpu = sum(b - a for a, b in zip(cpu_first, cpu_last, strict=True))
    return {
        "keys_per_second": done / (ended - began),
        "keys": done,
        "seconds": ended - began,
        "processes": processes,
        "commands_per_key": commands / done,
        "scripts_per_key": scripts / done,
        "server_cpu_per_key": cpu / done,
        "round_trips_per_key": reads / done,
        "client_cpu_per_key": client_cpu / done,
        "keys_per_lpop": done / lpops if lpops else 0,
        "by_command": by_command,
    }


class Usage(NamedTuple):
    """What the server's INFO says it did so far (``_server_usage``)."""

    commands: int
    scripts: int
    cpu: float
    reads: int
    lpops: int
    by_command: dict[str, tuple[int, int]]  # "cmdstat_lpop": (calls, usec)


def _server_usage(admin: redis.Redis) -> Usage:
    """Commands the server ran (those inside scripts too; our INFO calls not), script
    calls, CPU seconds, read events on client sockets (one per round trip), ``LPOP``
    calls, and each command's calls and microseconds (a script's include those of
    the commands it ran)."""
    stats = admin.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    scripts = sum(
        int(v["calls"])
        for k, v in stats.items()
        if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_evalsha_ro")
    )
    cpu = admin.info("cpu")
    reads = int(admin.info("stats")["total_reads_processed"])
    lpops = int(stats.get("cmdstat_lpop", {}).get("calls", 0))
    used = float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])
    by_command = {k: (int(v["calls"]), int(v["usec"])) for k, v in stats.items()}
    return Usage(calls, scripts, used, reads, lpops, by_command)


RATIOS = ("keys_per_second", "server_cpu_per_key", "client_cpu_per_key")


def floor_ratios(url: str, processes: int = PROCESSES) -> dict[str, Any]:
    """keyqueue's end-to-end run against the batched floor, back to back: the
    floor's processes pop as many keys a round trip as keyqueue's claims took
    (its keys per ``LPOP``, rounded), ``BATCHED_FLOOR_KEYS`` keys (its server
    CPU per key falls as its rate rises, each request sharing the event
    loop's wake-ups: a short run overstates it), ``BATCHED_FLOOR_RUNS`` times,
    each of its figures the median over them (its server CPU per key, a few
    requests' worth of wake-ups, spreads 2x from run to run on a shared
    machine). keyqueue's run, the floor's medians and runs, that batch, and
    keyqueue's keys/s, server CPU and worker CPU per key as ratios to the
    floor's."""
    admin = redis.Redis.from_url(url)
    admin.flushall()
    kq = drain("keyqueue", url, processes)
    batch = max(1, round(kq["keys_per_lpop"]))
    runs = []
    for _ in range(BATCHED_FLOOR_RUNS):
        admin.flushall()
        runs.append(drain("floor", url, processes, batch, BATCHED_FLOOR_KEYS))
    admin.close()
    numbers = [field for field, value in runs[0].items() if isinstance(value, int | float)]
    floor = {field: statistics.median(run[field] for run in runs) for field in numbers}
    return {
        "keyqueue": kq,
        "floor": floor,
        "floor_runs": runs,
        "batch": batch,
        "ratios": {field: kq[field] / floor[field] for field in RATIOS},
    }


def print_floor_ratios(runs: int) -> None:
    """``--only floor-ratios [RUNS]``: ``floor_ratios`` ``runs`` times on a private
    server; each run's figures, keyqueue's server time per key by command (the
    scripts' own Lua is their time less that of the commands they ran), then each
    ratio's median and range over the runs."""
    from keyqueue.testing import local_valkey  # noqa: PLC0415

    results = []
    with local_valkey() as url:
        for run in range(runs):
            r = floor_ratios(url)
            results.append(r)
            kq, floor = r["keyqueue"], r["floor"]
            print(
                f"run {run + 1}: batch {r['batch']} (keyqueue {kq['keys_per_lpop']:.1f} keys "
                f"a claim); keyqueue {kq['keys_per_second']:,.0f} keys/s, "
                f"{kq['server_cpu_per_key'] * 1e6:.1f} µs server, "
                f"{kq['client_cpu_per_key'] * 1e6:.1f} µs workers a key; floor "
                f"{floor['keys_per_second']:,.0f} keys/s, "
                f"{floor['server_cpu_per_key'] * 1e6:.1f} µs, "
                f"{floor['client_cpu_per_key'] * 1e6:.1f} µs; ratios "
                + ", ".join(f"{field} {r['ratios'][field]:.2f}x" for field in RATIOS),
                flush=True,
            )
            rows = sorted(kq["by_command"].items(), key=lambda item: -item[1][1])
            print(
                "  keyqueue, per key: "
                + ", ".join(
                    f"{name} {calls:.2f} calls {usec * 1e6:.2f} µs" for name, (calls, usec) in rows
                ),
                flush=True,
            )
    for field in RATIOS:
        values = sorted(r["ratios"][field] for r in results)
        print(
            f"{field}: median {statistics.median(values):.2f}x "
            f"(range {values[0]:.2f}x to {values[-1]:.2f}x, {runs} runs)"
        )


def pickup(lib: str, url: str) -> dict[str, float]:
    """One idle worker process: the commands it makes the server run a second while
    idle, then add on this client → handler start, ``PICKUP_SAMPLES`` times."""
    context = multiprocessing.get_context("spawn")
    warmup = 5
    starts = context.Array("d", PICKUP_SAMPLES + warmup, lock=False)
    queue = f"pickup-{lib}"
    latencies: list[float] = []

    async def probe() -> None:
        client = await producer(lib, url, queue)
        try:
            for i in range(PICKUP_SAMPLES + warmup):
                await asyncio.sleep(PICKUP_GAP)  # the worker is back waiting
                t0 = now()
                await client.add(f"p-{i}")
                deadline = t0 + 5
                while not starts[i] and now() < deadline:
                    await asyncio.sleep(0.0005)
                if not starts[i]:
                    raise RuntimeError(f"{lib}: key p-{i} was not picked up in 5 s")
                if i >= warmup:
                    latencies.append(starts[i] - t0)
        finally:
            await client.close()

    admin = redis.Redis.from_url(url)
    with workers(lib, url, queue, "pickup", starts, 1):
        time.sleep(1.0)  # its start-up calls are done
        before = _server_usage(admin)
        began = now()
        time.sleep(IDLE_SECONDS)
        after = _server_usage(admin)
        idle = (after[0] - before[0]) / (now() - began)
        # Requests: read events, one per request sent (a blocking command is counted in
        # commandstats only when it returns; a request counts when it arrives). Less ours:
        # each _server_usage is three INFO calls.
        requests = (after[3] - before[3] - 3) / (now() - began)
        asyncio.run(probe())
    admin.close()
    latencies.sort()
    return {
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "idle_commands_per_second": idle,
        "idle_requests_per_second": requests,
    }


def lost_updates(lib: str, url: str) -> dict[str, int]:
    """Bump versions while handlers run; count keys whose final version a handler read."""
    queue = f"lost-{lib}"
    keys = [f"obj-{i}" for i in range(LOST_KEYS)]
    store = redis.Redis.from_url(url, decode_responses=True)

    async def produce() -> int:
        client = await producer(lib, url, queue)
        rng = random.Random(1)
        events = int(LOST_RATE * LOST_SECONDS)
        start = now()
        try:
            for i in range(events):
                due = start + i / LOST_RATE
                if due > now():
                    await asyncio.sleep(due - now())
                key = rng.choice(keys)
                store.incr(f"ver:{key}")
                await client.add(key)
        finally:
            await client.close()
        return events

    try:
        with workers(lib, url, queue, "lost", None, PROCESSES):
            events = asyncio.run(produce())
            # Quiet: no handler running and no new run for a second (bounded).
            deadline = now() + 8
            quiet_since, runs, settled = now(), store.get("runs"), False
            while now() < deadline:
                time.sleep(0.05)
                active = sum(int(store.get(f"active:{key}") or 0) for key in keys)
                if store.get("runs") != runs or active:
                    quiet_since, runs = now(), store.get("runs")
                elif now() - quiet_since > 1.0:
                    settled = True
                    break
            active = sum(int(store.get(f"active:{key}") or 0) for key in keys)
        final = {key: int(store.get(f"ver:{key}") or 0) for key in keys}
        seen = {key: int(score) for key, score in store.zrange("seen", 0, -1, withscores=True)}
        return {
            "keys": LOST_KEYS,
            "events": events,
            "final_seen": sum(1 for key in keys if seen.get(key) == final[key]),
            "runs": int(store.get("runs") or 0),
            "overlaps": int(store.get("overlaps") or 0),
            "settled": settled,  # False: still running (or stuck) 8 s after the producer
            "active_at_end": active,
        }
    finally:
        store.close()


WORKLOADS: dict[str, Callable[[str, str], Any]] = {
    "coalesced_add": lambda lib, url: asyncio.run(coalesced_adds(lib, url)),
    "drain": drain,
    "pickup": pickup,
    "lost_updates": lost_updates,
}


def measure_lib(lib: str, url: str, names: tuple[str, ...] = tuple(WORKLOADS)) -> dict[str, Any]:
    """``lib``'s workloads ``names``, here (the server flushed before each); for
    BullMQ, ``lost_updates`` also with its simple deduplication."""
    admin = redis.Redis.from_url(url)
    results: dict[str, Any] = {}
    for name in names:
        admin.flushall()
        began = now()
        results[name] = WORKLOADS[name](lib, url)
        print(f"  {lib:>8} {name}: {results[name]} ({now() - began:.1f}s)", flush=True)
    if lib == "bullmq" and "lost_updates" in names:  # the lost-update table's second row
        admin.flushall()
        results["lost_updates_simple"] = lost_updates("bullmq-simple", url)
        print(f"  {lib:>8} lost_updates (simple): {results['lost_updates_simple']}", flush=True)
    admin.close()
    return results


def measure_elsewhere(lib: str, url: str, python: Path) -> dict[str, Any]:
    """``measure_lib`` run by another virtualenv's Python (a subprocess), as JSON."""
    done = subprocess.run(
        [str(python), __file__, "--json", url, lib],
        check=True,
        stdout=subprocess.PIPE,
        text=True,
    )
    *progress, last = done.stdout.strip().splitlines()
    for line in progress:
        print(line, flush=True)
    result: dict[str, Any] = json.loads(last)
    return result


def measure(libs: tuple[str, ...] = LIBS, scaling: tuple[int, ...] = SCALING) -> dict[str, Any]:
    """Every distributed workload for every library, the floor and keyqueue's scaling
    row, on one private valkey-server: the measurements (``report.summarize_distributed``
    adds the targets and notes)."""
    from keyqueue.testing import local_valkey  # noqa: PLC0415

    report: dict[str, Any] = {
        "libs": [],
        "results": {},
        "processes": PROCESSES,
        "concurrency": CONCURRENCY,
        "parameters": PARAMETERS,
        "skipped": {},
        "settings": {lib: adapter(lib).SETTINGS for lib in libs},
    }
    began = now()
    load = [os.getloadavg()]
    with local_valkey() as url:
        admin = redis.Redis.from_url(url)
        report["server"] = admin.info("server").get("valkey_version") or admin.info("server").get(
            "redis_version"
        )
        report["redis_py"] = redis.__version__
        for lib in libs:
            if lib == "bullmq":
                if not BULLMQ_PYTHON.exists():
                    report["skipped"][lib] = f"no {BULLMQ_PYTHON} (make bench makes it)"
                    print(f"  {lib:>8} skipped: {report['skipped'][lib]}", flush=True)
                    continue
                report["results"][lib] = measure_elsewhere(lib, url, BULLMQ_PYTHON)
            else:
                report["results"][lib] = measure_lib(lib, url)
            report["libs"].append(lib)
        admin.flushall()
        report["floor"] = drain("floor", url)
        print(f"     floor drain: {report['floor']}", flush=True)
        rows = []
        for n in scaling if "keyqueue" in libs else ():  # one series, back to back
            admin.flushall()
            rows.append(drain("keyqueue", url, n))
            print(f"  keyqueue drain x{n}: {rows[-1]}", flush=True)
        report["scaling"] = rows
        if "keyqueue" in libs:
            report["batched_floor"] = floor_ratios(url)
            print(f"  batched floor: {report['batched_floor']['ratios']}", flush=True)
        admin.close()
    report["seconds"] = now() - began
    load.append(os.getloadavg())
    report["load"] = " -> ".join(", ".join(f"{x:.2f}" for x in one) for one in load)
    return report


def main(argv: list[str]) -> None:
    """``[LIB...]``: the whole section (every library by default), its tables and
    build/distributed.json; ``--json URL LIB [WORKLOAD...]``: one library's
    workloads (all by default) on the server at URL, as one JSON line; ``--only
    floor-ratios [RUNS]``: keyqueue against the batched floor only, RUNS times (3)."""
    if argv[:2] == ["--only", "floor-ratios"]:
        print_floor_ratios(int(argv[2]) if argv[2:] else 3)
        return
    if argv[:1] == ["--json"]:
        url, lib, *names = argv[1:]
        print(json.dumps(measure_lib(lib, url, tuple(names) or tuple(WORKLOADS))))
        return
    report = summarize_distributed(measure(tuple(argv) or LIBS))
    json_path = ROOT / "build" / "distributed.json"
    json_path.parent.mkdir(exist_ok=True)
    json_path.write_text(json.dumps(report, indent=2))
    print(distributed_console(report))
    print(f"{report['seconds']:.0f} s; wrote {json_path}")


if __name__ == "__main__":
    main(sys.argv[1:])
