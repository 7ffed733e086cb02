"""The live key trace: a real ``AsyncWorkQueue``, a few workers, its events as lines.

Theory of operation
-------------------
Everything runs on the server's event loop, so nothing here needs a lock: the
queue, its workers, the HTTP handlers that add keys, and the ``subscribe``
callback that turns each transition into a log line in the seed's words and
into the page's picture of each key.

That picture is built from the queue's events alone, as any subscriber could
build it (DESIGN rule 3): ENQUEUE → waiting, MARK_WHILE_PROCESSING →
processing + pending, GET → processing, DONE → absent, or for a pending key
the REDELIVER that follows it → waiting. The FIFO is the ENQUEUE and REDELIVER
order minus the GETs. The ``Get``/``Done`` lines come from the reconcile
itself, which knows its worker.

Workers: one ``arun_workers(workers=1)`` per worker, each with its own stop
event, so the count can change while a key is held (a stopped worker finishes
its key, then exits). Holds make the trace deterministic: "Hold" makes a key's
next reconcile wait until "Release", so a reader (or a test) can add the key
while it is held and watch REQUEUE-WHILE-PROCESSING, COALESCED, then exactly one
REDELIVERY, without racing a timer.

Every change bumps ``rev``; a page's event stream sends the lines changed since
the rev it last saw, plus the whole (small) snapshot.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import statistics
from collections import deque
from dataclasses import dataclass
from typing import Any

from keyqueue import (
    AsyncWorkQueue,
    Event,
    EventKind,
    ItemExponentialFailureRateLimiter,
    arun_workers,
)

__all__ = ["LIMITER_BASE", "LIMITER_CAP", "TIMES", "LiveLab", "SimulatedFailure"]

# This queue's backoff is slower than client-go's 5 ms so that it can be watched.
LIMITER_BASE = 0.25
LIMITER_CAP = 10.0

MAX_KEY_LENGTH = 100
MAX_BURST = 10_000
MAX_FAILURES = 20
MAX_WORKERS = 16
MAX_RECONCILE = 60.0
TIMES = "\u00d7"
"""Marks the repeat count on a COALESCED line that stands for several adds in a row."""
MAX_LINES = 500
"""Log lines kept (the page keeps the same number)."""
MAX_KEYS = 40
"""Key rows kept; the oldest idle ones go first."""
SAMPLES = 200
"""Queue waits and reconcile times the p50s are taken over."""

ABSENT, WAITING, PROCESSING, PENDING = "absent", "waiting", "processing", "processing + pending"

# Line tags: the seed's words, as ``lab slowmo`` prints them; each queue tag is
# named after the Stats counter it adds one to (the seed's DEDUP is COALESCED).
ENQUEUE, COALESCED, MARK, REDELIVERY, RATELIMIT, DELAY, WORKER = (
    "ENQUEUE",
    "COALESCED",
    "REQUEUE-WHILE-PROCESSING",
    "REDELIVERY",
    "RATELIMIT",
    "DELAY",
    "WORKER",
)


class SimulatedFailure(Exception):
    """The lab's stand-in for a reconcile that failed."""


def _duration(seconds: float) -> str:
    return f"{seconds * 1000:.4g}ms" if seconds < 1 else f"{seconds:.4g}s"


@dataclass(slots=True)
class Line:
    n: int
    t: float
    tag: str
    key: str
    text: str
    rev: int
    """The lab's rev when this line last changed (a COALESCED line counts repeats)."""
    count: int = 1
    reason: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"n": self.n, "t": round(self.t, 3), "tag": self.tag, "key": self.key,
                "text": self.text}  # fmt: skip


@dataclass(slots=True)
class KeyRow:
    state: str = ABSENT
    worker: int | None = None
    """The worker running this key's reconcile (from its Get line to its Done line)."""
    held: bool = False
    hold_next: bool = False
    fail_next: int = 0
    retry_at: float | None = None
    """Queue-clock time a DELAY/RATELIMIT entry comes due (display only)."""


