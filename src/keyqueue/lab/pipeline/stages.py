"""Stage timings for the pipeline: where each millisecond of a change's trip goes.

Every stage is the difference of two ``time.monotonic()`` readings taken at its
two ends. The trigger is timed in the load generator's process, the etcd write
in the API server's, the informer's, queue's and workers' stages in the
controller's; write → watch event and trigger → reconciled start in one
process and end in another. That subtraction is sound because on Linux
``time.monotonic()`` reads ``CLOCK_MONOTONIC``, one clock for the whole
machine (not per process), so the readings of all three agree:

=====================  =====================================================
trigger                the load generator's POST /trigger round trip
etcd write             the API server's etcd transaction (send → answer)
write → watch event    the write sent to etcd → the decoded event at the informer
watch event → add      the event's arrival → the handler's ``queue.add``
queue.add call         the ``add`` call itself, with the lab's trace hook (a
                       metrics observer: no Event built); ``perf_counter``
add → get              the add that made the key dirty → a worker's ``get``
                       (the queue's GET event; coalesced adds have none)
reconcile              the worker's handler (simulated work)
trigger → reconciled   a trigger sent → the end of the first reconcile that
                       saw its version or a later one
=====================  =====================================================

``write → watch event`` pairs the write and the event by resourceVersion
(etcd's revision), which both ends know, and starts when the write was sent:
etcd answers the write and notifies the watch at about the same moment, so
the event often reaches the informer before the API server has read the
write's answer. Timed from the answer, those samples were negative (and
were shown as 0, a ``p50 0µs`` that measured nothing); from the send, every
sample is the time a change takes to come back as an event, the etcd
transaction included.
"""

from __future__ import annotations

from dataclasses import dataclass

from .._percentiles import Percentiles, percentiles

__all__ = [
    "STAGES",
    "Percentiles",
    "StageSpec",
    "Timings",
    "format_duration",
    "percentiles",
    "recent",
]


@dataclass(frozen=True, slots=True)
class StageSpec:
    name: str
    label: str
    what: str


STAGES = (
    StageSpec("trigger", "HTTP trigger round trip", "client → API server → etcd → back"),
    StageSpec("etcd_write", "etcd write", "one etcd transaction"),
    StageSpec("write_to_event", "write → watch event", "sent to etcd → event at the informer"),
    StageSpec("event_to_add", "watch event → queue.add", "informer cache, handler"),
    StageSpec("add_call", "queue.add call", "the queue's work, trace hook too"),
    StageSpec("add_to_get", "queue.add → get", "waiting for a worker"),
    StageSpec("reconcile", "reconcile", "--reconcile-ms, plus loop lag"),
    StageSpec("end_to_end", "trigger → reconciled", "until a reconcile saw it"),
)
"""The stages in the order a change passes them (the last spans them all)."""


def format_duration(seconds: float | None) -> str:
    """``63µs``, ``2.209ms``, ``1.25s``; ``-`` for None."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f}µs"
    if seconds < 1:
        return f"{seconds * 1e3:.3f}ms"
    return f"{seconds:.2f}s"


class Timings:
    """The samples of one run, per stage, plus what end-to-end pairing needs.

    Everything runs on the controller's event loop (the other processes' samples
    arrive there as messages): no locks.
    """

    def __init__(self) -> None:
        self.samples: dict[str, list[float]] = {stage.name: [] for stage in STAGES}
        # revision -> when its write was answered and sent (the API server's
        # on_write), and when its watch event reached the informer; paired in
        # summary().
        self.write_done: dict[int, float] = {}
        self.write_sent: dict[int, float] = {}
        self.event_at: dict[int, float] = {}
        # Triggers answered: (object name, revision, sent); reconciles done, per
        # key: (finish time, revision seen) in finishing order.
        self.triggers: list[tuple[str, int, float]] = []
        self.reconciles: dict[str, list[tuple[float, int]]] = {}

    def add(self, stage: str, seconds: float) -> None:
        self.samples[stage].append(seconds)

    def on_write(self, revision: int, started: float, finished: float) -> None:
        self.write_done[revision] = finished
        self.write_sent[revision] = started
        self.samples["etcd_write"].append(finished - started)

    def trigger_answered(self, name: str, revision: int, sent: float, answered: float) -> None:
        self.triggers.append((name, revision, sent))
        self.samples["trigger"].append(answered - sent)

    def reconciled(self, key: str, revision: int, finished: float) -> None:
        self.reconciles.setdefault(key, []).append((finished, revision))

    def end_to_end(self, namespace: str = "default") -> list[float]:
        """For each trigger: from sending it to the end of the first reconcile of its
        object that saw its revision or a later one (triggers never covered: none)."""
        out = []
        for name, revision, sent in self.triggers:
            done = self.reconciles.get(f"{namespace}/{name}", ())
            covering = [f for f, seen in done if seen >= revision and f >= sent]
            if covering:
                out.append(min(covering) - sent)
        return out

    def write_to_event(self) -> list[float]:
        """From each write's send to its event at the informer (paired by revision)."""
        sent = self.write_sent
        return [t - sent[rv] for rv, t in self.event_at.items() if rv in sent]

    def summary(self) -> dict[str, Percentiles]:
        self.samples["write_to_event"] = self.write_to_event()
        self.samples["end_to_end"] = self.end_to_end()
        return {name: percentiles(samples) for name, samples in self.samples.items()}


def recent(samples: list[float], since: int) -> Percentiles:
    """Percentiles of ``samples[since:]`` (for the live [STATS] lines)."""
    return percentiles(samples[since:])
