"""What the firehose's two backends share: its load, its measurements, its result.

``memory`` runs the load on one ``WorkQueue``, ``redis`` in several processes
on one ``RedisWorkQueue``. Both fire with a ``Producer``, reconcile with
``Workers`` (``run_workers`` with the simulated ``Reconcile``: a sleep of
about ``config.reconcile``, failing at a seeded rate through the default
controller limiter, as in a real controller), measure with ``Samples``, keep
their ``FirehoseTick`` samples in ``Ticks`` and end with the same
``FirehoseResult`` (``firehose_result``).

Keys: each event's key is a seeded uniform draw over all ``keys`` keys
(``key_draws``), taken a batch at a time with ``random.choices``. Up to
``NAMED_KEYS`` keys the names are a list made once; above it they are
formatted as drawn, so ``--keys 10000000`` builds nothing that size.

Pacing: the producer works in batches of at most a few milliseconds' worth of
events, measured against ``time.monotonic``: at each turn it fires what is due
by now and sleeps when it is ahead. When the machine is too slow it never
sleeps, falls behind, and the run reports the rate it actually achieved
against the target, plainly, instead of pretending.

Queue wait and reconcile time come from the queue's own GET and DONE events
(``queue.subscribe``): GET carries the time since the add that made the key
dirty, DONE the time the key was held. Subscribing costs every add a little
(the callback runs for coalesced adds too), which is part of what is measured.
"""

from __future__ import annotations

import math
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from keyqueue import Event, EventKind, Stats, run_workers

from .._percentiles import Percentiles, percentiles
from ..simulated import SimulatedFailure

__all__ = [
    "BACKENDS",
    "FirehoseConfig",
    "FirehoseResult",
    "FirehoseTick",
    "KEEP_UP",
    "NAMED_KEYS",
    "Producer",
    "Reconcile",
    "Samples",
    "Ticks",
    "Workers",
    "drain_estimate",
    "firehose_result",
    "key_draws",
    "key_name",
    "one_by_one",
]

KEEP_UP = 0.95
"""Below this fraction of the target rate, the run says the machine could not keep up."""

BATCH_SECONDS = 0.005
"""The producer adds at most about this long between clock reads."""
NAMED_KEYS = 65_536
"""Up to this many keys, their names are made once; above it, as each is drawn."""

BACKENDS = ("memory", "redis")
"""Where the firehose's queue lives: ``FirehoseConfig.backend``."""

_GET = EventKind.GET
_DONE = EventKind.DONE


@dataclass(frozen=True, slots=True)
class FirehoseConfig:
    rate: float = 50_000.0
    """Target events per second."""
    keys: int = 20
    duration: float = 10.0
    """Seconds the producer fires."""
    workers: int = 4
    reconcile: float = 0.004
    """Mean simulated reconcile time, seconds (each is uniform in 0.5x..1.5x)."""
    failure_rate: float = 0.01
    """Fraction of reconciles that fail (and are retried with backoff)."""
    seed: int = 0
    tick: float = 1.0
    """Seconds between status samples."""
    backend: str = "memory"
    """``memory`` (one ``WorkQueue``) or ``redis`` (``RedisWorkQueue`` in ``processes``
    processes sharing one queue on a Valkey/Redis server: ``firehose.redis``)."""
    processes: int = 1
    """Processes the producer rate and the workers are spread over (``redis`` only)."""
    durability: str = "primary"
    """The Redis queue's ``durability=`` (``redis`` only)."""

    def __post_init__(self) -> None:
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be > 0, got {self.rate!r}")
        if self.keys < 1:
            raise ValueError(f"keys must be >= 1, got {self.keys!r}")
        if not (self.duration > 0 and math.isfinite(self.duration)):
            raise ValueError(f"duration must be > 0, got {self.duration!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers!r}")
        if not (self.reconcile >= 0 and math.isfinite(self.reconcile)):
            raise ValueError(f"reconcile must be >= 0, got {self.reconcile!r}")
        if not 0 <= self.failure_rate < 1:
            raise ValueError(f"failure_rate must be in [0, 1), got {self.failure_rate!r}")
        if not (self.tick > 0 and math.isfinite(self.tick)):
            raise ValueError(f"tick must be > 0, got {self.tick!r}")
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {self.backend!r}")
        if self.processes < 1:
            raise ValueError(f"processes must be >= 1, got {self.processes!r}")
        if self.backend == "memory" and self.processes != 1:
            raise ValueError("processes > 1 needs the redis backend (one queue shared by them)")
        if self.durability not in ("primary", "replicated"):
            raise ValueError(
                f"durability must be 'primary' or 'replicated', got {self.durability!r}"
            )
        if self.backend == "memory" and self.durability != "primary":
            raise ValueError("durability needs the redis backend (it waits for its replicas)")


