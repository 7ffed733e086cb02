"""The health of a queue, read from its snapshots: the one verdict ``top`` and the dashboard show.

Theory of operation
-------------------
A ``Health`` is fed one ``Reading`` per refresh (a ``Snapshot``, plus what
``probe`` reads beside it on Redis: the shared retry bucket and the last
delayed key) and answers a ``Verdict``: every ``Finding`` that holds, worst
first, or one that says the queue keeps up (or is idle). ``keyqueue top``
and ``keyqueue dashboard`` both call it, so they say the same thing about
the same state, in the same words.

**The window.** Trends are taken over the readings of the last ``WINDOW``
(60) seconds, and only once they span ``MIN_SPAN`` (10) seconds. One
reading a second makes two per-second rates that cross and uncross by
chance on a steady queue (96.4 keys/s arrive, 96.3/s are reconciled, then
the other way round): comparing them flaps. A minute averages that noise
out, and still shows a real backlog within it: a queue that gains one key a
second has gained 60. A verdict also never rests on rates alone: a queue
falls behind only when what waits *really grows*, which rates cannot say
once coalescing absorbs adds.

**Really grows.** Depth (and, alike, the oldest wait and the delayed keys)
grows when the mean of the window's last third exceeds the mean of its first
third by more than a tolerance: ``GROWTH_KEYS`` keys and ``GROWTH_FRACTION``
of where it started (``GROWTH_SECONDS`` for the oldest wait). Thirds, not
the first and last readings, so one noisy reading moves nothing. Once
behind, the queue is behind until the growth falls under half the
tolerance (hysteresis), so a verdict near the threshold does not flap either.

**What a snapshot shows at once.** Some trouble needs no trend, and each
has its own reading rather than "idle": held keys past their lease (their
holders stopped renewing: dead or paused), delayed keys past due that
nobody moved to waiting (a worker's ``get`` does that: none is calling it),
and keys waiting while no client holds any (``NO_WORKER_WAIT`` seconds for
the oldest: idle workers take a waiting key at once).

**Retry debt.** Failed keys come back through the rate limiter. On Redis
its shared bucket (default 10 retries a second) is the queue-wide cap: when
failures outrun it the bucket goes into debt, every new retry waits for a
token rather than its own backoff, and the delayed keys pile up. The
finding says so: delayed keys growing, the bucket in debt (read beside the
snapshot), and the longest backoff (when the last delayed key comes due).

**Resets.** A counter that goes down (a server restarted without its data,
a queue deleted and made again) is a reset: the window starts again from
that reading, and no rate is taken across it, so no rate is negative.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from keyqueue import Snapshot, Stats

from .._console.format import count, counted, duration, number

__all__ = [
    "GROWTH_FRACTION",
    "GROWTH_KEYS",
    "GROWTH_SECONDS",
    "LEASE_GRACE",
    "MIN_SPAN",
    "NO_WORKER_WAIT",
    "OVERDUE_AFTER",
    "STALL_SPAN",
    "WINDOW",
    "Finding",
    "Health",
    "Probe",
    "Rates",
    "Reading",
    "Verdict",
    "counters_reset",
    "error_verdict",
    "rates",
]

WINDOW = 60.0
"""Seconds of readings a trend is taken over (see the module docstring: why a minute)."""
MIN_SPAN = 10.0
"""Seconds the readings must span before any trend is read."""
GROWTH_KEYS = 10
"""Keys by which the window's last third must exceed its first for depth or delayed to grow."""
GROWTH_FRACTION = 0.25
"""And by this fraction of the first third's mean (a large queue's noise is larger)."""
GROWTH_SECONDS = 5.0
"""Seconds by which the oldest wait must grow (and ``GROWTH_FRACTION`` of it)."""
NO_WORKER_WAIT = 5.0
"""Seconds the oldest key waits, with no key held, before "no worker" is said."""
OVERDUE_AFTER = 1.0
"""Seconds past due before a delayed key counts as overdue (promotion is not instant)."""
LEASE_GRACE = 1.0
"""Seconds past its lease before a held key counts as abandoned."""
STALL_SPAN = 30.0
"""Seconds with keys held, keys waiting and no ``done`` before "stalled" is said
(a handler may take long; half a window of none finishing while others wait
is worth a look)."""

_COUNTERS = (
    "adds",
    "enqueued",
    "coalesced",
    "marked_while_processing",
    "redeliveries",
    "gets",
    "dones",
    "retries",
    "rate_limited",
    "queue_wait_seconds",
    "work_seconds",
    "leases_expired",
    "leases_lost",
)
"""The counters that only grow while a queue lives (the last two on Redis only)."""

