"""What both sharded drivers share: the shards, built, and the plain surface.

A client of a queue of ``shards=N`` (N > 1) is a facade over N clients of
today's kind, one per shard (``_shards``: shard ``i`` is the ordinary queue
``name/i``), all on one redis-py client: ``RedisWorkQueue(name,
shards=N)`` makes a ``ShardedRedisWorkQueue`` (a subclass, so the type and
the methods are the same), ``AsyncRedisWorkQueue`` an
``AsyncShardedRedisWorkQueue``. Each shard client keeps its own holds,
renewal loop (one call per shard that has holds), reap timer and doorbell;
the facade routes each per-key call to its key's shard, in the caller's
thread or task (so a hold is the caller's, as on one queue), and adds up
what reads the whole queue. Its events and metrics are the facade's: every
shard reports to the facade's subscribers, under the queue's name.

``build`` makes the shards from the constructor's arguments; the drivers'
``__init__`` call it. Waiting for any shard is ``_shard_waits``'.

The client follows the queue's map on the server (``_resharding``), not
``shards=``: that is the count a queue new on the server starts with. Every
shard client's script calls carry the map's epoch (the drivers replace each
shard client's ``_run``); a refusal for an older map reloads it, and the
shards a reshard adds are made then (``_grow``).
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, ClassVar, TypeVar

from .._checks import check_keys
from .._events import Event, Subscribers
from .._options import QueueOptions
from .._ratelimit import RateLimiter
from ._claim_book import ClaimParts
from ._claim_rules import ClaimRules
from ._config import check_key, priority_arg, with_limiter
from ._connection import client_from_url, close_client
from ._front import RedisFront
from ._limiter import RedisRateLimiter
from ._shard_map import ShardMap
from ._shards import check_shards, shard_name, split_limiter

__all__ = ["ShardedParts"]

C = TypeVar("C", bound=ClaimRules)


class ShardedParts:
    """The facade's state and the calls both drivers make the same way.
    Mixed into each sharded driver before its unsharded base."""

    _shards: list[Any]  # the shard clients: _shards[i] serves shard i
    _waits: Any  # the driver's waits for any shard (_shard_waits), made by _start
    _rate_limiter: RedisRateLimiter | RateLimiter

    _base: ClassVar[type[RedisFront[Any]]]
    """The driver's unsharded client: one per shard."""

    def __init__(self, name: str, **options: Any) -> None:
        """The driver's constructor, its arguments as the unsharded driver's
        (``RedisFront.__new__`` checked them against its signature): the
        shard clients made (``_build``), then the driver's own state
        (``_start``). ``shards`` is the count a queue new on the server
        starts with."""
        self._build(name, options)
        self._start()

    def _start(self) -> None:
        raise NotImplementedError

    def _build(self, name: str, options: dict[str, Any]) -> None:
        """Make the shard clients of ``_base`` (the unsharded driver) on one
        redis-py client (made from ``url`` and owned, or ``client``), their
        events the facade's; every other option is each shard client's."""
        base = self._base
        url, client = options.pop("url", None), options.pop("client", None)
        count = check_shards(options.pop("shards", 1))
        metrics = options.pop("metrics", None)
        rate_limiter = options.get("rate_limiter")
        kind = type(self).__name__
        if (url is None) == (client is None):
            raise TypeError(f"{kind} needs exactly one of url= or client=")
        checked = QueueOptions(
            name,
            rate_limiter=rate_limiter,
            max_retries=options.get("max_retries"),
            clock=options.get("clock"),
            metrics=metrics,
            aging=options.get("aging"),
            fair_by=options.get("fair_by"),
        )
        owns = client is None
        if client is None:
            try:
                client = client_from_url(url, asyncio=base._asyncio)
            except ValueError as exc:
                raise ValueError(f"{kind}(url=...): {exc}") from None
        self.name = checked.name
        self._rate_limiter = checked.rate_limiter
        self._events = Subscribers(
            checked.name, checked.metrics.new_queue_metrics(checked.name, self._gauges)
        )
        self._given_limiter = rate_limiter  # as passed: split by each map's width (_split)
        self._options = {**options, "rate_limiter": split_limiter(rate_limiter, count)}
        self._client = client
        self._owns_client = owns
        self._asked = count
        self._map: ShardMap | None = None  # the server's, once read (_map_read)
        # The runners' claims on this client: given the shards a reshard adds.
        self._claim_sources: weakref.WeakSet[Any] = weakref.WeakSet()
        self._shards = []
        try:
            self._grow(count)
        except BaseException:
            if owns and not base._asyncio:  # an asyncio client has not connected yet
                close_client(client)
            raise
        first = self._shards[0]
        # What the inherited read-only properties read: shard 0's (every shard's are alike).
        self._cfg = first._cfg
        self._batch = first._batch
        self._add_timeout = first._add_timeout
        self._replication = first._replication
        self._waiting = first._waiting

    def _grow(self, width: int) -> None:
        """Shard clients up to ``width``: their events the facade's, each
        one's ``_run`` the driver's ``_shard_run`` (which adds the map); once
        the driver is started, given to its waits and its runners' claims."""
        built = len(self._shards)
        while len(self._shards) < width:
            named = shard_name(self.name, len(self._shards))
            shard: Any = self._base(named, client=self._client, **self._options)
            shard._run = functools.partial(self._shard_run, shard._run)
            shard._events = shard._reports.events = self._events
            self._shards.append(shard)
        waits = getattr(self, "_waits", None)
        if waits is not None and len(self._shards) > built:
            added = self._shards[built:]
            for claims in list(self._claim_sources):
                claims.grow([self._shard_claim_parts(shard) for shard in added])
            waits.grow()

    def _new_claims(self, kind: type[C], fold_forget: bool) -> C:
        """The runners' batched source (``kind``: the driver's claims): each
        shard's claims (its parts), the claimant waiting for any shard
        (``_waits``), given the shards a reshard adds (``_grow``)."""
        parts = [self._shard_claim_parts(shard) for shard in self._shards]
        claims = kind(self, parts, fold_forget, self._waits, self._shard_index)
        self._claim_sources.add(claims)
        return claims

    @staticmethod
    def _shard_claim_parts(shard: Any) -> ClaimParts:
        """A shard's claim machinery, as the sharded client's claims use it."""
        raise NotImplementedError

    def _shard_run(self, run: Any, script: str, args: list[str]) -> Any:
        raise NotImplementedError

    def _map_read(self, reply: Sequence[Any]) -> bool:
        """The ``map`` script's reply from shard 0: the map kept if newer than
        this client's, and the shards it adds made. Whether it changed."""
        found = ShardMap.parse(reply)
        if self._map is not None and found.epoch <= self._map.epoch:
            return False
        self._grow(found.width)
        self._map = found
        self._split(found.width)
        return True

    def _split(self, width: int) -> None:
        """Every shard client's server buckets split ``width`` ways (qps/width,
        burst/width: ``split_limiter``), the shards made later too, so the
        shards' sum stays the rate given whatever count a reshard leaves."""
        limiter = split_limiter(self._given_limiter, width)
        self._options["rate_limiter"] = limiter
        if limiter is None:
            return
        for shard in self._shards:
            shard._cfg = with_limiter(shard._cfg, limiter)

    def _map_args(self) -> list[str]:
        return [self._shards[0]._cfg.clock_arg(), str(self._asked)]

    # -- what both drivers answer alike --------------------------------------------------

    def _gauges(self) -> Any:
        raise NotImplementedError

    def _holding(self, key: str) -> Any:
        """The shard client that holds ``key`` for this client, or None
        (``TypeError`` for a key that is not a ``str``)."""
        check_key(key)
        for shard in self._shards:
            if key in shard._holds:
                return shard
        return None

    def _first(self, key: str, by_hold: bool = True) -> tuple[int, int]:
        """The shard to ask first for a per-key call of ``key``, and its shard
        once moved (``ShardMap.route``); ``TypeError`` for a key that is not a
        ``str``. With ``by_hold``, the shard where this client holds the key:
        an outcome sent there is fenced by the hold's token (``LeaseLost`` if
        the hold ran out, also after the key moved on), and asked as moving
        where the map puts the key in another shard. Without (an add, never
        fenced), the map alone: a hold that ran out while the key moved gives
        it no state there again (a held key's old shard serves its add as
        the map's first shard while the key is still held there)."""
        check_key(key)
        first, home = self._current.route(key)
        if by_hold:
            for index, shard in enumerate(self._shards):
                if key in shard._holds:
                    return index, home
        return first, home

    def _shard(self, key: str) -> Any:
        """The shard client that holds ``key``, else its shard's by the map
        (once moved, while keys move)."""
        return self._shards[self._shard_index(key)]

    def _shard_index(self, key: str) -> int:
        """The index of ``_shard(key)`` (``TypeError`` for a key that is not a ``str``)."""
        check_key(key)
        for index, shard in enumerate(self._shards):
            if key in shard._holds:
                return index
        return self._current.route(key)[1]

    def _check_not_moving(self) -> None:
        """``delete``'s guard: a reshard under way would import the keys it
        carries into the deleted queue, so ``delete`` is refused
        (``RuntimeError``, nothing changed) until the reshard ends."""
        moving = self._current.moving_from
        if moving is not None:
            raise RuntimeError(
                f"queue {self.name!r}: a reshard from {moving} to {self._current.shards} shards"
                f" is under way; finish it (reshard({self._current.shards})) before delete"
            )

    @property
    def _current(self) -> ShardMap:
        """The map this client routes by (the count asked until it is read)."""
        return self._map or ShardMap(self._asked, 0)

    def _groups(self, keys: Iterable[str], priority: int) -> tuple[list[list[str]], list[str]]:
        """``add_many``'s keys: those that stay in their shard, by shard, each
        shard's in order; and those that move (added one at a time). Every
        key, its group (``fair_by``) and the priority checked first
        (``TypeError``, ``ValueError``, ``fair_by``'s error: nothing sent)."""
        priority_arg(priority)
        checked = [check_key(key) for key in check_keys(keys)]
        self._cfg.groups_arg(checked)  # with fair_by, every key's group: none sent on a raise
        shard_map = self._current
        groups: list[list[str]] = [[] for _ in range(shard_map.width)]
        moving: list[str] = []
        for key in checked:
            first, home = shard_map.route(key)
            if first == home:
                groups[home].append(key)
            else:
                moving.append(key)
        return groups, moving

    @property
    def shards(self) -> int:
        """How many shards the queue has: its map's, as this client last read
        it (``shards=`` is what a queue new on the server starts with)."""
        return self._current.shards

    @property
    def rate_limiter(self) -> RedisRateLimiter | RateLimiter:
        """As given. Each shard's server buckets (the queue's and each
        endpoint's) get ``qps / N`` and ``burst / N``, N the shards of the
        map this client follows (of both counts while a reshard moves keys),
        split again whenever it follows a new map."""
        return self._rate_limiter

    @property
    def _getters(self) -> int:
        return sum(shard._getters for shard in self._shards)

    def token(self, key: str) -> int:
        """The fencing token of ``key``, which this client holds (``ValueError``
        otherwise). Tokens strictly increase per key; each shard counts its
        own, so keys of different shards may share a token."""
        return int(self._shard(key).token(key))

    def abandon(self, key: str) -> None:
        """As ``RedisWorkQueue.abandon``, on the key's shard."""
        self._shard(key).abandon(key)

    def subscribe(self, callback: Callable[[Event[str]], None]) -> Callable[[], None]:
        """As ``RedisWorkQueue.subscribe``: every shard's transitions this client made."""
        return self._events.subscribe(callback)

    def _watch_poison(self, watcher: Callable[[str], object]) -> Callable[[], None]:
        stops = [shard._watch_poison(watcher) for shard in self._shards]

        def stop() -> None:
            for each in stops:
                each()

        return stop

    def _quiet_shut(self, shards: Sequence[Any]) -> None:
        """Shards past the first are shut with no SHUTDOWN event of their own
        (the first's is the client's one)."""
        for shard in shards[1:]:
            with shard._waiting.lock:
                shard._waiting.shutting_down = True

    def __repr__(self) -> str:
        state = "shutting down" if self._waiting.shutting_down else "running"
        held = sum(len(shard._holds) for shard in self._shards)
        return (
            f"<{type(self).__name__} {self.name!r} {self._current} {state}: "
            f"{held} held by this client>"
        )
