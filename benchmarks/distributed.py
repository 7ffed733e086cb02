"""The distributed section of ``make bench``: keyqueue.redis beside arq, SAQ and rq.

Everything runs against one private valkey-server (``keyqueue.testing``),
flushed between workloads, in one run, so ratios compare like with like:

- coalesced adds/s, one client: a key already waiting added again, one call
  at a time (``add``) and batched (``add_many``, 100 keys a call); each peer
  does the closest thing it offers, a deduplicated enqueue (a job id that is
  already queued), one at a time and, for the asyncio peers, 100 at once
  (``asyncio.gather``: they have no batch call);
- end-to-end no-op keys/s: ``DRAIN_KEYS`` distinct keys waiting, then
  ``PROCESSES`` worker processes with ``CONCURRENCY`` handlers each, from the
  first handler's start to the last one's end;
- pickup latency: one idle worker process; the producer reads the clock,
  adds one key and waits until the handler has started (its start time is
  written to shared memory); ``PICKUP_SAMPLES`` times;
- lost updates: ``LOST_KEYS`` keys, a producer bumping a key's version in
  Redis and enqueueing it, ``LOST_RATE`` a second for ``LOST_SECONDS``; the
  handler reads the key's version, works ``LOST_WORK`` seconds, and records
  the highest version it read. Counted: keys whose final version was read by
  a handler, handler runs, and runs that overlapped another of the same key.

Each library runs as documented, with what favours it where its defaults
would make the comparison pointless: arq polls its queue every
``ARQ_POLL_DELAY`` seconds (its default is 0.5 s) and keeps no results (with
a kept result, a job id stays taken for an hour); rq runs ``SimpleWorker``
(no fork per job) with ``unique=True`` and ``result_ttl=0``; SAQ runs with
its defaults. keyqueue runs ``RedisWorkQueue`` in the producer and under
``run_workers`` (``CONCURRENCY`` threads) in the workers: per call, redis-py's
blocking client costs less CPU than ``redis.asyncio`` (in one process on this
machine ``run_workers`` drained about 1.5x what ``AsyncRedisWorkQueue`` under
``arun_workers`` did). Clocks are
``time.monotonic`` (system-wide on Linux, so comparable across processes).
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import random
import statistics
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import redis
import redis.asyncio

LIBS = ("keyqueue", "arq", "saq", "rq")
PROCESSES = 4
CONCURRENCY = 10  # handlers at once per worker process: arq's and SAQ's default
BATCH = 100
DRAIN_KEYS = 4000
DRAIN_CAP = 3.0  # seconds: a slower library is measured on what it did by then
PICKUP_SAMPLES = 200
PICKUP_GAP = 0.003
LOST_KEYS = 50
LOST_RATE = 500.0
LOST_SECONDS = 2.0
LOST_WORK = 0.02
ARQ_POLL_DELAY = 0.005
RATE_TIME = 0.4  # seconds per rate measurement
RATE_REPEATS = 3

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for rq's workers: distributed.rq_job


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
        counts, first, last = _shared
        with _count_lock:  # handlers may run in threads: no lost increment
            counts[_index] += 1
            if not first[_index]:
                first[_index] = t
            last[_index] = t
        return True
    if _mode == "pickup":
        _shared[int(key.rsplit("-", 1)[1])] = t
        return True
    return False


async def _ahandle(key: str) -> None:
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
    """The handler of the threaded workers (keyqueue's ``run_workers``, rq's)."""
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


def rq_job(key: str) -> None:
    _handle(key)


async def arq_job(ctx: dict[str, Any], key: str) -> None:
    await _ahandle(key)


async def saq_job(ctx: dict[str, Any]) -> None:
    await _ahandle(ctx["job"].key)


# -- producers: one client each ------------------------------------------------------------


class Producer:
    """A library's client: ``add`` one key (deduplicated), ``add_batch`` many."""

    async def add(self, key: str) -> None:
        raise NotImplementedError

    async def add_batch(self, keys: list[str]) -> None:
        await asyncio.gather(*(self.add(key) for key in keys))

    async def close(self) -> None:
        pass


