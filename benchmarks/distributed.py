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

BullMQ's Python port needs redis-py 6.2 or later and arq pins it below 6, so
BullMQ runs in a virtualenv of its own (``BULLMQ_PYTHON``, made by ``make
bench``): this script runs itself there as a subprocess for BullMQ's
workloads (``distributed.py --json URL bullmq``), against the same server.

Each library runs as documented, on its own fastest settings (``SETTINGS``
says which, and the report prints them). Clocks are ``time.monotonic``
(system-wide on Linux, so comparable across processes).
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
from typing import Any

import redis
import redis.asyncio

LIBS = ("keyqueue", "bullmq", "streaq", "saq", "arq", "rq")
PROCESSES = 4
SCALING = (1, 2, 4, 8)  # worker processes for keyqueue's scaling row
CONCURRENCY = 10  # handlers at once per worker process: arq's and SAQ's default
BATCH = 100
DRAIN_KEYS = 20_000  # keyqueue and the floor drain them in about a second: long enough to measure
DRAIN_CAP = 2.5  # seconds: a slower library is measured on what it did by then
PICKUP_SAMPLES = 200
PICKUP_GAP = 0.003
IDLE_SECONDS = 5.0  # BullMQ blocks 5 s at a time (drainDelay): one whole cycle
LOST_KEYS = 50
LOST_RATE = 500.0
LOST_SECONDS = 2.0
LOST_WORK = 0.02
ARQ_POLL_DELAY = 0.005
RATE_TIME = 0.3  # seconds per rate measurement
RATE_REPEATS = 3
ROOT = Path(__file__).resolve().parent.parent
BULLMQ_PYTHON = Path(
    os.environ.get("BULLMQ_PYTHON", ROOT / ".venv-bench-bullmq" / "bin" / "python")
)
NAMES = {
    "keyqueue": "keyqueue",
    "bullmq": "BullMQ",
    "bullmq-simple": "BullMQ, simple dedup",
    "streaq": "streaq",
    "saq": "SAQ",
    "arq": "arq",
    "rq": "rq",
}
SETTINGS = {
    "keyqueue": f"`RedisWorkQueue` under `run_workers` ({CONCURRENCY} threads per process); "
    "coalesces by key",
    "bullmq": f"`Worker(concurrency={CONCURRENCY})`, jobs with `removeOnComplete` and "
    "`removeOnFail`, `deduplication={id: key, keepLastIfActive: true}`",
    "streaq": f"`Worker(concurrency={CONCURRENCY})` (prefetch its default), a task with "
    "`ttl=0` (no result kept) and `silent=True`, task id = key",
    "saq": f"`Worker(concurrency={CONCURRENCY})`, its defaults, `enqueue(key=key)`",
    "arq": f"`max_jobs={CONCURRENCY}`, `poll_delay={ARQ_POLL_DELAY:g}` (default 0.5 s), "
    "`keep_result=0` (a kept result holds the job id for an hour), `_job_id=key`",
    "rq": "`SimpleWorker` (no fork per job; one job at a time per process, its model), "
    "`unique=True`, `result_ttl=0`, `job_id=key`",
}

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


async def bullmq_job(job: Any, token: str) -> None:
    await _ahandle(job.data["k"])


def _streaq_worker(url: str, queue: str) -> tuple[Any, Any]:
    """streaq's worker and its one task (the producer registers the same task)."""
    from streaq import Worker  # noqa: PLC0415

    worker: Any = Worker(
        redis_url=url, queue_name=queue, concurrency=CONCURRENCY, handle_signals=False
    )

    async def streaq_job(key: str) -> None:
        await _ahandle(key)

    return worker, worker.task(name="job", ttl=0, silent=True)(streaq_job)


# -- producers: one client each ------------------------------------------------------------


class Producer:
    """A library's client: ``add`` one key (deduplicated), ``add_batch`` many, ``load``
    the drain's distinct keys."""

    async def add(self, key: str) -> None:
        raise NotImplementedError

    async def add_batch(self, keys: list[str]) -> None:
        await asyncio.gather(*(self.add(key) for key in keys))

    async def load(self, keys: list[str]) -> None:
        for i in range(0, len(keys), BATCH):
            await self.add_batch(keys[i : i + BATCH])

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

    async def load(self, keys: list[str]) -> None:
        # Distinct keys: one pipeline per BATCH (enqueue_many), no uniqueness check.
        prepare = self.queue.prepare_data
        for i in range(0, len(keys), BATCH):
            self.queue.enqueue_many(
                [
                    prepare("distributed.rq_job", (key,), job_id=key, result_ttl=0)
                    for key in keys[i : i + BATCH]
                ]
            )

    async def close(self) -> None:
        self.redis.close()


