"""Placing a sharded queue's shards on distinct primaries of a Valkey Cluster.

Theory of operation
-------------------
Shard ``i`` of the queue ``name`` lives in the slot of its hash tag (shard 0
``{name}``, shard ``i`` > 0 ``{name/i}``), and the Cluster puts a slot where
its slot ranges say. CRC16 is linear, so on an evenly split Cluster the
shards share primaries by chance (3 shards reach 3 primaries for about one
name in four). ``place_shards`` reads the queue's map (``read_map``), each
shard's slot and the primary serving it, and plans (``plan_moves``, no I/O)
moves of whole slots: while a primary has at least two more of the queue's
shards than another, the slot of its highest shard goes to the primary with
fewest (ties by the primaries' names). With no more shards than primaries
that ends with each shard on a primary of its own. Only the queue's own
slots move; the other slots on those primaries, and whatever else shares a
moved slot, are not the tool's business (a moved slot takes all its keys).

Each move is Valkey's slot migration, online (``move_slot``): the target
``IMPORTING``, the source ``MIGRATING``, the slot's keys ``MIGRATE``\\ d in
batches until the source has none, then ``SETSLOT NODE`` on the target, the
source and every other primary. Meanwhile the queue's clients are answered
``ASK`` (a call whose keys all moved or none exist yet) or ``TRYAGAIN`` (a
call whose keys are partly on each side), and redis-py asks again
(``keyqueue.redis._send``); the window lasts as long as the slot's keys take
to cross, a few milliseconds for a queue of a few thousand keys.

The plan is a function of where the queue's slots are now, and each move
changes one slot's owner only at its end, so a run interrupted mid-move is
resumed by running it again: the same slot goes to the same primary (its
migration states are set again, and the keys still on the source cross).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["MIGRATE_BATCH", "Move", "NotACluster", "move_slot", "place_shards", "plan_moves"]

MIGRATE_BATCH = 100
"""Keys per ``MIGRATE`` (and per ``CLUSTER GETKEYSINSLOT``)."""
MIGRATE_TIMEOUT_MS = 5000
"""``MIGRATE``'s timeout: the longest the source waits on the target, in milliseconds."""


class NotACluster(ValueError):
    """The client is not a Cluster client: a queue on one server (or a
    Sentinel service) has nothing to place."""


@dataclass(frozen=True, slots=True)
class Move:
    """One slot of the queue to move: it holds ``shards`` (the queue's shard
    indexes in it, usually one), and goes from the primary ``source`` to the
    primary ``target`` (``host:port`` each)."""

    slot: int
    shards: tuple[int, ...]
    source: str
    target: str

    def as_dict(self) -> dict[str, Any]:
        """As ``keyqueue place --json`` writes it."""
        return {
            "slot": self.slot,
            "shards": list(self.shards),
            "from": self.source,
            "to": self.target,
        }


def plan_moves(
    slots: Sequence[int], owners: Mapping[int, str], primaries: Iterable[str]
) -> list[Move]:
    """The moves that spread a queue's shards over ``primaries``.

    ``slots[i]`` is shard ``i``'s slot and ``owners[slot]`` the primary
    serving it. While the primary with most of the queue's shards has a slot
    whose shards, moved to the primary with fewest, leave the first with
    more than the second, the last such slot (by its highest shard) moves
    there. Ties between primaries go to the first by name. Each move lowers
    the sum of the squared counts, so the plan ends; with no more shards
    than primaries (and no two shards in one slot), each shard ends on a
    primary of its own."""
    where = dict(owners)
    nodes = sorted(set(primaries) | set(where[s] for s in slots))
    in_slot: dict[int, list[int]] = {}
    for shard, slot in enumerate(slots):
        in_slot.setdefault(slot, []).append(shard)
    moves: list[Move] = []
    while True:
        count = {node: 0 for node in nodes}
        for slot, shards in in_slot.items():
            count[where[slot]] += len(shards)
        fullest = max(nodes, key=lambda n: (count[n], -nodes.index(n)))
        emptiest = min(nodes, key=lambda n: (count[n], nodes.index(n)))
        movable = [
            slot
            for slot, shards in in_slot.items()
            if where[slot] == fullest and count[emptiest] + len(shards) < count[fullest]
        ]
        if not movable:
            return moves
        slot = max(movable, key=lambda s: max(in_slot[s]))
        moves.append(Move(slot, tuple(in_slot[slot]), fullest, emptiest))
        where[slot] = emptiest