class KeyqueueProducer(Producer):
    def __init__(self, url: str, queue: str) -> None:
        from keyqueue.redis import RedisWorkQueue  # noqa: PLC0415

        self.q = RedisWorkQueue(queue, url=url)

    async def add(self, key: str) -> None:
        self.q.add(key)

    async def add_batch(self, keys: list[str]) -> None:
        self.q.add_many(keys)

    async def close(self) -> None:
        self.q.close()


class ArqProducer(Producer):
    def __init__(self, url: str, queue: str) -> None:
        self.url, self.queue = url, queue

    async def open(self) -> None:
        from arq.connections import RedisSettings, create_pool  # noqa: PLC0415

        self.pool = await create_pool(
            RedisSettings.from_dsn(self.url), default_queue_name=self.queue
        )

    async def add(self, key: str) -> None:
        await self.pool.enqueue_job("arq_job", key, _job_id=key)

    async def close(self) -> None:
        await self.pool.aclose()


class SaqProducer(Producer):
    def __init__(self, url: str, queue: str) -> None:
        from saq import Queue  # noqa: PLC0415

        self.queue = Queue.from_url(url, name=queue)

    async def open(self) -> None:
        await self.queue.connect()

    async def add(self, key: str) -> None:
        await self.queue.enqueue("saq_job", key=key)

    async def close(self) -> None:
        await self.queue.disconnect()


class RqProducer(Producer):
    def __init__(self, url: str, queue: str) -> None:
        import rq  # noqa: PLC0415
        from rq.exceptions import DuplicateJobError  # noqa: PLC0415

        self.redis = redis.Redis.from_url(url)
        self.queue = rq.Queue(queue, connection=self.redis)
        self.duplicate = DuplicateJobError

    async def add(self, key: str) -> None:
        with contextlib.suppress(self.duplicate):
            self.queue.enqueue("distributed.rq_job", key, job_id=key, unique=True, result_ttl=0)

    async def add_batch(self, keys: list[str]) -> None:
        for key in keys:
            await self.add(key)

    async def close(self) -> None:
        self.redis.close()


async def producer(lib: str, url: str, queue: str) -> Producer:
    made: Producer = {
        "keyqueue": KeyqueueProducer,
        "arq": ArqProducer,
        "saq": SaqProducer,
        "rq": RqProducer,
    }[lib](url, queue)
    opener = getattr(made, "open", None)
    if opener is not None:
        await opener()
    return made


# -- worker processes ----------------------------------------------------------------------


def _serve(lib: str, url: str, queue: str, mode: str, shared: Any, index: int, ready: Any) -> None:
    """A worker process: this library's worker, forever (the parent kills it)."""
    global _mode, _shared, _index, _sredis
    _mode, _shared, _index = mode, shared, index
    if lib == "rq":
        import distributed  # noqa: PLC0415 (rq imports its job by name: this module, as such)
        import rq  # noqa: PLC0415

        _sredis = redis.Redis.from_url(url)
        distributed._mode, distributed._shared, distributed._index = mode, shared, index
        distributed._sredis = _sredis
        connection = redis.Redis.from_url(url)
        worker = rq.SimpleWorker([rq.Queue(queue, connection=connection)], connection=connection)
        ready.set()
        worker.work(logging_level="ERROR")
        return
    if lib == "keyqueue":
        from keyqueue import run_workers  # noqa: PLC0415
        from keyqueue.redis import RedisWorkQueue  # noqa: PLC0415

        _sredis = redis.Redis.from_url(url)
        q = RedisWorkQueue(queue, url=url)
        ready.set()
        run_workers(q, _handle, workers=CONCURRENCY)
        return
    asyncio.run(_aserve(lib, url, queue, ready))


async def _aserve(lib: str, url: str, queue: str, ready: Any) -> None:
    global _aredis
    _aredis = redis.asyncio.Redis.from_url(url)
    if lib == "arq":
        from arq.connections import RedisSettings  # noqa: PLC0415
        from arq.worker import Worker  # noqa: PLC0415

        worker = Worker(
            functions=[arq_job],  # type: ignore[list-item]
            redis_settings=RedisSettings.from_dsn(url),
            queue_name=queue,
            max_jobs=CONCURRENCY,
            poll_delay=ARQ_POLL_DELAY,
            keep_result=0,
            handle_signals=False,
        )
        ready.set()
        await worker.main()
    else:
        from saq import Queue, Worker  # noqa: PLC0415

        saq_worker = Worker(
            Queue.from_url(url, name=queue), functions=[saq_job], concurrency=CONCURRENCY
        )
        ready.set()
        await saq_worker.start()


