"""``keyqueue lab slowmo``: every transition of a few keys, one line each, in slow motion.

Theory of operation
-------------------
Lines come from two places. The queue's own transitions arrive through
``queue.subscribe``; each tag is named after the ``Stats`` counter that
transition adds one to: ENQUEUE (``enqueued``), COALESCED (``coalesced``),
REQUEUE-WHILE-PROCESSING (``marked_while_processing``), REDELIVERY
(``redeliveries``), RATELIMIT (``rate_limited``). The lab's handler adds a
line when a worker starts a key and when it ends it (``[WORKER-n] ... Get`` /
``Done``). One lock numbers the lines and hands them to the renderer, so
numbers are in print order; subscribers run under the queue's lock, so the
queue's lines are in transition order. Times are wall seconds since the start.

A renderer that raises (``BrokenPipeError`` once ``| head`` has what it
wanted) stops the run from whichever thread it raised in: the trace keeps the
error and sets the workers' stop event, and the calling thread, which never
waits without looking at that event, raises it.

Most of the run is left to the threads' timing, but one key, the proof key,
is scripted with two handshakes: the generator adds it again only once a
worker holds it, and that worker keeps holding it until the generator's burst
is over. So every run, at any speed, shows for that key one
REQUEUE-WHILE-PROCESSING, a COALESCED for each further add while held, then
exactly one REDELIVERY and one more Get. The summary does not assume this: it
finds the sequence in the trace (``find_proof``) and points at its lines.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from keyqueue import (
    Event,
    EventKind,
    ItemExponentialFailureRateLimiter,
    Stats,
    WorkQueue,
    run_workers,
)

from ..._console.format import number
from ..simulated import SimulatedFailure, quiet_simulated_give_ups

__all__ = [
    "PROOF_KEY",
    "Proof",
    "SlowmoConfig",
    "SlowmoResult",
    "TraceLine",
    "find_proof",
    "run_slowmo",
]

PROOF_KEY = "default/web"
API, DB, DNS = "default/api", "default/db", "kube-system/dns"
FAILING = {DB: 2}
"""Keys whose first N reconciles fail (then succeed)."""

# The generator's script, one "add" per tick; a "burst" adds at once, with no
# tick. "hold" waits until a worker holds the proof key; "release" lets that
# worker finish it.
_SCRIPT: tuple[tuple[str, str], ...] = (
    ("add", API),
    ("add", DB),
    ("add", DNS),
    ("add", API),
    ("add", API),
    ("add", PROOF_KEY),
    ("hold", PROOF_KEY),
    ("add", PROOF_KEY),  # held: REQUEUE-WHILE-PROCESSING
    ("add", DNS),
    ("add", PROOF_KEY),  # held and already marked: COALESCED
    ("add", API),
    ("add", PROOF_KEY),  # COALESCED again
    ("release", PROOF_KEY),
    ("add", DNS),
    ("add", API),
    ("add", DB),
    ("add", API),
    ("burst", DNS),  # both workers likely busy: DNS waits...
    ("burst", DNS),  # ...so these are coalesced into a waiting key
    ("burst", DNS),
    ("add", API),
)

# Line tags: the queue's, each named after the Stats counter it adds to, and the workers'.
ENQUEUE = "ENQUEUE"
COALESCED = "COALESCED"
MARK = "REQUEUE-WHILE-PROCESSING"
REDELIVERY = "REDELIVERY"
RATELIMIT = "RATELIMIT"
WORKER = "WORKER"


@dataclass(frozen=True, slots=True)
class SlowmoConfig:
    speed: float = 1.0
    """Time runs this many times faster than the slow-motion defaults."""
    workers: int = 2
    hold: float = 0.3
    """Seconds a worker holds a key (at speed 1)."""
    rate: float = 4.0
    """Generator events per second (at speed 1)."""

    def __post_init__(self) -> None:
        if not (self.speed > 0 and math.isfinite(self.speed)):
            raise ValueError(f"speed must be a finite number > 0, got {self.speed!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers!r}")
        if not (self.hold >= 0 and math.isfinite(self.hold)):
            raise ValueError(f"hold must be a finite number >= 0, got {self.hold!r}")
        if not (self.rate > 0 and math.isfinite(self.rate)):
            raise ValueError(f"rate must be a finite number > 0, got {self.rate!r}")


@dataclass(frozen=True, slots=True)
class TraceLine:
    n: int
    """Line number in the trace, from 1."""
    t: float
    """Wall seconds since the run started."""
    tag: str
    """ENQUEUE, COALESCED, REQUEUE-WHILE-PROCESSING, REDELIVERY, RATELIMIT or WORKER."""
    key: str
    text: str
    """The line as printed, without number and time."""
    worker: int | None = None
    seq: int | None = None
    """For WORKER lines: which delivery (Get) this is, counted over the run."""
    action: str | None = None
    """For WORKER lines: "Get" or "Done"."""
    ok: bool | None = None
    """For WORKER Done lines: the reconcile succeeded."""


@dataclass(frozen=True, slots=True)
class Proof:
    """One key's REQUEUE-WHILE-PROCESSING → COALESCED* → one REDELIVERY → one more Get."""

    key: str
    mark: TraceLine
    coalesced: tuple[TraceLine, ...]
    redelivery: TraceLine
    get: TraceLine
    held_by: TraceLine | None = None
    """The Get line of the delivery that was held while the adds arrived."""

    @property
    def held_seq(self) -> int | None:
        return self.held_by.seq if self.held_by else None

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "held_seq": self.held_seq,
            "mark_line": self.mark.n,
            "coalesced_lines": [line.n for line in self.coalesced],
            "redelivery_line": self.redelivery.n,
            "get_line": self.get.n,
            "get_seq": self.get.seq,
        }


