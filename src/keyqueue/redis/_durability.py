"""Durability modes: what a reply must have reached before a client acts on it.

Theory of operation
-------------------
Replication is asynchronous: a primary answers a script before its replicas
have it, and the replica promoted when the primary dies may miss its last
writes (a hand-out, an add, a done). ``durability="primary"`` (the default)
acts on the primary's reply alone: today's scripts, no command more.
``durability="replicated"`` sends each script that writes with ``WAIT n
timeout`` behind it, on the same connection, in one round trip (``WAIT``
counts the writes of its own connection; ``_send``), and acts on the reply
only if ``WAIT`` answered at least ``n``. ``n`` is every replica of the
primary (``replicas=``, default: the primary's ``connected_slaves`` at start,
read once), not a majority: Sentinel and a Cluster promote one replica, the
one with the highest offset among those they reach, and the others keep
acknowledging the old primary's writes until they are pointed at the new
one; a write every replica has is on whichever is promoted, and an old
primary cut off from its replicas cannot complete a ``WAIT n`` again.

A reply whose ``WAIT`` came short raises ``NotReplicated``, one of the
queue's ``connection_errors``: the call's outcome is unknown, exactly as
after a lost connection, and the recovery is the same one (``_ops``): a
hand-out's keys are handed back by the next get or claim (their records),
an outcome is asked again and applied once, an add is asked again
(``_ride``), a renewal does not extend its holds. While fewer than ``n``
replicas are in sync every write waits the ``WAIT`` timeout and raises: the
mode stops rather than promise less, and says so once per episode
(``Replication.confirmed``); a primary with fewer than ``n`` replicas at
start, or none to wait for, is said once at start (``Replication.start``).

Holds in the replicated mode keep a local deadline (``Hold.deadline``): the
send time of the last hand-out or renewal that ``WAIT`` confirmed, plus the
lease, less ``MARGIN`` of it for the next primary's clock. The next primary
has that lease (every replica had it) and hands the key out only when it
runs out by its own clock; the holder loses its hold at the deadline, before
that (its ``done`` and fenced calls raise ``LeaseLost``, as after a renewal
that said lost). The renewal loop, which walks the holds anyway, marks them
(``Holds.renewal``) and wakes at the earliest deadline (``Holds.next_wake``);
the outcome calls look at the deadline themselves (``Holds.overdue``).

The ``WAIT`` timeout is derived from the lease: ``WAIT_SHARE`` of it, at most
``LONGEST_WAIT``. A renewal in flight can delay marking a hold by one
timeout, so the timeout stays well inside the margin. It is also at most
``SOCKET_SHARE`` of the client's socket timeout: a ``WAIT`` that outlived
the socket timeout would turn each write a lagging replica holds up into a
``TimeoutError`` and a closed connection, where a shorter ``WAIT`` answers
``NotReplicated`` on the same connection (the same recovery: asked again).
The cap shortens only how long a write waits for late replicas; the
figure the episode's warning names is the capped one.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import redis
import redis.asyncio

from ._schema import SCRIPTS

__all__ = [
    "DURABILITIES",
    "LONGEST_WAIT",
    "MARGIN",
    "SOCKET_SHARE",
    "WAIT_SHARE",
    "WRITES",
    "NotReplicated",
    "Replication",
    "areplicas_at_start",
    "check_durability",
    "connected_replicas",
    "replicas_at_start",
    "socket_timeout",
]

logger = logging.getLogger("keyqueue")

DURABILITIES = ("primary", "replicated")
"""``durability=``'s values."""

MARGIN = 0.1
"""Share of the lease a holder's local deadline leaves for the next primary's
clock (and the renewal loop's lateness): 3 s of the default 30 s lease."""

WAIT_SHARE = 0.05
"""``WAIT``'s timeout, as a share of the lease (1.5 s of 30 s, capped)."""

LONGEST_WAIT = 1.0
"""``WAIT``'s longest timeout in seconds, whatever the lease."""

SOCKET_SHARE = 0.5
"""``WAIT``'s longest timeout, as a share of the client's socket timeout: the
other half is for the script and the round trip."""

WRITES = frozenset(SCRIPTS) - {"idle", "snapshot", "stats"}
"""The scripts sent with ``WAIT`` in the replicated mode: every one that writes
but ``stats`` (its reap is redone by any later script; it promises nothing)."""


class NotReplicated(redis.exceptions.RedisError):
    """A write the primary answered but fewer replicas than ``durability=
    "replicated"`` waits for acknowledged within the ``WAIT`` timeout: its
    outcome is unknown (it may be lost in a failover), so the reply was not
    acted on. Asking the same call again is safe, as after a lost connection
    (it is one of the queue's ``connection_errors``)."""

    def __init__(self, message: str, reply: Any = None, acked: int = 0) -> None:
        super().__init__(message)
        self.reply = reply
        """The primary's reply, not acted on."""
        self.acked = acked
        """How many replicas acknowledged the write in time."""


