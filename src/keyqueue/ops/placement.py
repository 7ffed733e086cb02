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

Each move is online (``move_slot``). Where the source has it (Valkey 9.0
and later), ``CLUSTER MIGRATESLOTS``: the source serves the slot while its
keys are copied, then the target takes it over, and the queue's clients
follow one ``MOVED``; its end is read from ``CLUSTER GETSLOTMIGRATIONS``,
the only place the server reports it. Else Valkey's slot migration
protocol: the target ``IMPORTING``, the source ``MIGRATING``, the slot's
keys ``MIGRATE``\\ d in batches until the source has none, then ``SETSLOT
NODE`` on the target, the source and every other primary. Meanwhile the
queue's clients are answered ``ASK`` (a call whose keys all moved or none
exist yet) or ``TRYAGAIN`` (a call whose keys are partly on each side: an
empty list is no key, so nearly every call), and redis-py asks again for
about 0.4 s (``keyqueue.redis._send``; an add rides out longer,
``_ride``). The window is the time the slot's keys (at most 25 Redis keys
whatever the queue's size) take to cross.

The plan is a function of where the queue's slots are now, and each move
changes one slot's owner only at its end, so a run interrupted mid-move is
resumed by running it again: the same slot goes to the same primary (by
the protocol, its migration states are set again and the keys still on the
source cross; an atomic migration still under way is waited for).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = [
    "MIGRATE_BATCH",
    "Move",
    "MoveFailed",
    "NotACluster",
    "move_slot",
    "place_shards",
    "plan_moves",
]

MIGRATE_BATCH = 100
"""Keys per ``MIGRATE`` (and per ``CLUSTER GETKEYSINSLOT``)."""
MIGRATE_TIMEOUT_MS = 5000
"""``MIGRATE``'s timeout: the longest the source waits on the target, in milliseconds."""
MOVE_TIMEOUT = 60.0
"""Seconds an atomic migration of one slot may take before ``move_slot`` gives up waiting."""
ATOMIC_POLL = 0.02
"""Seconds between two reads of an atomic migration's state."""


class MoveFailed(RuntimeError):
    """The server ended an atomic slot migration without moving the slot."""


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
    client: Any,
    slot: int,
    source: Any,
    target: Any,
    *,
    atomic: bool | None = None,
    batch: int = MIGRATE_BATCH,
    timeout: float = MOVE_TIMEOUT,
) -> None:
    """Move ``slot`` and its keys from the primary ``source`` to the primary
    ``target`` (redis-py ``ClusterNode``\\ s of the Cluster client
    ``client``), online, and reload the client's slot table.

    ``atomic``: True, the server's atomic slot migration (``CLUSTER
    MIGRATESLOTS``, Valkey 9.0 and later); False, the slot migration protocol
    (``SETSLOT``, ``MIGRATE``; ``batch`` keys at a time); None (the default),
    atomic where the source knows the command, else the protocol. Raises
    the server's error (``ResponseError``) if a step is refused, leaving the
    slot migrating (running it again resumes it); ``MoveFailed`` if the
    server ended an atomic migration otherwise than with success, and
    ``TimeoutError`` if one has not ended within ``timeout`` seconds (it goes
    on: running it again waits for it)."""
    import redis  # noqa: PLC0415 (the redis extra, only when a slot moves)

    if atomic is not False:
        try:
            _migrate_atomically(client, slot, source, target, timeout)
        except redis.exceptions.ResponseError as exc:
            if atomic or "unknown subcommand" not in str(exc).lower():
                raise
        else:
            client.nodes_manager.initialize()
            return
    _migrate_by_protocol(client, slot, source, target, batch)
    client.nodes_manager.initialize()


def _on(client: Any, node: Any, *args: Any) -> Any:
    return client.execute_command(*args, target_nodes=node)


