"""The dashboard's live state: each queue read once a second, its health and its last 10 minutes.

Theory of operation
-------------------
One ``Monitor`` per dashboard reads every queue's snapshot (``q.snapshot``:
one script, the lists consistent with the counters) and its probe
(``keyqueue.ops.probe``: the shared retry bucket, the last delayed key) once
per ``interval``, whatever the number of open pages: each page's event
stream waits on ``changed`` and sends the newest state, so pages cost the
server nothing. Each queue's ``keyqueue.ops.health.Health`` turns the
readings into rates (counter deltas over the server clock's delta; a
counter that goes down is a reset, and no rate is taken across it) and the
verdict, the same one ``keyqueue top`` prints; it keeps ``HISTORY``
seconds of (time, depth, adds/s, dones/s) points for the chart (no rate at
a reset: the chart never goes below zero).

What the page gets per queue is the server it reads (``server``: what
``describe`` says of its client, a Sentinel client's current primary
included) and ``Snapshot.as_dict()`` (its stable JSON
shape) with each row's ``cells`` (``ops.render.cells``: the text ``inspect``
and ``top`` show), the rates and every duration as text (``shown``: written
by the one formatter, ``keyqueue._console.format``), and the verdict
(``health``). A sharded queue is one queue on the page: its map is
read from the server each round (a reshard opens its client again), its
snapshot is the shards' merged and its probe theirs merged; beside it, each
shard's sizes and server (``shards``, and as a line of text in ``shown``).
The page computes nothing: it shows this. A read that fails
(the server went away) is shown on that queue as its error, its verdict
the error, and tried again next interval; the page's header says how many
queues could be read (``header``). An action (``retry``, ``forget``,
``replay`` of a dead key) reads the queue again at once, so the page sees
what it did without waiting.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import deque
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio

from keyqueue import Event, EventKind, Snapshot
from keyqueue.redis import AsyncRedisWorkQueue, aclose_client, client_from_url, describe
from keyqueue.redis._shard_map import ShardMap, aread_map

from .._console.format import duration, number
from ..ops import probe
from ..ops.connect import CONNECT_TIMEOUT, SOCKET_TIMEOUT
from ..ops.health import Health, Probe, Rates, Reading, Verdict, error_verdict
from ..ops.render import COLUMNS, DEAD_COLUMNS, cells, dead_cells, shard_line
from ..ops.shards import ShardRow, server_of, shard_row

__all__ = ["CHART_MIN", "HISTORY", "Monitor"]

HISTORY = 600.0
"""Seconds of depth and rates the chart shows."""
CHART_MIN = 10.0
"""Seconds the chart spans at least (a page opened on a new dashboard still draws a line)."""


_WHAT_ADD_DID = {
    EventKind.ENQUEUE: "waiting now",
    EventKind.COALESCE: "it was already waiting",
    EventKind.MARK_WHILE_PROCESSING: "a worker holds it: handed out again after its done",
}


_RATES = ("adds", "gets", "dones", "failures")
Point = tuple[float, int, float | None, float | None]
"""A chart's point: server time, depth, adds/s and dones/s (None: a counter reset there)."""


def _rates(r: Rates) -> dict[str, float]:
    return {"adds": r.adds, "gets": r.gets, "dones": r.dones, "failures": r.failures}


def _shown(verdict: Verdict, oldest_wait: float) -> dict[str, Any]:
    """What the page writes as text: every rate and duration, by the commands' formatter."""
    r, w = verdict.rates, verdict.window
    rate = {k: number(v, 3) for k, v in _rates(r).items()} if r else dict.fromkeys(_RATES, "-")
    backoff = verdict.longest_backoff
    return {
        "rates": rate,
        "oldest_wait": duration(oldest_wait),
        "mean_work": "-" if w is None or w.mean_work is None else duration(w.mean_work),
        "longest_backoff": "-" if backoff is None else duration(backoff),
    }


