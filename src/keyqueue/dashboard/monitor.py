"""The dashboard's live state: each queue read once a second, its rates and its last 10 minutes.

Theory of operation
-------------------
One ``Monitor`` per dashboard reads every queue's snapshot (``q.snapshot``:
one script, the lists consistent with the counters) once per ``interval``,
whatever the number of open pages: each page's event stream waits on
``changed`` and sends the newest state, so pages cost the server nothing.
From two readings it derives the rates (counter deltas over the server
clock's delta, as ``keyqueue top`` does: ``ops.render.rates``); it keeps
``HISTORY`` seconds of (time, depth, adds/s, dones/s) points for the chart,
and the seed's reading of whether the queue keeps up: keys enter waiting
(``enqueued + redeliveries``) and leave it by being reconciled (``dones``);
when the first outpaces the second, waiting grows whatever the coalescing
absorbed.

What the page gets per queue is ``Snapshot.as_dict()`` (its stable JSON
shape) plus the rates, the window's mean work time and the reading. A read
that fails (the server went away) is shown on that queue as its error and
tried again next interval. An action (``retry``, ``forget``) reads
the queue again at once, so the page sees what it did without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from keyqueue import Event, EventKind, Snapshot, Stats
from keyqueue.redis import AsyncRedisWorkQueue

from ..ops.connect import CONNECT_TIMEOUT, SOCKET_TIMEOUT
from ..ops.render import rates

__all__ = ["HISTORY", "Monitor", "reading"]

HISTORY = 600.0
"""Seconds of depth and rates the chart shows."""
WINDOW = 60.0
"""Seconds over which the mean work time and the reading are taken."""


_WHAT_ADD_DID = {
    EventKind.ENQUEUE: "waiting now",
    EventKind.COALESCE: "it was already waiting",
    EventKind.MARK_WHILE_PROCESSING: "a worker holds it: handed out again after its done",
}


def _per_second(after: Stats, before: Stats, seconds: float, *fields: str) -> float:
    if seconds <= 0:
        return 0.0
    return float(sum(getattr(after, f) - getattr(before, f) for f in fields)) / seconds


def reading(
    depth: int, arrive: float, serve: float, growth: float, coalesced: float
) -> dict[str, Any]:
    """The seed's reading of one window: ``arrive`` distinct keys/s enter waiting,
    ``serve``/s are reconciled, depth moves by ``growth``/s, ``coalesced`` adds/s
    were absorbed. ``state`` is ``idle``, ``keeping-up``, ``stalled`` or ``behind``."""
    if arrive == 0 and serve == 0 and depth == 0:
        return {"state": "idle", "text": "Idle: nothing arrives and nothing waits."}
    if arrive > serve and growth > 0:
        return {
            "state": "behind",
            "text": (
                f"Falling behind: {arrive:.3g} distinct keys/s arrive and {serve:.3g}/s are "
                f"reconciled, so waiting grows by {growth:.3g}/s whatever the coalescing "
                f"({coalesced:.3g} adds/s absorbed). Look at the mean work time before "
                "adding workers."
            ),
        }
    if depth and serve == 0:
        return {
            "state": "stalled",
            "text": f"Stalled: {depth} keys wait and none was reconciled: are the workers running?",
        }
    if depth and serve > arrive:
        clear = depth / (serve - arrive)
        return {
            "state": "keeping-up",
            "text": (
                f"Keeping up: {serve:.3g}/s reconciled against {arrive:.3g} distinct keys/s "
                f"arriving; the {depth} waiting clear in about {clear:.3g} s."
            ),
        }
    return {
        "state": "keeping-up",
        "text": (
            f"Keeping up: {serve:.3g}/s reconciled against {arrive:.3g} distinct keys/s arriving."
        ),
    }


class _Queue:
    """One queue's client, last reading and history."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        # Short timeouts, as the operator's commands have: a server that stops
        # answering is this queue's error within seconds, not a page gone still.
        self.redis = redis.asyncio.Redis.from_url(
            url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=SOCKET_TIMEOUT
        )
        self.client = AsyncRedisWorkQueue(name, client=self.redis)
        self.error: str | None = None
        self.latest: dict[str, Any] | None = None
        self.samples: deque[tuple[float, Stats]] = deque()  # (taken_at, stats), HISTORY long
        self.points: deque[list[float]] = deque()  # [t, depth, adds/s, dones/s]
        self.lease_seen: dict[tuple[str, int | None], float] = {}

    def update(self, snap: Snapshot[str]) -> None:
        now, stats = snap.taken_at, snap.stats
        last_t, last = self.samples[-1] if self.samples else (now, stats)
        self.samples.append((now, stats))
        while self.samples[0][0] < now - HISTORY:
            self.samples.popleft()
        step = rates(last, stats, now - last_t)  # top's arithmetic, over one reading
        if now > last_t:  # the first reading has no rates yet
            self.points.append([now, stats.depth, step.adds, step.dones])
        while self.points and self.points[0][0] < now - HISTORY:
            self.points.popleft()
        # The window: from the oldest reading within WINDOW seconds.
        then_t, then = next((t, s) for t, s in self.samples if t >= now - WINDOW)
        span = now - then_t
        window = rates(then, stats, span)
        arrive = _per_second(stats, then, span, "enqueued", "redeliveries")
        growth = (stats.depth - then.depth) / span if span > 0 else 0.0
        coalesced = _per_second(stats, then, span, "coalesced", "marked_while_processing")
        shown = snap.as_dict()
        seen: dict[tuple[str, int | None], float] = {}
        for row in shown["processing"]:
            hold, left = (row["key"], row["token"]), row["lease_left"] or 0.0
            seen[hold] = most = max(self.lease_seen.get(hold, 0.0), left)
            row["lease_fraction"] = max(0.0, left) / most if most > 0 else 0.0
        self.lease_seen = seen
        self.error = None
        self.latest = {
            **shown,
            "rates": {
                "adds": step.adds,
                "gets": step.gets,
                "dones": step.dones,
                "failures": step.failures,
            },
            "window": span,
            "oldest_wait": stats.oldest_wait_seconds,
            "mean_work": window.mean_work,
            "reading": reading(stats.depth, arrive, window.dones, growth, coalesced),
        }

    def state(self, history: bool) -> dict[str, Any]:
        state: dict[str, Any] = {"name": self.name, "error": self.error, "now": self.latest}
        state["point"] = self.points[-1] if self.points else None
        if history:
            state["history"] = list(self.points)
        return state

    async def close(self) -> None:
        await self.client.aclose()
        await self.redis.aclose()


