"""``keyqueue lab fairness``: priorities, aging, per-endpoint buckets and fair tenants, exactly.

Everything runs on a ``FakeClock`` with the library's own queues and limiters
(public names only), one simulated worker taking keys one at a time, so the
numbers are exact and a minute of simulated traffic takes a moment.

(a) A relist: ``relist`` keys at priority 0 all at t=0, each taking
``service`` seconds to handle.

- A trickle of user edits (one every ``edit_every`` seconds) arrives while the
  relist drains: their latency (add to get) when they are plain adds (FIFO:
  behind the whole relist), with strict priorities, and with aging.
- A sustained stream of priority-1 keys at the worker's full capacity: with
  strict priorities the relist is never served (its oldest key has waited as
  long as the run, and longer in a longer run); with aging every relist key is
  handed out within ``aging`` seconds plus the time to serve what was waiting
  then, which the run measures and prints as the bound.

(b) Endpoints: ``failing`` keys fail at once against endpoint A and keep
failing, while keys on healthy endpoint B fail now and then (once each) and
succeed on retry. With client-go's default limiter (per-key backoff and one
token bucket) A's debt delays B's retries too; with per-endpoint buckets
B keeps its own budget; with per-key backoff alone A is hammered.

(c) Tenants: the same relist from one tenant (namespace ``default``) while
another tenant (``team-b``) edits one object every ``edit_every`` seconds,
every key at priority 0: plain adds (FIFO: an edit waits behind the whole
relist) against ``fair_by`` the namespace (the two tenants take turns: an
edit waits for at most one relist key and the key in hand, the bound).

(d) The combined rule: (c)'s relist and edits beside a third tenant's
sustained priority-1 stream (``team-c``, one key per ``service``: the
worker's full capacity), with ``aging``. Aging alone serves priority 0 once
the relist has aged past the stream, but the edits (which arrived after the
relist) wait behind all of it; with ``fair_by`` too, the priority aging
chose is served in turns, so the edits are out within their rotation. The
printed bound: (P_max - p) x aging, the stream keys waiting then and the key
in hand, then one relist key and one edit per edit.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from keyqueue import (
    BucketRateLimiter,
    Empty,
    EndpointRateLimiter,
    Event,
    EventKind,
    ItemExponentialFailureRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    WorkQueue,
)
from keyqueue.testing import FakeClock

from .._percentiles import percentile

__all__ = [
    "CombinedRow",
    "EndpointRow",
    "FairnessConfig",
    "FairnessResult",
    "LatencyRow",
    "StreamRow",
    "TenantRow",
    "run_fairness",
]

LOW, HIGH = 0, 1  # the relist's priority, and the edits' and the stream's
QPS, BURST = 10.0, 100  # client-go's default bucket (per endpoint, in the per-endpoint row)
BASE, CAP = 0.005, 1000.0  # client-go's default per-key backoff
TICK = 0.01  # seconds between looks in the endpoint simulation


@dataclass(frozen=True, slots=True)
class FairnessConfig:
    relist: int = 10_000
    """Keys the relist adds at t=0, at priority 0."""
    service: float = 0.001
    """Seconds the worker spends on each key."""
    edit_every: float = 0.05
    """Seconds between user edits (priority 1) during the relist."""
    aging: float = 15.0
    """Seconds a waiting key takes to gain one priority step (the aging runs)."""
    duration: float = 60.0
    """Seconds the sustained priority-1 stream runs."""
    failing: int = 1_000
    """Keys failing against endpoint A in (b)."""
    endpoint_duration: float = 60.0
    """Seconds the endpoint simulation runs."""

    def __post_init__(self) -> None:
        for name in ("service", "edit_every", "aging", "duration", "endpoint_duration"):
            value = getattr(self, name)
            if not (isinstance(value, int | float) and math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
        for name in ("relist", "failing"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")


@dataclass(frozen=True, slots=True)
class LatencyRow:
    mode: str
    """'FIFO (no priorities)', 'strict priorities', 'aging'."""
    edits: int
    edit_p50: float
    edit_p99: float
    edit_max: float
    relist_done: float
    """When the last relist key was handed out (seconds after the relist)."""


@dataclass(frozen=True, slots=True)
class StreamRow:
    mode: str
    """'strict priorities' or 'aging'."""
    at: float
    """Seconds into the stream this row was read."""
    relist_served: int
    """Relist keys handed out by then."""
    relist_tail: float
    """The longest a relist key has waited by then (handed out or not)."""
    stream_p99: float
    """p99 wait of the stream's keys handed out by then."""
    bound: float | None
    """Aging only: (P_max - p) * aging plus serving what waited at that time."""