# The findings, worst first: the verdict's first finding is its headline.
_SEVERITY = (
    "error",
    "expired-leases",
    "no-workers",
    "overdue",
    "stalled",
    "behind",
    "retry-debt",
    "starting",
    "keeping-up",
    "idle",
)


def counters_reset(before: Stats, after: Stats) -> bool:
    """True when a counter went down from ``before`` to ``after``: a reset."""
    return any(
        getattr(after, name, 0) < getattr(before, name, 0)
        for name in _COUNTERS
        if hasattr(after, name)
    )


@dataclass(frozen=True, slots=True)
class Rates:
    """Per second over an interval, from two readings' counters."""

    adds: float
    gets: float
    dones: float
    failures: float
    """Failed keys coming back through the rate limiter (``retry``,
    ``add_rate_limited``, expired leases): the ``rate_limited`` counter."""
    arrive: float
    """Distinct keys entering waiting (``enqueued + redeliveries``)."""
    mean_work: float | None
    """Mean seconds held per ``done`` in the interval (None: no done)."""


def rates(before: Stats, after: Stats, seconds: float) -> Rates | None:
    """The rates between two readings ``seconds`` apart (server time); None
    across a reset (a counter went down) or when no time passed."""
    if seconds <= 0 or counters_reset(before, after):
        return None
    dones = after.dones - before.dones
    worked = after.work_seconds - before.work_seconds
    return Rates(
        adds=(after.adds - before.adds) / seconds,
        gets=(after.gets - before.gets) / seconds,
        dones=dones / seconds,
        failures=(after.rate_limited - before.rate_limited) / seconds,
        arrive=(after.enqueued + after.redeliveries - before.enqueued - before.redeliveries)
        / seconds,
        mean_work=worked / dones if dones > 0 else None,
    )


@dataclass(frozen=True, slots=True)
class Probe:
    """What a Redis snapshot does not carry, read beside it (``keyqueue.ops.probe``)."""

    bucket_tokens: float | None = None
    """Tokens the shared retry bucket had left at its last take (negative: in
    debt, each new retry waits for a token); None: no bucket state."""
    bucket_last: float | None = None
    """Server time of that take."""
    last_due: float | None = None
    """Server time the last delayed key comes due; None: none delayed."""
    buckets: int = 1
    """How many buckets were read: a sharded queue's shards each have one
    (``bucket_tokens`` is then their debts summed)."""


@dataclass(frozen=True, slots=True)
class Reading:
    """One snapshot's numbers that the verdict reads."""

    at: float
    """The server's time of the snapshot (``taken_at``)."""
    stats: Stats
    overdue: int = 0
    """Delayed keys more than ``OVERDUE_AFTER`` past due, among the rows read."""
    most_overdue: float = 0.0
    """Seconds past due of the most overdue one."""
    expired: int = 0
    """Held keys more than ``LEASE_GRACE`` past their lease, among the rows read."""
    most_expired: float = 0.0
    """Seconds past its lease of the first to run out."""
    rows_cut: bool = False
    """The snapshot held fewer delayed or held rows than there are (counts are "at least")."""
    probe: Probe = Probe()

    @classmethod
    def of(cls, snap: Snapshot[Any], probe: Probe | None = None) -> Reading:
        """The reading of ``snap`` (and of ``probe``, read beside it)."""
        late = [-d.due_in for d in snap.delayed if d.due_in < -OVERDUE_AFTER]
        gone = [
            -h.lease_left
            for h in snap.processing
            if h.lease_left is not None and h.lease_left < -LEASE_GRACE
        ]
        s = snap.stats
        return cls(
            at=snap.taken_at,
            stats=s,
            overdue=len(late),
            most_overdue=max(late, default=0.0),
            expired=len(gone),
            most_expired=max(gone, default=0.0),
            rows_cut=len(snap.delayed) < s.delayed or len(snap.processing) < s.processing,
            probe=probe or Probe(),
        )

    @property
    def longest_backoff(self) -> float | None:
        """Seconds until the last delayed key comes due (None: unknown or none delayed)."""
        last = self.probe.last_due
        if last is None or self.stats.delayed == 0:
            return None
        return max(0.0, last - self.at)


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing that holds of the queue: ``state`` (a stable word) and a sentence."""

    state: str
    text: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """Every finding that holds, worst first (never empty): the first is the headline."""

    findings: tuple[Finding, ...]
    rates: Rates | None
    """Over the last interval (None: the first reading, or a reset)."""
    window: Rates | None
    """Over the window (None: it spans no time yet)."""
    span: float
    """Seconds the window's readings span."""
    reset_at: float | None
    """Server time of the last counter reset seen (None: none)."""
    longest_backoff: float | None
    """Seconds until the last delayed key comes due (None: unknown, or none delayed)."""

    @property
    def state(self) -> str:
        """The headline's state: the worst finding's."""
        return self.findings[0].state

    @property
    def text(self) -> str:
        """The headline: the worst finding's sentence."""
        return self.findings[0].text

    @property
    def states(self) -> list[str]:
        """Every finding's state, worst first (``top --plain``'s ``health=``)."""
        return [f.state for f in self.findings]

    def as_dict(self) -> dict[str, Any]:
        """What the dashboard's page gets: the headline and every finding."""
        return {
            "state": self.state,
            "text": self.text,
            "findings": [{"state": f.state, "text": f.text} for f in self.findings],
        }