class BullmqProducer(Producer):
    def __init__(self, url: str, queue: str, keep_last: bool = True) -> None:
        from bullmq import Queue  # noqa: PLC0415

        self.queue = Queue(queue, {"connection": url})
        self.keep_last = keep_last

    def _opts(self, key: str) -> dict[str, Any]:
        dedup: dict[str, Any] = {"id": key}
        if self.keep_last:
            dedup["keepLastIfActive"] = True
        return {"deduplication": dedup, "removeOnComplete": True, "removeOnFail": True}

    async def add(self, key: str) -> None:
        await self.queue.add("job", {"k": key}, self._opts(key))

    async def add_batch(self, keys: list[str]) -> None:
        await self.queue.addBulk(
            [{"name": "job", "data": {"k": key}, "opts": self._opts(key)} for key in keys]
        )

    async def close(self) -> None:
        await self.queue.close()


class StreaqProducer(Producer):
    def __init__(self, url: str, queue: str) -> None:
        self.worker, self.task = _streaq_worker(url, queue)
        self.stack = contextlib.AsyncExitStack()

    async def open(self) -> None:
        await self.stack.enter_async_context(self.worker)

    def _task(self, key: str) -> Any:
        task = self.task.enqueue(key)
        task.id = key  # a task id already stored is not enqueued again: deduplication
        return task

    async def add(self, key: str) -> None:
        await self._task(key)

    async def add_batch(self, keys: list[str]) -> None:
        await self.worker.enqueue_many([self._task(key) for key in keys])

    async def close(self) -> None:
        await self.stack.aclose()


async def producer(lib: str, url: str, queue: str) -> Producer:
    made: Producer
    if lib == "bullmq-simple":
        made = BullmqProducer(url, queue, keep_last=False)
    else:
        made = {
            "keyqueue": KeyqueueProducer,
            "arq": ArqProducer,
            "saq": SaqProducer,
            "rq": RqProducer,
            "bullmq": BullmqProducer,
            "streaq": StreaqProducer,
        }[lib](url, queue)
    opener = getattr(made, "open", None)
    if opener is not None:
        await opener()
    return made


# -- worker processes ----------------------------------------------------------------------


def _serve(
    lib: str, url: str, queue: str, mode: str, shared: Any, index: int, ready: Any, go: Any
) -> None:
    """A worker process: this library's worker, forever (the parent kills it). It
    starts when every process of the run is ready (``go``), so all run at once."""
    global _mode, _shared, _index, _sredis
    _mode, _shared, _index = mode, shared, index
    ready = _Ready(ready, go)
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
    if lib == "floor":
        _floor_worker(url, queue, ready)
        return
    asyncio.run(_aserve(lib, url, queue, ready))


class _Ready:
    """``set()``: this process is ready; returns when the parent says go."""

    def __init__(self, ready: Any, go: Any) -> None:
        self.ready, self.go = ready, go

    def set(self) -> None:
        self.ready.set()
        self.go.wait()