@dataclass(frozen=True, slots=True)
class TenantRow:
    mode: str
    """'plain (FIFO)' or 'fair_by namespace'."""
    edits: int
    edit_p50: float
    edit_p99: float
    edit_max: float
    relist_done: float
    """When the last relist key was handed out (seconds after the relist)."""
    bound: float | None
    """fair_by only: an edit's wait at most, one key of each other tenant
    waiting and the key in hand."""


@dataclass(frozen=True, slots=True)
class CombinedRow:
    mode: str
    """'aging' or 'aging + fair_by namespace'."""
    edits: int
    edit_p50: float
    edit_max: float
    edits_done: float
    """When the last edit was handed out (seconds after the relist)."""
    relist_done: float
    """When the last relist key was handed out (seconds after the relist)."""
    bound: float | None
    """fair_by only: when the last edit is handed out at the latest."""


@dataclass(frozen=True, slots=True)
class EndpointRow:
    limiter: str
    calls_to_a: int
    """Handler calls on endpoint A's keys (all failing) during the run."""
    a_calls_first_second: int
    b_failures: int
    b_delay_p50: float
    """Backoff the limiter gave B's failed keys (seconds)."""
    b_delay_max: float


@dataclass(frozen=True, slots=True)
class FairnessResult:
    config: FairnessConfig
    high: int
    low: int
    latency: tuple[LatencyRow, ...]
    stream: tuple[StreamRow, ...]
    aging_wait_part: float
    """(P_max - p) * aging: the part of the bound that aging sets."""
    tenants: tuple[TenantRow, ...]
    combined: tuple[CombinedRow, ...]
    endpoints: tuple[EndpointRow, ...]
    failing_endpoint_qps: float
    failing_endpoint_burst: int

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- (a) one worker on a FakeClock ----------------------------------------------------


class _Worker:
    """One worker handling keys back to back; arrivals land at their exact times."""

    def __init__(
        self,
        queue: WorkQueue[str],
        clock: FakeClock,
        service: float,
        arrivals: Iterator[tuple[float, str, int]],
        on_time: Callable[[float], None] | None = None,
    ) -> None:
        self.queue, self.clock, self.service = queue, clock, service
        self.arrivals, self.on_time = arrivals, on_time
        self.upcoming = next(arrivals, None)
        self.added: dict[str, float] = {}  # key -> when it was added
        self.waited: dict[str, float] = {}  # key -> add to get, once handed out

    def arrive(self, key: str, priority: int) -> None:
        self.added[key] = self.clock.now()
        self.queue.add(key, priority)

    def _step_to(self, t: float) -> None:
        if t > self.clock.now():
            self.clock.step(t - self.clock.now())
            if self.on_time is not None:
                self.on_time(self.clock.now())

    def advance_to(self, t: float) -> None:
        """Move the clock to ``t``, adding each arrival on the way at its time."""
        while self.upcoming is not None and self.upcoming[0] <= t:
            at, key, priority = self.upcoming
            self._step_to(at)
            self.arrive(key, priority)
            self.upcoming = next(self.arrivals, None)
        self._step_to(t)

    def run(self, until: float) -> None:
        """Serve until ``until``, or until nothing is left to serve or to arrive."""
        clock, queue = self.clock, self.queue
        while clock.now() < until:
            self.advance_to(clock.now())
            try:
                key = queue.get_nowait()
            except Empty:
                if self.upcoming is None:
                    return
                self.advance_to(min(self.upcoming[0], until))
                continue
            self.waited[key] = clock.now() - self.added[key]
            self.advance_to(clock.now() + self.service)
            queue.done(key)


def _relist(n: int) -> list[str]:
    return [f"default/relist-{i:05d}" for i in range(n)]


def _latency_run(config: FairnessConfig, mode: str) -> LatencyRow:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(
        "fairness", clock=clock, aging=config.aging if mode == "aging" else None
    )
    span = config.relist * config.service
    edits = int(span / config.edit_every)
    priority = LOW if mode.startswith("FIFO") else HIGH
    # Edits land mid-service (a third of the way into a key), as they would.
    offset = config.service / 3
    arrivals = (
        ((i + 1) * config.edit_every + offset, f"default/edit-{i:05d}", priority)
        for i in range(edits)
    )
    worker = _Worker(queue, clock, config.service, arrivals)
    relist = _relist(config.relist)
    for key in relist:
        worker.arrive(key, LOW)
    worker.run(until=math.inf)
    waits = [worker.waited[f"default/edit-{i:05d}"] for i in range(edits)]
    return LatencyRow(
        mode=mode,
        edits=edits,
        edit_p50=percentile(waits, 50),
        edit_p99=percentile(waits, 99),
        edit_max=max(waits, default=0.0),
        relist_done=max(worker.waited[key] for key in relist),  # all added at t=0
    )


