"""Every rate limiter's exact sequence of delays, on a FakeClock where time matters."""

from __future__ import annotations

import math
import random
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest

from keyqueue import (
    BucketRateLimiter,
    EndpointRateLimiter,
    EventKind,
    ItemExponentialFailureRateLimiter,
    ItemFastSlowRateLimiter,
    MaxOfRateLimiter,
    RateLimiter,
    WithMaxWaitRateLimiter,
    WorkQueue,
    default_controller_rate_limiter,
)
from keyqueue.testing import FakeClock


def whens(limiter: RateLimiter, key: Any, n: int) -> list[float]:
    return [limiter.when(key) for _ in range(n)]


# -- ItemExponentialFailureRateLimiter --------------------------------------------------


def test_exponential_first_failure_waits_base_then_doubles_up_to_cap() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 20.0)
    assert whens(limiter, "a", 7) == [1.0, 2.0, 4.0, 8.0, 16.0, 20.0, 20.0]


def test_exponential_sequence_with_client_go_defaults() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    assert whens(limiter, "a", 5) == [0.005, 0.01, 0.02, 0.04, 0.08]


def test_exponential_counts_each_key_separately() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0)
    assert limiter.when("a") == 1.0
    assert limiter.when("a") == 2.0
    assert limiter.when("b") == 1.0
    assert limiter.when("a") == 4.0
    assert (limiter.num_requeues("a"), limiter.num_requeues("b")) == (3, 1)


def test_exponential_num_requeues_counts_failures_since_forget() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0)
    assert limiter.num_requeues("a") == 0
    whens(limiter, "a", 3)
    assert limiter.num_requeues("a") == 3
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 1.0  # back to the base delay
    assert limiter.num_requeues("a") == 1


def test_exponential_forget_of_unknown_key_is_harmless() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0)
    limiter.forget("never")
    assert limiter.num_requeues("never") == 0
    assert limiter.when("never") == 1.0


def test_exponential_huge_failure_count_returns_max_never_negative_or_inf() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.005, 1000.0)
    delays = whens(limiter, "a", 3000)  # far beyond 2**1023
    assert all(math.isfinite(d) and 0 < d <= 1000.0 for d in delays)
    assert delays[-2000:] == [1000.0] * 2000
    assert limiter.num_requeues("a") == 3000


def test_exponential_overflow_with_large_base_clamps_to_max() -> None:
    # base * 2**1023 overflows to inf for base > 2: must still come back as max_delay.
    limiter = ItemExponentialFailureRateLimiter(8.0, 1e308)
    delays = whens(limiter, "a", 1100)
    assert all(math.isfinite(d) and 0 < d <= 1e308 for d in delays)
    assert delays[-1] == 1e308


def test_exponential_base_equal_to_max_is_constant() -> None:
    limiter = ItemExponentialFailureRateLimiter(3.0, 3.0)
    assert whens(limiter, "a", 4) == [3.0] * 4


def test_exponential_zero_base_is_always_zero() -> None:
    limiter = ItemExponentialFailureRateLimiter(0.0, 10.0)
    assert whens(limiter, "a", 1100) == [0.0] * 1100


def test_exponential_max_tracked_evicts_oldest_tracked_key() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0, max_tracked=2)
    limiter.when("a")
    limiter.when("b")
    limiter.when("a")  # a fails again but is still the oldest tracked
    limiter.when("c")  # a third key: a is evicted
    assert limiter.num_requeues("a") == 0
    assert limiter.num_requeues("b") == 1
    assert limiter.num_requeues("c") == 1
    assert limiter.when("a") == 1.0  # a starts over (and evicts b)
    assert limiter.num_requeues("b") == 0


def test_exponential_memory_bounded_by_max_tracked_for_stream_of_failing_keys() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0, max_tracked=3)
    for i in range(1000):
        assert limiter.when(i) == 1.0
    tracked = [i for i in range(1000) if limiter.num_requeues(i)]
    assert tracked == [997, 998, 999]