def _migrate_by_protocol(client: Any, slot: int, source: Any, target: Any, batch: int) -> None:
    """The slot migration protocol: ``IMPORTING`` on the target, ``MIGRATING``
    on the source, its keys ``MIGRATE``\\ d in batches until the source has
    none, then ``SETSLOT NODE`` on the target, the source and every other
    primary."""
    source_id, target_id = _node_id(client, source), _node_id(client, target)
    _on(client, target, "CLUSTER", "SETSLOT", slot, "IMPORTING", source_id)
    _on(client, source, "CLUSTER", "SETSLOT", slot, "MIGRATING", target_id)
    auth = _auth(source)
    while keys := _on(client, source, "CLUSTER", "GETKEYSINSLOT", slot, batch):
        _on(client, source, "MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS,
            *auth, "KEYS", *keys)  # fmt: skip
    _on(client, target, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    _on(client, source, "CLUSTER", "SETSLOT", slot, "NODE", target_id)
    for node in client.get_primaries():
        if node.name not in (source.name, target.name):
            _on(client, node, "CLUSTER", "SETSLOT", slot, "NODE", target_id)


def _migrate_atomically(client: Any, slot: int, source: Any, target: Any, timeout: float) -> None:
    """``CLUSTER MIGRATESLOTS`` of ``slot`` on the source (unless a migration
    of it is under way already: one an interrupted run started), then its
    state read every ``ATOMIC_POLL`` seconds until it ends: the server
    reports a migration's end only there. The source serves the slot until
    the last moment, then the target does: clients are redirected
    (``MOVED``), never asked to try again."""
    ranges = f"{slot}-{slot}"
    if _ended(_export_state(client, source, ranges)):
        target_id = _node_id(client, target)
        _on(client, source, "CLUSTER", "MIGRATESLOTS", "SLOTSRANGE", slot, slot, "NODE", target_id)
    deadline = time.monotonic() + timeout
    while not _ended(state := _export_state(client, source, ranges)):
        if time.monotonic() >= deadline:
            raise TimeoutError(f"slot {slot} still migrating after {timeout:g} s: {state}")
        time.sleep(ATOMIC_POLL)
    if state != "success":
        raise MoveFailed(f"the migration of slot {slot} ended {state}")


def _ended(state: str | None) -> bool:
    """Whether a migration in ``state`` (None: there is none) has ended."""
    return state is None or state in ("success", "failed", "cancelled")


def _export_state(client: Any, source: Any, ranges: str) -> str | None:
    """The state of the source's latest migration of the slot range
    ``ranges`` (``CLUSTER GETSLOTMIGRATIONS``), or None if it has none."""
    latest: tuple[int, str] | None = None
    for job in _on(client, source, "CLUSTER", "GETSLOTMIGRATIONS") or []:
        fields = _fields(job)
        if fields.get("operation") == "EXPORT" and fields.get("slot_ranges") == ranges:
            made = (int(fields.get("create_time") or 0), fields.get("state", ""))
            latest = made if latest is None or made[0] >= latest[0] else latest
    return None if latest is None else latest[1]


def _fields(job: Any) -> dict[str, str]:
    """A migration's fields (a map, or a flat list of names and values), as text."""
    pairs = job.items() if isinstance(job, dict) else zip(job[::2], job[1::2], strict=True)
    return {_text(k): _text(v) for k, v in pairs}


def place_shards(
    client: Any, name: str, *, dry_run: bool = False, atomic: bool | None = None
) -> list[Move]:
    """Spread the shards of the queue ``name`` over the Cluster's primaries
    (``client``: a redis-py ``RedisCluster``), moving the slots of shards
    that share a primary to the primaries with fewest of the queue's shards,
    keys and all, while the queue runs. Returns the moves (made, or only
    planned with ``dry_run``): none if each shard has a primary of its own
    already, or the queue has one shard (or no map: unsharded or absent).
    ``atomic`` as ``move_slot``'s.

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
    slots = [client.keyslot(hash_tag(shard)) for shard in found.names(name)]
    owners = {slot: nodes.get_node_from_slot(slot).name for slot in slots}
    primaries = {node.name: node for node in client.get_primaries()}
    moves = plan_moves(slots, owners, primaries)
    if not dry_run:
        for move in moves:
            source, target = primaries[move.source], primaries[move.target]
            move_slot(client, move.slot, source, target, atomic=atomic)
    return moves
