"""Where the dashboard's numbers come from: one queue's snapshot, as plain JSON.

``read(queue, limit)`` is the only place that knows how a snapshot is taken;
everything above it (the monitor's rates and history, the page) sees the
snapshot's JSON shape. ``exists(queue)`` says whether any client has used the queue.

INTERIM: until ``q.snapshot()`` lands (issue 21's library half), the lists
are read from the queue's keys with one pipeline (not atomic with ``stats``,
and holders are not recorded yet). Replace the body of ``read`` with the
public call and this docstring's INTERIM paragraph goes.

The shape is ``Snapshot.as_dict()``'s (``keyqueue._snapshot``: version 1).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from keyqueue.redis import AsyncRedisWorkQueue

__all__ = ["exists", "read"]


def _keys(queue: AsyncRedisWorkQueue) -> dict[str, str]:
    from keyqueue.redis._schema import KEY_NAMES, key_names  # noqa: PLC0415 (INTERIM)

    return dict(zip(KEY_NAMES, key_names(queue.name), strict=True))


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


async def exists(queue: AsyncRedisWorkQueue) -> bool:
    """Whether any client has used the queue (its counters are on the server)."""
    client = queue._client  # INTERIM
    return bool(await client.exists(_keys(queue)["stats"]))


async def read(queue: AsyncRedisWorkQueue, limit: int) -> dict[str, Any]:
    """The queue's snapshot, at most ``limit`` keys per list, in the shape above."""
    stats = await queue.stats()
    keys = _keys(queue)
    client = queue._client  # INTERIM
    pipe = client.pipeline(transaction=True)
    pipe.time()
    pipe.lrange(keys["fifo"], 0, limit - 1)
    pipe.zrange(keys["ranked"], 0, limit - 1)
    pipe.hgetall(keys["dirty"])
    pipe.hgetall(keys["repushed"])
    pipe.hgetall(keys["rank"])
    pipe.zrange(keys["processing"], 0, limit - 1, withscores=True)
    pipe.hgetall(keys["lease"])
    pipe.zrange(keys["delayed"], 0, limit - 1, withscores=True)
    pipe.hgetall(keys["delayed_priority"])
    pipe.hgetall(keys["failures"])
    pipe.hgetall(keys["requeues"])
    (
        (secs, micros),
        fifo,
        ranked,
        dirty,
        repushed,
        rank,
        held,
        lease,
        delayed,
        dprio,
        f1,
        f2,
    ) = await pipe.execute()
    now = secs + micros / 1e6

    def table(raw: dict[Any, Any]) -> dict[str, str]:
        return {_text(k): _text(v) for k, v in raw.items()}

    dirty, repushed, rank, lease = table(dirty), table(repushed), table(rank), table(lease)
    waiting_keys = [_text(k) for k in fifo] + [_text(k)[16:] for k in ranked]
    waiting = [
        {
            "key": key,
            "priority": int(rank[key].split()[0]) if key in rank else 0,
            "waited": max(0.0, now - float(repushed.get(key) or dirty.get(key) or now)),
        }
        for key in waiting_keys
    ]
    processing = []
    for raw, expiry in held:
        key = _text(raw)
        token, started = (lease.get(key) or "0 0").split()[:2]
        processing.append(
            {
                "key": key,
                "holder": None,
                "token": int(token),
                "held": max(0.0, now - float(started)),
                "lease_left": max(0.0, expiry - now),
            }
        )
    dprio = table(dprio)
    due = {_text(k): score - now for k, score in delayed}
    delayed_rows = [
        {"key": key, "due_in": max(0.0, d), "priority": int(dprio.get(key, 0))}
        for key, d in due.items()
    ]
    counts: dict[str, int] = {}
    for raw in (f1, f2):
        for k, v in table(raw).items():
            counts[k] = max(counts.get(k, 0), int(v))
    failing = [
        {"key": key, "failures": n, "comes_back_in": due.get(key)}
        for key, n in sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]
    ]
    return {
        "version": 1,
        "taken_at": now,
        "limit": limit,
        "stats": dataclasses.asdict(stats),
        "waiting": waiting[:limit],
        "processing": processing,
        "delayed": delayed_rows,
        "failing": failing,
    }