def _stream_run(config: FairnessConfig, mode: str) -> list[StreamRow]:
    clock = FakeClock()
    aging = config.aging if mode == "aging" else None
    queue: WorkQueue[str] = WorkQueue("fairness", clock=clock, aging=aging)
    count = int(config.duration / config.service) + 2  # outlasts the run
    # One priority-1 key per service time, the first at t=0 and then each half way
    # through a service: the worker's whole capacity.
    arrivals = (
        (0.0 if i == 0 else (i - 0.5) * config.service, f"default/stream-{i:07d}", HIGH)
        for i in range(count)
    )
    waiting_then: list[int] = []  # keys waiting when the relist's credit caught up

    def on_time(now: float) -> None:
        if aging is not None and not waiting_then and now >= (HIGH - LOW) * aging:
            waiting_then.append(queue.stats().depth)

    worker = _Worker(queue, clock, config.service, arrivals, on_time)
    relist = _relist(config.relist)
    for key in relist:
        worker.arrive(key, LOW)
    worker.advance_to(0.0)  # the stream's first key, with the relist
    rows = []
    for at in (config.duration / 2, config.duration):
        worker.run(until=at)
        served = [worker.waited[key] for key in relist if key in worker.waited]
        unserved = clock.now() if len(served) < len(relist) else 0.0  # added at t=0
        stream = [w for key, w in worker.waited.items() if key.startswith("default/stream-")]
        bound = None
        if waiting_then:
            # No key arriving after (P_max - p) * aging ranks ahead of a relist key;
            # what waited then (and the key in service) is served before it.
            bound = (HIGH - LOW) * config.aging + (waiting_then[0] + 1) * config.service
        rows.append(
            StreamRow(
                mode=mode,
                at=at,
                relist_served=len(served),
                relist_tail=max(max(served, default=0.0), unserved),
                stream_p99=percentile(stream, 99),
                bound=bound,
            )
        )
    return rows


def _namespace(key: str) -> str:
    return key.split("/", 1)[0]


def _tenant_run(config: FairnessConfig, fair: bool) -> TenantRow:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue("fairness", clock=clock, fair_by=_namespace if fair else None)
    edits = int(config.relist * config.service / config.edit_every)
    offset = config.service / 3  # mid-service, as in (a)
    edit_keys = [f"team-b/edit-{i:05d}" for i in range(edits)]
    arrivals = (((i + 1) * config.edit_every + offset, key, LOW) for i, key in enumerate(edit_keys))
    worker = _Worker(queue, clock, config.service, arrivals)
    relist = _relist(config.relist)
    for key in relist:
        worker.arrive(key, LOW)
    worker.run(until=math.inf)
    waits = [worker.waited[key] for key in edit_keys]
    return TenantRow(
        mode="fair_by namespace" if fair else "plain (FIFO)",
        edits=edits,
        edit_p50=percentile(waits, 50),
        edit_p99=percentile(waits, 99),
        edit_max=max(waits, default=0.0),
        relist_done=max(worker.waited[key] for key in relist),  # all added at t=0
        # The other tenant has one key ahead of an edit at most, and one is in hand.
        bound=2 * config.service if fair else None,
    )


def _combined_run(config: FairnessConfig, fair: bool) -> CombinedRow:
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(
        "fairness", clock=clock, aging=config.aging, fair_by=_namespace if fair else None
    )
    edits = int(config.relist * config.service / config.edit_every)
    offset = config.service / 3  # mid-service, as in (a)
    edit_keys = [f"team-b/edit-{i:05d}" for i in range(edits)]
    edit_arrivals = (
        ((i + 1) * config.edit_every + offset, key, LOW) for i, key in enumerate(edit_keys)
    )
    stream = (  # as (a)'s stream: the worker's full capacity, for as long as the run
        (0.0 if i == 0 else (i - 0.5) * config.service, f"team-c/stream-{i:08d}", HIGH)
        for i in itertools.count()
    )
    aged = (HIGH - LOW) * config.aging
    stream_then: list[int] = []  # priority-1 keys waiting when the relist aged past them

    def on_time(now: float) -> None:
        if not stream_then and now >= aged:
            stream_then.append(queue.stats().waiting_by_priority.get(HIGH, 0))

    worker = _Worker(queue, clock, config.service, heapq.merge(edit_arrivals, stream), on_time)
    relist = _relist(config.relist)
    for key in relist:
        worker.arrive(key, LOW)
    worker.advance_to(0.0)
    until = aged
    while any(key not in worker.waited for key in (*relist, *edit_keys)):
        until += aged + (config.relist + 2 * edits) * config.service
        worker.run(until=until)
    waits = [worker.waited[key] for key in edit_keys]
    return CombinedRow(
        mode="aging + fair_by namespace" if fair else "aging",
        edits=edits,
        edit_p50=percentile(waits, 50),
        edit_max=max(waits, default=0.0),
        edits_done=max((worker.added[k] + worker.waited[k] for k in edit_keys), default=0.0),
        relist_done=max(worker.waited[key] for key in relist),  # all added at t=0
        bound=aged + (stream_then[0] + 1 + 2 * edits) * config.service if fair else None,
    )


