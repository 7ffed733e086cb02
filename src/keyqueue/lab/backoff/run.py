"""``keyqueue lab backoff``: what the rate limiters do, computed by running them.

Nothing here is a formula copied from the limiters: the per-key table asks a
real ``ItemExponentialFailureRateLimiter`` for each attempt's delay, and the
thundering herd makes N keys fail at once on a real ``WorkQueue`` with the
default controller limiter, both on a ``FakeClock``. So the numbers are the
library's own, exact, and computed instantly.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from keyqueue import (
    Event,
    EventKind,
    ItemExponentialFailureRateLimiter,
    WorkQueue,
    default_controller_rate_limiter,
)
from keyqueue.testing import FakeClock

__all__ = [
    "BackoffResult",
    "BackoffRow",
    "HerdResult",
    "MAX_AUTO_ATTEMPTS",
    "backoff_table",
    "run_backoff",
    "thundering_herd",
]

MAX_AUTO_ATTEMPTS = 64
"""Without ``attempts``, the table stops two rows after the cap, or here."""

# The default controller limiter's token bucket (documented in docs/queue.md).
DEFAULT_QPS = 10.0
DEFAULT_BURST = 100


@dataclass(frozen=True, slots=True)
class BackoffRow:
    attempt: int
    """The key's N-th failure in a row."""
    delay: float
    """Seconds the limiter makes it wait before the next try."""
    total: float
    """Seconds waited over attempts 1..N."""
    capped: bool
    """The delay is the cap."""


@dataclass(frozen=True, slots=True)
class HerdResult:
    keys: int
    """Distinct keys that failed at the same instant."""
    qps: float
    burst: int
    readds_per_second: tuple[int, ...]
    """Index s: keys re-added during (s, s+1] seconds after the failure."""
    first_readd: float
    last_readd: float
    within_burst: int
    """Keys re-added after only their per-key delay (the bucket had a token)."""


@dataclass(frozen=True, slots=True)
class BackoffResult:
    base: float
    cap: float
    rows: tuple[BackoffRow, ...]
    cap_attempt: int | None
    """The first attempt whose delay is the cap (None if the table does not reach it)."""
    herd: HerdResult

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def backoff_table(base: float, cap: float, attempts: int | None = None) -> list[BackoffRow]:
    """Ask an ``ItemExponentialFailureRateLimiter(base, cap)`` for each attempt's delay.

    ``attempts=None``: until two rows past the cap, at most ``MAX_AUTO_ATTEMPTS``.
    """
    limiter = ItemExponentialFailureRateLimiter(base, cap)
    limit = MAX_AUTO_ATTEMPTS if attempts is None else attempts
    rows: list[BackoffRow] = []
    total = 0.0
    capped_rows = 0
    for attempt in range(1, limit + 1):
        delay = limiter.when("key")
        total += delay
        capped = delay >= cap
        rows.append(BackoffRow(attempt, delay, total, capped))
        capped_rows += capped
        if attempts is None and capped_rows == 3:
            break
    return rows


def thundering_herd(keys: int) -> HerdResult:
    """Fail ``keys`` distinct keys at t=0 through the default controller limiter.

    A ``WorkQueue`` on a ``FakeClock`` takes every failure with
    ``add_rate_limited``; the clock then steps one second at a time and the
    queue's own ENQUEUE events say how many keys came back in each second.
    """
    if keys < 1:
        raise ValueError(f"keys must be >= 1, got {keys!r}")
    clock = FakeClock()
    queue: WorkQueue[str] = WorkQueue(
        "herd", rate_limiter=default_controller_rate_limiter(clock), clock=clock
    )
    backoffs: list[float] = []
    readds: list[int] = []

    def on_event(event: Event[str]) -> None:
        if event.kind is EventKind.RATE_LIMIT:
            assert event.duration is not None
            backoffs.append(event.duration)
        elif event.kind is EventKind.ENQUEUE:
            second = int(event.time) - 1  # stepping whole seconds: released in (s-1, s]
            while len(readds) <= second:
                readds.append(0)
            readds[second] += 1

    queue.subscribe(on_event)
    for i in range(keys):
        queue.add_rate_limited(f"default/pod-{i:05d}")
    while queue.stats().delayed:
        clock.step(1.0)
    queue.shutdown()
    if sum(readds) != keys:  # every key came back exactly once
        raise AssertionError(f"herd: {sum(readds)} re-adds for {keys} keys")
    per_key_first = min(backoffs)
    return HerdResult(
        keys=keys,
        qps=DEFAULT_QPS,
        burst=DEFAULT_BURST,
        readds_per_second=tuple(readds),
        first_readd=per_key_first,
        last_readd=max(backoffs),
        within_burst=sum(1 for b in backoffs if b <= per_key_first),
    )


def run_backoff(
    base: float, cap: float, attempts: int | None = None, herd_keys: int = 500
) -> BackoffResult:
    """The per-key table for ``base``/``cap`` and a herd of ``herd_keys`` keys."""
    rows = backoff_table(base, cap, attempts)
    cap_attempt = next((row.attempt for row in rows if row.capped), None)
    return BackoffResult(
        base=base,
        cap=cap,
        rows=tuple(rows),
        cap_attempt=cap_attempt,
        herd=thundering_herd(herd_keys),
    )
