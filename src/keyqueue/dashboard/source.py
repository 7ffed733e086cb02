"""Where the dashboard's numbers come from: one queue's snapshot, as plain JSON.

``read(queue, limit)`` is the only place that knows how a snapshot is taken
(``q.snapshot``: one script on the server, consistent with its stats);
everything above it (the monitor's rates and history, the page) sees the
snapshot's stable JSON shape, ``Snapshot.as_dict()`` (version 1).
``exists(queue)`` says whether any client has used the queue.
"""

from __future__ import annotations

from typing import Any

from keyqueue.redis import AsyncRedisWorkQueue

__all__ = ["exists", "read"]


async def exists(queue: AsyncRedisWorkQueue) -> bool:
    """Whether any client has used the queue (``q.exists()``)."""
    return await queue.exists()


async def read(queue: AsyncRedisWorkQueue, limit: int) -> dict[str, Any]:
    """The queue's snapshot, at most ``limit`` keys per list, as ``Snapshot.as_dict()``."""
    return (await queue.snapshot(limit)).as_dict()