@dataclass(frozen=True, slots=True)
class FirehoseTick:
    """One status sample. Counters are totals so far, ``event_rate`` is the
    average since firing began, percentiles cover the interval since the
    previous sample."""

    t: float
    events: int
    """Adds the producer fired so far."""
    event_rate: float
    """Events a second since firing began: the last sample of the firing is the
    summary's achieved rate, exactly."""
    adds: int
    enqueued: int
    coalesced: int
    marked_while_processing: int
    processed: int
    rate_limited: int
    depth: int
    max_depth: int
    processing: int
    """Keys held by workers at the sample."""
    absorbed: float
    """Percent of adds coalesced into a key that was already dirty."""
    queue_wait: Percentiles
    reconcile: Percentiles
    draining: bool = False
    """Taken after the last event, while the workers finish what is left."""
    drain_eta: float | None = None
    """On the sample taken as firing ends: the seconds the drain should take
    (``drain_estimate``); ``None`` on every other sample."""


@dataclass(frozen=True)
class FirehoseResult:
    config: FirehoseConfig
    elapsed: float
    """Seconds the producer fired."""
    events: int
    achieved_rate: float
    kept_up: bool
    """Achieved at least ``KEEP_UP`` of the target rate."""
    stats: Stats
    """The queue's counters at the end (after draining)."""
    absorbed: float
    reconciles_per_second: float
    """Reconciles over the whole run, firing and drain."""
    failures: int
    """Reconciles that failed (simulated)."""
    gave_up: int
    """Failures the runner gave up on, not retried: a queue that is shutting
    down (the drain) takes no retries."""
    queue_wait: Percentiles
    reconcile: Percentiles
    drained_in: float = 0.0
    """Seconds from the last event until the workers had finished every key."""
    ticks: tuple[FirehoseTick, ...] = field(default=())
    interrupted: bool = False

    def to_json(self) -> dict[str, Any]:
        data = {name: getattr(self, name) for name in self.__dataclass_fields__}
        data["config"] = asdict(self.config)
        data["stats"] = asdict(self.stats)
        data["queue_wait"] = asdict(self.queue_wait)
        data["reconcile"] = asdict(self.reconcile)
        data["ticks"] = [asdict(tick) for tick in self.ticks]
        return data


def key_name(i: int) -> str:
    """The name of key number ``i``: ``default/pod-007``."""
    return f"default/pod-{i:03d}"


class _KeyNames:
    """``key_name(i)`` for ``i`` in ``range(n)``, made when indexed: no list of n names."""

    def __init__(self, n: int) -> None:
        self._n = n

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i: int) -> str:
        return key_name(i)


def key_draws(keys: int, seed: int) -> Callable[[int], list[str]]:
    """``draw(n)``: the next ``n`` events' keys, each uniform over all ``keys``
    keys, the same sequence for the same seed. Builds nothing ``keys``-sized
    above ``NAMED_KEYS``."""
    if keys < 1:
        raise ValueError(f"keys must be >= 1, got {keys!r}")
    names = [key_name(i) for i in range(keys)] if keys <= NAMED_KEYS else _KeyNames(keys)
    choices = random.Random(seed).choices
    return lambda n: choices(names, k=n)