def _floor_worker(url: str, queue: str, ready: Any) -> None:
    """The floor: CONCURRENCY threads, each RPOPs one key per round trip and handles it."""
    client = redis.Redis.from_url(url, max_connections=CONCURRENCY)

    def loop() -> None:
        while (key := client.rpop(queue)) is not None:
            _record(key.decode())

    ready.set()
    threads = [threading.Thread(target=loop, daemon=True) for _ in range(CONCURRENCY)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    threading.Event().wait()  # the parent kills it


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
    elif lib == "saq":
        from saq import Queue, Worker  # noqa: PLC0415

        saq_worker = Worker(
            Queue.from_url(url, name=queue), functions=[saq_job], concurrency=CONCURRENCY
        )
        ready.set()
        await saq_worker.start()
    elif lib == "streaq":
        streaq_worker, _ = _streaq_worker(url, queue)
        ready.set()
        await streaq_worker.run_async()
    else:  # bullmq, bullmq-simple: the same worker
        from bullmq import Worker as BullWorker  # noqa: PLC0415

        options = {
            "connection": url,
            "concurrency": CONCURRENCY,
            "removeOnComplete": True,
            "removeOnFail": True,
        }
        bull_worker = BullWorker(queue, bullmq_job, options)  # autorun: it runs already
        ready.set()
        await asyncio.Event().wait()
        await bull_worker.close()


@contextlib.contextmanager
def workers(lib: str, url: str, queue: str, mode: str, shared: Any, n: int) -> Iterator[list[Any]]:
    """``n`` worker processes of ``lib`` for the ``with`` block; killed after it (they
    are disposable, and some libraries wait seconds for a graceful stop)."""
    context = multiprocessing.get_context("spawn")
    processes = []
    go = context.Event()
    try:
        for i in range(n):
            ready = context.Event()
            process = context.Process(
                target=_serve, args=(lib, url, queue, mode, shared, i, ready, go), daemon=True
            )
            process.start()
            processes.append((process, ready))
        for process, ready in processes:
            if not ready.wait(60):
                raise RuntimeError(f"{lib} worker process {process.pid} did not start")
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


def drain(lib: str, url: str, processes: int = PROCESSES) -> dict[str, float]:
    """No-op keys a second through ``processes`` worker processes, ``DRAIN_KEYS`` waiting
    (``lib`` "floor": a bare list, RPOP one key per round trip)."""
    context = multiprocessing.get_context("spawn")
    shared = tuple(context.Array(kind, processes, lock=False) for kind in ("q", "d", "d", "d", "d"))
    counts, first, last, cpu_first, cpu_last = shared
    queue = f"drain-{lib}"
    keys = [f"key-{i}" for i in range(DRAIN_KEYS)]
    admin = redis.Redis.from_url(url)

    async def load() -> None:
        client = await producer(lib, url, queue)
        try:
            await client.load(keys)
        finally:
            await client.close()

    if lib == "floor":
        for i in range(0, DRAIN_KEYS, 1000):
            admin.lpush(queue, *keys[i : i + 1000])
    else:
        asyncio.run(load())
    before = _server_usage(admin)
    with workers(lib, url, queue, "noop", shared, processes):
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
    commands, scripts, cpu, reads = (a - b for a, b in zip(after, before, strict=True))
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
    }


def _server_usage(admin: redis.Redis) -> tuple[int, int, float, int]:
    """Commands the server ran (those inside scripts too; our INFO calls not), script
    calls, CPU seconds, and read events on client sockets (one per round trip)."""
    stats = admin.info("commandstats")
    calls = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    scripts = sum(
        int(v["calls"])
        for k, v in stats.items()
        if k in ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_fcall", "cmdstat_evalsha_ro")
    )
    cpu = admin.info("cpu")
    reads = int(admin.info("stats")["total_reads_processed"])
    return calls, scripts, float(cpu["used_cpu_user"]) + float(cpu["used_cpu_sys"]), reads


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


def describe() -> str:
    """The settings, for docs/benchmarks.md."""
    return (
        f"Coalesced adds: one client adds a key that is already waiting, one call at a time "
        f"and {BATCH} at a time (keyqueue: `add_many`; BullMQ: `addBulk`; streaq: "
        f"`enqueue_many`; arq and SAQ: {BATCH} deduplicated enqueues under `asyncio.gather`, "
        f"as they have no batch call; rq: one at a time), {RATE_REPEATS} runs of "
        f"{RATE_TIME:g} s, median. End-to-end: {DRAIN_KEYS:,} distinct keys waiting, then "
        f"{PROCESSES} worker processes with {CONCURRENCY} handlers each, timed from the first "
        f"handler's start to the last one's end, at most {DRAIN_CAP:g} s; over that run the "
        "server's INFO: commandstats (commands inside scripts counted, and the script calls "
        "themselves), `used_cpu_user` + `used_cpu_sys`, and `total_reads_processed` (read "
        "events on client sockets: one per round trip), each divided by the keys handled; "
        "client CPU is the worker processes' own CPU time between their first and last "
        f"handler. Idle: one worker process with nothing to do, over {IDLE_SECONDS:g} s: "
        "commands a second (commandstats; a blocking command counts when it returns) and "
        "requests a second (`total_reads_processed`, less our INFO calls). Pickup: that "
        "worker, idle; read the clock, add one key, the "
        f"handler writes its start time to shared memory; {PICKUP_SAMPLES} times, "
        f"{PICKUP_GAP * 1000:g} ms apart. Each library runs on its own fastest settings (the "
        "table below). "
        "BullMQ's Python port needs redis-py ≥ 6.2 and arq pins it below 6, so BullMQ runs "
        "from a virtualenv of its own (`.venv-bench-bullmq`), a subprocess against the same "
        "server."
    )


