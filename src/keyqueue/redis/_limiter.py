"""``RedisRateLimiter``: the rate limiter whose state is on the server.

The parameters, checked, and the arguments the scripts take for them; the
rules themselves are ``lua/lib/limiter.lua`` and ``lua/lib/endpoint.lua``.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass

from .._checks import check_count, check_optional_callable, check_rate, check_seconds

__all__ = ["RedisRateLimiter"]


@dataclass(frozen=True, slots=True)
class RedisRateLimiter:
    """The rate limiter the server runs, shared by every client of a queue.

    client-go's default limiter with its state in Redis: the longer of a per-key
    exponential backoff (``base_delay * 2**failures``, capped at ``max_delay``;
    per-key failures kept in a hash that ``forget`` clears) and one token bucket
    for the whole queue (``qps`` tokens a second, ``burst`` at most, going into
    debt as ``rate.Reserve()``; ``qps=None`` means no bucket). Both read the
    server's clock. Pass it as ``rate_limiter=``; every client of one queue
    should pass the same parameters.

    ``endpoint``: ``EndpointRateLimiter`` on the server. ``endpoint(key)`` names
    the dependency a key talks to (its ``str()`` is the bucket's name); each
    endpoint has its own bucket (``endpoint_qps``, ``endpoint_burst``), the
    least recently used dropped beyond ``max_endpoints``, and the delay is the
    longest of the three. A key whose lease ran out is retried without its
    endpoint's bucket (the server cannot call ``endpoint``).
    """

    base_delay: float = 0.005
    """Seconds a key's first failure waits."""
    max_delay: float = 1000.0
    """The most seconds a key's backoff reaches."""
    qps: float | None = 10.0
    """Tokens added per second to the queue's one bucket (None: no bucket)."""
    burst: int = 100
    """The queue's bucket capacity in tokens, and what it starts with."""
    endpoint: Callable[[str], Hashable] | None = None
    """``endpoint(key)``: the dependency a key talks to (None: no endpoint buckets)."""
    endpoint_qps: float = 10.0
    """Tokens added per second to each endpoint's bucket."""
    endpoint_burst: int = 100
    """Each endpoint's bucket capacity in tokens, and what it starts with."""
    max_endpoints: int = 10_000
    """The most endpoints with a bucket (least recently used dropped beyond it)."""

    def __post_init__(self) -> None:
        check_seconds(self.base_delay, "base_delay")
        check_seconds(self.max_delay, "max_delay")
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"max_delay ({self.max_delay!r}) must be >= base_delay ({self.base_delay!r})"
            )
        check_rate(self.qps, "qps", optional=True)
        check_count(self.burst, "burst")
        check_optional_callable(self.endpoint, "endpoint")
        check_rate(self.endpoint_qps, "endpoint_qps")
        check_count(self.endpoint_burst, "endpoint_burst")
        check_count(self.max_endpoints, "max_endpoints")

    def args(self) -> list[str]:
        """base, cap, qps, burst, as the scripts take them (qps 0: no bucket)."""
        return [
            repr(float(self.base_delay)),
            repr(float(self.max_delay)),
            repr(float(self.qps or 0.0)),
            str(self.burst),
        ]

    def endpoint_args(self, key: str) -> list[str]:
        """endpoint, its qps, burst, max endpoints, as the scripts take them
        (all '' when there is none); ``endpoint(key)`` may raise."""
        if self.endpoint is None:
            return ["", "", "", ""]
        return [
            str(self.endpoint(key)),
            repr(float(self.endpoint_qps)),
            str(self.endpoint_burst),
            str(self.max_endpoints),
        ]
