"""A Redis queue client's connection and identity.

Who this client is (its holder name, on its leases and as its connections'
client name), what it talks to (``describe``: host, port and
database, never a password), the server it needs (Redis >= 6.2, Valkey >=
7.2), the keys and scripts it sends, and what a failed call means
(``CONNECTION_ERRORS``: its outcome unknown; ``Unsent``: never sent).
"""

from __future__ import annotations

import logging
import os
import socket
import uuid
from typing import Any

import redis

from ._schema import KEY_NAMES, SCRIPTS, claim_record, get_record, key_names, script_keys
from ._schema import wake_key as _wake_key

__all__ = [
    "CONNECTION_ERRORS",
    "SAID_ERRORS",
    "WAKE_TTL_MS",
    "Keys",
    "Unsent",
    "block_limit",
    "check_holder",
    "default_holder",
    "describe",
    "name_connections",
    "server_checked",
    "unreachable",
]

logger = logging.getLogger("keyqueue")

MIN_SERVER = (6, 2)
DEFAULT_BLOCK = 30.0  # longest single BLPOP, in seconds, when the socket timeout and lease allow it
WAKE_TTL_MS = 60_000  # a shut-down client's wake-up list outlives it by this much

CONNECTION_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,
    redis.exceptions.TimeoutError,
    OSError,
)
"""What a call raises when the server did not answer (its outcome is
unknown): the runner asks such a call again, with a backoff."""

SAID_ERRORS: tuple[type[BaseException], ...] = (redis.exceptions.MaxConnectionsError,)
"""Connection errors a client logs itself, once: redis-py's pool had no free
connection (a pool too small for the workers; nothing was sent). The runners
ask such a call again without a warning each time."""


def default_holder() -> str:
    """This process's identity, ``hostname:pid``, as a client name takes it
    (any character but printable ASCII without spaces becomes ``-``)."""
    raw = f"{socket.gethostname()}:{os.getpid()}"
    return "".join(c if "!" <= c <= "~" else "-" for c in raw)


def check_holder(holder: object) -> str:
    """``holder=``: a non-empty ``str`` of printable ASCII without spaces
    (what Redis takes as a client name; a lease records it as one word)."""
    if not isinstance(holder, str):
        raise TypeError(f"holder must be a str, got {holder!r}")
    if not holder or not all("!" <= c <= "~" for c in holder):
        raise ValueError(
            f"holder must be printable ASCII without spaces (a Redis client name), got {holder!r}"
        )
    return holder


def name_connections(client: Any, holder: str) -> None:
    """Make ``holder`` the client name of the connections ``client`` opens
    from now on, unless it has a name already (the caller's choice stands).
    A cluster client's nodes keep their own settings."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict) and not kwargs.get("client_name"):
        kwargs["client_name"] = holder


def describe(client: Any) -> str:
    """What a redis-py client (``redis`` or ``redis.asyncio``) talks to, as
    errors and operators' tools name it: ``host:port/db``, ``unix:<path>``,
    or ``the cluster at`` its startup nodes. Never a password."""
    nodes = getattr(getattr(client, "nodes_manager", None), "startup_nodes", None)
    if nodes:
        return "the cluster at " + ", ".join(sorted(nodes))
    kwargs = client.get_connection_kwargs()
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def block_limit(client: Any) -> float:
    """The longest single BLPOP: well inside the client's socket timeout.

    Servers end a blocking call's timeout on their cron tick (``hz``, 10 a
    second by default), so a BLPOP may return up to ~100 ms after its timeout:
    keep that much margin, and more.
    """
    kwargs = client.get_connection_kwargs()
    socket_timeout = kwargs.get("socket_timeout", 5.0)  # redis-py's default
    if socket_timeout is None:
        return DEFAULT_BLOCK
    socket_timeout = float(socket_timeout)
    return max(0.001, min(DEFAULT_BLOCK, max(socket_timeout / 4, socket_timeout - 0.5)))


def parse_version(info: dict[str, Any]) -> tuple[int, ...]:
    raw = str(info.get("redis_version", "0"))
    try:
        return tuple(int(part) for part in raw.split(".")[:2])
    except ValueError:
        return (0,)


def server_checked(name: str, at: str, info: dict[str, Any]) -> None:
    """Raise ``RuntimeError`` if the server's INFO says it is too old."""
    if parse_version(info) < MIN_SERVER:
        raise RuntimeError(
            f"keyqueue.redis queue {name!r}: the server at {at} speaks "
            f"Redis {info.get('redis_version')}; keyqueue needs Redis >= 6.2 or Valkey >= 7.2"
        )


def unreachable(name: str, at: str, exc: BaseException) -> redis.exceptions.ConnectionError:
    """The constructor's (or first call's) error for a server it cannot reach."""
    return redis.exceptions.ConnectionError(
        f"keyqueue.redis queue {name!r}: cannot reach the server at {at}: {exc}"
    )


class Keys:
    """The server keys one client of queue ``name`` sends: the queue's, and
    its own (its wake-up list, its get and claim records)."""

    __slots__ = ("bell", "queue", "requeues", "scripts", "stats", "wake")

    def __init__(self, name: str) -> None:
        self.queue = key_names(name)
        by_name = dict(zip(KEY_NAMES, self.queue, strict=True))
        # The keys each script takes, in its KEYS order (_schema.script_keys).
        self.scripts = {s: [by_name[k] for k in script_keys(s)] for s in SCRIPTS}
        self.bell = by_name["bell"]
        self.requeues = by_name["requeues"]
        self.stats = by_name["stats"]  # exists once any client used the queue
        client_id = uuid.uuid4().hex
        self.wake = _wake_key(name, client_id)
        # The get and claim scripts' last key: this client's record of its
        # gets by slot, and of its last claim.
        self.scripts["get"].append(get_record(name, client_id))
        self.scripts["claim"].append(claim_record(name, client_id))


class Unsent:
    """Whether a call that raised was never sent: redis-py found no free
    connection in the client's pool (``MaxConnectionsError``), a
    configuration error said once, at ERROR. Its outcome is known (nothing
    happened), so no hold stops being renewed; the runners ask again."""

    __slots__ = ("name", "said")

    def __init__(self, name: str) -> None:
        self.name = name
        self.said = False  # a MaxConnectionsError was logged (once per client)

    def __call__(self, exc: BaseException) -> bool:
        if not isinstance(exc, redis.exceptions.MaxConnectionsError):
            return False
        if not self.said:
            self.said = True
            logger.error(
                "keyqueue %r: the redis connection pool has no free connection "
                "(MaxConnectionsError: %s): it is too small for this client's workers; "
                "give it at least one connection per worker, plus two (BLPOP and "
                "renewals). Calls that found none are asked again",
                self.name,
                exc,
            )
        return True
