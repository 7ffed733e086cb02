"""Rate limiters: how long a failed key waits before its next try.

Units: every delay (an argument, an attribute, what ``when`` returns) is in
seconds; ``qps`` is tokens per second; ``burst`` is a number of tokens.

The formulas are client-go's (``util/workqueue/default_rate_limiters.go``),
plus ``EndpointRateLimiter`` (one token bucket per dependency, so one failing
endpoint cannot spend everyone's retry budget), with three fixes: exponential
overflow is clamped to ``max_delay`` (client-go's float edge case can go
negative), the token bucket reads an injected clock (so it can be tested), and
per-key failure history is bounded (``max_tracked``: when a new key would
exceed it, the key tracked longest is forgotten, so a stream of keys that
never succeed cannot grow memory without bound).

No limiter returns ``inf`` or NaN. Constructors take only finite numbers (a
``ValueError`` names the parameter otherwise); the few products that can still
overflow (jitter on a huge ``max_delay``, a huge debt in a slow bucket) are
clamped to the largest float. The composite limiters check what the limiters
they wrap return: NaN (or, for ``MaxOfRateLimiter``, ``inf``) is a
``ValueError`` naming the limiter that returned it.

Each limiter takes its own small lock: limiters may be shared between queues,
and they sit on the failure path, not the hot path.
"""

from __future__ import annotations

import math
import random
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, Protocol, runtime_checkable

from ._checks import check_count, check_finite
from ._clock import Clock, resolve_clock

__all__ = [
    "BucketRateLimiter",
    "EndpointRateLimiter",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "RateLimiter",
    "WithMaxWaitRateLimiter",
    "default_controller_rate_limiter",
]

DEFAULT_MAX_TRACKED = 100_000
_LONGEST = sys.float_info.max  # the longest delay a limiter returns (seconds)


@runtime_checkable
class RateLimiter(Protocol):
    """What a queue needs from a rate limiter: any object with these three methods.

    ``when`` returns a delay in seconds (finite, >= 0); a queue calls it on
    each ``add_rate_limited`` and ``retry``, and ``forget`` once the key
    succeeded or was given up.
    """

    def when(self, key: Any) -> float:
        """Record a failure of ``key``; return seconds to wait before retrying it."""
        ...

    def forget(self, key: Any) -> None:
        """``key`` succeeded (or was given up): drop its history."""
        ...

    def num_requeues(self, key: Any) -> int:
        """Failures recorded for ``key`` since it was last forgotten."""
        ...


def _check_seconds(name: str, value: float) -> float:
    seconds = check_finite(value, name)
    if seconds < 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return seconds


def _check_returned(limiter: RateLimiter, key: Any, delay: float, *, inf_ok: bool = False) -> None:
    """Raise if a wrapped ``limiter`` returned NaN (or ``inf``, unless ``inf_ok``)."""
    if math.isnan(delay) or (math.isinf(delay) and not inf_ok):
        raise ValueError(f"{limiter!r}.when({key!r}) returned {delay!r}, not a number of seconds")


class _FailureCounts:
    """key -> failures, evicting the oldest-tracked key beyond ``max_tracked``."""

    __slots__ = ("_counts", "_lock", "_max")

    def __init__(self, max_tracked: int) -> None:
        # Insertion order is tracking age. An OrderedDict, not a dict: popping
        # the oldest of a plain dict rescans the deleted slots at its front.
        self._counts: OrderedDict[Hashable, int] = OrderedDict()
        self._lock = threading.Lock()
        self._max = check_count(max_tracked, "max_tracked")

    def bump(self, key: Hashable) -> int:
        """Record a failure; return the count *before* it."""
        with self._lock:
            counts = self._counts
            before = counts.get(key)
            if before is None:
                if len(counts) >= self._max:
                    counts.popitem(last=False)
                before = 0
            counts[key] = before + 1
            return before

    def get(self, key: Hashable) -> int:
        with self._lock:
            return self._counts.get(key, 0)

    def pop(self, key: Hashable) -> None:
        with self._lock:
            self._counts.pop(key, None)

    def __len__(self) -> int:
        return len(self._counts)


