"""A sharded queue's rules without I/O: which shard a key is in, and how the shards' views add up.

Theory of operation
-------------------
A queue of ``shards=N`` (N > 1) is N ordinary queues: shard 0 is the
unsharded queue ``name`` itself (slot ``{name}``), shard ``i`` > 0 is named
``name/i`` and so in the slot of its own hash tag ``{name/i}``
(``hash_tag``): on a Valkey Cluster the shards spread over the primaries,
and a queue of one shard grows by an ordinary reshard (``_resharding``). A key lives in
one shard for ever (until a reshard moves it), fixed by ``shard_of``: jump
consistent hash (Lamping and Veach, 2014) over the first 8 bytes, big-endian,
of the SHA-256 of the key's UTF-8. Every client of every language computes
the same shard; growing N to M moves only (M - N) / M of the keys, each to
a new shard, which is what an online reshard needs.

Every per-key rule reads and writes only its key's fields, all in its shard,
so each holds for the whole queue as it does for one: coalescing, one holder
per key, the one redelivery, delays, backoff, ``max_retries``, stalls,
fencing tokens (which strictly increase per key: each shard counts its own,
so two keys of different shards may share a token). What is per shard:
hand-out order (each shard FIFO, or ranked by priority with aging within
the shard; across shards the getters take from the shards that have work
in turn), the token bucket (``split_limiter``: each shard gets qps/N and
burst/N), and each shard's clock (its primary's ``TIME``).

The views add up here: ``merge_stats`` sums the shards' stats (each read in
one step on its shard, so the identities of ``RedisStats`` hold for the
sum), ``merge_snapshots`` merges their rows in each list's order, and
``merge_gauges`` the gauges a metrics scrape reads.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
from collections.abc import Iterable, Sequence
from typing import Any, TypeVar

from .._checks import check_count
from .._dead import DeadKey
from .._metrics import QueueGauges
from .._ratelimit import RateLimiter
from .._snapshot import Snapshot
from .._stats import PriorityCounts
from ._limiter import RedisRateLimiter
from ._replies import RedisStats

__all__ = [
    "check_shards",
    "group_by_shard",
    "merge_dead",
    "merge_gauges",
    "merge_snapshots",
    "merge_stats",
    "shard_name",
    "shard_of",
    "split_limiter",
]

T = TypeVar("T")

_JUMP = 2862933555777941757  # Lamping and Veach's linear congruential multiplier
_MASK = (1 << 64) - 1


def check_shards(shards: object) -> int:
    """``shards=``: an int >= 1 (``ValueError`` in one line otherwise)."""
    return check_count(shards, "shards")


def shard_of(key: str, shards: int) -> int:
    """The shard of ``key`` in a queue of ``shards`` shards: ``0 <= i < shards``.

    Jump consistent hash (Lamping and Veach, "A Fast, Minimal Memory,
    Consistent Hash Algorithm", 2014) of the first 8 bytes, big-endian, of
    SHA-256 of ``key`` encoded as UTF-8. Stable across processes, machines
    and versions (never Python's salted ``hash``); from N to M > N shards a
    key moves only if its new shard is one of the added ones, (M - N) / M of
    the keys. ``shard_of(key, 1) == 0``.
    """
    if shards == 1:
        return 0
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    b, j = -1, 0
    while j < shards:
        b = j
        h = (h * _JUMP + 1) & _MASK
        j = int((b + 1) * ((1 << 31) / ((h >> 33) + 1)))
    return b


def shard_name(name: str, index: int) -> str:
    """The name of shard ``index`` of the queue ``name``: ``name`` for shard 0
    (the unsharded queue's keys, hash tag ``{name}``), else ``name/index``
    (hash tag ``{name/index}``)."""
    return name if index == 0 else f"{name}/{index}"


def group_by_shard(keys: Iterable[str], shards: int) -> list[list[str]]:
    """``keys`` by shard, each shard's in the order given (empty lists for shards without any)."""
    groups: list[list[str]] = [[] for _ in range(shards)]
    for key in keys:
        groups[shard_of(key, shards)].append(key)
    return groups


def split_limiter(
    limiter: RedisRateLimiter | RateLimiter | None, shards: int
) -> RedisRateLimiter | RateLimiter | None:
    """Each shard's rate limiter. A ``RedisRateLimiter``'s buckets are split:
    each shard's queue bucket gets ``qps / shards`` and ``burst / shards``
    tokens (at least 1), and so does each endpoint's bucket in each shard;
    the per-key backoff is unchanged. The sum is the global rate when the
    failing keys spread over the shards; a few failing keys in one shard get
    1/N of it. A local limiter (this process's) is shared as it is."""
    if not isinstance(limiter, RedisRateLimiter):
        return limiter
    return dataclasses.replace(
        limiter,
        qps=None if limiter.qps is None else limiter.qps / shards,
        burst=max(1, limiter.burst // shards),
        endpoint_qps=limiter.endpoint_qps / shards,
        endpoint_burst=max(1, limiter.endpoint_burst // shards),
    )


def _sum_priorities(parts: Iterable[Any]) -> PriorityCounts:
    total: dict[int, int] = {}
    for part in parts:
        for priority, count in part.items():
            total[priority] = total.get(priority, 0) + count
    return PriorityCounts(total)


_MAXIMA = frozenset({"oldest_wait_seconds", "max_rate_limit_delay_seconds"})
_THIS_CLIENT = frozenset({"shutting_down"})


def merge_stats(parts: Sequence[RedisStats], shutting_down: bool) -> RedisStats:
    """The queue's stats from its shards': counters, sizes and seconds summed
    (``max_depth`` too: the sum of the shards' high-water marks, an upper
    bound), waiting keys by priority summed, the oldest wait and the longest
    backoff the longest."""
    fields: dict[str, Any] = {}
    for f in dataclasses.fields(RedisStats):
        name = f.name
        if name in _THIS_CLIENT:
            fields[name] = shutting_down
        elif name == "waiting_by_priority":
            fields[name] = _sum_priorities(p.waiting_by_priority for p in parts)
        elif name in _MAXIMA:
            fields[name] = max(getattr(p, name) for p in parts)
        else:
            fields[name] = sum(getattr(p, name) for p in parts)
    return RedisStats(**fields)


def _merged(rows: Iterable[Sequence[T]], key: Any, limit: int) -> tuple[T, ...]:
    """Every shard's rows in ``key`` order (ties in shard order), the first ``limit``."""
    return tuple(sorted(itertools.chain.from_iterable(rows), key=key)[:limit])


def merge_snapshots(parts: Sequence[Snapshot[str]], shutting_down: bool) -> Snapshot[str]:
    """The queue's snapshot from its shards' (each taken in one step on its
    shard, with the same ``limit``): each list's rows merged in its order
    and cut at ``limit``. Waiting: highest priority first, then longest
    waited (each shard's hand-out order within the shard; across shards the
    getters take in turn, so this is the order by rank and arrival, not a
    promise); held: soonest lease expiry first; delayed: soonest due first;
    failing: most failures first; dead: newest first. ``taken_at`` is the latest shard's; each
    row's times are relative to its own shard's reading (the shards' clocks
    and reads differ by the masters' skew and a round trip)."""
    limit = parts[0].limit
    stats = merge_stats([p.stats for p in parts], shutting_down)  # type: ignore[misc]
    return Snapshot(
        stats=stats,
        waiting=_merged((p.waiting for p in parts), lambda r: (-r.priority, -r.waited), limit),
        processing=_merged(
            (p.processing for p in parts),
            lambda r: (r.lease_left is None, r.lease_left or 0.0),
            limit,
        ),
        delayed=_merged((p.delayed for p in parts), lambda r: r.due_in, limit),
        failing=_merged((p.failing for p in parts), lambda r: -r.failures, limit),
        taken_at=max(p.taken_at for p in parts),
        limit=limit,
        failing_keys=sum(p.failing_keys for p in parts),
        dead=merge_dead([p.dead for p in parts], limit),
    )


def merge_dead(parts: Iterable[Sequence[DeadKey[str]]], limit: int) -> tuple[DeadKey[str], ...]:
    """The shards' dead keys (each newest first), newest first, cut at ``limit``."""
    return _merged(parts, lambda r: -r.at, limit)


def merge_gauges(parts: Sequence[QueueGauges]) -> QueueGauges:
    """The gauges of the queue from its shards' (as last read)."""
    return QueueGauges(
        depth=sum(g.depth for g in parts),
        delayed=sum(g.delayed for g in parts),
        unfinished_work_seconds=sum(g.unfinished_work_seconds for g in parts),
        longest_running_processor_seconds=max(g.longest_running_processor_seconds for g in parts),
        waiting_by_priority=_sum_priorities(g.waiting_by_priority for g in parts),
        oldest_wait_seconds=max(g.oldest_wait_seconds for g in parts),
    )