def test_exponential_forget_frees_a_tracking_slot() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 100.0, max_tracked=2)
    limiter.when("a")
    limiter.when("b")
    limiter.forget("a")
    limiter.when("c")  # fits in a's slot: b survives
    assert (limiter.num_requeues("b"), limiter.num_requeues("c")) == (1, 1)


def test_exponential_jitter_matches_seeded_rng_and_stays_in_range() -> None:
    jitter = 0.5
    limiter = ItemExponentialFailureRateLimiter(1.0, 8.0, jitter=jitter, rng=random.Random(7))
    reference = random.Random(7)
    for base in [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]:
        got = limiter.when("a")
        assert got == base + base * jitter * reference.random()
        assert base <= got < base * (1 + jitter)


def test_exponential_jitter_range_over_many_draws() -> None:
    limiter = ItemExponentialFailureRateLimiter(2.0, 2.0, jitter=0.25, rng=random.Random(1))
    draws = [limiter.when(i) for i in range(2000)]
    assert all(2.0 <= d < 2.5 for d in draws)
    assert len(set(draws)) > 1000  # actually jittered
    assert min(draws) < 2.05
    assert max(draws) > 2.45


def test_exponential_same_seed_gives_same_jittered_sequence() -> None:
    def run(seed: int) -> list[float]:
        limiter = ItemExponentialFailureRateLimiter(
            0.1, 1000.0, jitter=1.0, rng=random.Random(seed)
        )
        return whens(limiter, "a", 10)

    unjittered = whens(ItemExponentialFailureRateLimiter(0.1, 1000.0), "a", 10)  # below the cap
    jittered = run(3)
    assert run(3) == jittered
    assert run(4) != jittered  # the sequence comes from the rng passed in
    # Each delay is stretched by a factor in (1, 2), not left as it was.
    assert all(b < d < 2 * b for d, b in zip(jittered, unjittered, strict=True))


def test_exponential_zero_jitter_is_exact() -> None:
    limiter = ItemExponentialFailureRateLimiter(1.0, 8.0, jitter=0.0, rng=random.Random(0))
    assert whens(limiter, "a", 5) == [1.0, 2.0, 4.0, 8.0, 8.0]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"base_delay": -1.0, "max_delay": 1.0}, "base_delay"),
        ({"base_delay": math.nan, "max_delay": 1.0}, "base_delay"),
        ({"base_delay": True, "max_delay": 1.0}, "base_delay"),
        ({"base_delay": "1", "max_delay": 1.0}, "base_delay"),
        ({"base_delay": 1.0, "max_delay": -1.0}, "max_delay"),
        ({"base_delay": 1.0, "max_delay": math.nan}, "max_delay"),
        ({"base_delay": 2.0, "max_delay": 1.0}, "max_delay"),
        ({"base_delay": 1.0, "max_delay": 2.0, "jitter": -0.1}, "jitter"),
        ({"base_delay": 1.0, "max_delay": 2.0, "jitter": math.nan}, "jitter"),
        ({"base_delay": 1.0, "max_delay": 2.0, "jitter": math.inf}, "jitter"),
        ({"base_delay": 1.0, "max_delay": 2.0, "max_tracked": 0}, "max_tracked"),
        ({"base_delay": 1.0, "max_delay": 2.0, "max_tracked": True}, "max_tracked"),
        ({"base_delay": 1.0, "max_delay": 2.0, "max_tracked": 2.5}, "max_tracked"),
    ],
)
def test_exponential_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ItemExponentialFailureRateLimiter(**kwargs)


# -- ItemFastSlowRateLimiter -------------------------------------------------------------


def test_fast_slow_gives_fast_delay_for_first_attempts_then_slow() -> None:
    limiter = ItemFastSlowRateLimiter(0.1, 10.0, max_fast_attempts=3)
    assert whens(limiter, "a", 5) == [0.1, 0.1, 0.1, 10.0, 10.0]
    assert limiter.num_requeues("a") == 5


def test_fast_slow_zero_fast_attempts_is_always_slow() -> None:
    limiter = ItemFastSlowRateLimiter(0.1, 10.0, max_fast_attempts=0)
    assert whens(limiter, "a", 2) == [10.0, 10.0]


