"""A Redis queue client's settings, checked once, as the scripts take them.

``configure`` checks the constructor's arguments (those every queue takes,
through ``QueueOptions``, and the Redis client's own) and returns a frozen
``QueueConfig``: the settings the operations (``_ops``) read, many already
spelled as the scripts' ARGV (``lease_arg``, ``aging_arg``, ``reap_args``,
the server limiter's arguments). The argument checks the operations share
(keys, priorities, ``add_many``'s batches) are here too. No I/O.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from .._checks import check_keys, check_priority, check_seconds
from .._clock import Clock, VirtualClock
from .._options import QueueOptions
from .._ratelimit import RateLimiter
from .._waiting import group_of
from ._limiter import RedisRateLimiter

__all__ = [
    "ADD_BATCH",
    "DEFAULT_MAX_STALLS",
    "MAX_CLAIM",
    "QueueConfig",
    "check_key",
    "configure",
    "key_batches",
    "priority_arg",
    "with_limiter",
]

DEFAULT_MAX_STALLS = 1
"""``max_stalls``' default (docs/DESIGN.md, "What a crash costs")."""
ADD_BATCH = 1000
"""Keys per script run in ``add_many``: the server runs nothing else meanwhile."""
MAX_CLAIM = 1000
"""Most keys one claim takes (``Claims`` also settles at most this many holds
in one: the script works in chunks either way, but runs nothing else meanwhile)."""


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """One client's settings: what its operations send and how they read time."""

    name: str
    """The queue's name, as given (its keys' hash tag, its metrics label)."""
    holder: str
    """This client's identity, recorded with each lease it takes."""
    lease: float
    """Seconds a hold lasts without renewal."""
    max_retries: int | None
    """Failures after which ``retry`` gives a key up (None: never)."""
    max_stalls: int
    """Stalls in a row after which a reaping call gives a key up as poison."""
    aging: float | None
    """This client's ``aging`` (None: strict)."""
    rate_limiter: RedisRateLimiter | RateLimiter
    """The limiter as given (``RedisRateLimiter()`` by default)."""
    local_limiter: RateLimiter | None
    """The local limiter, which keeps the backoff state in this process (None:
    the server keeps it)."""
    server_limiter_args: tuple[str, ...]
    """The server limiter's base, cap, qps and burst ARGV (empty with a local one)."""
    clock: VirtualClock | None
    """A virtual clock replacing the server's time (tests), else None."""
    unsent: Callable[[BaseException], bool]
    """Whether a call that raised this was never sent (``_connection.Unsent``)."""
    lease_arg: str
    """``lease`` as the scripts take it."""
    aging_arg: str
    """What the scripts that take a priority pass as aging ('' for strict)."""
    reap_args: tuple[str, ...]
    """What reaping scripts take (``lua/lib/reap.lua`` reap_config): max_stalls."""
    max_retries_arg: str
    """``max_retries`` as ``retry`` takes it ('' for never)."""
    fair_by: Callable[[Any], str] | None = None
    """This client's ``fair_by`` (None: none): it computes each key's group
    at add and sends it with the key (``lua/lib/fair.lua``)."""

    def groups_arg(self, keys: list[str]) -> str:
        """The add script's groups argument: the keys' groups as a JSON list
        ('' without ``fair_by``); ``group_of``'s errors before anything is sent."""
        fair_by = self.fair_by
        if fair_by is None:
            return ""
        return json.dumps([group_of(fair_by, key) for key in keys], ensure_ascii=False)

    def group_tail(self, key: str) -> list[str]:
        """The delayed adds' last argument: the key's group (none without ``fair_by``)."""
        fair_by = self.fair_by
        return [] if fair_by is None else [group_of(fair_by, key)]

    def clock_arg(self) -> str:
        """The scripts' first argument: the virtual clock's now ('' for the server's time)."""
        return "" if self.clock is None else repr(self.clock.now())

    def local(self, now: float) -> float:
        """This client's time for hold ages: the virtual clock's, else ``now``
        (monotonic, passed by the driver)."""
        return self.clock.now() if self.clock is not None else now

    def endpoint_args(self, key: str) -> list[str]:
        """The server limiter's endpoint arguments for ``key`` (see ``RedisRateLimiter``)."""
        limiter = self.rate_limiter
        if isinstance(limiter, RedisRateLimiter):
            return limiter.endpoint_args(key)
        return ["", "", "", ""]


