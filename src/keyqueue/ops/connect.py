"""Opening a queue for an operator's command, and saying in one line why not.

The client has short socket timeouts and no retries, so a server that cannot
be reached is an error within seconds, not a hang; a queue that no client has
used (``RedisWorkQueue.exists``) is an error too, rather than an empty
picture of a name with a typo in it. Every Redis error inside the ``with``
block becomes one line (``click.ClickException``: exit status 1), naming the
server as ``host:port/db``, the Sentinel service and its primary, or the
Cluster's nodes, never a password.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, TypeVar

import click

from .._console import OPS_INSTALL
from .._console.options import durability_option, redis_url
from .shards import ShardRow, server_of, shard_row

if TYPE_CHECKING:
    from keyqueue.redis import RedisWorkQueue
    from keyqueue.redis._shard_map import ShardMap

__all__ = [
    "CONNECT_TIMEOUT",
    "SOCKET_TIMEOUT",
    "URL_HELP",
    "QueueAt",
    "open_queue",
    "queue_arguments",
]

F = TypeVar("F", bound=Callable[..., Any])

CONNECT_TIMEOUT = 3.0
"""Seconds to connect to the server before the command gives up."""
SOCKET_TIMEOUT = 5.0
"""Seconds to wait for any one reply."""
URL_ENV = "KEYQUEUE_REDIS_URL"
URL_HELP = (
    "The server, as redis://[user:password@]host:port/db, a Sentinel service as "
    "redis+sentinel://[user:password@]host:port[,host:port...]/service[/db], or a "
    f"Cluster as redis+cluster://host:port[,host:port...] (or ${URL_ENV})."
)
"""``--redis-url``'s help in every operator's command."""


def queue_arguments(f: F) -> F:
    """``NAME``, ``--redis-url`` (or ``$KEYQUEUE_REDIS_URL``) and ``--durability``:
    which queue, where, and when its writes count as made."""
    f = durability_option(f)
    f = click.option(
        "--redis-url",
        "url",
        envvar=URL_ENV,
        required=True,
        metavar="URL",
        callback=redis_url,
        help=URL_HELP,
    )(f)
    return click.argument("name")(f)


class QueueAt:
    """An open queue for an operator's command: ``queue``, one client of the
    whole queue (sharded or not, as the server's map says: ``shard_map``,
    None for an unsharded queue), its redis-py ``client`` (for ``probe``),
    and where it lives (``where``: ``describe``'s words once the queue opened).

    ``follow`` reads the map again and opens the queue again if a reshard
    changed it; ``close`` closes what is open (not ``client``).
    """

    def __init__(self, name: str, client: Any, durability: str = "primary") -> None:
        self.name = name
        self.client = client
        self.durability = durability
        self.shard_map: ShardMap | None = None
        self._queue: RedisWorkQueue | None = None
        self._shards: list[RedisWorkQueue] = []  # an ordinary client per shard, opened when read
        self.where = ""
        self.follow()

    @property
    def queue(self) -> RedisWorkQueue:
        """The client of the whole queue (as the map last read says)."""
        assert self._queue is not None
        return self._queue

    @property
    def names(self) -> tuple[str, ...]:
        """The shards' queue names (the queue's own name alone if unsharded)."""
        return (self.name,) if self.shard_map is None else self.shard_map.names(self.name)

    def follow(self) -> bool:
        """Read the queue's map on the server; open the queue (again) if it is
        not open or the map changed since (a reshard). True if it opened.

        The first time, a name or map the client refuses raises ``ValueError``;
        later, the queue open stays so and the next call tries again."""
        from keyqueue.redis import RedisWorkQueue, describe  # noqa: PLC0415 (redis-py)
        from keyqueue.redis._shard_map import read_map  # noqa: PLC0415

        found = read_map(self.client, self.name)
        if self._queue is not None and found == self.shard_map:
            return False
        try:
            opened = RedisWorkQueue(
                self.name,
                client=self.client,
                durability=self.durability,
                shards=1 if found is None else found.shards,
            )
        except ValueError:  # the map changed again meanwhile: the next refresh reads it
            if self._queue is None:
                raise
            return False
        self.close()
        self.shard_map, self._queue = found, opened
        self.where = describe(self.client)  # a Sentinel client now names its primary
        return True

    def shard_rows(self) -> list[ShardRow]:
        """Each shard's sizes and server (none for an unsharded queue): one
        read-only script per shard, on an ordinary client of it."""
        from keyqueue.redis import RedisWorkQueue  # noqa: PLC0415 (redis-py)

        if self.shard_map is None:
            return []
        if not self._shards:
            self._shards = [
                RedisWorkQueue(shard, client=self.client, durability=self.durability)
                for shard in self.shard_map.names(self.name)
            ]
        whole = self.where
        return [
            shard_row(i, q.name, server_of(self.client, q.name, whole), q.snapshot(limit=0))
            for i, q in enumerate(self._shards)
        ]

    def close(self) -> None:
        """Close the queue's clients (each shut down; the redis-py client stays open)."""
        for q in [*self._shards, *([self._queue] if self._queue is not None else [])]:
            q.close()
        self._shards, self._queue = [], None


def _reason(exc: BaseException) -> str:
    """The innermost message of a connection error (the socket's own words)."""
    while exc.__cause__ is not None and str(exc.__cause__):
        exc = exc.__cause__
    return str(exc).rstrip(".")


@contextlib.contextmanager
def open_queue(
    name: str, url: str, *, must_exist: bool = True, durability: str = "primary"
) -> Iterator[QueueAt]:
    """The queue ``name`` on the server at ``url`` (``durability`` as the
    queue's), closed at the end of the block.

    Raises ``click.BadParameter`` (exit status 2) for a URL or name the client
    refuses, ``click.ClickException`` (exit status 1) for a server that cannot
    be reached, a queue that does not exist (if ``must_exist``), or any Redis
    error meanwhile.
    """
    try:
        import redis  # noqa: PLC0415 (the redis extra, only when a command runs)
        from redis.backoff import NoBackoff  # noqa: PLC0415
        from redis.retry import Retry  # noqa: PLC0415

        from keyqueue.redis import client_from_url, close_client, describe  # noqa: PLC0415
        from keyqueue.redis._connection import shown_url  # noqa: PLC0415
    except ImportError:
        raise click.ClickException(f"this command needs redis-py: {OPS_INSTALL}") from None
    client: Any = None
    where = shown_url(url)
    try:
        try:
            client = client_from_url(
                url,
                socket_connect_timeout=CONNECT_TIMEOUT,
                socket_timeout=SOCKET_TIMEOUT,
                retry=Retry(NoBackoff(), 0),
            )
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'--redis-url'") from None
        where = describe(client)
        try:
            at = QueueAt(name, client, durability)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'NAME'") from None
        where = at.where  # a Sentinel client now names its primary
        try:
            if must_exist and not at.queue.exists():
                raise click.ClickException(
                    f"no queue {name!r} at {where} (a queue exists once a client has used it)"
                )
            yield at
        finally:
            at.close()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise click.ClickException(f"cannot reach the server at {where}: {_reason(exc)}") from None
    except redis.exceptions.RedisError as exc:
        raise click.ClickException(f"the server at {where} answered: {exc}") from None
    finally:
        if client is not None:
            close_client(client)