def test_fast_slow_forget_starts_fast_again_per_key() -> None:
    limiter = ItemFastSlowRateLimiter(1.0, 5.0, max_fast_attempts=1)
    assert whens(limiter, "a", 2) == [1.0, 5.0]
    assert limiter.when("b") == 1.0
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 1.0
    assert limiter.when("b") == 5.0


def test_fast_slow_max_tracked_evicts_oldest_tracked_key() -> None:
    limiter = ItemFastSlowRateLimiter(1.0, 5.0, max_fast_attempts=1, max_tracked=1)
    assert limiter.when("a") == 1.0
    assert limiter.when("b") == 1.0  # evicts a
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 1.0  # a forgot its failure; evicts b


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((-1.0, 1.0, 1), "fast_delay"),
        ((math.nan, 1.0, 1), "fast_delay"),
        ((1.0, -1.0, 1), "slow_delay"),
        ((1.0, 2.0, -1), "max_fast_attempts"),
        ((1.0, 2.0, 1.5), "max_fast_attempts"),
        ((1.0, 2.0, True), "max_fast_attempts"),
    ],
)
def test_fast_slow_rejects_bad_arguments(args: tuple[Any, ...], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ItemFastSlowRateLimiter(*args)


# -- BucketRateLimiter ----------------------------------------------------------------


def test_bucket_starts_full_then_goes_into_debt_one_over_qps_apart() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=4, burst=3, clock=clock)
    assert whens(limiter, "a", 3) == [0.0, 0.0, 0.0]
    # The k-th call beyond the burst waits k / qps.
    assert whens(limiter, "a", 4) == [1 / 4, 2 / 4, 3 / 4, 4 / 4]


def test_bucket_is_shared_by_all_keys() -> None:
    limiter = BucketRateLimiter(qps=2, burst=2, clock=FakeClock())
    assert [limiter.when(k) for k in "abcd"] == [0.0, 0.0, 0.5, 1.0]
    assert limiter.num_requeues("c") == 0
    limiter.forget("c")
    assert limiter.when("c") == 1.5  # forget does not give tokens back


def test_bucket_refills_at_qps_as_clock_steps() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=2, burst=1, clock=clock)
    assert whens(limiter, "a", 3) == [0.0, 0.5, 1.0]  # tokens now -2
    clock.step(1.0)  # +2 tokens: back to 0
    assert limiter.when("a") == 0.5
    clock.step(0.5)  # +1 token: back to 0
    assert limiter.when("a") == 0.5
    clock.step(1.5)  # +3 tokens from -1, capped at burst 1
    assert whens(limiter, "a", 2) == [0.0, 0.5]


def test_bucket_never_refills_above_burst() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=10, burst=5, clock=clock)
    limiter.when("a")
    clock.step(1000.0)
    assert whens(limiter, "a", 5) == [0.0] * 5
    assert limiter.when("a") == pytest.approx(0.1)


def test_bucket_frozen_clock_never_refills() -> None:
    clock = FakeClock(start=100.0)
    limiter = BucketRateLimiter(qps=1, burst=1, clock=clock)
    assert whens(limiter, "a", 4) == [0.0, 1.0, 2.0, 3.0]


def test_bucket_partial_refill_shortens_debt() -> None:
    clock = FakeClock()
    limiter = BucketRateLimiter(qps=10, burst=1, clock=clock)
    whens(limiter, "a", 4)  # tokens: -3
    clock.step(0.25)  # +2.5 tokens: -0.5
    assert limiter.when("a") == pytest.approx(0.15)  # tokens -1.5 / 10


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"qps": 0, "burst": 1}, "qps"),
        ({"qps": -1.0, "burst": 1}, "qps"),
        ({"qps": math.nan, "burst": 1}, "qps"),
        ({"qps": True, "burst": 1}, "qps"),
        ({"qps": 1.0, "burst": 0}, "burst"),
        ({"qps": 1.0, "burst": 1.5}, "burst"),
        ({"qps": 1.0, "burst": True}, "burst"),
    ],
)
def test_bucket_rejects_bad_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        BucketRateLimiter(**kwargs, clock=FakeClock())


