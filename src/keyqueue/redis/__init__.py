"""keyqueue on Valkey/Redis: one queue shared by many processes on many machines.

    from keyqueue.redis import RedisWorkQueue, AsyncRedisWorkQueue, LeaseLost, Stalled

The same rules as ``WorkQueue`` (coalescing, exactly one redelivery, per-key
exclusion, delays, backoff, give-up), kept on a Redis >= 6.2 or Valkey >= 7.2
server by one Lua script per core transition, with leases, fencing tokens and
crash recovery (a key whose handler never started costs nothing; one whose
handler started is a stall, and past ``max_stalls`` in a row given up with
``Stalled``). Needs the ``keyqueue[redis]`` extra (redis-py).
"""

try:
    import redis as _redis  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError("keyqueue.redis needs redis-py: pip install 'keyqueue[redis]'") from exc

from .._errors import LeaseLost, Stalled
from .._source import batch_with
from ._async import AsyncRedisWorkQueue
from ._async_claims import AsyncClaims
from ._claims import Claims
from ._connection import describe
from ._limiter import RedisRateLimiter
from ._replies import RedisStats
from ._sync import RedisWorkQueue

# The runners' batched workers on these queues (``batch=``, ``_source``).
batch_with(RedisWorkQueue, Claims)
batch_with(AsyncRedisWorkQueue, AsyncClaims)

__all__ = [
    "AsyncRedisWorkQueue",
    "LeaseLost",
    "RedisRateLimiter",
    "RedisStats",
    "RedisWorkQueue",
    "Stalled",
    "describe",
]