@contextlib.contextmanager
def workers(lib: str, url: str, queue: str, mode: str, shared: Any, n: int) -> Iterator[list[Any]]:
    """``n`` worker processes of ``lib`` for the ``with`` block; killed after it (they
    are disposable, and some libraries wait seconds for a graceful stop)."""
    context = multiprocessing.get_context("spawn")
    processes = []
    try:
        for i in range(n):
            ready = context.Event()
            process = context.Process(
                target=_serve, args=(lib, url, queue, mode, shared, i, ready), daemon=True
            )
            process.start()
            processes.append((process, ready))
        for process, ready in processes:
            if not ready.wait(60):
                raise RuntimeError(f"{lib} worker process {process.pid} did not start")
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


def drain(lib: str, url: str) -> dict[str, float]:
    """No-op keys a second through ``PROCESSES`` worker processes, ``DRAIN_KEYS`` waiting."""
    context = multiprocessing.get_context("spawn")
    counts = context.Array("q", PROCESSES, lock=False)
    first = context.Array("d", PROCESSES, lock=False)
    last = context.Array("d", PROCESSES, lock=False)
    queue = f"drain-{lib}"

    async def load() -> None:
        client = await producer(lib, url, queue)
        try:
            keys = [f"key-{i}" for i in range(DRAIN_KEYS)]
            for i in range(0, DRAIN_KEYS, BATCH):
                await client.add_batch(keys[i : i + BATCH])
        finally:
            await client.close()

    asyncio.run(load())
    admin = redis.Redis.from_url(url)
    before = _server_usage(admin)
    with workers(lib, url, queue, "noop", (counts, first, last), PROCESSES):
        deadline = now() + DRAIN_CAP + 30  # start-up included
        while sum(counts) < DRAIN_KEYS and now() < deadline:
            started = [t for t in first if t]
            if started and now() - min(started) > DRAIN_CAP:
                break
            time.sleep(0.01)
        done = sum(counts)
        began = min(t for t in first if t)
        ended = max(last)
        after = _server_usage(admin)
    admin.close()
    commands, scripts, cpu = (a - b for a, b in zip(after, before, strict=True))
    return {
        "keys_per_second": done / (ended - began),
        "keys": done,
        "seconds": ended - began,
        "commands_per_key": commands / done,
        "scripts_per_key": scripts / done,
        "server_cpu_per_key": cpu / done,
    }


def _server_usage(admin: redis.Redis) -> tuple[int, int, float]:
    """Commands the server ran (those inside scripts too), script calls, CPU seconds."""
    stats = admin.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if not k.endswith(("info", "_ping")))
    scripts = sum(
        int(v["calls"])
        for k, v in stats.items()
        if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall")
    )
    cpu = admin.info("cpu")
    return calls, scripts, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"])