def test_bucket_rejects_clock_without_now() -> None:
    with pytest.raises(TypeError, match="clock"):
        BucketRateLimiter(1.0, 1, clock=object())  # type: ignore[arg-type]


# -- EndpointRateLimiter --------------------------------------------------------------


def host(key: str) -> str:
    """The endpoint of ``"host/object"`` keys."""
    return key.split("/", maxsplit=1)[0]


def test_endpoint_each_endpoint_has_its_own_bucket() -> None:
    limiter = EndpointRateLimiter(host, qps=2, burst=2, clock=FakeClock())
    # A's keys run A's bucket into debt, 1/qps apart; B's keys never see it.
    assert [limiter.when(f"a/{i}") for i in range(5)] == [0.0, 0.0, 0.5, 1.0, 1.5]
    assert [limiter.when(f"b/{i}") for i in range(3)] == [0.0, 0.0, 0.5]
    assert limiter.when("a/9") == 2.0
    assert limiter.endpoints() == 2


def test_endpoint_bucket_matches_a_bucket_rate_limiter_step_by_step() -> None:
    clock = FakeClock()
    per_endpoint = EndpointRateLimiter(host, qps=4, burst=3, clock=clock)
    alone = BucketRateLimiter(qps=4, burst=3, clock=clock)
    seen = []
    for step in [0.0, 0.0, 0.0, 0.0, 0.1, 0.0, 2.0, 0.0, 0.3, 0.0]:
        clock.step(step)
        seen.append((per_endpoint.when("a/x"), alone.when("x")))
    assert [ours for ours, _ in seen] == [theirs for _, theirs in seen]
    assert seen[3] == (0.25, 0.25)


def test_endpoint_refills_each_bucket_on_the_clock() -> None:
    clock = FakeClock()
    limiter = EndpointRateLimiter(host, qps=1, burst=1, clock=clock)
    assert whens(limiter, "a/1", 3) == [0.0, 1.0, 2.0]  # a: tokens -2
    clock.step(2.0)  # a back to 0
    assert limiter.when("a/1") == 1.0
    assert limiter.when("b/1") == 0.0  # b starts full


def test_endpoint_least_recently_used_is_evicted_beyond_max_endpoints() -> None:
    limiter = EndpointRateLimiter(host, qps=1, burst=1, clock=FakeClock(), max_endpoints=2)
    assert limiter.when("a/1") == 0.0
    assert limiter.when("b/1") == 0.0
    assert limiter.when("a/2") == 1.0  # a is now the most recently used
    assert limiter.when("c/1") == 0.0  # a third endpoint: b (least recent) goes
    assert limiter.endpoints() == 2
    assert limiter.when("a/3") == 2.0  # a kept its debt
    assert limiter.when("b/2") == 0.0  # b starts full again (and c goes)
    assert limiter.when("c/2") == 0.0
    assert limiter.endpoints() == 2


def test_endpoint_memory_is_bounded_for_a_stream_of_endpoints() -> None:
    limiter = EndpointRateLimiter(host, qps=1, burst=1, clock=FakeClock(), max_endpoints=100)
    for i in range(10_000):
        limiter.when(f"endpoint-{i}/k")
    assert limiter.endpoints() == 100


def test_endpoint_keeps_no_per_key_state() -> None:
    limiter = EndpointRateLimiter(host, qps=1, burst=1, clock=FakeClock())
    whens(limiter, "a/1", 3)
    assert limiter.num_requeues("a/1") == 0
    limiter.forget("a/1")
    assert limiter.when("a/1") == 3.0  # forget gives no tokens back


def test_endpoint_names_can_be_any_hashable() -> None:
    limiter = EndpointRateLimiter(lambda key: (key[0], 443), qps=1, burst=1, clock=FakeClock())
    assert [limiter.when(k) for k in ["a1", "a2", "b1"]] == [0.0, 1.0, 0.0]