class _Queue:
    """One queue's client, last reading and history."""

    def __init__(self, name: str, url: str, durability: str = "primary") -> None:
        self.name = name
        # Short timeouts, as the operator's commands have: a server that stops
        # answering is this queue's error within seconds, not a page gone still.
        self.redis = client_from_url(
            url,
            asyncio=True,
            socket_connect_timeout=CONNECT_TIMEOUT,
            socket_timeout=SOCKET_TIMEOUT,
        )
        self.durability = durability
        self.shard_map: ShardMap | None = None
        self.client: AsyncRedisWorkQueue | None = None  # the whole queue, as the map says
        self.shards: list[AsyncRedisWorkQueue] = []  # an ordinary client per shard
        self.error: str | None = None
        self.latest: dict[str, Any] | None = None
        self.health = Health()
        self.seen = False  # a reading was taken (the next one has a point)
        self.points: deque[Point] = deque()
        self.lease_seen: dict[tuple[str, int | None], float] = {}

    @property
    def names(self) -> tuple[str, ...]:
        """The shards' queue names (the queue's own name alone if unsharded)."""
        return (self.name,) if self.shard_map is None else self.shard_map.names(self.name)

    async def opened(self) -> AsyncRedisWorkQueue:
        """The client of the whole queue, the map read again first: opened
        again (and each shard's) when a reshard changed the map."""
        found = await aread_map(self.redis, self.name)
        if self.client is None or found != self.shard_map:
            await self.close()
            self.shard_map = found
            shards = 1 if found is None else found.shards
            self.client = AsyncRedisWorkQueue(
                self.name, client=self.redis, durability=self.durability, shards=shards
            )
            names = () if found is None else found.names(self.name)
            self.shards = [
                AsyncRedisWorkQueue(shard, client=self.redis, durability=self.durability)
                for shard in names
            ]
        return self.client

    async def read(self, limit: int) -> None:
        """One reading: the map followed, the snapshot (a sharded queue's merged),
        the probe of every shard, each shard's sizes."""
        client = await self.opened()
        snap = await client.snapshot(limit)
        probed = await probe.aread(self.redis, self.names)
        whole = describe(self.redis)
        sizes = await asyncio.gather(*(q.snapshot(0) for q in self.shards))
        rows = [
            shard_row(i, q.name, server_of(self.redis, q.name, whole), part)
            for i, (q, part) in enumerate(zip(self.shards, sizes, strict=True))
        ]
        self.update(snap, probed, rows)

    def update(
        self, snap: Snapshot[str], probed: Probe | None = None, shards: Sequence[ShardRow] = ()
    ) -> None:
        """Take a reading: the verdict, the chart's point, what the page shows."""
        verdict = self.health.update(Reading.of(snap, probed))
        now, stats = snap.taken_at, snap.stats
        step = verdict.rates
        if self.seen:  # the first reading has no rates, so no point
            adds, dones = (None, None) if step is None else (step.adds, step.dones)
            self.points.append((now, stats.depth, adds, dones))  # none across a reset
        self.seen = True
        while self.points and self.points[0][0] < now - HISTORY:
            self.points.popleft()
        shown = snap.as_dict()
        for kind in ("waiting", "processing", "delayed", "failing"):
            for row, typed in zip(shown[kind], getattr(snap, kind), strict=True):
                row["cells"] = list(cells(typed))
        for row, dead in zip(shown["dead"], snap.dead, strict=True):
            row["cells"] = list(dead_cells(dead, now))  # now: the server's time, as `at`
        seen: dict[tuple[str, int | None], float] = {}
        for row in shown["processing"]:
            hold, left = (row["key"], row["token"]), row["lease_left"] or 0.0
            seen[hold] = most = max(self.lease_seen.get(hold, 0.0), left)
            row["lease_fraction"] = max(0.0, left) / most if most > 0 else 0.0
        self.lease_seen = seen
        self.error = None
        span = min(HISTORY, max(CHART_MIN, now - self.points[0][0] if self.points else 0.0))
        self.latest = {
            **shown,
            "rates": None if step is None else _rates(step),
            "window": verdict.span,
            "oldest_wait": stats.oldest_wait_seconds,
            "mean_work": None if verdict.window is None else verdict.window.mean_work,
            "reset_at": verdict.reset_at,
            "health": verdict.as_dict(),
            "chart": {"span": span, "label": "\u2212" + duration(round(span))},
            "shown": {
                **_shown(verdict, stats.oldest_wait_seconds),
                "shards": shard_line(shards) if shards else "",
            },
            "shards": [row.as_dict() for row in shards],
        }

    def state(self, history: bool) -> dict[str, Any]:
        state: dict[str, Any] = {
            "name": self.name,
            "server": describe(self.redis),
            "error": self.error,
            "now": self.latest,
        }
        state["health"] = (
            error_verdict(self.error).as_dict() if self.error else (self.latest or {}).get("health")
        )
        state["point"] = list(self.points[-1]) if self.points else None
        if history:
            state["history"] = [list(point) for point in self.points]
        return state

    async def close(self) -> None:
        """Close the queue's clients (the redis-py client stays open)."""
        for q in [*self.shards, *([self.client] if self.client is not None else [])]:
            await q.aclose()
        self.client, self.shards = None, []

    async def aclose(self) -> None:
        """Close the queue's clients and the redis-py client."""
        await self.close()
        await aclose_client(self.redis)


