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
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from .._checks import check_keys
from .._events import Event, Subscribers
from .._metrics import MetricsProvider
from .._options import QueueOptions
from .._ratelimit import RateLimiter
from ._config import check_key, priority_arg
from ._connection import client_from_url, close_client
from ._front import RedisFront
from ._limiter import RedisRateLimiter
from ._shards import (
    MAP_EPOCH,
    MAP_SHARDS,
    check_map,
    check_shards,
    group_by_shard,
    shard_name,
    shard_of,
    split_limiter,
)

__all__ = ["ShardedParts"]


class ShardedParts:
    """The facade's state and the calls both drivers make the same way.
    Mixed into each sharded driver before its unsharded base."""

    _shards: list[Any]  # the shard clients: _shards[i] serves shard i
    _shard_count: int
    _rate_limiter: RedisRateLimiter | RateLimiter

    def _build(
        self,
        base: type[RedisFront[Any]],
        name: str,
        url: str | None,
        client: Any,
        shards: object,
        rate_limiter: RedisRateLimiter | RateLimiter | None,
        metrics: MetricsProvider | None,
        options: dict[str, Any],
    ) -> None:
        """Make the shard clients of ``base`` (the unsharded driver) on one
        redis-py client (made from ``url`` and owned, or ``client``), their
        events the facade's."""
        count = check_shards(shards)
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
        )
        owns = client is None
        if client is None:
            try:
                client = client_from_url(url, asyncio=base._asyncio)  # type: ignore[arg-type]
            except ValueError as exc:
                raise ValueError(f"{kind}(url=...): {exc}") from None
        each = split_limiter(rate_limiter, count)
        try:
            built = [
                base(shard_name(name, i), client=client, rate_limiter=each, **options)
                for i in range(count)
            ]
        except BaseException:
            if owns and not base._asyncio:  # an asyncio client has not connected yet
                close_client(client)
            raise
        self._shards = built
        self._shard_count = count
        self._owns_client = owns
        self._client = client
        self.name = checked.name
        first = built[0]
        self._rate_limiter = checked.rate_limiter
        # What the inherited read-only properties read: shard 0's (every shard's are alike).
        self._cfg = first._cfg
        self._batch = first._batch
        self._add_timeout = first._add_timeout
        self._replication = first._replication
        self._waiting = first._waiting
        self._events = Subscribers(
            checked.name, checked.metrics.new_queue_metrics(checked.name, self._gauges)
        )
        for shard in built:
            shard._events = shard._reports.events = self._events

    def _map_pipeline(self, index: int) -> Any:
        """Shard ``index``'s map, as one pipeline on its slot: the map's fields
        of its stats hash (``_shards.MAP_SHARDS``, ``MAP_EPOCH``) written if
        absent (``HSETNX``: the first client's stay), then the count read
        back (``_map_written`` checks it). The pipeline's client is the
        shard's (sync or asyncio); the caller executes it."""
        shard = self._shards[index]
        pipe = shard._client.pipeline()
        pipe.hsetnx(shard._stats_key, MAP_SHARDS, self._shard_count)
        pipe.hsetnx(shard._stats_key, MAP_EPOCH, 0)
        pipe.hget(shard._stats_key, MAP_SHARDS)
        return pipe

    # -- what both drivers answer alike --------------------------------------------------

    def _gauges(self) -> Any:
        raise NotImplementedError

    def _shard(self, key: str) -> Any:
        """The shard client of ``key`` (``TypeError`` for a key that is not a ``str``)."""
        return self._shards[self._shard_index(key)]

    def _shard_index(self, key: str) -> int:
        """The shard of ``key`` (``TypeError`` for a key that is not a ``str``)."""
        return shard_of(check_key(key), self._shard_count)

    def _groups(self, keys: Iterable[str], priority: int) -> list[list[str]]:
        """``add_many``'s keys by shard, each shard's in order; every key and
        the priority checked first (``TypeError``, ``ValueError``: nothing sent)."""
        priority_arg(priority)
        checked = [check_key(key) for key in check_keys(keys)]
        return group_by_shard(checked, self._shard_count)

    def _map_written(self, index: int, replies: Sequence[Any]) -> None:
        """``_map_pipeline``'s replies: ``ValueError`` if the map on the
        server names another shard count than this client's."""
        check_map(self.name, index, self._shard_count, replies[-1])

    @property
    def shards(self) -> int:
        """How many shards the queue has (``shards=``)."""
        return self._shard_count

    @property
    def rate_limiter(self) -> RedisRateLimiter | RateLimiter:
        """As given (each shard's server bucket gets ``qps / shards`` and ``burst / shards``)."""
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
            f"<{type(self).__name__} {self.name!r} {self._shard_count} shards {state}: "
            f"{held} held by this client>"
        )