def test_endpoint_raising_or_unhashable_name_propagates_and_spends_nothing() -> None:
    def endpoint(key: str) -> Any:
        if key == "boom":
            raise LookupError("no endpoint for boom")
        return ["unhashable"] if key == "list" else "a"

    limiter = EndpointRateLimiter(endpoint, qps=1, burst=1, clock=FakeClock())
    with pytest.raises(LookupError):
        limiter.when("boom")
    with pytest.raises(TypeError):
        limiter.when("list")
    assert limiter.endpoints() == 0
    assert limiter.when("x") == 0.0


def test_endpoint_composes_with_per_key_backoff_through_max_of() -> None:
    clock = FakeClock()
    limiter = MaxOfRateLimiter(
        ItemExponentialFailureRateLimiter(1.0, 100.0),
        EndpointRateLimiter(host, qps=1, burst=2, clock=clock),
    )
    # a/1 fails again and again: its own backoff; the others on a pay a's debt.
    assert whens(limiter, "a/1", 3) == [1.0, 2.0, 4.0]
    assert [limiter.when(f"a/{i}") for i in range(2, 5)] == [2.0, 3.0, 4.0]
    assert limiter.when("b/1") == 1.0  # b: only its per-key base delay
    assert limiter.num_requeues("a/1") == 3


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"endpoint": "host"}, TypeError, "endpoint"),
        ({"qps": 0}, ValueError, "qps"),
        ({"qps": math.inf}, ValueError, "qps"),
        ({"burst": 0}, ValueError, "burst"),
        ({"burst": 1.5}, ValueError, "burst"),
        ({"max_endpoints": 0}, ValueError, "max_endpoints"),
        ({"max_endpoints": True}, ValueError, "max_endpoints"),
        ({"clock": object()}, TypeError, "clock"),
    ],
)
def test_endpoint_rejects_bad_arguments(
    kwargs: dict[str, Any], error: type[Exception], message: str
) -> None:
    arguments: dict[str, Any] = {"endpoint": host, "qps": 1.0, "burst": 1, **kwargs}
    with pytest.raises(error, match=message):
        EndpointRateLimiter(**arguments)


def test_endpoint_limiter_on_a_queue_backs_off_per_endpoint() -> None:
    clock = FakeClock()
    limiter = EndpointRateLimiter(host, qps=1, burst=1, clock=clock)
    q: WorkQueue[str] = WorkQueue("endpoints", clock=clock, rate_limiter=limiter)
    for i in range(3):
        q.add_rate_limited(f"a/{i}")  # a: 0, 1, 2 s
    q.add_rate_limited("b/0")  # b: at once
    assert [q.get_nowait() for _ in range(len(q))] == ["a/0", "b/0"]
    clock.step(1.0)
    assert q.get_nowait() == "a/1"
    clock.step(1.0)
    assert q.get_nowait() == "a/2"


# -- MaxOfRateLimiter ----------------------------------------------------------------


def test_max_of_returns_longest_delay_and_every_limiter_records() -> None:
    fast_slow = ItemFastSlowRateLimiter(0.1, 10.0, max_fast_attempts=2)
    exponential = ItemExponentialFailureRateLimiter(1.0, 1000.0)
    limiter = MaxOfRateLimiter(fast_slow, exponential)
    assert whens(limiter, "a", 6) == [1.0, 2.0, 10.0, 10.0, 16.0, 32.0]
    assert fast_slow.num_requeues("a") == 6
    assert exponential.num_requeues("a") == 6


def test_max_of_num_requeues_is_max_and_forget_reaches_all() -> None:
    exponential = ItemExponentialFailureRateLimiter(1.0, 1000.0)
    bucket = BucketRateLimiter(qps=1, burst=10, clock=FakeClock())
    limiter = MaxOfRateLimiter(bucket, exponential)
    whens(limiter, "a", 3)
    assert limiter.num_requeues("a") == 3
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert exponential.num_requeues("a") == 0
    assert limiter.when("a") == 1.0


