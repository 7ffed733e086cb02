"""``keyqueue lab pipeline --replicas N``: the controller as N processes on one Redis queue.

Theory of operation
-------------------
The same parts as ``run`` (etcd, the API server's process, the load
generator's), but the controller is not this process: it is N ``replica``
processes (``fleet``), each an informer on ``default`` ConfigMaps feeding one
``AsyncRedisWorkQueue`` on a private Valkey (or ``--redis-url``), with
``arun_workers`` reconciling each object (its status := its spec, under a
resourceVersion precondition and the queue's fencing token). This process
starts them, sends the load, and gathers their lines: each stage is timed at
its two ends as in ``run`` (the replicas report the watch event's arrival, the
``add`` it caused, each hand-out's wait and each reconcile), with
``time.monotonic()``, one clock for every process of the machine.

``--kill-replica-at S`` freezes replica r0 S seconds into the load, reads the
keys it holds from the queue's snapshot, and SIGKILLs it. Its keys come back
to the others when their leases run out. The summary's failover line says how
long they waited (the longest write → reconcile gap of the writes the dead
replica held up, and from the kill to each held key's next reconcile),
against the longest gap of every other write. Without a kill it shows the
same split with nothing held up.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import time
import uuid
from collections.abc import Callable
from typing import Any

from keyqueue import Stats
from keyqueue.redis import AsyncRedisWorkQueue
from keyqueue.testing import local_etcd, local_valkey

from ..._console.options import ctrl_c_taken
from .fleet import Fault, Fleet, Reconcile, Write, failover
from .processes import Child, new_event_loop
from .replica import ReplicaConfig
from .run import (
    NAMESPACE,
    SYNC_TIMEOUT,
    Line,
    PipelineConfig,
    PipelineError,
    PipelineResult,
    StageResult,
    _ChildError,
    _children_of,
    _Run,
    _stop_all,
    check_etcd,
)
from .stages import STAGES, format_duration

__all__ = ["replicated_pipeline", "run_replicated"]


def _stats_line(run: _Run, fleet: Fleet, stats: Stats, t: float, *, final: bool = False) -> str:
    per = _per_replica(fleet.log.ended)
    each = " ".join(f"{name}={count:,}" for name, count in sorted(per.items()))
    return (
        f"[STATS] t={t:.1f}s {'final ' if final else ''}triggers={run.answered:,} "
        f"adds={stats.adds:,} coalesced={stats.coalesced:,} reconciles={len(fleet.log.ended):,} "
        f"({each}) depth={stats.depth} processing={stats.processing}"
    )


async def replicated_pipeline(
    config: PipelineConfig, on_line: Line | None, on_url: Any
) -> PipelineResult:
    """Run the pipeline with ``config.replicas`` controller processes (see the module)."""
    run = _Run(config, on_line)
    started = time.monotonic()
    ticks: list[str] = []
    interrupted = False
    url = etcd_url = redis_url = ""
    writes: list[Write] = []
    layout: dict[str, dict[str, Any]] = {}
    loop = asyncio.get_running_loop()
    main = asyncio.current_task()
    assert main is not None
    for signum in (signal.SIGTERM, signal.SIGHUP):
        with contextlib.suppress(ValueError, NotImplementedError, RuntimeError):
            loop.add_signal_handler(signum, main.cancel)
    children: list[Child] = []
    fleet: Fleet | None = None
    queue: AsyncRedisWorkQueue | None = None
    stats: Stats | None = None
    load_started = started

    def on_load(message: tuple[Any, ...]) -> None:
        if message[0] == "answered":
            for name, rv, sent, answered in message[1]:
                writes.append(Write(f"{NAMESPACE}/{name}", rv, sent, answered))
        run.on_load_message(message)

    def on_end(r: Reconcile) -> None:
        run.timings.add("reconcile", r.end - r.start)
        run.timings.reconciled(r.key, r.seen, r.end)
        if r.seen > run.seen.get(r.key, 0):
            run.seen[r.key] = r.seen
        if run.traces(r.key):
            run.line(
                "WORKER",
                f"[WORKER] {r.replica} key={r.key} token={r.token} {r.outcome} rv={r.seen} "
                f"reconcile={format_duration(r.end - r.start)}",
            )
        run.check_settled()

    async with contextlib.AsyncExitStack() as stack:
        try:
            stack.callback(_stop_all, children)
            api = Child.start("apiserver")
            children.append(api)
            api.listen(loop, run.on_api_message)
            layout["apiserver"] = {"pid": api.pid, "holds": ["API server"]}
            load = Child.start("load")
            children.append(load)
            load.listen(loop, on_load)
            layout["load"] = {"pid": load.pid, "holds": ["load generator"]}
            if config.etcd is None:
                known = set(_children_of(os.getpid()))
                etcd_url = stack.enter_context(local_etcd())
                etcd_pids = [pid for pid in _children_of(os.getpid()) if pid not in known]
                layout["etcd"] = {"pid": etcd_pids[0] if etcd_pids else None, "holds": ["etcd"]}
            else:
                etcd_url = config.etcd.rstrip("/")
                layout["etcd"] = {"pid": None, "holds": ["etcd"], "url": etcd_url}
            if config.redis_url is None:
                known = set(_children_of(os.getpid()))
                redis_url = stack.enter_context(local_valkey())
                pids = [pid for pid in _children_of(os.getpid()) if pid not in known]
                layout["valkey"] = {"pid": pids[0] if pids else None, "holds": ["the queue"]}
            else:
                redis_url = config.redis_url
                layout["valkey"] = {"pid": None, "holds": ["the queue"], "url": redis_url}
            stack.callback(_stop_all, children)
            await check_etcd(etcd_url)
            api.send("serve", etcd_url, config.port, sorted(run.traced), False)
            try:
                async with asyncio.timeout(SYNC_TIMEOUT):
                    url = await run.api_ready
            except _ChildError as exc:
                if exc.kind == "listen":
                    raise PipelineError(
                        f"cannot listen on 127.0.0.1:{config.port}: {exc}"
                    ) from None
                raise PipelineError(str(exc)) from None
            except TimeoutError:
                raise PipelineError("the API server process did not start") from None
            name = f"pipeline-{uuid.uuid4().hex[:8]}"
            queue = AsyncRedisWorkQueue(
                name, url=redis_url, holder="pipeline", durability=config.durability
            )
            stack.push_async_callback(queue.aclose)
            replica = ReplicaConfig(
                api=url,
                redis=redis_url,
                queue=name,
                lease=config.lease,
                durability=config.durability,
                workers=config.workers,
                namespace=NAMESPACE,
                work=config.reconcile,
                trace=True,
            )
            fleet = Fleet(replica, config.replicas)
            fleet.log.on_end = on_end
            stack.push_async_callback(fleet.close)
            await fleet.start()
            for r in fleet.replicas:
                layout[f"replica {r.name}"] = {"pid": r.pid, "holds": ["informer", "workers"]}
            if on_url is not None:
                on_url(url, etcd_url, 0)
            current_fleet = fleet

            async def stats_ticks() -> None:
                assert queue is not None
                last = ""
                while True:
                    await asyncio.sleep(config.tick)
                    line = _stats_line(
                        run, current_fleet, await queue.stats(), time.monotonic() - started
                    )
                    counts = line.split(" ", 2)[2]
                    if counts != last:
                        ticks.append(line)
                        run.line("STATS", line)
                        last = counts

            ticking = asyncio.create_task(stats_ticks(), name="pipeline-stats")
            stack.push_async_callback(_cancel, ticking)

            async def kill_one(at: float) -> None:
                await asyncio.sleep(max(0.0, load_started + at - time.monotonic()))
                victim = current_fleet.replicas[0]
                fault = await current_fleet.kill(0)
                layout[f"replica {victim.name}"]["killed_at"] = fault.at - load_started
                run.line(
                    "FAULT",
                    f"[FAULT] {fault.at - load_started:.1f}s into the load: SIGSTOP, SIGKILL "
                    f"replica {victim.name} (pid {victim.pid}) holding {len(fault.held)} "
                    f"key{'s' if len(fault.held) != 1 else ''}",
                )

            rng = random.Random(config.seed)
            names = [f"obj-{rng.randrange(config.objects)}" for _ in range(config.requests)]
            load_started = time.monotonic()
            load.send("go", url, names, config.concurrency)
            killing = None
            if config.kill_replica_at is not None:
                killing = asyncio.create_task(kill_one(config.kill_replica_at))
                stack.push_async_callback(_cancel, killing)
            await run.load_done.wait()
            if killing is not None:
                await killing  # the kill is part of the run, however short the load
            run.settled.clear()
            run.check_settled()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(run.settled.wait(), config.settle_timeout)
            stats = await queue.stats()
        except asyncio.CancelledError:
            interrupted = True
            main.uncancel()
    elapsed = time.monotonic() - started
    log = fleet.log if fleet is not None else None
    faults: list[Fault] = fleet.faults if fleet is not None else []
    if log is not None:
        _stage_samples(run, log)
    if stats is None:  # interrupted before the queue answered: zeros
        stats = run.queue.stats()
    if fleet is not None:
        final = _stats_line(run, fleet, stats, elapsed, final=True)
        ticks.append(final)
        run.line("STATS", final)
    summary = run.timings.summary()
    stages = tuple(StageResult(s.name, s.label, s.what, summary[s.name]) for s in STAGES)
    shown = failover(log.reconciles(), writes, faults) if log is not None else None
    replicas: dict[str, Any] = {
        "replicas": config.replicas,
        "redis": redis_url,
        "lease": config.lease,
        "faults": [
            {
                "kind": f.kind,
                "replica": f.replica,
                "at": f.at - load_started,
                "held": sorted(f.held),
            }
            for f in faults
        ],
        "failover": shown.to_json() if shown is not None else None,
        "reconciles": {} if log is None else _per_replica(log.ended),
    }
    return PipelineResult(
        config=config,
        url=url,
        etcd=etcd_url,
        elapsed=elapsed,
        triggers=run.answered,
        created=run.created,
        failed=run.failed,
        watch_events=len(log.events) if log is not None else 0,
        stats=stats,
        stages=stages,
        objects=len(run.final),
        stale=tuple(run.stale()),
        interrupted=interrupted,
        ticks=tuple(ticks),
        processes=layout,
        replicas=replicas,
    )


def _per_replica(ended: list[Reconcile]) -> dict[str, int]:
    out: dict[str, int] = {}
    for r in ended:
        out[r.replica] = out.get(r.replica, 0) + 1
    return out


def _stage_samples(run: _Run, log: Any) -> None:
    """The replicas' event and hand-out lines as stage samples (the first informer
    to see a revision times its write → watch event)."""
    timings = run.timings
    event_at = timings.event_at
    for _, _, rv, received, add_started, add_ended in log.events:
        if rv not in event_at or received < event_at[rv]:
            event_at[rv] = received
        timings.add("event_to_add", add_started - received)
        timings.add("add_call", add_ended - add_started)
    for _, _, waited in log.gets:
        timings.add("add_to_get", waited)


async def _cancel(task: asyncio.Task[Any]) -> None:
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


def run_replicated(
    config: PipelineConfig,
    on_line: Line | None = None,
    on_url: Callable[[str, str, int], None] | None = None,
) -> PipelineResult:
    """``run_pipeline`` with ``config.replicas`` controller processes; the same
    callbacks, the same errors, and ``PipelineResult.replicas`` filled in."""
    with ctrl_c_taken(), asyncio.Runner(loop_factory=new_event_loop) as runner:
        return runner.run(replicated_pipeline(config, on_line, on_url))
