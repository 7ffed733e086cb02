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

if TYPE_CHECKING:
    from keyqueue.redis import RedisWorkQueue

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
    """An open queue (``queue``), where it lives (``where``: ``describe``'s words) and
    its redis-py ``client`` (for ``probe``)."""

    def __init__(self, queue: RedisWorkQueue, where: str, client: Any = None) -> None:
        self.queue = queue
        self.where = where
        self.client = client


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

        from keyqueue.redis import (  # noqa: PLC0415
            RedisWorkQueue,
            client_from_url,
            close_client,
            describe,
        )
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
            queue = RedisWorkQueue(name, client=client, durability=durability)
        except ValueError as exc:
            raise click.BadParameter(str(exc), param_hint="'NAME'") from None
        where = describe(client)  # a Sentinel client now names its primary
        try:
            if must_exist and not queue.exists():
                raise click.ClickException(
                    f"no queue {name!r} at {where} (a queue exists once a client has used it)"
                )
            yield QueueAt(queue, where, client)
        finally:
            queue.close()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
        raise click.ClickException(f"cannot reach the server at {where}: {_reason(exc)}") from None
    except redis.exceptions.RedisError as exc:
        raise click.ClickException(f"the server at {where} answered: {exc}") from None
    finally:
        if client is not None:
            close_client(client)
