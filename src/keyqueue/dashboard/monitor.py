"""The dashboard's live state: each queue read once a second, its rates and its last 10 minutes.

Theory of operation
-------------------
One ``Monitor`` per dashboard reads every queue's snapshot (``source.read``)
once per ``interval``, whatever the number of open pages: each page's event
stream waits on ``changed`` and sends the newest state, so pages cost the
server nothing. From two readings it derives the rates (counter deltas over
the server clock's delta); it keeps ``HISTORY`` seconds of (time, depth,
adds/s, dones/s) points for the chart, and the seed's reading of whether
the queue keeps up: keys enter waiting (``enqueued + redeliveries``) and
leave it by being reconciled (``dones``); when the first outpaces the
second, waiting grows whatever the coalescing absorbed.

A read that fails (the server went away) is shown on that queue as its
error and tried again next interval. An action (``retry``, ``forget``) reads
the queue again at once, so the page sees what it did without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis

from keyqueue.redis import AsyncRedisWorkQueue

from . import source

__all__ = ["HISTORY", "Monitor", "NoSuchQueue", "reading"]

HISTORY = 600.0
"""Seconds of depth and rates the chart shows."""
WINDOW = 60.0
"""Seconds over which the mean work time and the reading are taken."""


class NoSuchQueue(LookupError):
    """A queue name no client has used on this server."""


def _rate(new: dict[str, Any], old: dict[str, Any], dt: float, *fields: str) -> float:
    if dt <= 0:
        return 0.0
    return max(0.0, float(sum(new[f] - old[f] for f in fields)) / dt)


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
    """One queue's client, last readings and history."""

    def __init__(self, name: str, url: str) -> None:
        self.name = name
        self.client = AsyncRedisWorkQueue(name, url=url)
        self.error: str | None = None
        self.latest: dict[str, Any] | None = None
        self.samples: deque[tuple[float, dict[str, Any]]] = deque()  # (taken_at, stats)
        self.points: deque[list[float]] = deque()  # [t, depth, adds/s, dones/s]
        self.lease_seen: dict[tuple[str, int], float] = {}

    def update(self, snap: dict[str, Any]) -> None:
        now, stats = snap["taken_at"], snap["stats"]
        previous = self.samples[-1] if self.samples else (now, stats)
        self.samples.append((now, stats))
        while self.samples and self.samples[0][0] < now - HISTORY:
            self.samples.popleft()
        dt = now - previous[0]
        rates = {
            "adds": _rate(stats, previous[1], dt, "adds"),
            "gets": _rate(stats, previous[1], dt, "gets"),
            "dones": _rate(stats, previous[1], dt, "dones"),
            "failures": _rate(stats, previous[1], dt, "rate_limited", "leases_expired"),
        }
        if dt > 0:  # the first reading has no rates yet
            self.points.append([now, stats["depth"], rates["adds"], rates["dones"]])
        while self.points and self.points[0][0] < now - HISTORY:
            self.points.popleft()
        # The window: the oldest sample within WINDOW seconds.
        then_t, then = next(((t, s) for t, s in self.samples if t >= now - WINDOW), (now, stats))
        span = now - then_t
        done_n = stats["dones"] - then["dones"]
        if done_n > 0:
            mean_work = (stats["work_seconds"] - then["work_seconds"]) / done_n
        else:
            mean_work = stats["work_seconds"] / stats["dones"] if stats["dones"] else None
        arrive = _rate(stats, then, span, "enqueued", "redeliveries")
        serve = _rate(stats, then, span, "dones")
        growth = (stats["depth"] - then["depth"]) / span if span > 0 else 0.0
        coalesced = _rate(stats, then, span, "coalesced", "marked_while_processing")
        seen = {}
        for row in snap["processing"]:
            hold = (row["key"], row["token"])
            seen[hold] = max(self.lease_seen.get(hold, 0.0), row["lease_left"])
            row["lease_fraction"] = row["lease_left"] / seen[hold] if seen[hold] > 0 else 0.0
        self.lease_seen = seen
        self.error = None
        self.latest = {
            **snap,
            "rates": rates,
            "window": span,
            "oldest_wait": stats["oldest_wait_seconds"],
            "mean_work": mean_work,
            "reading": reading(stats["depth"], arrive, serve, growth, coalesced),
        }

    def state(self, history: bool) -> dict[str, Any]:
        state: dict[str, Any] = {"name": self.name, "error": self.error, "now": self.latest}
        state["point"] = self.points[-1] if self.points else None
        if history:
            state["history"] = list(self.points)
        return state


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

    async def check(self) -> None:
        """Raise ``redis.exceptions.ConnectionError`` (server unreachable) or
        ``NoSuchQueue`` before serving; then take the first reading."""
        for queue in self.queues.values():
            if not await source.exists(queue.client):
                raise NoSuchQueue(
                    f"no queue named {queue.name!r} on this server (a queue exists once "
                    "any client has used it)"
                )
        await self._round()

    def start(self) -> None:
        self._task = asyncio.create_task(self._loop())

    async def close(self) -> None:
        self.closing = True
        self.changed.set()
        self._poke.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        for queue in self.queues.values():
            await queue.client.aclose()

    async def _round(self) -> None:
        for queue in self.queues.values():
            try:
                queue.update(await source.read(queue.client, self.limit))
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

    def state(self, history: bool = False) -> dict[str, Any]:
        return {
            "rev": self.rev,
            "queues": [queue.state(history) for queue in self.queues.values()],
        }

    def _queue(self, name: object) -> _Queue:
        if not isinstance(name, str) or name not in self.queues:
            raise ValueError(f"no queue {name!r} on this dashboard")
        return self.queues[name]

    async def retry(self, name: object, key: object) -> str:
        """Retry now: clear ``key``'s failures, then hand it out again (``forget``, ``add``)."""
        queue = self._queue(name)
        checked = _key(key)
        await queue.client.forget(checked)
        await queue.client.add(checked)
        self._poke.set()
        return f"{checked!r}: failures cleared and added again to {name!r}"

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