class ItemExponentialFailureRateLimiter:
    """``base_delay * 2**failures`` seconds, capped at ``max_delay`` seconds.

    The first failure waits ``base_delay``, the second twice that, and so on;
    huge failure counts return ``max_delay`` (never a negative or infinite delay).
    With ``jitter=j > 0`` each delay is stretched by a uniform factor in
    ``[1, 1 + j)`` (as client-go's ``wait.Jitter``), so it can exceed
    ``max_delay`` by at most that factor (never past the largest float). ``rng``
    makes jitter reproducible. Every argument must be finite. At most
    ``max_tracked`` keys' failure counts are kept (beyond it the key tracked
    longest is forgotten).
    """

    def __init__(
        self,
        base_delay: float,
        max_delay: float,
        jitter: float = 0.0,
        max_tracked: int = DEFAULT_MAX_TRACKED,
        *,
        rng: random.Random | None = None,
    ) -> None:
        self.base_delay = _check_seconds("base_delay", base_delay)
        """Seconds the first failure waits (client-go's default: 0.005)."""
        self.max_delay = _check_seconds("max_delay", max_delay)
        """The most seconds any failure waits, before jitter (client-go's default: 1000)."""
        if self.max_delay < self.base_delay:
            raise ValueError(f"max_delay ({max_delay!r}) must be >= base_delay ({base_delay!r})")
        self.jitter = check_finite(jitter, "jitter")
        """A fraction (no unit): each delay is stretched by a factor in ``[1, 1 + jitter)``."""
        if self.jitter < 0:
            raise ValueError(f"jitter must be a number >= 0, got {jitter!r}")
        self._rng = rng if rng is not None else random.Random()
        self._failures = _FailureCounts(max_tracked)

    def when(self, key: Any) -> float:
        """Count a failure of ``key``; ``base_delay`` doubled per earlier one, capped, jittered."""
        exp = self._failures.bump(key)
        # 2.0**1023 is the largest power of two a float holds (2.0**1024 raises);
        # the product can still overflow to inf, which the cap catches.
        delay = self.base_delay * 2.0 ** min(exp, 1023)
        if not delay <= self.max_delay:
            delay = self.max_delay
        if self.jitter:
            # delay * (finite) is at worst inf, never NaN (as inf * 0.0 would be).
            delay += delay * (self.jitter * self._rng.random())
            if delay > _LONGEST:
                delay = _LONGEST
        return delay

    def forget(self, key: Any) -> None:
        """Drop ``key``'s count: its next failure waits ``base_delay`` again."""
        self._failures.pop(key)

    def num_requeues(self, key: Any) -> int:
        """Failures counted for ``key`` since it was last forgotten."""
        return self._failures.get(key)

    def __repr__(self) -> str:
        return (
            f"ItemExponentialFailureRateLimiter(base_delay={self.base_delay!r}, "
            f"max_delay={self.max_delay!r}, jitter={self.jitter!r})"
        )


class ItemFastSlowRateLimiter:
    """``fast_delay`` seconds for the first ``max_fast_attempts`` failures, then ``slow_delay``.

    Both delays (seconds) must be finite.
    """

    def __init__(
        self,
        fast_delay: float,
        slow_delay: float,
        max_fast_attempts: int,
        max_tracked: int = DEFAULT_MAX_TRACKED,
    ) -> None:
        self.fast_delay = _check_seconds("fast_delay", fast_delay)
        """Seconds each of the first ``max_fast_attempts`` failures waits."""
        self.slow_delay = _check_seconds("slow_delay", slow_delay)
        """Seconds each later failure waits."""
        self.max_fast_attempts = check_count(max_fast_attempts, "max_fast_attempts", 0)
        """How many failures of a key wait ``fast_delay`` (a count)."""
        self._failures = _FailureCounts(max_tracked)

    def when(self, key: Any) -> float:
        """Count a failure of ``key``: ``fast_delay`` up to ``max_fast_attempts``, then slow."""
        attempts = self._failures.bump(key) + 1
        return self.fast_delay if attempts <= self.max_fast_attempts else self.slow_delay

    def forget(self, key: Any) -> None:
        """Drop ``key``'s count: its next failures are fast again."""
        self._failures.pop(key)

    def num_requeues(self, key: Any) -> int:
        """Failures counted for ``key`` since it was last forgotten."""
        return self._failures.get(key)

    def __repr__(self) -> str:
        return (
            f"ItemFastSlowRateLimiter(fast_delay={self.fast_delay!r}, "
            f"slow_delay={self.slow_delay!r}, max_fast_attempts={self.max_fast_attempts!r})"
        )


def _check_qps(qps: float) -> float:
    number = check_finite(qps, "qps")
    if not number > 0:
        raise ValueError(f"qps must be a number > 0, got {qps!r}")
    if math.isinf(1.0 / number):
        raise ValueError(f"qps is too small: 1/qps seconds per token overflows, got {qps!r}")
    return number


