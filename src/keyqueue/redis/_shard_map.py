"""Reading a queue's shard map from the server, for a tool that is not told ``shards=``.

A sharded queue's map (``_shards.MAP_SHARDS``, ``MAP_EPOCH``) is in its
shard 0's stats hash, written by its first client. ``read_map`` reads it
(one ``HMGET``, on any client: one server, a Sentinel service or a
Cluster) and answers a ``ShardMap``, or None for a name with no map there:
an unsharded queue, or none. It reads the map as it is now; a reshard
changes it (a new epoch), so a tool that watches a queue reads it again on
each refresh. ``aread_map`` is the asyncio twin.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ._schema import KEY_NAMES, key_names
from ._shards import MAP_EPOCH, MAP_SHARDS, shard_name

__all__ = ["ShardMap", "aread_map", "read_map"]


@dataclass(frozen=True, slots=True)
class ShardMap:
    """A sharded queue's map as the server holds it: ``shards`` shards at ``epoch``."""

    name: str
    """The queue's name (its shards are ``names``)."""
    shards: int
    """How many shards the queue has."""
    epoch: int
    """The map's epoch: 0 until a reshard, raised by each one."""

    @property
    def names(self) -> tuple[str, ...]:
        """Each shard's queue name, shard 0 first (an ordinary queue each)."""
        return tuple(shard_name(self.name, i) for i in range(self.shards))


def _map_key(name: str) -> str:
    """The stats hash that holds the map of ``name``: its shard 0's."""
    return key_names(shard_name(name, 0))[KEY_NAMES.index("stats")]


def _parsed(name: str, reply: Sequence[Any]) -> ShardMap | None:
    shards, epoch = reply
    if shards is None:
        return None
    return ShardMap(name, int(shards), int(epoch or 0))


def read_map(client: Any, name: str) -> ShardMap | None:
    """The map of the queue ``name`` (redis-py client ``client``), or None if
    no sharded queue of that name is on the server."""
    return _parsed(name, client.hmget(_map_key(name), [MAP_SHARDS, MAP_EPOCH]))


async def aread_map(client: Any, name: str) -> ShardMap | None:
    """As ``read_map``, with a ``redis.asyncio`` client."""
    return _parsed(name, await client.hmget(_map_key(name), [MAP_SHARDS, MAP_EPOCH]))