@dataclass(slots=True)
class _Worker:
    number: int
    stop: asyncio.Event
    task: asyncio.Task[None] | None = None


def check_key(key: object) -> str:
    """A key from the page: a non-empty string of at most ``MAX_KEY_LENGTH`` characters."""
    if not isinstance(key, str) or not key.strip():
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    key = key.strip()
    if len(key) > MAX_KEY_LENGTH:
        raise ValueError(f"key must be at most {MAX_KEY_LENGTH} characters, got {len(key)}")
    return key


def check_int(name: str, value: object, low: int, high: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
    return value


class LiveLab:
    """The queue the page watches. Create, ``start`` and ``close`` it on one running loop.

    Every method is a plain call on that loop (the server's handlers); bad
    input raises ``ValueError`` naming the problem and changes nothing.
    """

    def __init__(self, *, workers: int = 2, reconcile: float = 0.8) -> None:
        self.check_options(workers, reconcile)
        self.id = secrets.token_hex(4)
        """Changes when the server restarts, so a page knows to drop its old log."""
        self.reconcile = reconcile
        self.rev = 0
        self.limiter = ItemExponentialFailureRateLimiter(LIMITER_BASE, LIMITER_CAP)
        self.queue: AsyncWorkQueue[str] = AsyncWorkQueue("lab-web", rate_limiter=self.limiter)
        self._clock = self.queue.clock
        self._start = self._clock.now()
        self._wanted_workers = workers
        self._workers: list[_Worker] = []  # running and stopping, by number
        self._lines: deque[Line] = deque(maxlen=MAX_LINES)
        self._keys: dict[str, KeyRow] = {}
        self._fifo: dict[str, None] = {}  # waiting keys, oldest first
        self._gates: dict[str, asyncio.Event] = {}  # held reconciles, by key
        self._waits: deque[float] = deque(maxlen=SAMPLES)
        self._works: deque[float] = deque(maxlen=SAMPLES)
        self._seq = 0
        self._changed = asyncio.Event()
        self.closing = False
        self.queue.subscribe(self._on_event)

    @staticmethod
    def check_options(workers: int, reconcile: float) -> None:
        """Raise ValueError unless ``workers`` and ``reconcile`` (seconds) are in range."""
        check_int("workers", workers, 1, MAX_WORKERS)
        if not 0 <= reconcile <= MAX_RECONCILE:
            raise ValueError(f"reconcile must be 0 to {MAX_RECONCILE:g} seconds, got {reconcile!r}")

    # -- lifecycle -----------------------------------------------------------------

    def start(self) -> None:
        self.set_workers(self._wanted_workers)

    def end_streams(self) -> None:
        """Make every ``wait_change`` return, now and from now on (the server is stopping)."""
        self.closing = True
        self._bump()

    async def close(self) -> None:
        """Shut the queue down, let held reconciles go, stop the workers."""
        self.end_streams()
        await self.queue.shutdown()
        for gate in self._gates.values():
            gate.set()
        tasks = [w.task for w in self._workers if w.task is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    # -- what the page asks ---------------------------------------------------------

    def add(self, key: object) -> None:
        self.queue.add(check_key(key))

    def burst(self, key: object, n: object) -> None:
        key, n = check_key(key), check_int("burst size", n, 1, MAX_BURST)
        add = self.queue.add
        for _ in range(n):
            add(key)

    def hold(self, key: object) -> None:
        """The key's next reconcile waits until ``release``."""
        self._row(check_key(key)).hold_next = True
        self._bump()

    def release(self, key: object) -> None:
        """Let the key's held reconcile finish (and drop a hold not yet used)."""
        key = check_key(key)
        gate = self._gates.get(key)
        row = self._keys.get(key)
        if gate is None and (row is None or not row.hold_next):
            raise ValueError(f"key {key!r} is not held")
        if gate is not None:
            gate.set()
        if row is not None:
            row.hold_next = False
        self._bump()

    def fail(self, key: object, n: object) -> None:
        """The key's next ``n`` reconciles fail (the runner retries them with backoff)."""
        key, n = check_key(key), check_int("failures", n, 0, MAX_FAILURES)
        self._row(key).fail_next = n
        self._bump()

    def configure(self, workers: object = None, reconcile_ms: object = None) -> None:
        """Set the worker count and/or the reconcile time (whole milliseconds)."""
        n = None if workers is None else check_int("workers", workers, 1, MAX_WORKERS)
        ms = (
            None
            if reconcile_ms is None
            else check_int("reconcile time (ms)", reconcile_ms, 0, int(MAX_RECONCILE * 1000))
        )
        if ms is not None:
            self.reconcile = ms / 1000
        if n is not None:
            self.set_workers(n)
        self._bump()

    def set_workers(self, n: int) -> None:
        """Run ``n`` workers: start new ones, or stop the highest-numbered ones."""
        check_int("workers", n, 1, MAX_WORKERS)
        self._wanted_workers = n
        running = [w for w in self._workers if not w.stop.is_set()]
        while len(running) > n:
            running.pop().stop.set()
        taken = {w.number for w in self._workers}
        number = 1
        while len(running) < n:
            while number in taken:
                number += 1
            worker = _Worker(number, asyncio.Event())
            worker.task = asyncio.get_running_loop().create_task(
                self._run_worker(worker), name=f"keyqueue-lab-web-worker-{number}"
            )
            self._workers.append(worker)
            self._workers.sort(key=lambda w: w.number)
            running.append(worker)
            taken.add(number)
        self._bump()

    # -- what the page sees ---------------------------------------------------------

    async def wait_change(self, rev: int, timeout: float) -> None:
        """Return once ``self.rev > rev``, the lab is closing, or ``timeout`` passes."""
        changed = self._changed
        if self.rev > rev or self.closing:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(changed.wait(), timeout)

    def snapshot(self, since: int = -1) -> dict[str, Any]:
        """The page's picture: lines changed after rev ``since``, and everything else."""
        now = self._clock.now()
        s = self.queue.stats()
        keys = []
        for key, row in self._keys.items():
            retry_in = None
            if row.retry_at is not None and row.retry_at > now:
                retry_in = round((row.retry_at - now) * 1000)
            keys.append(
                {
                    "key": key,
                    "state": row.state,
                    "worker": row.worker,
                    "held": row.held,
                    "hold_next": row.hold_next,
                    "fail_next": row.fail_next,
                    "retry_in_ms": retry_in,
                }
            )
        return {
            "lab": self.id,
            "rev": self.rev,
            "workers": self._wanted_workers,
            "reconcile_ms": round(self.reconcile * 1000),
            "limiter": {"base": LIMITER_BASE, "cap": LIMITER_CAP},
            "counters": {
                "adds": s.adds,
                "coalesced": s.coalesced,
                "marked_while_processing": s.marked_while_processing,
                "redeliveries": s.redeliveries,
                "depth": s.depth,
                "processing": s.processing,
                "delayed": s.delayed,
                "wait_p50_ms": _p50_ms(self._waits),
                "reconcile_p50_ms": _p50_ms(self._works),
            },
            "fifo": list(self._fifo),
            "keys": keys,
            "lines": [line.to_json() for line in self._lines if line.rev > since],
        }

    # -- inside ----------------------------------------------------------------------

    def _bump(self) -> None:
        self.rev += 1
        self._changed.set()
        self._changed = asyncio.Event()

    def _row(self, key: str) -> KeyRow:
        row = self._keys.get(key)
        if row is None:
            row = self._keys[key] = KeyRow()
            if len(self._keys) > MAX_KEYS:
                self._evict()
        return row

    def _evict(self) -> None:
        now = self._clock.now()
        for key, row in self._keys.items():
            idle = (
                row.state == ABSENT and row.worker is None and not (row.hold_next or row.fail_next)
            )
            if idle and (row.retry_at is None or row.retry_at <= now):
                del self._keys[key]
                return

    def _line(self, tag: str, key: str, text: str, reason: str = "") -> None:
        last = self._lines[-1] if self._lines else None
        if (
            tag == COALESCED
            and last is not None
            and (last.tag, last.key, last.reason) == (COALESCED, key, reason)
        ):
            last.count += 1
            last.text = f"{text} {TIMES}{last.count}"
            last.rev = self.rev + 1
            return
        n = self._lines[-1].n + 1 if self._lines else 1
        t = self._clock.now() - self._start
        self._lines.append(Line(n, t, tag, key, text, self.rev + 1, reason=reason))

    def _on_event(self, event: Event[str]) -> None:  # on the loop, in transition order
        kind, key = event.kind, event.key
        if kind is EventKind.SHUTDOWN:
            return
        row = self._row(key)
        if kind is EventKind.ENQUEUE:
            row.state = WAITING
            self._fifo[key] = None
            self._line(ENQUEUE, key, f"[{ENQUEUE}] key={key}")
        elif kind is EventKind.COALESCE:
            why = (
                "already waiting"
                if row.state == WAITING
                else f"held by WORKER-{row.worker}, redelivery already pending"
            )
            self._line(COALESCED, key, f"[{COALESCED}] key={key} ({why})", reason=why)
        elif kind is EventKind.MARK_WHILE_PROCESSING:
            row.state = PENDING
            self._line(
                MARK,
                key,
                f"[{MARK}] key={key} (held by WORKER-{row.worker}: one more Get after Done)",
            )
        elif kind is EventKind.REDELIVER:
            row.state = WAITING
            self._fifo[key] = None
            self._line(
                REDELIVERY, key, f"[{REDELIVERY}] key={key} (changed while held: queued once)"
            )
        elif kind is EventKind.GET:
            row.state = PROCESSING
            self._fifo.pop(key, None)
            if event.duration is not None:
                self._waits.append(event.duration)
        elif kind is EventKind.DONE:
            if row.state != PENDING:  # a pending key's REDELIVER comes next
                row.state = ABSENT
            if event.duration is not None:
                self._works.append(event.duration)
        elif kind in (EventKind.RATE_LIMIT, EventKind.DELAY):
            assert event.duration is not None
            due = event.time + event.duration
            if row.retry_at is None or row.retry_at <= event.time or due < row.retry_at:
                row.retry_at = due
            if kind is EventKind.RATE_LIMIT:
                attempt = self.limiter.num_requeues(key)
                text = f"attempt={attempt} backoff={_duration(event.duration)}"
                self._line(RATELIMIT, key, f"[{RATELIMIT}] key={key} {text}")
            else:
                self._line(DELAY, key, f"[{DELAY}] key={key} after={_duration(event.duration)}")
        self._bump()

    async def _run_worker(self, worker: _Worker) -> None:
        async def reconcile(key: str) -> None:
            await self._reconcile(worker.number, key)

        try:
            await arun_workers(self.queue, reconcile, workers=1, stop=worker.stop)
        finally:
            self._workers.remove(worker)

    async def _reconcile(self, worker: int, key: str) -> None:
        """The simulated reconcile: wait (or hold until released), then succeed or fail."""
        self._seq += 1
        seq = self._seq
        row = self._row(key)
        row.worker = worker
        tag = f"WORKER-{worker}"
        self._line(WORKER, key, f"[{tag}] key={key} Get seq={seq}")
        self._bump()
        try:
            if row.hold_next and not self.closing:
                row.hold_next, row.held = False, True
                gate = self._gates[key] = asyncio.Event()
                self._bump()
                try:
                    await gate.wait()
                finally:
                    del self._gates[key]
                    row.held = False
            else:
                await asyncio.sleep(self.reconcile)
            if row.fail_next:
                row.fail_next -= 1
                self._line(WORKER, key, f"[{tag}] key={key} Done seq={seq} result=ERROR → Retry")
                raise SimulatedFailure(key)
            self._line(WORKER, key, f"[{tag}] key={key} Done seq={seq} result=OK → Forget")
        finally:
            row.worker = None
            self._bump()


def _p50_ms(samples: deque[float]) -> float | None:
    return round(statistics.median(samples) * 1000, 1) if samples else None