@dataclass(frozen=True)
class SlowmoResult:
    config: SlowmoConfig
    lines: tuple[TraceLine, ...]
    stats: Stats
    proof: Proof | None
    elapsed: float
    interrupted: bool = False
    events: int = 0
    """Adds the generator fired."""
    failures: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "config": asdict(self.config),
            "elapsed": self.elapsed,
            "interrupted": self.interrupted,
            "events": self.events,
            "failures": self.failures,
            "stats": asdict(self.stats),
            "proof": self.proof.to_json() if self.proof else None,
            "lines": [{"n": x.n, "t": round(x.t, 4), "text": x.text} for x in self.lines],
        }


def find_proof(lines: Sequence[TraceLine], prefer: str = PROOF_KEY) -> Proof | None:
    """Find, for one key, REQUEUE-WHILE-PROCESSING, then only COALESCED (and the
    holder's successful Done) until exactly one REDELIVERY, then that key's
    next line is a Get. Prefers ``prefer``; None if no key shows it."""
    by_key: dict[str, list[TraceLine]] = {}
    for line in lines:
        by_key.setdefault(line.key, []).append(line)
    order = sorted(by_key, key=lambda k: k != prefer)
    for key in order:
        key_lines = by_key[key]
        for i, line in enumerate(key_lines):
            if line.tag == MARK:
                proof = _proof_from(key, key_lines, i)
                if proof is not None:
                    return proof
    return None


def _proof_from(key: str, key_lines: list[TraceLine], i: int) -> Proof | None:
    held_by = next(
        (x for x in reversed(key_lines[:i]) if x.tag == WORKER and x.action == "Get"), None
    )
    coalesced: list[TraceLine] = []
    for j in range(i + 1, len(key_lines)):
        line = key_lines[j]
        if line.tag == COALESCED:
            coalesced.append(line)
        elif line.tag == WORKER and line.action == "Done" and line.ok:
            continue
        elif line.tag == REDELIVERY:
            after = key_lines[j + 1] if j + 1 < len(key_lines) else None
            if after is not None and after.tag == WORKER and after.action == "Get":
                return Proof(key, key_lines[i], tuple(coalesced), line, after, held_by)
            return None
        else:
            return None
    return None


