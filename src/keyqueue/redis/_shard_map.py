"""A sharded queue's map: the one type the clients, the mover and the operator's tools read.

A sharded queue's map is in each shard's stats hash (``map_shards``,
``map_epoch`` and, while a reshard moves keys, ``map_from``); shard 0's, in
the unsharded queue's slot (``{name}``), is the authority, written by the
queue's first sharded client and first by each reshard. ``ShardMap`` is that
map: the clients read it with the ``map`` script (``_resharding``, which
says how they follow it), the tools with ``read_map`` (one ``HMGET``, on any
client: one server, a Sentinel service or a Cluster), which answers None for
a name with no map there: an unsharded queue, none, or one shard of a sharded
queue (``name/i``, an ordinary queue, whose stats hash may hold a copy of
its queue's map: one ``HMGET`` more, of the queue's map, tells it apart). It
reads the map as it is now; a reshard changes it (a new epoch), so a tool
that watches a queue reads it again on each refresh. ``aread_map`` is the
asyncio twin. Which slot is shard ``i``'s is ``_shards.shard_name``'s.
"""

from __future__ import annotations

import re
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

from ._schema import KEY_NAMES, key_names
from ._shards import shard_name, shard_of

__all__ = ["ShardMap", "aread_map", "read_map"]

FIELDS = ("map_shards", "map_epoch", "map_from")
"""The map's fields in each shard's stats hash."""
_SHARD = re.compile(r"^(.+)/([1-9][0-9]*)$")


@dataclass(frozen=True, slots=True)
class ShardMap:
    """A sharded queue's map as the server holds it: ``shards`` shards at
    ``epoch``; while a reshard moves keys, ``moving_from`` is the count they
    move from (None otherwise)."""

    shards: int
    """How many shards the queue has (once every key has moved)."""
    epoch: int
    """The map's epoch: raised by each reshard."""
    moving_from: int | None = None
    """The shard count keys move from while a reshard runs; None: none runs."""

    @classmethod
    def parse(cls, reply: Sequence[object]) -> ShardMap:
        """The map from the server's reply: shards, epoch and the count moved
        from, as the ``map`` script answers them or ``HMGET FIELDS`` reads
        them (bytes or str; '' or None for no epoch or none moving)."""
        shards, epoch, moving = (_text(part) for part in reply[:3])
        return cls(int(shards), int(epoch or 0), int(moving) if moving else None)

    @property
    def width(self) -> int:
        """How many shards may hold keys: those of both maps while keys move."""
        return max(self.shards, self.moving_from or 0)

    def route(self, key: str) -> tuple[int, int]:
        """The shard to ask first for ``key`` and its shard once moved (the
        same one unless it moves)."""
        home = shard_of(key, self.shards)
        if self.moving_from is None:
            return home, home
        return shard_of(key, self.moving_from), home

    def names(self, queue: str) -> tuple[str, ...]:
        """The queue names of ``queue``'s shards (an ordinary queue each),
        shard 0 first, ``width`` of them."""
        return tuple(shard_name(queue, i) for i in range(self.width))

    def __str__(self) -> str:
        moving = "" if self.moving_from is None else f" (moving from {self.moving_from})"
        return f"{self.shards} shards at epoch {self.epoch}{moving}"


def _text(part: object) -> str:
    if part is None:
        return ""
    return part.decode() if isinstance(part, bytes) else str(part)


def _stats(name: str) -> str:
    return key_names(name)[KEY_NAMES.index("stats")]


def _parsed(reply: Sequence[Any]) -> ShardMap | None:
    return None if reply[0] is None else ShardMap.parse(reply)


def _read(name: str) -> Generator[str, Sequence[Any], ShardMap | None]:
    """The protocol: yields each stats hash to ``HMGET FIELDS`` of, takes its reply."""
    found = _parsed((yield _stats(shard_name(name, 0))))
    shard = _SHARD.match(name)
    if found is None or shard is None:
        return found
    parent, index = shard.group(1), int(shard.group(2))
    whole = _parsed((yield _stats(shard_name(parent, 0))))
    return None if whole is not None and index < whole.width else found


def read_map(client: Any, name: str) -> ShardMap | None:
    """The map of the queue ``name`` (redis-py client ``client``), or None if
    no sharded queue of that name is on the server."""
    op = _read(name)
    key = next(op)
    try:
        while True:
            key = op.send(client.hmget(key, FIELDS))
    except StopIteration as done:
        result: ShardMap | None = done.value
        return result


async def aread_map(client: Any, name: str) -> ShardMap | None:
    """As ``read_map``, with a ``redis.asyncio`` client."""
    op = _read(name)
    key = next(op)
    try:
        while True:
            key = op.send(await client.hmget(key, FIELDS))
    except StopIteration as done:
        result: ShardMap | None = done.value
        return result