class Monitor:
    """Read ``names`` on the server at ``url`` every ``interval`` seconds, up to
    ``limit`` keys per list; ``changed`` is set (and replaced) after each round.
    Its actions write with the queues' ``durability``."""

    def __init__(
        self,
        names: Sequence[str],
        url: str,
        *,
        limit: int = 100,
        interval: float = 1.0,
        durability: str = "primary",
    ) -> None:
        self.queues = {name: _Queue(name, url, durability) for name in dict.fromkeys(names)}
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
            await queue.aclose()

    async def _round(self) -> None:
        for queue in self.queues.values():
            try:
                await queue.read(self.limit)
            except (redis.exceptions.RedisError, OSError, ValueError) as exc:
                queue.error = f"cannot read the queue at {describe(queue.redis)}: {exc}"
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
        seen nothing yet (``since < 0``), else with the newest point only. With
        the header (``header``) and each list's column labels (``columns``)."""
        return {
            "rev": self.rev,
            "header": self.header(),
            "columns": {**COLUMNS, "dead": DEAD_COLUMNS},
            "queues": [queue.state(history=since < 0) for queue in self.queues.values()],
        }

    def header(self) -> dict[str, str]:
        """What the page's header says: ``state`` ``ok`` (every queue read at the
        last round), ``partial`` or ``down`` (none read), and a sentence."""
        total = len(self.queues)
        failed = [q for q in self.queues.values() if q.error]
        if not failed:
            return {"state": "ok", "text": f"live: {len(self.queues)} of {total} queues read"}
        if len(failed) == total:
            return {
                "state": "down",
                "text": f"cannot read any queue: {failed[0].error}",
            }
        return {
            "state": "partial",
            "text": f"live: {total - len(failed)} of {total} queues read; cannot read "
            + ", ".join(q.name for q in failed),
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

        client = await queue.opened()
        await client.forget(checked)
        unsubscribe = client.subscribe(on_event)
        try:
            await client.add(checked)
        finally:
            unsubscribe()
        self._poke.set()
        what = next((_WHAT_ADD_DID[k] for k in seen if k in _WHAT_ADD_DID), "added")
        return f"{checked!r}: failures cleared and added again to {name!r}: {what}"

    async def forget(self, name: object, key: object) -> str:
        """Forget: clear ``key``'s failures (a delayed retry still comes due)."""
        queue = self._queue(name)
        checked = _key(key)
        await (await queue.opened()).forget(checked)
        self._poke.set()
        return f"{checked!r}: failures cleared in {name!r}"

    async def replay(self, name: object, key: object) -> str:
        """Replay: add a dead ``key`` back, its failures cleared (``replay``);
        ``ValueError`` if it is not dead."""
        queue = self._queue(name)
        checked = _key(key)
        if not await (await queue.opened()).replay(checked):
            raise ValueError(f"{checked!r} is not a dead key of {name!r}: nothing replayed")
        self._poke.set()
        return f"{checked!r}: replayed to {name!r}, its failures cleared"


def _key(key: object) -> str:
    if not isinstance(key, str) or not key:
        raise ValueError(f"key must be a non-empty string, got {key!r}")
    return key