class _Trace:
    """Numbers lines and passes them on, in one order, from any thread.

    If ``on_line`` raises, the trace keeps the error (``failure``), stops
    calling it and sets ``halt``; the run raises the error in its own thread.
    """

    def __init__(self, on_line: Callable[[TraceLine], None] | None, halt: threading.Event) -> None:
        self._lock = threading.Lock()
        self._on_line = on_line
        self._halt = halt
        self._start = time.monotonic()
        self.lines: list[TraceLine] = []
        self.failure: BaseException | None = None
        self._workers: dict[int, int] = {}  # thread ident -> WORKER-n

    def worker(self) -> int:
        """This thread's worker number (1, 2, ... in order of first Get)."""
        ident = threading.get_ident()
        with self._lock:
            n = self._workers.get(ident)
            if n is None:
                n = self._workers[ident] = len(self._workers) + 1
            return n

    def emit(self, tag: str, key: str, text: str, **extra: Any) -> TraceLine:
        with self._lock:
            line = TraceLine(
                len(self.lines) + 1, time.monotonic() - self._start, tag, key, text, **extra
            )
            self.lines.append(line)
            if self._on_line is not None and self.failure is None:
                try:
                    self._on_line(line)
                except BaseException as exc:  # rich's broken-pipe exit is a SystemExit
                    self.failure = exc
                    self._halt.set()
            return line

    def check(self) -> None:
        """Raise the renderer's error, if it raised."""
        if self.failure is not None:
            raise self.failure