def _check_burst(burst: int) -> float:
    """``burst`` as the bucket's capacity (a float)."""
    return check_finite(check_count(burst, "burst"), "burst")


class _Bucket:
    """One token bucket's state: tokens now, and when they were counted."""

    __slots__ = ("last", "tokens")

    def __init__(self, capacity: float) -> None:
        self.tokens = capacity  # starts full
        self.last: float | None = None

    def take(self, now: float, qps: float, capacity: float) -> float:
        """Refill since ``last``, take a token; the seconds until the debt is repaid."""
        last = self.last
        if last is not None and now > last:
            self.tokens = min(capacity, self.tokens + (now - last) * qps)
        if last is None or now > last:
            self.last = now
        self.tokens -= 1.0
        if self.tokens >= 0:
            return 0.0
        return min(-self.tokens / qps, _LONGEST)  # a huge debt overflows to inf


class BucketRateLimiter:
    """A token bucket shared by all keys: ``qps`` tokens a second, ``burst`` tokens at most.

    As golang.org/x/time/rate's ``Reserve().Delay()``: the bucket starts full,
    every ``when`` takes a token, and when none is left it goes into debt and
    returns how many seconds until the debt is repaid, so N simultaneous failures are
    spread ``1/qps`` apart. Keeps no per-key state: ``num_requeues`` is 0.

    ``qps`` must be finite and large enough that ``1/qps`` is (above about
    5.6e-309); ``burst`` must fit in a float.
    """

    def __init__(self, qps: float, burst: int, clock: Clock | None = None) -> None:
        self.qps = _check_qps(qps)
        """Tokens added per second (client-go's default: 10)."""
        self._capacity = _check_burst(burst)
        self.burst = burst
        """The bucket's capacity in tokens, and what it starts with (client-go's default: 100)."""
        self._clock = resolve_clock(clock)
        self._lock = threading.Lock()
        self._bucket = _Bucket(self._capacity)

    def when(self, key: Any) -> float:
        """Take a token (any ``key``): 0 while one is left, else seconds until the debt is paid."""
        with self._lock:
            return self._bucket.take(self._clock.now(), self.qps, self._capacity)

    def forget(self, key: Any) -> None:
        """Nothing: the bucket is shared by all keys."""
        pass

    def num_requeues(self, key: Any) -> int:
        """Always 0: no per-key state."""
        return 0

    def __repr__(self) -> str:
        return f"BucketRateLimiter(qps={self.qps!r}, burst={self.burst!r})"


class EndpointRateLimiter:
    """One token bucket per endpoint: a failing dependency spends only its own budget.

    ``endpoint(key)`` names the dependency a key talks to (any hashable: a
    host, a tenant, an API group). Each endpoint has a ``BucketRateLimiter``'s
    bucket of its own (``qps`` tokens a second, ``burst`` at most, starting
    full, going into debt), so a thousand keys failing against one endpoint
    push back only that endpoint's retries, while keys on healthy endpoints
    keep their budget. Compose it with per-key backoff through
    ``MaxOfRateLimiter`` (say ``ItemExponentialFailureRateLimiter`` and this).

    Memory is bounded: beyond ``max_endpoints`` buckets the least recently
    used endpoint's is dropped (if it comes back it starts full, so keep
    ``max_endpoints`` above the number of endpoints in use). Keeps no per-key
    state: ``num_requeues`` is 0, ``forget`` does nothing. An exception from
    ``endpoint`` propagates from ``when``; an unhashable name is a
    ``TypeError``. ``qps``/``burst`` as ``BucketRateLimiter``'s.
    """

    def __init__(
        self,
        endpoint: Callable[[Any], Hashable],
        qps: float,
        burst: int,
        clock: Clock | None = None,
        max_endpoints: int = 10_000,
    ) -> None:
        if not callable(endpoint):
            raise TypeError(f"endpoint must be a callable key -> endpoint name, got {endpoint!r}")
        self.endpoint = endpoint
        """``endpoint(key)``: the name of the dependency ``key`` talks to (any hashable)."""
        self.qps = _check_qps(qps)
        """Tokens added per second to each endpoint's bucket."""
        self._capacity = _check_burst(burst)
        self.burst = burst
        """Each endpoint's bucket capacity in tokens, and what it starts with."""
        self.max_endpoints = check_count(max_endpoints, "max_endpoints")
        """The most endpoints with a bucket (least recently used dropped beyond it)."""
        self._clock = resolve_clock(clock)
        self._lock = threading.Lock()
        # endpoint -> its bucket, least recently used first.
        self._buckets: OrderedDict[Hashable, _Bucket] = OrderedDict()

    def when(self, key: Any) -> float:
        """Take a token from ``endpoint(key)``'s bucket: 0, or seconds until its debt is paid."""
        name = self.endpoint(key)
        with self._lock:
            buckets = self._buckets
            bucket = buckets.get(name)
            if bucket is None:
                if len(buckets) >= self.max_endpoints:
                    buckets.popitem(last=False)
                bucket = buckets[name] = _Bucket(self._capacity)
            else:
                buckets.move_to_end(name)
            return bucket.take(self._clock.now(), self.qps, self._capacity)

    def forget(self, key: Any) -> None:
        """Nothing: the buckets are per endpoint, not per key."""
        pass

    def num_requeues(self, key: Any) -> int:
        """Always 0: no per-key state."""
        return 0

    def endpoints(self) -> int:
        """Endpoints with a bucket now (at most ``max_endpoints``)."""
        return len(self._buckets)

    def __repr__(self) -> str:
        return (
            f"EndpointRateLimiter({self.endpoint!r}, qps={self.qps!r}, burst={self.burst!r}, "
            f"max_endpoints={self.max_endpoints!r})"
        )