def test_max_of_needs_at_least_one_limiter() -> None:
    with pytest.raises(ValueError, match="at least one"):
        MaxOfRateLimiter()


def test_max_of_rejects_non_limiter() -> None:
    with pytest.raises(TypeError, match="not a rate limiter"):
        MaxOfRateLimiter(ItemExponentialFailureRateLimiter(1.0, 2.0), object())  # type: ignore[arg-type]


# -- WithMaxWaitRateLimiter ------------------------------------------------------------


def test_with_max_wait_caps_inner_delay() -> None:
    inner = ItemExponentialFailureRateLimiter(1.0, 1000.0)
    limiter = WithMaxWaitRateLimiter(inner, max_delay=5.0)
    assert whens(limiter, "a", 5) == [1.0, 2.0, 4.0, 5.0, 5.0]
    assert limiter.num_requeues("a") == 5
    assert inner.when("a") == 32.0  # the inner limiter kept counting
    limiter.forget("a")
    assert inner.num_requeues("a") == 0
    assert limiter.when("a") == 1.0


def test_with_max_wait_caps_bucket_debt() -> None:
    limiter = WithMaxWaitRateLimiter(BucketRateLimiter(qps=1, burst=1, clock=FakeClock()), 1.5)
    assert whens(limiter, "a", 4) == [0.0, 1.0, 1.5, 1.5]


@pytest.mark.parametrize("bad", [-1.0, math.nan, True])
def test_with_max_wait_rejects_bad_max_delay(bad: Any) -> None:
    with pytest.raises(ValueError, match="max_delay"):
        WithMaxWaitRateLimiter(ItemExponentialFailureRateLimiter(1.0, 2.0), bad)


def test_with_max_wait_rejects_non_limiter() -> None:
    with pytest.raises(TypeError, match="not a rate limiter"):
        WithMaxWaitRateLimiter(object(), 1.0)  # type: ignore[arg-type]


# -- never inf, never NaN -------------------------------------------------------------

BIG_INT = 10**400  # an int no float can hold


