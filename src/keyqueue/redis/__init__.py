"""keyqueue on Valkey/Redis: one queue shared by many processes on many machines.

    from keyqueue.redis import RedisWorkQueue, AsyncRedisWorkQueue, LeaseLost, Stalled

The same rules as ``WorkQueue`` (coalescing, exactly one redelivery, per-key
exclusion, delays, backoff, give-up), kept on a Redis >= 6.2 or Valkey >= 7.2
server by one Lua script per core transition, with leases, fencing tokens and
crash recovery (a key whose handler never started costs nothing; one whose
handler started is a stall, and past ``max_stalls`` in a row given up with
``Stalled``). Needs the ``keyqueue[redis]`` extra (redis-py).

How a hold ends, one word each (the code, the docs and the metrics use them
so):

- *done*: its holder released it (``done``, or a batched done in a claim);
  the key is free, or waits again once if it was added meanwhile
  (``RedisStats.dones``).
- *put back*: released without a failure, the key waiting again at once
  (the ``put_back`` script: a claimed key no worker started, a cancelled
  asyncio ``get``'s key, a run's end); counted as an add.
- *abandoned*: its holder let go without telling the server (``abandon``);
  the lease is no longer renewed, so the hold is reaped.
- *reaped*: its lease ran out and the server took it back (``reap``, in any
  client's next script); the key waits again at once
  (``RedisStats.leases_expired``); errors say "taken back".
- *stalled*: reaped after its handler had started (``RedisStats.stalls``);
  reaped before, it cost nothing.
- *lost*: its holder learned that it was reaped (a renewal, or a late
  ``done`` or fenced call): ``LeaseLost``, ``EventKind.LEASE_LOST``
  (``RedisStats.leases_lost``); nothing changed.
- *given up*: the key, not only the hold, ends: it stalled its holder more
  than ``max_stalls`` times in a row (``Stalled``, ``EventKind.POISON``,
  ``RedisStats.given_up_stalls``), or ``retry`` found it failed
  ``max_retries`` times (``RedisStats.given_up_retries``).
"""

try:
    import redis as _redis  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("keyqueue.redis needs redis-py: pip install 'keyqueue[redis]'") from exc

from .._errors import LeaseLost, Stalled
from ._async import AsyncRedisWorkQueue
from ._connection import aclose_client, client_from_url, close_client, describe
from ._durability import NotReplicated
from ._limiter import RedisRateLimiter
from ._replies import RedisStats
from ._sharded_async import AsyncShardedRedisWorkQueue as _AsyncSharded  # noqa: F401
from ._sharded_sync import ShardedRedisWorkQueue as _Sharded  # noqa: F401
from ._shards import shard_of
from ._sync import RedisWorkQueue

__all__ = [
    "AsyncRedisWorkQueue",
    "LeaseLost",
    "NotReplicated",
    "RedisRateLimiter",
    "RedisStats",
    "RedisWorkQueue",
    "Stalled",
    "aclose_client",
    "client_from_url",
    "close_client",
    "describe",
    "shard_of",
]
