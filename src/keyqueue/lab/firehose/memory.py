"""The firehose on one in-memory ``WorkQueue`` (``--backend memory``, the default).

Theory of operation
-------------------
One producer thread fires ``queue.add`` at the target rate onto the keys;
``run_workers`` runs the workers in another thread. The caller's thread
samples ``queue.stats()`` once a tick (a second), and keeps sampling while the
queue drains after the last event (a long drain shows its progress): the
queue is shut down, so the keys waiting or held are still handed out and
finished, and the workers return once none is left. Retries still delayed
then are dropped (a queue that is shutting down takes no retries) and counted
as given up.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

from keyqueue import WorkQueue

from ..simulated import quiet_simulated_give_ups
from .common import (
    FirehoseConfig,
    FirehoseResult,
    FirehoseTick,
    Producer,
    Samples,
    Ticks,
    Workers,
    firehose_result,
    one_by_one,
)

__all__ = ["run_memory_firehose"]


def run_memory_firehose(
    config: FirehoseConfig,
    on_tick: Callable[[FirehoseTick], None] | None = None,
    on_start: Callable[[Callable[[], float]], None] | None = None,
) -> FirehoseResult:
    """``run_firehose`` for ``config.backend == "memory"``: the same contract."""
    queue: WorkQueue[str] = WorkQueue("firehose")
    samples = Samples()
    queue.subscribe(samples.on_event)
    halt = threading.Event()
    workers = Workers(queue, config, config.workers, stop=halt)
    runner = workers.thread
    producer = Producer(config, halt, one_by_one(queue.add))
    ticks = Ticks(config, on_tick)

    def firing_time() -> float:
        return (producer.finished_at or time.monotonic()) - producer.started_at

    def sample(draining: bool = False, notify: bool = True, last: bool = False) -> None:
        sent = producer.sent
        now = time.monotonic() - producer.started_at
        waits, works = samples.take()
        s = queue.stats()
        firing = firing_time()
        ticks.take(s, now, sent, firing, waits, works, draining=draining, last=last, notify=notify)

    def stop() -> None:
        halt.set()
        queue.shutdown()
        producer.join(timeout=5)
        runner.join(timeout=5)

    interrupted = False
    drained_in = 0.0
    drain_start: float | None = None
    drained_so_far = 0.0  # when interrupted mid-drain
    with quiet_simulated_give_ups():  # the drain's give-ups are counted in gave_up
        try:
            runner.start()
            producer.start()
            while not producer.started_at:
                time.sleep(0.001)
            if on_start is not None:
                on_start(lambda: time.monotonic() - producer.started_at)
            # Samples at tick, 2*tick, ... strictly before the end of firing; the
            # last one, when the producer stops, covers the rest.
            next_sample = config.tick
            while producer.is_alive():
                producer.join(max(0.0, producer.started_at + next_sample - time.monotonic()))
                due = time.monotonic() - producer.started_at >= next_sample
                if due and next_sample < config.duration and producer.is_alive():
                    sample()
                    next_sample += config.tick
            sample(last=True)  # with the drain's estimate
            # Drain: no more adds; the keys waiting or held are still handed out
            # and finished, and the workers return once none is left.
            drain_start = time.monotonic()
            queue.shutdown()
            while not _joined(runner, config.tick):
                sample(draining=True)
            drained_in = time.monotonic() - drain_start
        except KeyboardInterrupt:
            interrupted = True
            stop()
            if drain_start is not None:
                drained_so_far = time.monotonic() - drain_start
            if not ticks.covers(producer.sent):
                sample(notify=False)  # the caller prints a summary; no more live updates
        except BaseException:
            stop()
            raise

    elapsed = firing_time()
    stats = queue.stats()
    samples.take()
    return firehose_result(
        config,
        elapsed=elapsed,
        events=producer.sent,
        drained_in=drained_in,
        stats=stats,
        failures=workers.reconcile.failures,
        gave_up=workers.gave_up,
        waits=samples.all_waits,
        works=samples.all_works,
        ticks=ticks.taken,
        interrupted=interrupted,
        ran_for=elapsed + drained_so_far if interrupted else None,
    )


def _joined(thread: threading.Thread, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``thread`` to end; whether it has."""
    thread.join(timeout)
    return not thread.is_alive()