class Monitor:
    """Read ``names`` on the server at ``url`` every ``interval`` seconds, up to
    ``limit`` keys per list; ``changed`` is set (and replaced) after each round."""

    def __init__(
        self, names: Sequence[str], url: str, *, limit: int = 100, interval: float = 1.0
    ) -> None:
        self.queues = {name: _Queue(name, url) for name in dict.fromkeys(names)}
        self.limit = limit
        self.interval = interval
        self.rev = 0
        self.changed = asyncio.Event()
        self.closing = False
        self._poke = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def first_reading(self) -> None:
        """Read every queue once (before serving: the first page has numbers)."""
        await self._round()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        self.end_streams()
        self._poke.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for queue in self.queues.values():
            await queue.close()

    async def _round(self) -> None:
        for queue in self.queues.values():
            try:
                queue.update(await queue.client.snapshot(self.limit))
            except (redis.exceptions.RedisError, OSError) as exc:
                queue.error = f"cannot read the queue: {exc}"
        self.rev += 1
        changed, self.changed = self.changed, asyncio.Event()
        changed.set()

    async def _loop(self) -> None:
        # Ends on ``closing`` too: a cancellation that arrives while redis-py
        # reads a reply can be swallowed by it, and the loop would go on.
        while not self.closing:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.interval):
                    await self._poke.wait()
            self._poke.clear()
            await self._round()

    def snapshot(self, since: int = -1) -> dict[str, Any]:
        """Every queue's latest reading; with its history for a page that has
        seen nothing yet (``since < 0``), else with the newest point only."""
        return {
            "rev": self.rev,
            "queues": [queue.state(history=since < 0) for queue in self.queues.values()],
        }

    async def wait_change(self, rev: int, timeout: float) -> None:
        """Return once a reading after ``rev`` is in, the monitor is closing, or
        ``timeout`` passes."""
        changed = self.changed
        if self.rev > rev or self.closing:
            return
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await changed.wait()

    def end_streams(self) -> None:
        """Make every ``wait_change`` return, now and from now on (the server is stopping)."""
        self.closing = True
        self.changed.set()

    def _queue(self, name: object) -> _Queue:
        if not isinstance(name, str) or name not in self.queues:
            raise ValueError(f"no queue {name!r} on this dashboard")
        return self.queues[name]

    async def retry(self, name: object, key: object) -> str:
        """Retry now: clear ``key``'s failures, then hand it out again (``forget``, ``add``)."""
        queue = self._queue(name)
        checked = _key(key)
        seen: list[EventKind] = []

        def on_event(event: Event[str]) -> None:
            if event.key == checked:
                seen.append(event.kind)

        await queue.client.forget(checked)
        unsubscribe = queue.client.subscribe(on_event)
        try:
            await queue.client.add(checked)
        finally:
            unsubscribe()
        self._poke.set()
        what = next((_WHAT_ADD_DID[k] for k in seen if k in _WHAT_ADD_DID), "added")
        return f"{checked!r}: failures cleared and added again to {name!r}: {what}"

    async def forget(self, name: object, key: object) -> str:
        """Forget: clear ``key``'s failures (a delayed retry still comes due)."""
        queue = self._queue(name)
        checked = _key(key)
        await queue.client.forget(checked)
        self._poke.set()
        return f"{checked!r}: failures cleared in {name!r}"


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    return key