class Samples:
    """Queue-wait and work-time samples from GET/DONE events, per interval and overall."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.waits: list[float] = []
        self.works: list[float] = []
        self.all_waits: list[float] = []
        self.all_works: list[float] = []

    def on_event(self, event: Event[str]) -> None:  # under the queue's lock: keep it short
        kind, duration = event.kind, event.duration
        if duration is None:
            return
        if kind is _GET:
            with self._lock:
                self.waits.append(duration)
        elif kind is _DONE:
            with self._lock:
                self.works.append(duration)

    def take(self) -> tuple[list[float], list[float]]:
        """This interval's samples; starts the next interval."""
        with self._lock:
            waits, works = self.waits, self.works
            self.waits, self.works = [], []
        self.all_waits += waits
        self.all_works += works
        return waits, works


class Reconcile:
    """The simulated reconcile: sleeps ~``config.reconcile`` (0.5x to 1.5x) and
    fails at ``config.failure_rate``, both drawn from one seeded generator."""

    def __init__(self, config: FirehoseConfig, seed: int) -> None:
        self.rng = random.Random(seed)
        self.failure_rate = config.failure_rate
        self.low, self.spread = 0.5 * config.reconcile, config.reconcile
        self.failures = 0

    def __call__(self, key: str) -> None:
        rng = self.rng
        r = rng.random()  # one draw decides both: reproducible mix per seed
        if self.spread:
            time.sleep(self.low + self.spread * rng.random())
        if r < self.failure_rate:
            self.failures += 1
            raise SimulatedFailure(key)


def one_by_one(add: Callable[[str], None]) -> Callable[[list[str]], None]:
    """``add_batch`` for a queue without a batch call: ``add`` each key."""

    def add_batch(keys: list[str]) -> None:
        for key in keys:
            add(key)

    return add_batch


class Producer(threading.Thread):
    """Fires ``config.rate`` events a second for ``config.duration`` seconds
    (see the module's pacing notes); ``add_batch(keys)`` adds one batch."""

    def __init__(
        self,
        config: FirehoseConfig,
        halt: threading.Event,
        add_batch: Callable[[list[str]], None],
    ):
        super().__init__(name="keyqueue-lab-producer", daemon=True)
        self.add_batch = add_batch
        self.config = config
        self.halt = halt
        self.sent = 0  # read by the sampling thread; an int store is atomic
        self.started_at = self.finished_at = 0.0
        self.draw = key_draws(config.keys, config.seed)

    def run(self) -> None:
        add_batch, draw = self.add_batch, self.draw
        rate, duration, halt = self.config.rate, self.config.duration, self.halt
        max_batch = max(1, int(rate * BATCH_SECONDS))  # at most ~5 ms of events per batch
        min_batch = max(1, int(rate * 0.001))  # sleep until ~1 ms of events is due
        sent = 0
        limit = max_batch  # shrinks when adds are slow: a batch stays ~5 ms long
        start = self.started_at = time.monotonic()
        try:
            while not halt.is_set():
                elapsed = time.monotonic() - start
                if elapsed >= duration:
                    break
                due = min(int(elapsed * rate) + 1, math.ceil(duration * rate)) - sent
                if due < min_batch:
                    time.sleep(max(0.0, (sent + min_batch) / rate - elapsed))
                    continue
                batch = min(due, limit)
                add_batch(draw(batch))
                self.sent = sent = sent + batch
                took = time.monotonic() - start - elapsed
                # Size the next batch by what this one cost, so firing stops
                # within a few ms of the duration however slow an add is
                # (contended, or a slow machine), never a batch's worth late.
                if took > 0:
                    limit = max(1, min(max_batch, int(batch * BATCH_SECONDS / took)))
            # The last events fall due just before the deadline: fire them if the
            # producer was keeping up (never a catch-up burst after falling behind).
            rest = math.ceil(duration * rate) - sent
            if not halt.is_set() and 0 < rest <= limit:
                add_batch(draw(rest))
                self.sent = sent = sent + rest
        finally:
            self.finished_at = time.monotonic()