def check_durability(durability: object, replicas: object) -> tuple[bool, int | None]:
    """``durability=`` and ``replicas=``: whether the mode is replicated, and
    the replicas asked for (None: those connected at start). ``ValueError``
    (one line) for a bad value, before anything connects."""
    if durability not in DURABILITIES:
        raise ValueError(f"durability must be 'primary' or 'replicated', got {durability!r}")
    if replicas is None:
        return durability == "replicated", None
    if durability != "replicated":
        raise ValueError("replicas= is for durability='replicated' (the default waits for none)")
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 0:
        raise ValueError(f"replicas must be an int >= 0 or None, got {replicas!r}")
    return True, replicas


class Replication:
    """One replicated client's ``WAIT``: how many replicas (``replicas``,
    known at start), how long (``timeout_ms``), and the episodes of writes
    it could not confirm. Shared by the client's scripts (threads, tasks)."""

    def __init__(
        self, name: str, asked: int | None, lease: float, *, socket_timeout: float | None = None
    ) -> None:
        self.name = name
        self.asked = asked  # replicas=; None: those connected at start
        # Replicas a write must reach: set by start (before any script is sent).
        self.replicas = 0 if asked is None else asked
        wait = min(LONGEST_WAIT, lease * WAIT_SHARE)
        if socket_timeout is not None:  # the client's reads give up after it
            wait = min(wait, socket_timeout * SOCKET_SHARE)
        self.timeout_ms = max(1, round(wait * 1000))
        self.keep = lease * (1 - MARGIN)  # seconds a confirmed hand-out or renewal keeps a hold
        self._lock = threading.Lock()  # guards the three fields below
        self.short = False  # in an episode of writes WAIT did not confirm
        self.not_replicated = 0  # writes WAIT did not confirm, since this client started
        self.started = False  # start ran (it says a shortfall once)

    def start(self, connected: int, where: str) -> None:
        """The primary has ``connected`` replicas now: ``replicas`` is set,
        and a primary that cannot keep the promise is said once."""
        n = self.replicas = connected if self.asked is None else self.asked
        with self._lock:
            said, self.started = self.started, True
        if said:
            return
        if n == 0:
            logger.warning(
                "keyqueue %r: durability 'replicated' has no replica to wait for; the "
                "primary at %s has %d: writes are kept only by the primary",
                self.name,
                where,
                connected,
            )
        elif connected < n:
            logger.warning(
                "keyqueue %r: durability 'replicated' needs %d replica%s; this primary "
                "(%s) has %d: until it has, each write waits %.3g s and is not acknowledged",
                self.name,
                n,
                "" if n == 1 else "s",
                where,
                connected,
                self.timeout_ms / 1000,
            )

    def confirmed(self, acked: int) -> bool:
        """``WAIT`` answered ``acked``: whether the write reached every replica
        asked for. The first short answer after a full one starts an
        episode (one warning), the first full one after ends it (one INFO)."""
        if acked >= self.replicas:
            if self.short:
                with self._lock:
                    ended, self.short = self.short, False
                if ended:
                    logger.info(
                        "keyqueue %r: writes reach %d replica(s) again", self.name, self.replicas
                    )
            return True
        with self._lock:
            self.not_replicated += 1
            said, self.short = self.short, True
        if not said:
            logger.warning(
                "keyqueue %r: a write reached %d of the %d replica(s) durability "
                "'replicated' waits for within %.3g s; until all are in sync every "
                "write waits that long and is asked again (said once)",
                self.name,
                acked,
                self.replicas,
                self.timeout_ms / 1000,
            )
        return False

    def refused(self, reply: Any, acked: int) -> NotReplicated:
        """The error of a write ``WAIT`` did not confirm."""
        return NotReplicated(
            f"keyqueue.redis queue {self.name!r}: the write reached {acked} of "
            f"{self.replicas} replica(s) within {self.timeout_ms} ms; its outcome is "
            "unknown (asking again is safe)",
            reply,
            acked,
        )


def socket_timeout(client: Any) -> float | None:
    """The socket timeout of ``client``'s connections (None: they wait as long
    as it takes), as ``Replication`` is given it."""
    value = client.get_connection_kwargs().get("socket_timeout")
    return None if value is None else float(value)


def connected_replicas(info: dict[str, Any]) -> int:
    """The primary's replicas, from its ``INFO replication``."""
    return int(info.get("connected_slaves", 0))


def replicas_at_start(client: Any, key: str) -> int:
    """The replicas of the primary serving ``key`` now (``INFO replication``
    on it: a Cluster's node for the key's slot)."""
    node: Any = client
    if isinstance(client, redis.RedisCluster):
        cluster: Any = client
        node = cluster.get_redis_connection(cluster.get_node_from_key(key))
    return connected_replicas(node.info("replication"))


async def areplicas_at_start(client: Any, key: str) -> int:
    """``replicas_at_start`` on a ``redis.asyncio`` client."""
    if isinstance(client, redis.asyncio.RedisCluster):
        await client.initialize()
        node = client.get_node_from_key(key)
        info = await client.execute_command("INFO", "replication", target_nodes=node)
    else:
        info = await client.info("replication")
    return connected_replicas(info)