def run_slowmo(
    config: SlowmoConfig | None = None,
    on_line: Callable[[TraceLine], None] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> SlowmoResult:
    """Play the script on a real ``WorkQueue`` with ``run_workers``; return the trace.

    ``on_line(line)`` is called for each trace line as it happens (from any
    thread, one at a time); ``on_step(done, total)`` after each script step.
    Ctrl-C (KeyboardInterrupt in the calling thread) stops the run; the result
    then has ``interrupted=True`` and the lines so far. If ``on_line`` or
    ``on_step`` raises (``BrokenPipeError`` when the output pipe closed, say),
    in any thread, the run stops its threads and raises that error here.
    """
    config = config or SlowmoConfig()
    speed = config.speed
    tick = 1.0 / (config.rate * speed)
    hold = config.hold / speed
    limiter = ItemExponentialFailureRateLimiter(0.25 / speed, 5.0 / speed)
    queue: WorkQueue[str] = WorkQueue("slowmo", rate_limiter=limiter)
    halt = threading.Event()  # stops the workers; set by Ctrl-C or a failing on_line
    trace = _Trace(on_line, halt)
    holders: dict[str, int] = {}  # key -> worker holding it (kept by the subscriber)
    proof_held = threading.Event()
    proof_release = threading.Event()
    attempts: dict[str, int] = {}
    seq_lock = threading.Lock()
    seqs = [0]
    failures = [0]

    def on_event(event: Event[str]) -> None:  # under the queue's lock
        kind, key = event.kind, event.key
        if kind is EventKind.GET:
            holders[key] = trace.worker()
        elif kind is EventKind.DONE:
            holders.pop(key, None)
        elif kind is EventKind.ENQUEUE:
            trace.emit(ENQUEUE, key, f"[{ENQUEUE}] key={key}")
        elif kind is EventKind.COALESCE:
            holder = holders.get(key)
            why = (
                "already waiting"
                if holder is None
                else f"held by WORKER-{holder}, redelivery already pending"
            )
            trace.emit(COALESCED, key, f"[{COALESCED}] key={key} ({why})")
        elif kind is EventKind.MARK_WHILE_PROCESSING:
            holder = holders.get(key)
            trace.emit(
                MARK,
                key,
                f"[{MARK}] key={key} (held by WORKER-{holder}: one more Get after its Done)",
            )
        elif kind is EventKind.REDELIVER:
            trace.emit(
                REDELIVERY, key, f"[{REDELIVERY}] key={key} (changed while held: queued once)"
            )
        elif kind is EventKind.RATE_LIMIT:
            assert event.duration is not None
            attempt = limiter.num_requeues(key)
            trace.emit(
                RATELIMIT,
                key,
                f"[{RATELIMIT}] key={key} attempt={attempt:,} backoff={number(event.duration, 3)}s",
            )

    def reconcile(key: str) -> None:
        worker = trace.worker()
        with seq_lock:
            seqs[0] += 1
            seq = seqs[0]
        tag = f"WORKER-{worker}"
        trace.emit(
            WORKER, key, f"[{tag}] key={key} Get seq={seq:,}", worker=worker, seq=seq, action="Get"
        )
        if key == PROOF_KEY and not proof_held.is_set():
            proof_held.set()
            while not proof_release.wait(0.05):  # held until the generator's burst is over
                if halt.is_set():
                    break
        else:
            halt.wait(hold)
        failed_before = attempts.get(key, 0)
        if failed_before < FAILING.get(key, 0):
            attempts[key] = failed_before + 1
            failures[0] += 1
            trace.emit(
                WORKER,
                key,
                f"[{tag}] key={key} Done seq={seq:,} result=ERROR "
                f"(simulated failure {failed_before + 1} of {FAILING[key]}) → Retry",
                worker=worker,
                seq=seq,
                action="Done",
                ok=False,
            )
            raise SimulatedFailure(key)
        trace.emit(
            WORKER,
            key,
            f"[{tag}] key={key} Done seq={seq:,} result=OK → Forget",
            worker=worker,
            seq=seq,
            action="Done",
            ok=True,
        )

    queue.subscribe(on_event)
    runner = threading.Thread(
        target=run_workers,
        args=(queue, reconcile),
        kwargs={"workers": config.workers, "stop": halt},
        name="keyqueue-lab-slowmo",
        daemon=True,
    )
    start = time.monotonic()
    runner.start()
    interrupted = False
    events = 0

    def wait(event: threading.Event, seconds: float | None = None) -> None:
        """Wait for ``event`` (or ``seconds``, if given), but never past a failure."""
        deadline = None if seconds is None else time.monotonic() + seconds
        while not event.is_set() and not halt.is_set():
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                break
            event.wait(left)
        trace.check()

    def stop() -> None:
        halt.set()
        proof_release.set()
        queue.shutdown()
        runner.join(timeout=5)

    with quiet_simulated_give_ups():  # a stopped run gives up a failing key: expected
        try:
            next_at = time.monotonic()
            for done, (action, key) in enumerate(_SCRIPT, 1):
                if action == "hold":
                    wait(proof_held)
                elif action == "release":
                    proof_release.set()
                elif action == "burst":
                    queue.add(key)
                    events += 1
                else:
                    wait(halt, next_at - time.monotonic())
                    queue.add(key)
                    events += 1
                    next_at += tick
                trace.check()
                if on_step is not None:
                    on_step(done, len(_SCRIPT))
            # Let every key settle: nothing waiting, held or backing off.
            while True:
                s = queue.stats()
                if not (s.depth or s.processing or s.delayed):
                    break
                wait(halt, min(tick, 0.01))
            queue.shutdown(drain=True, timeout=10)
            runner.join()
            trace.check()
        except KeyboardInterrupt:
            interrupted = True
            stop()
        except BaseException:
            stop()
            raise
    elapsed = time.monotonic() - start
    lines = tuple(trace.lines)
    return SlowmoResult(
        config=config,
        lines=lines,
        stats=queue.stats(),
        proof=find_proof(lines),
        elapsed=elapsed,
        interrupted=interrupted,
        events=events,
        failures=failures[0],
    )