LOST_NOTE = (
    f"{LOST_KEYS} keys (objects), {PROCESSES} worker processes. A producer bumps a random "
    f"key's version in Redis and enqueues the key, {LOST_RATE:g} times a second for "
    f"{LOST_SECONDS:g} s; each handler reads the key's current version, works "
    f"{LOST_WORK * 1000:g} ms, and records the highest version it read. A key ends right "
    "when some handler read its final version. With a job id for deduplication, an "
    "enqueue while the job is *running* is dropped by arq, SAQ, rq and streaq alike, and by "
    "BullMQ's simple deduplication, so the change it carried is never processed; keyqueue "
    "marks the key and hands it out once more after `done`, and BullMQ's "
    "`keepLastIfActive` keeps the add made while the job is active and runs it after. "
    "Overlaps count handler runs of one key that ran at the same time."
)

WORKLOADS: dict[str, Callable[[str, str], Any]] = {
    "coalesced_add": lambda lib, url: asyncio.run(coalesced_adds(lib, url)),
    "drain": drain,
    "pickup": pickup,
    "lost_updates": lost_updates,
}


def measure_lib(lib: str, url: str) -> dict[str, Any]:
    """One library's workloads, here (the server flushed before each)."""
    admin = redis.Redis.from_url(url)
    results: dict[str, Any] = {}
    for name, workload in WORKLOADS.items():
        admin.flushall()
        began = now()
        results[name] = workload(lib, url)
        print(f"  {lib:>8} {name}: {results[name]} ({now() - began:.1f}s)", flush=True)
    if lib == "bullmq":  # the lost-update table's second BullMQ row
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
    row, on one private valkey-server."""
    from keyqueue.testing import local_valkey  # noqa: PLC0415

    report: dict[str, Any] = {
        "libs": [],
        "results": {},
        "processes": PROCESSES,
        "concurrency": CONCURRENCY,
        "lost_note": LOST_NOTE,
        "skipped": {},
        "settings": {lib: SETTINGS[lib] for lib in libs},
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
        admin.close()
    report["seconds"] = now() - began
    load.append(os.getloadavg())
    report["load"] = " -> ".join(", ".join(f"{x:.2f}" for x in one) for one in load)
    report["targets"] = targets(report)
    report["where_time_goes"] = where_time_goes(report)
    return report


def _target(target: str, measured: str, met: bool) -> dict[str, Any]:
    return {"target": target, "measured": measured, "met": met}


def targets(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Issue 19's targets, each from this run's own figures."""
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
                f"{ratio:.2f}x (fastest peer: {NAMES[best]}, {peers[best]:,.0f}/s)",
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


def round_trip_ms(run: dict[str, Any], concurrency: int = CONCURRENCY) -> float:
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
            f"handler thread, {round_trip_ms(peak):.1f} ms here, mostly waiting for a core"
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
        f"from {round_trip_ms(first):.1f} to {round_trip_ms(last):.1f} ms."
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


def tables(report: dict[str, Any]) -> dict[str, str]:
    """The section's tables, in Markdown: speed (every library and the floor), scaling,
    settings, lost updates and targets."""
    libs = report["libs"]
    r = report["results"]
    floor = report.get("floor")
    rule = "|---" * (len(libs) + 1 + bool(floor)) + "|"
    head = (
        "| | "
        + " | ".join(NAMES[lib] for lib in libs)
        + (" | floor (bare list, RPOP) |" if floor else " |")
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
            f"coalesced add, {BATCH} at a time",
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
        ("a handler thread's wait per round trip", lambda x: f"{round_trip_ms(x):.1f} ms"),
    ):
        scaling.append(
            f"| {label} | " + " | ".join(cell(x) for x in report.get("scaling", [])) + " |"
        )
    settings = ["| library | settings |", "|---|---|"] + [
        f"| {NAMES[lib]} | {report['settings'][lib]} |" for lib in libs
    ]
    lost_libs = [
        lib for lib in libs for lib in ((lib, "bullmq-simple") if lib == "bullmq" else (lib,))
    ]

    def lost_of(lib: str) -> dict[str, Any]:
        return (
            r["bullmq"]["lost_updates_simple"] if lib == "bullmq-simple" else r[lib]["lost_updates"]
        )

    lost = [
        "| | " + " | ".join(NAMES[lib] for lib in lost_libs) + " |",
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
    }


if __name__ == "__main__":
    if sys.argv[1:2] == ["--json"]:  # one library, for measure_elsewhere
        print(json.dumps(measure_lib(sys.argv[3], sys.argv[2])))
    else:
        chosen = tuple(sys.argv[1:]) or LIBS
        report = measure(chosen)
        json_path = ROOT / "build" / "distributed.json"
        json_path.parent.mkdir(exist_ok=True)
        json_path.write_text(json.dumps(report, indent=2))
        for text in tables(report).values():
            print(text, end="\n\n")
        print(report["where_time_goes"])
        print(f"load average: {report['load']}")
        print(f"{report['seconds']:.0f} s; wrote {json_path}")
