"""Adds that ride out a failover.

An add coalesces: asked twice, it has the effect of asking once (the key
waits once, at the highest priority asked, from its first add). So an add
whose call failed while the queue's primary changed is asked again by the
library, not by every producer: with a pause of 0.05 s doubling to 1 s
(each drawn between half and all of it, so producers that failed together
do not ask together), until it is answered or ``add_timeout`` seconds have
passed since it was first sent; then the last error is raised. A fenced
call (``add_after`` of a key this client holds) is not asked again here:
what its outcome means is its hold's.

Asked again (``ridden``): no answer (a connection error, Sentinel's
``MasterNotFoundError`` among them, or a timeout: the outcome is unknown,
and asking again is harmless), and the replies of a node that cannot take
a write now, which are known not to have run the script: ``READONLY`` (a
demoted primary), ``NOREPLICAS`` (``min-replicas-to-write`` unmet: an old
primary cut off from its replicas), ``MASTERDOWN`` (a replica without its
primary), ``TRYAGAIN`` and ``CLUSTERDOWN`` (a Cluster in mid-failover),
``LOADING``, redis-py's ``ClusterError`` (a Cluster client that followed
``MOVED``, ``ASK`` and ``TRYAGAIN`` as often as it does, about 0.4 s, while
a slot's keys still crossed: the script never ran); and, with
``durability="replicated"``, a write fewer replicas acknowledged than it
waits for (``NotReplicated``: the add may be lost in a failover, so it is
not acknowledged yet). Not asked again: refused
credentials or permissions, and every other reply (a bug or a
misconfiguration says so at once).

The replies of a node that is not the primary (``READONLY``,
``NOREPLICAS``, ``MASTERDOWN``: ``misrouted``) also send the client back to
whoever names the primary (``reroute``): a Sentinel client closes its idle
connections, so the next one asks the sentinels where the primary is (its
connection that a ``READONLY`` answered is closed by redis-py itself); a
Cluster client reloads its slot map.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import redis

from .._checks import check_number
from .._outcome import jitter
from ._connection import sentinels_of
from ._durability import NotReplicated

__all__ = [
    "ADD_TIMEOUT",
    "Ride",
    "areroute",
    "check_add_timeout",
    "misrouted",
    "reroute",
    "ridden",
]

ADD_TIMEOUT = 30.0
"""``add_timeout``'s default, in seconds: Sentinel's default
``down-after-milliseconds`` alone is 30 s."""
FIRST_PAUSE = 0.05  # seconds before an add is first asked again
LONGEST_PAUSE = 1.0  # the pause doubles up to this

_NOT_PRIMARY = ("READONLY", "NOREPLICAS", "MASTERDOWN")
_NOT_NOW = (*_NOT_PRIMARY, "TRYAGAIN", "CLUSTERDOWN", "LOADING")
_REFUSED = (redis.exceptions.AuthenticationError, redis.exceptions.AuthorizationError)
# redis-py's classes for some of those codes (a reply it parsed carries its code too).
_NOT_PRIMARY_KINDS = (redis.exceptions.ReadOnlyError, redis.exceptions.MasterDownError)
_NOT_NOW_KINDS = (
    *_NOT_PRIMARY_KINDS,
    redis.exceptions.TryAgainError,
    redis.exceptions.ClusterError,  # ClusterDownError, and "TTL exhausted" of redirects
)


def check_add_timeout(value: object) -> float:
    """``add_timeout=``: seconds >= 0, finite (0: an add raises its first error)."""
    must = "add_timeout must be a finite number of seconds >= 0"
    seconds = check_number(value, must, finite=True)
    if not seconds >= 0:
        raise ValueError(f"{must}, got {value!r}")
    return seconds


def _code(exc: BaseException) -> str:
    """A reply's error code: redis-py keeps it apart (``status_code``) for
    the codes it has a class for, else it leads the message."""
    code = getattr(exc, "status_code", None)
    if isinstance(code, str) and code:
        return code
    words = str(exc).split(maxsplit=1)
    return words[0] if words else ""


def ridden(exc: BaseException) -> bool:
    """Whether an add that raised ``exc`` is asked again (see the module)."""
    if isinstance(exc, _REFUSED):
        return False
    if isinstance(
        exc,
        (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError, NotReplicated),
    ):
        return True
    return isinstance(exc, _NOT_NOW_KINDS) or (
        isinstance(exc, redis.exceptions.ResponseError) and _code(exc) in _NOT_NOW
    )


def misrouted(exc: BaseException) -> bool:
    """Whether ``exc`` is a reply of a node that is not the primary."""
    return isinstance(exc, _NOT_PRIMARY_KINDS) or (
        isinstance(exc, redis.exceptions.ResponseError) and _code(exc) in _NOT_PRIMARY
    )


def reroute(client: Any) -> None:
    """Send a synchronous client back to whoever names the primary (see the module)."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is not None:
        nodes.initialize()
    elif sentinels_of(client):
        client.connection_pool.disconnect(inuse_connections=False)


async def areroute(client: Any) -> None:
    """``reroute`` for an asyncio client."""
    nodes = getattr(client, "nodes_manager", None)
    if nodes is not None:
        await nodes.initialize()
    elif sentinels_of(client):
        await client.connection_pool.disconnect(inuse_connections=False)


class Ride:
    """One add's attempts: after each failure, how long to pause before
    asking again, or None to raise. Time is ``now`` (monotonic seconds)."""

    __slots__ = ("_delay", "_now", "_until")

    def __init__(self, timeout: float, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._until = now() + timeout if timeout > 0 else None
        self._delay = 0.0  # the last pause's ceiling (0: none yet)

    def pause(self, exc: BaseException) -> float | None:
        """Seconds to pause after ``exc`` before asking again; None if
        ``exc`` is not ridden out or the add's time is up."""
        if self._until is None or not ridden(exc):
            return None
        left = self._until - self._now()
        if left <= 0:
            return None
        self._delay = FIRST_PAUSE if self._delay <= 0 else min(self._delay * 2, LONGEST_PAUSE)
        return min(jitter(self._delay), left)