# -- (b) endpoints ----------------------------------------------------------------------


def _endpoint(key: str) -> str:
    return key.split("/", 1)[0]


def _endpoint_run(
    config: FairnessConfig, name: str, limiter: RateLimiter, clock: FakeClock
) -> EndpointRow:
    queue: WorkQueue[str] = WorkQueue("endpoints", clock=clock, rate_limiter=limiter)
    b_delays: list[float] = []

    def on_event(event: Event[str]) -> None:
        if event.kind is EventKind.RATE_LIMIT and event.key.startswith("b/"):
            assert event.duration is not None
            b_delays.append(event.duration)

    queue.subscribe(on_event)
    failed_once: set[str] = set()
    calls_to_a = first_second = 0
    for i in range(config.failing):
        queue.add(f"a/obj-{i:05d}")
    next_b = 1.0  # a B key fails once every second
    b_index = 0
    while clock.now() < config.endpoint_duration:
        if clock.now() >= next_b:
            queue.add(f"b/obj-{b_index:05d}")
            b_index += 1
            next_b += 1.0
        while True:
            try:
                key = queue.get_nowait()
            except Empty:
                break
            if key.startswith("a/"):
                calls_to_a += 1
                if clock.now() < 1.0:
                    first_second += 1
                queue.retry(key)  # A keeps failing
            elif key not in failed_once:
                failed_once.add(key)  # B's one transient failure
                queue.retry(key)
            else:
                queue.forget(key)
            queue.done(key)
        clock.step(TICK)
    queue.shutdown()
    return EndpointRow(
        limiter=name,
        calls_to_a=calls_to_a,
        a_calls_first_second=first_second,
        b_failures=len(b_delays),
        b_delay_p50=percentile(b_delays, 50),
        b_delay_max=max(b_delays, default=0.0),
    )


def _endpoint_runs(config: FairnessConfig) -> list[EndpointRow]:
    rows = []
    variants: list[tuple[str, Callable[[FakeClock], RateLimiter]]] = [
        ("per-key backoff only", lambda clock: ItemExponentialFailureRateLimiter(BASE, CAP)),
        (
            "per-key + one bucket (client-go's default)",
            lambda clock: MaxOfRateLimiter(
                ItemExponentialFailureRateLimiter(BASE, CAP), BucketRateLimiter(QPS, BURST, clock)
            ),
        ),
        (
            "per-key + a bucket per endpoint",
            lambda clock: MaxOfRateLimiter(
                ItemExponentialFailureRateLimiter(BASE, CAP),
                EndpointRateLimiter(_endpoint, QPS, BURST, clock),
            ),
        ),
    ]
    for name, make in variants:
        clock = FakeClock()
        rows.append(_endpoint_run(config, name, make(clock), clock))
    return rows


def run_fairness(config: FairnessConfig | None = None) -> FairnessResult:
    """Both simulations, with ``config`` (the defaults without one)."""
    config = FairnessConfig() if config is None else config
    latency = [
        _latency_run(config, mode)
        for mode in ("FIFO (no priorities)", "strict priorities", "aging")
    ]
    stream = _stream_run(config, "strict priorities") + _stream_run(config, "aging")
    return FairnessResult(
        config=config,
        high=HIGH,
        low=LOW,
        latency=tuple(latency),
        stream=tuple(stream),
        aging_wait_part=(HIGH - LOW) * config.aging,
        tenants=(_tenant_run(config, fair=False), _tenant_run(config, fair=True)),
        combined=(_combined_run(config, fair=False), _combined_run(config, fair=True)),
        endpoints=tuple(_endpoint_runs(config)),
        failing_endpoint_qps=QPS,
        failing_endpoint_burst=BURST,
    )
