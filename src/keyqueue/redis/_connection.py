"""A Redis queue client's connection and identity.

Who this client is (its holder name, on its leases and as its connections'
client name), what it talks to (``describe``: host, port and
database, or the Sentinel service and the primary it named, never a
password), the client a URL names (``client_from_url``: one server, a
Sentinel service, a Cluster), the server it needs (Redis >= 6.2, Valkey >=
7.2), the keys and scripts it sends, and what a failed call means
(``CONNECTION_ERRORS``: its outcome unknown; ``Unsent``: never sent).

A Sentinel client follows its service's primary by itself: redis-py's
Sentinel pool asks the sentinels for the primary on each new connection,
and drops a connection that a demoted primary answers ``READONLY`` on. A
Cluster client follows ``MOVED`` replies and reloads its slot map after a
connection error.
"""

from __future__ import annotations

import logging
import os
import socket
import urllib.parse
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.asyncio.sentinel
import redis.cluster
import redis.sentinel

from ._schema import KEY_NAMES, SCRIPTS, claim_record, get_record, key_names, script_keys
from ._schema import wake_key as _wake_key

__all__ = [
    "CONNECTION_ERRORS",
    "SAID_ERRORS",
    "WAKE_TTL_MS",
    "Keys",
    "StaleEpoch",
    "Unsent",
    "block_limit",
    "aclose_client",
    "check_holder",
    "check_url",
    "client_from_url",
    "close_client",
    "default_holder",
    "describe",
    "name_connections",
    "server_checked",
    "shown_url",
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


class StaleEpoch(redis.exceptions.ConnectionError):
    """A get or claim handed out nothing: the node it reached is not the
    primary this client verified (a failover happened, or is under way), and
    reading the new one's view (``_epoch``) did not settle it in a few
    attempts. Nothing changed on the server (a claim's dones were not sent
    either); the call is safe to ask again, and the runners do, after their
    backoff. A connection error, as a lost connection is."""


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


SENTINEL_PORT = 26379
REDIS_PORT = 6379
URL_FORMS = (
    "redis://host:port/db, rediss://, unix://, "
    "redis+sentinel://host:port[,host:port...]/service[/db] or redis+cluster://host:port[,...]"
)
"""The URLs ``client_from_url`` reads, as its errors name them."""
_parse_url: Callable[[str], dict[str, Any]] = redis.connection.parse_url  # typed here
_sync_node: Any = redis.cluster.ClusterNode
_PLAIN = ("redis", "rediss", "unix")
_SENTINEL = ("redis+sentinel", "rediss+sentinel")
_CLUSTER = ("redis+cluster", "rediss+cluster")
_SENTINEL_AUTH = ("sentinel_username", "sentinel_password")


@dataclass(frozen=True)
class _Target:
    """What a URL names: ``kind`` (``plain``, ``sentinel``, ``cluster``), the
    addresses to start from, the Sentinel ``service``, and the keyword
    arguments of the data nodes' connections and of the sentinels'."""

    kind: str
    url: str
    nodes: list[tuple[str, int]] = field(default_factory=list)
    service: str = ""
    kwargs: dict[str, Any] = field(default_factory=dict)
    sentinel_kwargs: dict[str, Any] = field(default_factory=dict)


def _bad(url: str, problem: str) -> ValueError:
    return ValueError(f"{shown_url(url)!r}: {problem}")


def shown_url(url: str) -> str:
    """``url`` without its password (in the user part or the query)."""
    if "password" not in url and ":" not in url.partition("://")[2].partition("@")[0]:
        return url
    parts = urllib.parse.urlsplit(url)
    user, at, host = parts.netloc.rpartition("@")
    netloc = f"{user.partition(':')[0]}:***@{host}" if at and ":" in user else parts.netloc
    query = urllib.parse.urlencode(
        [
            (k, "***" if "password" in k else v)
            for k, v in urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
        ]
    )
    return parts._replace(netloc=netloc, query=query).geturl()


def _address(url: str, text: str, default_port: int) -> tuple[str, int]:
    host, port = text, ""
    if text.startswith("["):  # [IPv6]:port
        host, _, rest = text[1:].partition("]")
        port = rest.removeprefix(":")
    elif text.count(":") == 1:
        host, _, port = text.partition(":")
    if not host:
        raise _bad(url, f"no host in {text!r}")
    if not port:
        return host, default_port
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise _bad(url, f"the port {port!r} of {text!r} is not a number from 1 to 65535")
    return host, int(port)


def _query_kwargs(url: str, query: str) -> dict[str, Any]:
    """redis-py's own reading of the URL's query (``socket_timeout=2``...)."""
    try:
        kwargs = dict(_parse_url("redis://x/?" + query))
    except ValueError as exc:
        raise _bad(url, str(exc).rstrip(".")) from None
    del kwargs["host"]
    return kwargs


def _target(url: str) -> _Target:
    """Read ``url``, or raise ``ValueError`` naming what is wrong (one line)."""
    if not isinstance(url, str):
        raise TypeError(f"url must be a str, got {url!r}")
    scheme, sep, _ = url.partition("://")
    scheme = scheme.lower()
    if not sep or scheme not in (*_PLAIN, *_SENTINEL, *_CLUSTER):
        raise ValueError(f"{shown_url(url)!r} is not a {URL_FORMS} URL")
    parts = urllib.parse.urlsplit(url)
    if scheme in _PLAIN:
        databases = urllib.parse.parse_qs(parts.query).get("db", [])
        if scheme != "unix":
            databases.append(parts.path.strip("/"))
        for db in databases:
            if db and not db.isdigit():
                raise _bad(url, f"the database {db!r} is not a number")
        try:
            _parse_url(url)
        except ValueError as exc:
            raise _bad(url, str(exc).rstrip(".")) from None
        return _Target("plain", url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    sentinel_auth = {k: v for k, v in query if k in _SENTINEL_AUTH}
    kwargs = _query_kwargs(
        url, urllib.parse.urlencode([kv for kv in query if kv[0] not in _SENTINEL_AUTH])
    )
    userinfo, at, hosts = parts.netloc.rpartition("@")
    if at:
        user, colon, password = userinfo.partition(":")
        if user:
            kwargs["username"] = urllib.parse.unquote(user)
        if colon:
            kwargs["password"] = urllib.parse.unquote(password)
    if not hosts:
        raise _bad(url, "no host:port")
    tls = scheme.startswith("rediss")
    if scheme in _CLUSTER:
        nodes = [_address(url, each, REDIS_PORT) for each in hosts.split(",")]
        if parts.path.strip("/") not in ("", "0") or kwargs.get("db", 0) != 0:
            raise _bad(url, "a Cluster has database 0 only")
        kwargs.pop("db", None)
        if sentinel_auth:
            raise _bad(url, f"{', '.join(sentinel_auth)} is for redis+sentinel:// URLs")
        if tls:
            kwargs["ssl"] = True
        return _Target("cluster", url, nodes, kwargs=kwargs)
    nodes = [_address(url, each, SENTINEL_PORT) for each in hosts.split(",")]
    service, _, db = parts.path.strip("/").partition("/")
    service = urllib.parse.unquote(service)
    if not service:
        raise _bad(
            url, "no service name: use redis+sentinel://host:port[,host:port...]/service[/db]"
        )
    if db:
        if not db.isdigit():
            raise _bad(url, f"the database {db!r} is not a number")
        kwargs["db"] = int(db)
    sentinel_kwargs = {k: v for k, v in kwargs.items() if k.startswith("socket_")}
    if "sentinel_username" in sentinel_auth:
        sentinel_kwargs["username"] = sentinel_auth["sentinel_username"]
    if "sentinel_password" in sentinel_auth:
        sentinel_kwargs["password"] = sentinel_auth["sentinel_password"]
    if tls:
        kwargs["ssl"] = sentinel_kwargs["ssl"] = True
    return _Target("sentinel", url, nodes, service, kwargs, sentinel_kwargs)


def check_url(url: str) -> None:
    """Raise ``ValueError`` (one line naming the problem, never a password)
    unless ``client_from_url`` reads ``url``. Connects to nothing."""
    _target(url)


SENTINEL_TIMEOUTS = {"socket_timeout": 2.0, "socket_connect_timeout": 2.0}
"""Seconds a sentinel has to accept a connection and to answer a question."""


def client_from_url(url: str, *, asyncio: bool = False, **options: Any) -> Any:
    """A redis-py client (``redis.asyncio``'s if ``asyncio``) for the server,
    Sentinel service or Cluster that ``url`` names:

    - ``redis://[user:password@]host:port/db``, ``rediss://`` (TLS),
      ``unix://path``: one server, as ``Redis.from_url`` reads it.
    - ``redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]``
      (``rediss+sentinel://``: TLS to the sentinels and the data nodes): the
      primary of ``service`` as the sentinels name it,
      ``Sentinel(...).master_for(service)``; it follows a failover by
      itself. The user and password are the data nodes'; the sentinels'
      are the query parameters ``sentinel_username`` and
      ``sentinel_password``. A port defaults to 26379.
    - ``redis+cluster://[user:password@]host:port[,host:port...]``
      (``rediss+cluster://``): a ``RedisCluster`` starting from those
      nodes. A port defaults to 6379.

    Query parameters redis-py reads (``socket_timeout=2``...) apply to the
    data nodes' connections (and the ``socket_*`` ones to the sentinels');
    ``options`` (keyword arguments of the client) override them. Raises
    ``ValueError`` for a URL it cannot read (``check_url``). A plain or
    Sentinel client connects on first use; a synchronous Cluster client
    reads its slot map here (``RedisClusterException`` if no node answers).
    Close it with ``close_client`` (``aclose_client``), which also closes a
    Sentinel client's connections to the sentinels.
    """
    target = _target(url)
    if target.kind == "plain":
        plain = redis.asyncio.Redis if asyncio else redis.Redis
        return plain.from_url(url, **options)
    kwargs = target.kwargs | options
    if target.kind == "cluster":
        if asyncio:
            return redis.asyncio.RedisCluster(
                startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in target.nodes],
                **kwargs,
            )
        return redis.RedisCluster(
            startup_nodes=[_sync_node(h, p) for h, p in target.nodes], **kwargs
        )
    # A sentinel that does not answer is an error within seconds (redis-py's
    # default waits for ever), unless the URL or the caller says otherwise.
    sentinel_kwargs = (
        SENTINEL_TIMEOUTS
        | target.sentinel_kwargs
        | {k: v for k, v in options.items() if k.startswith("socket_")}
    )
    kind = redis.asyncio.sentinel.Sentinel if asyncio else redis.sentinel.Sentinel
    sentinel = kind(target.nodes, sentinel_kwargs=sentinel_kwargs)
    return sentinel.master_for(target.service, **kwargs)


def sentinels_of(client: Any) -> list[Any]:
    """The clients of a Sentinel client's sentinels (none for another client)."""
    manager = getattr(getattr(client, "connection_pool", None), "sentinel_manager", None)
    return list(getattr(manager, "sentinels", None) or [])


def close_client(client: Any) -> None:
    """Close a synchronous client's connections, and a Sentinel client's sentinels'."""
    client.close()
    for each in sentinels_of(client):
        each.close()


async def aclose_client(client: Any) -> None:
    """Close an asyncio client's connections, and a Sentinel client's sentinels'."""
    await client.aclose()
    for each in sentinels_of(client):
        await each.aclose()


def _hostport(kwargs: dict[str, Any]) -> str:
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', REDIS_PORT)}"


def describe(client: Any) -> str:
    """What a redis-py client (``redis`` or ``redis.asyncio``) talks to, as
    errors and operators' tools name it: ``host:port/db``, ``unix:<path>``,
    ``the cluster at`` its startup nodes, or for a Sentinel client
    ``sentinel <service>[/db] via <first sentinel>[,…]`` (the first in the
    client's list: redis-py moves a sentinel that answered to its front) and, once it has
    asked, ``(primary host:port)``. Never a password. Reads only what the
    client holds: no network call."""
    nodes = getattr(getattr(client, "nodes_manager", None), "startup_nodes", None)
    if nodes:
        return "the cluster at " + ", ".join(sorted(nodes))
    pool: Any = getattr(client, "connection_pool", None)
    sentinels = sentinels_of(client)
    kwargs = client.get_connection_kwargs()
    if sentinels:
        db = kwargs.get("db", 0)
        first = _hostport(sentinels[0].get_connection_kwargs())
        more = ",…" if len(sentinels) > 1 else ""
        said = f"sentinel {pool.service_name}{f'/{db}' if db else ''} via {first}{more}"
        primary = getattr(pool, "master_address", None)
        return f"{said} (primary {primary[0]}:{primary[1]})" if primary else said
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{_hostport(kwargs)}/{kwargs.get('db', 0)}"


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

    __slots__ = ("bell", "dead", "queue", "requeues", "scripts", "stats", "wake")

    def __init__(self, name: str) -> None:
        self.queue = key_names(name)
        by_name = dict(zip(KEY_NAMES, self.queue, strict=True))
        # The keys each script takes, in its KEYS order (_schema.script_keys).
        self.scripts = {s: [by_name[k] for k in script_keys(s)] for s in SCRIPTS}
        self.bell = by_name["bell"]
        self.requeues = by_name["requeues"]
        self.stats = by_name["stats"]  # exists once any client used the queue
        self.dead = by_name["dead"]  # the dead keys: a queue holding some exists too
        client_id = uuid.uuid4().hex
        self.wake = _wake_key(name, client_id)
        # The get and claim scripts' last key: this client's record of its
        # gets by slot, and of its last claim.
        self.scripts["get"].append(get_record(name, client_id))
        self.scripts["claim"].append(claim_record(name, client_id))


class Unsent:
    """Whether a call that raised was never sent: redis-py found no free
    connection in the client's pool (``MaxConnectionsError``), a
    configuration error said once, at ERROR; or was refused before it
    changed anything (``StaleEpoch``). Its outcome is known (nothing
    happened), so no hold stops being renewed; the runners ask again."""

    __slots__ = ("name", "said")

    def __init__(self, name: str) -> None:
        self.name = name
        self.said = False  # a MaxConnectionsError was logged (once per client)

    def __call__(self, exc: BaseException) -> bool:
        if isinstance(exc, StaleEpoch):
            return True
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
