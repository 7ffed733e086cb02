"""Reading a queue's shard map from the server, for a tool that is not told ``shards=``.

A sharded queue's map is in its shard 0's stats hash (``map_shards``,
``map_epoch`` and, while a reshard moves keys, ``map_from``), written by its
first client. ``read_map`` reads it (one ``HMGET``, on any client: one
server, a Sentinel service or a Cluster) and answers a ``QueueMap``, or None
for a name with no map there: an unsharded queue, none, or one shard of a
sharded queue (``name/i``, an ordinary queue, whose stats hash may hold a
copy of its queue's map: one ``HMGET`` more, of the queue's map, tells it
apart). It reads the map as it is now; a reshard changes it (a new epoch),
so a tool that watches a queue reads it again on each refresh.
``aread_map`` is the asyncio twin. Which slot is shard 0's is
``_shards.shard_name``'s.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from ._schema import KEY_NAMES, key_names
from ._shards import shard_name

__all__ = ["QueueMap", "aread_map", "read_map"]

FIELDS = ("map_shards", "map_epoch", "map_from")
"""The map's fields in each shard's stats hash."""
_SHARD = re.compile(r"^(.+)/([1-9][0-9]*)$")


@dataclass(frozen=True, slots=True)
class QueueMap:
    """A sharded queue's map as the server holds it: ``shards`` shards at
    ``epoch``; while a reshard moves keys, ``moving_from`` is the count they
    move from (None otherwise)."""

    name: str
    """The queue's name."""
    shards: int
    """How many shards the queue has (once every key has moved)."""
    epoch: int
    """The map's epoch: raised by each reshard."""
    moving_from: int | None = None
    """The shard count keys move from while a reshard runs; None: none runs."""

    @property
    def width(self) -> int:
        """How many shards may hold keys: those of both maps while keys move."""
        return max(self.shards, self.moving_from or 0)

    @property
    def names(self) -> tuple[str, ...]:
        """Each shard's queue name (an ordinary queue each), shard 0 first,
        ``width`` of them."""
        return tuple(shard_name(self.name, i) for i in range(self.width))


def _stats(name: str) -> str:
    return key_names(name)[KEY_NAMES.index("stats")]


def _parsed(name: str, reply: Sequence[Any]) -> QueueMap | None:
    shards, epoch, moving = reply
    if shards is None:
        return None
    return QueueMap(name, int(shards), int(epoch or 0), int(moving) if moving else None)


def _read(name: str) -> Generator[str, Sequence[Any], QueueMap | None]:
    """The protocol: yields each stats hash to ``HMGET FIELDS`` of, takes its reply."""
    found = _parsed(name, (yield _stats(shard_name(name, 0))))
    shard = _SHARD.match(name)
    if found is None or shard is None:
        return found
    parent, index = shard.group(1), int(shard.group(2))
    whole = _parsed(parent, (yield _stats(shard_name(parent, 0))))
    return None if whole is not None and index < whole.width else found


def read_map(client: Any, name: str) -> QueueMap | None:
    """The map of the queue ``name`` (redis-py client ``client``), or None if
    no sharded queue of that name is on the server."""
    op = _read(name)
    key = next(op)
    try:
        while True:
            key = op.send(client.hmget(key, FIELDS))
    except StopIteration as done:
        result: QueueMap | None = done.value
        return result


async def aread_map(client: Any, name: str) -> QueueMap | None:
    """As ``read_map``, with a ``redis.asyncio`` client."""
    op = _read(name)
    key = next(op)
    try:
        while True:
            key = op.send(await client.hmget(key, FIELDS))
    except StopIteration as done:
        result: QueueMap | None = done.value
        return result