def pickup(lib: str, url: str) -> dict[str, float]:
    """Add on this client → handler start in an idle worker process, ``PICKUP_SAMPLES`` times."""
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

    with workers(lib, url, queue, "pickup", starts, 1):
        asyncio.run(probe())
    latencies.sort()
    return {
        "p50": latencies[len(latencies) // 2],
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
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
            deadline = now() + 15
            quiet_since, runs = now(), store.get("runs")
            while now() < deadline:
                time.sleep(0.05)
                active = sum(int(store.get(f"active:{key}") or 0) for key in keys)
                if store.get("runs") != runs or active:
                    quiet_since, runs = now(), store.get("runs")
                elif now() - quiet_since > 1.0:
                    break
        final = {key: int(store.get(f"ver:{key}") or 0) for key in keys}
        seen = {key: int(score) for key, score in store.zrange("seen", 0, -1, withscores=True)}
        return {
            "keys": LOST_KEYS,
            "events": events,
            "final_seen": sum(1 for key in keys if seen.get(key) == final[key]),
            "runs": int(store.get("runs") or 0),
            "overlaps": int(store.get("overlaps") or 0),
        }
    finally:
        store.close()


def describe() -> str:
    """The settings, for docs/benchmarks.md."""
    return (
        f"Coalesced adds: one client adds a key that is already waiting, one call at a time "
        f"and {BATCH} at a time (keyqueue: `add_many`; arq and SAQ: {BATCH} deduplicated "
        f"enqueues under `asyncio.gather`, as they have no batch call; rq: one at a time), "
        f"{RATE_REPEATS} runs of {RATE_TIME:g} s, median. End-to-end: {DRAIN_KEYS:,} distinct "
        f"keys waiting, then {PROCESSES} worker processes with {CONCURRENCY} handlers each "
        f"(rq: one job at a time per process, its model), timed from the first handler's "
        f"start to the last one's end, at most {DRAIN_CAP:g} s. Pickup: one idle worker "
        f"process; read the clock, add one key, the handler writes its start time to shared "
        f"memory; {PICKUP_SAMPLES} times, {PICKUP_GAP * 1000:g} ms apart. Deduplication: "
        f"keyqueue coalesces by key; arq `enqueue_job(_job_id=key)`, SAQ `enqueue(key=key)`, "
        f"rq `enqueue(job_id=key, unique=True)`. Settings that favour the peers: arq "
        f"`poll_delay={ARQ_POLL_DELAY:g}` (default 0.5 s) and `keep_result=0` (a kept result "
        f"holds the job id for an hour); rq `SimpleWorker` (no fork per job) and "
        f"`result_ttl=0`; SAQ its defaults. keyqueue: `RedisWorkQueue`, in the producer and "
        f"under `run_workers` ({CONCURRENCY} threads) in the workers (redis-py's blocking "
        f"client costs less CPU per call than `redis.asyncio`)."
    )


LOST_NOTE = (
    f"{LOST_KEYS} keys (objects), {PROCESSES} worker processes. A producer bumps a random "
    f"key's version in Redis and enqueues the key, {LOST_RATE:g} times a second for "
    f"{LOST_SECONDS:g} s; each handler reads the key's current version, works "
    f"{LOST_WORK * 1000:g} ms, and records the highest version it read. A key ends right "
    "when some handler read its final version. With a job id for deduplication, an "
    "enqueue while the job is *running* is dropped by arq, SAQ and rq alike, so the change "
    "it carried is never processed; keyqueue marks the key and hands it out once more "
    "after `done`. Overlaps count handler runs of one key that ran at the same time."
)


def measure(libs: tuple[str, ...] = LIBS) -> dict[str, Any]:
    """Every distributed workload for every library, on one private valkey-server."""
    from keyqueue.testing import local_valkey  # noqa: PLC0415

    report: dict[str, Any] = {
        "libs": list(libs),
        "results": {},
        "processes": PROCESSES,
        "lost_note": LOST_NOTE,
    }
    with local_valkey() as url:
        admin = redis.Redis.from_url(url)
        report["server"] = admin.info("server").get("redis_version")
        report["redis_py"] = redis.__version__
        for lib in libs:
            results: dict[str, Any] = {}
            for name, workload in (
                ("coalesced_add", lambda lib=lib: asyncio.run(coalesced_adds(lib, url))),
                ("drain", lambda lib=lib: drain(lib, url)),
                ("pickup", lambda lib=lib: pickup(lib, url)),
                ("lost_updates", lambda lib=lib: lost_updates(lib, url)),
            ):
                admin.flushall()
                began = now()
                results[name] = workload()
                print(f"  {lib:>8} {name}: {results[name]} ({now() - began:.1f}s)", flush=True)
            report["results"][lib] = results
        admin.close()
    report["where_time_goes"] = where_time_goes(report)
    return report


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
        f"{d['scripts_per_key']:.1f} script calls, one round trip each (`get`, then the "
        f"runner's `forget` and `done`), and {d['server_cpu_per_key'] * 1e6:.0f} µs of server "
        f"CPU; at {d['keys_per_second']:,.0f} keys/s that is "
        f"{d['server_cpu_per_key'] / wall:.0%} of one core, so the server is not the limit: "
        "the worker processes' client side is (redis-py packing each call's twelve key names "
        "and arguments, and reading the reply), and on this machine the four worker "
        "processes and the server share two cores. The next cut: fold the runner's `forget` "
        "into `done` (one round trip less per key)."
    )


if __name__ == "__main__":
    chosen = tuple(sys.argv[1:]) or LIBS
    print(measure(chosen))