class Workers:
    """``run_workers`` over ``queue`` with the simulated reconcile, in a daemon
    thread (``thread``, not started); counts the reconciles that failed
    (``reconcile.failures``) and those it gave up on (``gave_up``)."""

    def __init__(
        self,
        queue: Any,
        config: FirehoseConfig,
        workers: int,
        stop: threading.Event | None = None,
    ) -> None:
        self.reconcile = Reconcile(config, config.seed + 1)
        self.gave_up = 0
        self.thread = threading.Thread(
            target=run_workers,
            args=(queue, self.reconcile),
            kwargs={"workers": workers, "stop": stop, "on_give_up": self._on_give_up},
            name="keyqueue-lab-workers",
            daemon=True,
        )

    def _on_give_up(self, key: str, error: BaseException) -> None:
        self.gave_up += 1


def drain_estimate(s: Stats, config: FirehoseConfig) -> float:
    """Seconds the workers need to finish what ``s`` shows waiting and held, at
    the mean reconcile time each (failures retried add a little more)."""
    return (s.depth + s.processing) * config.reconcile / config.workers


class Ticks:
    """The samples a run has taken (``taken``, in order), each handed to
    ``on_tick`` as it is taken."""

    def __init__(
        self, config: FirehoseConfig, on_tick: Callable[[FirehoseTick], None] | None
    ) -> None:
        self.config = config
        self.on_tick = on_tick
        self.taken: list[FirehoseTick] = []

    def take(
        self,
        s: Stats,
        t: float,
        events: int,
        firing: float,
        waits: list[float],
        works: list[float],
        *,
        draining: bool = False,
        last: bool = False,
        notify: bool = True,
    ) -> None:
        """The sample at ``t`` seconds: the queue's counters ``s``, ``events``
        fired in ``firing`` seconds, the queue waits and reconcile times since
        the previous sample. ``last``: the sample as firing ends, with the
        drain's estimate; ``notify=False``: kept but not handed on (an
        interrupted run: its caller prints the summary instead)."""
        tick = FirehoseTick(
            t=t,
            events=events,
            event_rate=events / firing if firing > 0 else 0.0,
            adds=s.adds,
            enqueued=s.enqueued,
            coalesced=s.coalesced,
            marked_while_processing=s.marked_while_processing,
            processed=s.dones,
            rate_limited=s.rate_limited,
            depth=s.depth,
            max_depth=s.max_depth,
            processing=s.processing,
            absorbed=100.0 * s.coalesced / s.adds if s.adds else 0.0,
            queue_wait=percentiles(waits),
            reconcile=percentiles(works),
            draining=draining,
            drain_eta=drain_estimate(s, self.config) if last else None,
        )
        self.taken.append(tick)
        if notify and self.on_tick is not None:
            self.on_tick(tick)

    def covers(self, events: int) -> bool:
        """The latest sample counts ``events`` events."""
        return bool(self.taken) and self.taken[-1].events == events


def firehose_result(
    config: FirehoseConfig,
    *,
    elapsed: float,
    events: int,
    drained_in: float,
    stats: Stats,
    failures: int,
    gave_up: int,
    waits: Sequence[float],
    works: Sequence[float],
    ticks: list[FirehoseTick],
    interrupted: bool,
    ran_for: float | None = None,
) -> FirehoseResult:
    """The run's result: ``events`` fired in ``elapsed`` seconds, drained in
    ``drained_in``; ``stats`` the queue's counters at the end; ``waits`` and
    ``works`` every queue wait and reconcile time. ``ran_for``: the seconds
    the reconciles had, when not ``elapsed + drained_in`` (a run interrupted
    mid-drain has no ``drained_in`` but did drain for a while)."""
    achieved = events / elapsed if elapsed > 0 else 0.0
    run_time = elapsed + drained_in if ran_for is None else ran_for
    return FirehoseResult(
        config=config,
        elapsed=elapsed,
        events=events,
        achieved_rate=achieved,
        kept_up=achieved >= KEEP_UP * config.rate,
        stats=stats,
        absorbed=100.0 * stats.coalesced / stats.adds if stats.adds else 0.0,
        reconciles_per_second=stats.dones / run_time if run_time > 0 else 0.0,
        failures=failures,
        gave_up=gave_up,
        queue_wait=percentiles(waits),
        reconcile=percentiles(works),
        drained_in=drained_in,
        ticks=tuple(ticks),
        interrupted=interrupted,
    )