def with_limiter(cfg: QueueConfig, limiter: RedisRateLimiter | RateLimiter) -> QueueConfig:
    """``cfg`` with ``limiter`` in place of its rate limiter (a sharded client
    splitting the server's buckets again for a new map): what the next
    ``add_rate_limited`` and ``retry`` send."""
    if limiter is cfg.rate_limiter:
        return cfg
    if isinstance(limiter, RedisRateLimiter):
        return dataclasses.replace(
            cfg, rate_limiter=limiter, local_limiter=None, server_limiter_args=tuple(limiter.args())
        )
    return dataclasses.replace(
        cfg, rate_limiter=limiter, local_limiter=limiter, server_limiter_args=()
    )


def check_max_stalls(max_stalls: object) -> int:
    """``max_stalls=``: an ``int >= 0`` (0: a key's first stall gives it up)."""
    if isinstance(max_stalls, bool) or not isinstance(max_stalls, int) or max_stalls < 0:
        raise ValueError(f"max_stalls must be an int >= 0, got {max_stalls!r}")
    return max_stalls


def configure(
    options: QueueOptions,
    *,
    holder: str,
    lease: object,
    max_stalls: object,
    unsent: Callable[[BaseException], bool],
) -> QueueConfig:
    """The client's settings from its checked ``options`` and its own
    arguments; ``TypeError``/``ValueError`` for a bad one."""
    if not options.name:
        raise ValueError("a Redis queue needs a non-empty name (its keys' hash tag)")
    lease = check_seconds(lease, "lease", positive=True)
    limiter = RedisRateLimiter() if options.rate_limiter is None else options.rate_limiter
    if not isinstance(limiter, RedisRateLimiter | RateLimiter):
        raise TypeError(
            "rate_limiter must be a RedisRateLimiter (state on the server) or a "
            f"local RateLimiter (when/forget/num_requeues), got {limiter!r}"
        )
    max_stalls = check_max_stalls(max_stalls)
    clock: Clock | None = options.clock
    if clock is not None and not isinstance(clock, VirtualClock):
        raise TypeError(
            "a Redis queue reads time from the server; clock= takes only a virtual "
            f"clock for tests (keyqueue.testing.FakeClock), got {clock!r}"
        )
    return QueueConfig(
        name=options.name,
        holder=holder,
        lease=lease,
        max_retries=options.max_retries,
        max_stalls=max_stalls,
        aging=options.aging,
        rate_limiter=limiter,
        local_limiter=None if isinstance(limiter, RedisRateLimiter) else limiter,
        server_limiter_args=tuple(limiter.args()) if isinstance(limiter, RedisRateLimiter) else (),
        clock=clock,
        unsent=unsent,
        lease_arg=repr(lease),
        aging_arg="" if options.aging is None else repr(options.aging),
        reap_args=(str(max_stalls),),
        max_retries_arg="" if options.max_retries is None else str(options.max_retries),
        fair_by=options.fair_by,
    )


def check_key(key: object) -> str:
    """A key of a Redis queue: a ``str`` (``TypeError`` otherwise)."""
    if type(key) is not str:
        raise TypeError(f"keys of a Redis queue must be str, got {key!r}")
    return key


def key_batches(keys: Iterable[str]) -> list[list[str]]:
    """``add_many``'s keys, checked, in batches of at most ``ADD_BATCH``.

    Raises ``TypeError`` (before anything is sent) for a key that is not a
    ``str``, or for a ``str`` passed as the iterable (its characters are not
    meant as keys).
    """
    checked = [check_key(key) for key in check_keys(keys)]
    return [checked[i : i + ADD_BATCH] for i in range(0, len(checked), ADD_BATCH)]


def priority_arg(priority: object) -> str:
    """A priority as the scripts take it (``check_priority``: an int, 32-bit;
    as on the in-memory fronts, a false value is 0)."""
    return str(check_priority(priority)) if priority else "0"