class MaxOfRateLimiter:
    """The longest delay (seconds) of several limiters (every one records the failure).

    ``when`` raises ``ValueError`` if a limiter returns NaN or ``inf``.
    """

    def __init__(self, *limiters: RateLimiter) -> None:
        if not limiters:
            raise ValueError("MaxOfRateLimiter needs at least one limiter")
        for limiter in limiters:
            if not isinstance(limiter, RateLimiter):
                raise TypeError(f"not a rate limiter (needs when/forget/num_requeues): {limiter!r}")
        self.limiters = limiters
        """The limiters asked, in the order given."""

    def when(self, key: Any) -> float:
        """Ask every limiter (each records the failure); the longest delay."""
        delays = [limiter.when(key) for limiter in self.limiters]  # every one records
        for limiter, delay in zip(self.limiters, delays, strict=True):
            _check_returned(limiter, key, delay)
        return max(delays)

    def forget(self, key: Any) -> None:
        """Forget ``key`` in every limiter."""
        for limiter in self.limiters:
            limiter.forget(key)

    def num_requeues(self, key: Any) -> int:
        """The largest count any limiter has for ``key``."""
        return max(limiter.num_requeues(key) for limiter in self.limiters)

    def __repr__(self) -> str:
        return f"MaxOfRateLimiter({', '.join(map(repr, self.limiters))})"


class WithMaxWaitRateLimiter:
    """Another limiter's delay, but never more than ``max_delay`` seconds (finite).

    An ``inf`` from the wrapped limiter becomes ``max_delay``; NaN raises
    ``ValueError``.
    """

    def __init__(self, limiter: RateLimiter, max_delay: float) -> None:
        if not isinstance(limiter, RateLimiter):
            raise TypeError(f"not a rate limiter (needs when/forget/num_requeues): {limiter!r}")
        self.limiter = limiter
        """The limiter whose delays are capped."""
        self.max_delay = _check_seconds("max_delay", max_delay)
        """The most seconds ``when`` returns."""

    def when(self, key: Any) -> float:
        """The wrapped limiter's delay for ``key``, at most ``max_delay``."""
        delay = self.limiter.when(key)
        _check_returned(self.limiter, key, delay, inf_ok=True)  # inf: capped here
        return min(delay, self.max_delay)

    def forget(self, key: Any) -> None:
        """Forget ``key`` in the wrapped limiter."""
        self.limiter.forget(key)

    def num_requeues(self, key: Any) -> int:
        """The wrapped limiter's count for ``key``."""
        return self.limiter.num_requeues(key)

    def __repr__(self) -> str:
        return f"WithMaxWaitRateLimiter({self.limiter!r}, max_delay={self.max_delay!r})"


def default_controller_rate_limiter(clock: Clock | None = None) -> MaxOfRateLimiter:
    """client-go's default: per key 0.005 s doubling to 1000 s; overall 10 a second, burst 100.

    ``MaxOfRateLimiter(ItemExponentialFailureRateLimiter(0.005, 1000.0),
    BucketRateLimiter(qps=10, burst=100))``: a key's delay is the longer of
    its own backoff and the shared bucket's.

    ``clock`` drives the bucket; a queue built with ``rate_limiter=None`` passes
    its own clock.
    """
    return MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(0.005, 1000.0),
        BucketRateLimiter(qps=10, burst=100, clock=clock),
    )
