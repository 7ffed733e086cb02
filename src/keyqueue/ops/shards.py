"""A sharded queue as the operator's tools read it: one queue, and each shard briefly.

Theory of operation
-------------------
A queue of ``shards=N`` is N ordinary queues (``ShardMap.names``), and its
map is on the server (``keyqueue.redis._shard_map.read_map``), so the tools are never
told ``shards=``: they read the map and open one client of the whole queue
(``RedisWorkQueue(name, shards=N)``), whose ``snapshot`` merges the shards'
and whose ``stats`` sums them, so the verdict, the rates and the lists are
the whole queue's. A reshard changes the map (a new epoch): ``top`` and the
dashboard read it again on every refresh and open the queue again when it
changed.

Beside the whole, on-call wants to know which shard is full and where it
lives: ``ShardRow`` is one shard's sizes, read from an ordinary client of
that shard (``snapshot(limit=0)``: read-only, one script), and its server
(``server_of``: on a Cluster, the primary that serves the shard's slot). These
reads are separate from the whole queue's, so their sum may differ from it
by what changed in between. ``probe`` reads each shard's bucket and last
delayed key the same way and merges them (``probe.merge``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from keyqueue import Snapshot

__all__ = ["ShardRow", "server_of", "shard_row"]


def server_of(client: Any, name: str, whole: str) -> str:
    """The server of the queue ``name``'s slot: on a Cluster client, the
    primary that serves it now (``host:port``, from the client's slot table:
    no network call); on any other client ``whole`` (what ``describe`` says)."""
    if getattr(client, "nodes_manager", None) is None:
        return whole
    from keyqueue.redis._schema import KEY_NAMES, key_names  # noqa: PLC0415 (redis-py)

    node = client.get_node_from_key(key_names(name)[KEY_NAMES.index("stats")])
    return str(node.name)


@dataclass(frozen=True, slots=True)
class ShardRow:
    """One shard's sizes, as its own snapshot read them."""

    index: int
    name: str
    """The shard's queue name."""
    server: str
    """Where it lives (``server_of``)."""
    depth: int
    processing: int
    delayed: int
    failing: int

    def as_dict(self) -> dict[str, Any]:
        """As ``inspect --json`` and the dashboard's state write it."""
        return {
            "shard": self.index,
            "name": self.name,
            "server": self.server,
            "depth": self.depth,
            "processing": self.processing,
            "delayed": self.delayed,
            "failing": self.failing,
        }


def shard_row(index: int, name: str, server: str, snap: Snapshot[Any]) -> ShardRow:
    """Shard ``index`` (queue ``name``, on ``server``) from its snapshot ``snap``."""
    s = snap.stats
    return ShardRow(index, name, server, s.depth, s.processing, s.delayed, snap.failing_keys)