def _node_id(client: Any, node: Any) -> str:
    return _text(client.execute_command("CLUSTER", "MYID", target_nodes=node))


def _text(reply: Any) -> str:
    return reply.decode() if isinstance(reply, bytes) else str(reply)


def _auth(node: Any) -> list[str]:
    """``MIGRATE``'s ``AUTH``/``AUTH2`` arguments: the client's own credentials."""
    kwargs = node.redis_connection.connection_pool.connection_kwargs
    password, username = kwargs.get("password"), kwargs.get("username")
    if password is None:
        return []
    return ["AUTH2", username, password] if username else ["AUTH", password]


def move_slot(
    client: Any, slot: int, source: Any, target: Any, *, batch: int = MIGRATE_BATCH
) -> int:
    """Move ``slot`` and its keys from the primary ``source`` to the primary
    ``target`` (redis-py ``ClusterNode``\\ s of the Cluster client ``client``)
    by Valkey's slot migration protocol, online; returns how many keys
    crossed. Raises the server's error (``ResponseError``) if a step is
    refused, leaving the slot migrating: running it again resumes it. The
    client's slot table is reloaded at the end."""
    source_id, target_id = _node_id(client, source), _node_id(client, target)

    def on(node: Any, *args: Any) -> Any:
        return client.execute_command(*args, target_nodes=node)

    on(target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    on(source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    auth = _auth(source)
    moved = 0
    while True:
        keys = on(source, "CLUSTER", "GETKEYSINSLOT", slot, batch)
        if not keys:
            break
        on(source, "MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS, *auth,
           "KEYS", *keys)  # fmt: skip
        moved += len(keys)
    on(target, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    on(source, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    for node in client.get_primaries():
        if node.name not in (source.name, target.name):
            on(node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    client.nodes_manager.initialize()
    return moved


def place_shards(
    client: Any, name: str, *, dry_run: bool = False, batch: int = MIGRATE_BATCH
) -> list[Move]:
    """Spread the shards of the queue ``name`` over the Cluster's primaries
    (``client``: a redis-py ``RedisCluster``), moving the slots of shards
    that share a primary to the primaries with fewest of the queue's shards,
    keys and all, while the queue runs. Returns the moves (made, or only
    planned with ``dry_run``): none if each shard has a primary of its own
    already, or the queue has one shard (or no map: unsharded or absent).

    Raises ``NotACluster`` for a client of one server or a Sentinel service;
    the server's error if a move is refused (that move left migrating,
    completed by running it again)."""
    from keyqueue.redis._schema import hash_tag  # noqa: PLC0415 (redis-py)
    from keyqueue.redis._shard_map import read_map  # noqa: PLC0415

    nodes = getattr(client, "nodes_manager", None)
    if nodes is None:
        raise NotACluster(f"not a Cluster: the queue {name!r} is on one server, nothing to place")
    found = read_map(client, name)
    if found is None or found.width < 2:
        return []
    nodes.initialize()
    slots = [client.keyslot(hash_tag(shard)) for shard in found.names]
    owners = {slot: nodes.get_node_from_slot(slot).name for slot in slots}
    primaries = {node.name: node for node in client.get_primaries()}
    moves = plan_moves(slots, owners, primaries)
    if not dry_run:
        for move in moves:
            move_slot(client, move.slot, primaries[move.source], primaries[move.target], batch=batch)
    return moves