def _thirds(values: Sequence[float]) -> tuple[float, float]:
    """The means of the first and the last third of ``values`` (at least one each)."""
    n = max(1, len(values) // 3)
    return sum(values[:n]) / n, sum(values[-n:]) / n


def _growth(values: Sequence[float], floor: float) -> tuple[float, float, float]:
    """(first third's mean, last third's mean, the tolerance it must grow by)."""
    first, last = _thirds(values)
    return first, last, max(floor, GROWTH_FRACTION * first)


def error_verdict(message: str) -> Verdict:
    """The verdict on a queue that cannot be read."""
    return Verdict((Finding("error", message),), None, None, 0.0, None, None)


class Health:
    """The verdict on one queue from its readings over the last ``window`` seconds."""

    def __init__(self, window: float = WINDOW) -> None:
        self.window = window
        self.readings: deque[Reading] = deque()
        self.reset_at: float | None = None
        self._behind = False

    def update(self, reading: Reading) -> Verdict:
        """Take ``reading`` (newer than the last) and answer the verdict."""
        last = self.readings[-1] if self.readings else None
        if last is not None and counters_reset(last.stats, reading.stats):
            self.readings.clear()
            self.reset_at = reading.at
            self._behind = False
            last = None
        self.readings.append(reading)
        while len(self.readings) > 2 and self.readings[0].at < reading.at - self.window:
            self.readings.popleft()
        first = self.readings[0]
        span = reading.at - first.at
        step = None if last is None else rates(last.stats, reading.stats, reading.at - last.at)
        window = rates(first.stats, reading.stats, span)
        findings = sorted(
            self._findings(reading, window, span),
            key=lambda f: _SEVERITY.index(f.state),
        )
        return Verdict(tuple(findings), step, window, span, self.reset_at, reading.longest_backoff)

    def _findings(self, now: Reading, window: Rates | None, span: float) -> Iterable[Finding]:
        s = now.stats
        trends = span >= MIN_SPAN and len(self.readings) >= 3
        at_least = "at least " if now.rows_cut else ""
        found: list[Finding] = []
        if now.expired:
            found.append(
                Finding(
                    "expired-leases",
                    f"Leases run out: {at_least}{counted(now.expired, 'held key')} past "
                    f"{'its' if now.expired == 1 else 'their'} lease (the first by "
                    f"{duration(now.most_expired)}): the holder stopped renewing (gone, or "
                    "paused). A worker's next get takes them back.",
                )
            )
        no_workers = s.depth > 0 and s.processing == 0 and s.oldest_wait_seconds >= NO_WORKER_WAIT
        if no_workers:
            found.append(
                Finding(
                    "no-workers",
                    f"No worker is taking keys: {counted(s.depth, 'key')} "
                    f"{'waits' if s.depth == 1 else 'wait'}, the oldest for "
                    f"{duration(s.oldest_wait_seconds)}, and no client holds one. Are the "
                    "workers running?",
                )
            )
        if now.overdue:
            found.append(
                Finding(
                    "overdue",
                    f"Overdue: {at_least}{counted(now.overdue, 'delayed key')} "
                    f"{'is' if now.overdue == 1 else 'are'} past due (the first by "
                    f"{duration(now.most_overdue)}) and no client moved "
                    f"{'it' if now.overdue == 1 else 'them'} to waiting: a worker's get does "
                    "that. Are the workers running, or all busy?",
                )
            )
        if (
            span >= STALL_SPAN
            and window is not None
            and s.depth > 0
            and s.processing > 0
            and self.readings[0].stats.processing > 0
            and window.dones == 0
            and not now.expired
        ):
            found.append(
                Finding(
                    "stalled",
                    f"Stalled: {counted(s.processing, 'key')} held, none done in the last "
                    f"{_span(span)}, and {counted(s.depth, 'key')} waiting behind them: are "
                    "the handlers stuck?",
                )
            )
        if trends and not no_workers and (behind := self._falling_behind(window, span)):
            found.append(behind)
        if debt := self._retry_debt(now, window, span, trends):
            found.append(debt)
        if not found:
            found.append(self._steady(now, window, span, trends))
        return found

    def _falling_behind(self, window: Rates | None, span: float) -> Finding | None:
        depth = [float(r.stats.depth) for r in self.readings]
        wait = [r.stats.oldest_wait_seconds for r in self.readings]
        d0, d1, d_tol = _growth(depth, GROWTH_KEYS)
        w0, w1, w_tol = _growth(wait, GROWTH_SECONDS)
        scale = 0.5 if self._behind else 1.0  # hysteresis: leave at half the tolerance
        self._behind = d1 - d0 >= d_tol * scale or w1 - w0 >= w_tol * scale
        if not self._behind:
            return None
        rates_text = ""
        if window is not None:
            rates_text = (
                f"; {number(window.arrive, 3)} distinct keys/s arrive and "
                f"{number(window.dones, 3)}/s are reconciled"
            )
        return Finding(
            "behind",
            f"Falling behind: waiting went from {count(d0)} to {count(d1)} keys and the "
            f"oldest wait from {duration(w0)} to {duration(w1)} over the last "
            f"{_span(span)}{rates_text}. Look at the mean work time and the retries "
            "before adding workers.",
        )

    def _retry_debt(
        self, now: Reading, window: Rates | None, span: float, trends: bool
    ) -> Finding | None:
        s = now.stats
        delayed = [float(r.stats.delayed) for r in self.readings]
        x0, x1, tol = _growth(delayed, GROWTH_KEYS)
        growing = trends and x1 - x0 >= tol
        probe = now.probe
        in_debt = (
            probe.bucket_tokens is not None
            and probe.bucket_tokens < 0
            and probe.bucket_last is not None
            and now.at - probe.bucket_last <= self.window
            and s.delayed > 0
        )
        if not (growing or in_debt):
            return None
        parts = []
        if growing:
            parts.append(
                f"delayed keys went from {count(x0)} to {count(x1)} over the last {_span(span)}"
            )
        else:
            parts.append(f"{counted(s.delayed, 'key')} delayed")
        if window is not None and window.failures > 0:
            parts.append(f"{number(window.failures, 3)} failures/s come back through the limiter")
        if in_debt and probe.bucket_tokens is not None:
            owed = math.ceil(-probe.bucket_tokens)
            bucket = (
                "the shared retry bucket is"
                if probe.buckets == 1
                else f"the shards' retry buckets ({probe.buckets}) are"
            )
            parts.append(
                f"{bucket} {counted(owed, 'token')} in debt, so each new "
                "retry waits for a token, not for its own backoff"
            )
        backoff = now.longest_backoff
        if backoff is not None:
            parts.append(f"the longest backoff is {duration(backoff)}")
        return Finding(
            "retry-debt",
            "Retry debt: "
            + "; ".join(parts)
            + ". Fix what fails, or give the limiter a larger bucket.",
        )

    def _steady(self, now: Reading, window: Rates | None, span: float, trends: bool) -> Finding:
        s = now.stats
        quiet = window is None or (window.adds == 0 and window.dones == 0)
        if s.depth == 0 and s.processing == 0 and s.delayed == 0 and quiet:
            return Finding(
                "idle",
                "Idle: nothing waits, is held or delayed"
                + (f", and nothing arrived in the last {_span(span)}." if span > 0 else "."),
            )
        waiting = (
            f"{counted(s.depth, 'key')} {'waits' if s.depth == 1 else 'wait'}, the oldest for "
            f"{duration(s.oldest_wait_seconds)}"
            if s.depth
            else "nothing waits"
        )
        if window is None:
            return Finding("starting", f"Starting: {waiting}; rates from the next reading on.")
        rates_text = (
            f"{number(window.dones, 3)}/s reconciled against {number(window.arrive, 3)} "
            f"distinct keys/s arriving over the last {_span(span)}"
        )
        if not trends:
            return Finding(
                "starting",
                f"Starting: {rates_text}; {waiting}. A verdict once "
                f"{duration(MIN_SPAN)} of readings are in.",
            )
        return Finding("keeping-up", f"Keeping up: {rates_text}; {waiting}.")


def _span(seconds: float) -> str:
    """A window's span, to the second from 1 s on (readings come about a second apart)."""
    return duration(round(seconds) if seconds >= 1 else seconds)