class Returns:
    """A custom limiter that always returns ``delay`` and counts its calls."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.calls = 0

    def when(self, key: Any) -> float:
        self.calls += 1
        return self.delay

    def forget(self, key: Any) -> None:
        pass

    def num_requeues(self, key: Any) -> int:
        return self.calls

    def __repr__(self) -> str:
        return f"Returns({self.delay!r})"


class Draws(random.Random):
    """An rng whose ``random()`` returns the given values in turn."""

    def __init__(self, *values: float) -> None:
        super().__init__(0)
        self._values = iter(values)

    def random(self) -> float:
        return next(self._values)


def all_finite(limiter: RateLimiter, clock: FakeClock | None = None, n: int = 1100) -> bool:
    delays = []
    for _ in range(n):
        delays.append(limiter.when("a"))
        if clock is not None:
            clock.step(0.5)
    return all(isinstance(d, float) and math.isfinite(d) and d >= 0 for d in delays)


def test_exponential_jitter_on_a_huge_max_delay_stays_finite() -> None:
    limiter = ItemExponentialFailureRateLimiter(1, 1e308, jitter=10, rng=random.Random(11))
    delays = whens(limiter, "a", 1100)
    assert all(math.isfinite(d) for d in delays)
    assert delays[-1] >= 1e308  # capped, then stretched as far as a float goes


def test_exponential_huge_jitter_with_a_zero_draw_is_not_nan() -> None:
    # delay * jitter * 0.0 would be inf * 0.0 = NaN.
    limiter = ItemExponentialFailureRateLimiter(1e300, 1e300, jitter=1e300, rng=Draws(0.0, 0.5))
    assert limiter.when("a") == 1e300
    assert limiter.when("a") == sys.float_info.max


def test_bucket_with_the_smallest_allowed_qps_never_returns_inf() -> None:
    limiter = BucketRateLimiter(qps=1e-308, burst=1, clock=FakeClock())
    assert whens(limiter, "a", 4) == [0.0, 1e308, sys.float_info.max, sys.float_info.max]


@pytest.mark.parametrize(
    "make",
    [
        lambda clock: ItemExponentialFailureRateLimiter(5e-324, 1e308),
        lambda clock: ItemExponentialFailureRateLimiter(1e308, 1e308, jitter=1e308),
        lambda clock: ItemExponentialFailureRateLimiter(0, 0, jitter=1e308),
        lambda clock: ItemFastSlowRateLimiter(1e308, 0, 3),
        lambda clock: BucketRateLimiter(1e-308, 1, clock),
        lambda clock: BucketRateLimiter(1e308, 10**300, clock),
        lambda clock: MaxOfRateLimiter(
            ItemExponentialFailureRateLimiter(1, 1e308, jitter=10),
            BucketRateLimiter(1e-308, 1, clock),
        ),
        lambda clock: WithMaxWaitRateLimiter(
            ItemExponentialFailureRateLimiter(1e308, 1e308, jitter=1e308), 1e308
        ),
    ],
    ids=[
        "exp-tiny-base",
        "exp-huge-jitter",
        "exp-zero",
        "fast-slow",
        "bucket-slow",
        "bucket-fast",
        "max-of",
        "max-wait",
    ],
)
def test_every_limiter_at_its_extreme_parameters_returns_finite_delays(
    make: Callable[[FakeClock], RateLimiter],
) -> None:
    clock = FakeClock()
    assert all_finite(make(clock), clock)


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: ItemExponentialFailureRateLimiter(math.inf, math.inf), "base_delay"),
        (lambda: ItemExponentialFailureRateLimiter(1.0, math.inf), "max_delay"),
        (lambda: ItemExponentialFailureRateLimiter(BIG_INT, BIG_INT), "base_delay"),
        (lambda: ItemExponentialFailureRateLimiter(1, BIG_INT), "max_delay"),
        (lambda: ItemExponentialFailureRateLimiter(1, 2, jitter=BIG_INT), "jitter"),
        (lambda: ItemFastSlowRateLimiter(math.inf, 1.0, 1), "fast_delay"),
        (lambda: ItemFastSlowRateLimiter(1.0, math.inf, 1), "slow_delay"),
        (lambda: ItemFastSlowRateLimiter(1.0, BIG_INT, 1), "slow_delay"),
        (lambda: BucketRateLimiter(1e-320, 1), "qps"),
        (lambda: BucketRateLimiter(5e-324, 1), "qps"),
        (lambda: BucketRateLimiter(math.inf, 1), "qps"),
        (lambda: BucketRateLimiter(BIG_INT, 1), "qps"),
        (lambda: BucketRateLimiter(1.0, BIG_INT), "burst"),
        (lambda: WithMaxWaitRateLimiter(Returns(1.0), math.inf), "max_delay"),
        (lambda: WithMaxWaitRateLimiter(Returns(1.0), BIG_INT), "max_delay"),
    ],
    ids=[
        "exp-inf-base",
        "exp-inf-max",
        "exp-big-int-base",
        "exp-big-int-max",
        "exp-big-int-jitter",
        "fast-slow-inf-fast",
        "fast-slow-inf-slow",
        "fast-slow-big-int-slow",
        "bucket-qps-1e-320",
        "bucket-qps-smallest-subnormal",
        "bucket-inf-qps",
        "bucket-big-int-qps",
        "bucket-big-int-burst",
        "max-wait-inf",
        "max-wait-big-int",
    ],
)
def test_non_finite_or_overflowing_arguments_are_rejected_naming_the_parameter(
    make: Callable[[], RateLimiter], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        make()


@pytest.mark.parametrize("bad", [math.nan, math.inf])
@pytest.mark.parametrize("bad_first", [True, False])
def test_max_of_raises_naming_a_limiter_that_returns_nan_or_inf(
    bad: float, bad_first: bool
) -> None:
    good, broken = Returns(2.0), Returns(bad)
    limiter = MaxOfRateLimiter(*((broken, good) if bad_first else (good, broken)))
    with pytest.raises(ValueError, match=re.escape(f"Returns({bad!r}).when('a') returned {bad!r}")):
        limiter.when("a")
    assert (good.calls, broken.calls) == (1, 1)  # every limiter still recorded the failure


def test_with_max_wait_caps_an_infinite_inner_delay() -> None:
    assert WithMaxWaitRateLimiter(Returns(math.inf), 30.0).when("a") == 30.0


def test_with_max_wait_raises_naming_an_inner_limiter_that_returns_nan() -> None:
    limiter = WithMaxWaitRateLimiter(Returns(math.nan), 30.0)
    with pytest.raises(ValueError, match=re.escape("Returns(nan).when('a') returned nan")):
        limiter.when("a")


# -- default_controller_rate_limiter ----------------------------------------------------


def test_default_limiter_first_100_keys_get_5ms_then_bucket_debt() -> None:
    limiter = default_controller_rate_limiter(FakeClock())
    assert [limiter.when(f"k{i}") for i in range(100)] == [0.005] * 100
    assert limiter.when("k100") == 0.1  # bucket: 10 qps, first call beyond burst 100
    assert limiter.when("k101") == 0.2


def test_default_limiter_single_key_follows_exponential_within_burst() -> None:
    limiter = default_controller_rate_limiter(FakeClock())
    assert whens(limiter, "a", 6) == [0.005, 0.01, 0.02, 0.04, 0.08, 0.16]
    assert limiter.num_requeues("a") == 6
    limiter.forget("a")
    assert limiter.num_requeues("a") == 0
    assert limiter.when("a") == 0.005


def test_default_limiter_exponential_caps_at_1000_seconds() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock)
    delays = []
    for _ in range(40):
        delays.append(limiter.when("a"))
        clock.step(1000.0)  # keep the bucket full
    assert delays[:3] == [0.005, 0.01, 0.02]
    assert max(delays) == 1000.0
    assert delays[-1] == 1000.0


def test_default_limiter_bucket_refills_on_its_clock() -> None:
    clock = FakeClock()
    limiter = default_controller_rate_limiter(clock)
    for i in range(101):
        limiter.when(f"k{i}")
    clock.step(100.0)  # refilled to the burst
    assert [limiter.when(f"j{i}") for i in range(100)] == [0.005] * 100
    assert limiter.when("j100") == 0.1


# -- the queue's default limiter ----------------------------------------------------


def test_queue_without_rate_limiter_uses_default_limiter_on_its_clock() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(rate_limiter=None, clock=clock)
    chosen: list[float | None] = []
    q.subscribe(lambda e: chosen.append(e.duration) if e.kind is EventKind.RATE_LIMIT else None)
    for i in range(101):
        q.add_rate_limited(f"k{i}")
    # A frozen FakeClock: the bucket has not refilled at all (wall time would).
    assert chosen == [0.005] * 100 + [0.1]
    assert len(q) == 0
    assert q.stats().delayed == 101
    clock.step(0.005)
    assert len(q) == 100
    clock.step(0.09)
    assert len(q) == 100  # k100 is due at 0.1, not yet
    clock.step(0.01)
    assert len(q) == 101
    # Stepping the queue's clock refills the bucket it uses.
    clock.step(100.0)
    q.add_rate_limited("fresh")
    assert chosen[-1] == 0.005
    assert q.num_requeues("k0") == 1
    assert isinstance(q.rate_limiter, MaxOfRateLimiter)
    s = q.stats()
    assert (s.retries, s.rate_limited) == (102, 102)


def test_queue_retry_gives_up_with_bucket_limiter_that_keeps_no_count() -> None:
    clock = FakeClock()
    q: WorkQueue[str] = WorkQueue(
        rate_limiter=BucketRateLimiter(qps=1, burst=10, clock=clock), max_retries=2, clock=clock
    )
    q.add("a")
    assert q.get_nowait() == "a"
    assert q.retry("a") is True
    assert q.retry("a") is False
    assert q.num_requeues("a") == 0  # the bucket keeps no per-key count
    assert q.stats().rate_limited == 1
