"""The ``front`` harness's Redis fronts: ``RedisWorkQueue`` and ``AsyncRedisWorkQueue``
on the session's valkey-server, and the conformance tests they skip (``REDIS_SKIPS``).

Imports redis-py; conftest.py uses these fronts only when it is installed.
"""

from __future__ import annotations

import asyncio
import functools
import os
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest
import redis
import redis.asyncio

import keyqueue
from keyqueue import Requeue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue
from tests.support.fronts import Front, Handler, ThreadingFront, idle

__all__ = [
    "REDIS_SKIPS",
    "SHARDED_SKIPS",
    "AsyncRedisFront",
    "AsyncShardedRedisFront",
    "RedisFront",
    "ShardedRedisFront",
    "SyncOverAsync",
]

_STR_KEYS = "a Redis queue's keys are str (any other key is a TypeError naming it)"
_PER_CLIENT_SHUTDOWN = (
    "shutdown is per client on Redis: the shared queue keeps its waiting and delayed "
    "keys and takes adds for the other clients (DESIGN.md; the distributed version "
    "is in redis/test_clients.py, named ..._per_client_...)"
)
REDIS_SKIPS = {
    "test_a_callback_that_calls_its_queue_gets_runtime_error_not_a_deadlock": (
        "a Redis client's callbacks run after the server applied the call, under no "
        "lock: calling the queue from one works"
    ),
    "test_any_hashable_can_be_a_key": _STR_KEYS,
    "test_key_is_not_kept_alive_after_add_get_done_forget": _STR_KEYS,
    "test_key_is_not_kept_alive_after_retry_and_forget_once_the_delay_fired": _STR_KEYS,
    "test_runner_calls_done_for_every_key_whatever_the_outcome": _STR_KEYS,
    "test_delayed_keys_are_dropped_at_shutdown": _PER_CLIENT_SHUTDOWN,
    "test_add_after_shutdown_is_a_silent_no_op": _PER_CLIENT_SHUTDOWN,
    "test_retries_and_rate_limited_are_counted_on_a_live_queue_only": _PER_CLIENT_SHUTDOWN,
    "test_waiting_keys_are_handed_out_after_shutdown_then_get_raises_shutdown": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_get_raises_shutdown_while_keys_are_held_if_no_redelivery_is_owed": (_PER_CLIENT_SHUTDOWN),
    "test_key_marked_while_held_is_redelivered_after_shutdown": _PER_CLIENT_SHUTDOWN,
    "test_drain_waits_for_waiting_and_redelivered_keys": _PER_CLIENT_SHUTDOWN,
    "test_repeated_shutdown_emits_one_shutdown_event_and_keeps_waiting_keys": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_stats_counters_after_a_mixed_sequence_match_the_calls_and_the_events": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_runner_failure_while_shutting_down_is_given_up_with_a_warning": _PER_CLIENT_SHUTDOWN,
    "test_retry_while_shutting_down_returns_false_and_adds_nothing": _PER_CLIENT_SHUTDOWN,
    "test_retry_whose_re_add_meets_a_shutdown_gives_the_key_up_instead_of_losing_it": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_retry_of_a_key_re_added_while_held_during_shutdown_is_true_and_redelivers_it": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_runner_failure_of_a_key_re_added_while_held_at_shutdown_is_retried_not_given_up": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_runner_failure_whose_retry_meets_a_shutdown_is_given_up_with_a_warning": (
        _PER_CLIENT_SHUTDOWN
    ),
    "test_prometheus_retries_not_counted_after_shutdown": _PER_CLIENT_SHUTDOWN,
    "test_metrics_adds_after_shutdown_are_not_counted": _PER_CLIENT_SHUTDOWN,
    "test_metrics_delayed_keys_gauge_follows_the_delay_heap": _PER_CLIENT_SHUTDOWN,
    "test_metrics_retries_total_counts_add_after_and_add_rate_limited_on_a_live_queue": (
        _PER_CLIENT_SHUTDOWN
    ),
}


_ACROSS_SHARDS_ORDER = (
    "hand-out order is per shard: each shard is FIFO, and across shards the getters "
    "take from the shards that have work in turn, so keys of different shards come "
    "out in no promised order (this test takes keys expecting one queue-wide order; "
    "the per-key rules it also pins are in redis/test_shards.py)"
)
_PER_SHARD_PRIORITY = (
    "priorities and aging rank within a shard (DESIGN.md, 'One queue across a Valkey "
    "Cluster'): a higher key of one shard can wait while lower keys of another are "
    "handed out, and the aging bound counts that shard's hand-outs"
)
_PER_SHARD_FAIRNESS = (
    "fair_by's groups take turns within a shard, as priorities rank within one "
    "(docs/fairness.md): keys of different shards come out in no promised order "
    "(the per-shard turns are in redis/test_shards.py)"
)
SHARDED_SKIPS: dict[str, str] = {
    **REDIS_SKIPS,
    **dict.fromkeys(
        (
            "test_a_drain_that_times_out_leaves_the_unfinished_keys_queued_with_a_warning",
            "test_a_key_failing_during_a_drain_is_never_given_up",
            "test_add_after_zero_or_negative_adds_now",
            "test_add_many_is_add_on_each_key_in_order",
            "test_delayed_keys_come_out_in_ready_time_order",
            "test_distinct_keys_come_out_in_fifo_order",
            "test_held_key_is_not_handed_to_a_second_getter",
            "test_join_is_woken_by_the_done_that_leaves_the_queue_idle",
            "test_len_counts_waiting_keys_only",
            "test_metrics_unfinished_work_and_longest_running_are_computed_at_scrape_time",
            "test_prometheus_metrics_on_a_fake_clock",
            "test_runner_goes_on_when_a_queue_method_raises_for_one_key",
            "test_runner_goes_on_when_the_rate_limiter_fails_for_one_key",
            "test_runner_handler_raising_lease_lost_is_counted_and_not_retried",
            "test_runner_raising_on_give_up_does_not_stop_the_workers",
            "test_snapshot_shows_the_waiting_held_delayed_and_failing_keys_the_calls_left",
            "test_the_empty_string_is_a_key_like_any_other",
        ),
        _ACROSS_SHARDS_ORDER,
    ),
    **dict.fromkeys(
        (
            "test_a_false_priority_is_zero_also_once_ranked",
            "test_a_key_below_zero_is_raised_by_a_default_add",
            "test_a_raised_key_ages_from_its_first_arrival",
            "test_a_raised_key_keeps_its_arrival_among_keys_of_its_new_priority",
            "test_a_waiting_key_keeps_the_highest_priority_it_was_added_with",
            "test_add_after_adds_with_the_highest_priority_asked_at_the_earliest_time",
            "test_add_rate_limited_adds_with_its_priority",
            "test_aging_bound_scales_with_the_priority_gap",
            "test_aging_counts_from_arrival_also_for_keys_waiting_before_the_first_priority",
            "test_aging_hands_a_low_key_out_after_priority_steps_times_aging",
            "test_higher_priority_first_and_first_come_first_served_within_a_priority",
            "test_key_added_while_held_below_zero_is_raised_by_a_later_default_add",
            "test_key_added_while_held_comes_back_with_the_highest_priority_of_those_adds",
            "test_keys_waiting_before_the_first_priority_keep_their_order",
            "test_runner_requeue_with_a_priority_brings_the_key_back_with_it",
            "test_snapshot_of_a_ranked_queue_lists_keys_in_the_order_gets_take_them",
            "test_stats_waiting_by_priority_and_oldest_wait",
            "test_strict_priorities_starve_a_low_key_while_higher_ones_keep_coming",
            "test_the_priority_range_is_32_bit",
        ),
        _PER_SHARD_PRIORITY,
    ),
    **dict.fromkeys(
        (
            "test_fair_by_hands_out_the_groups_in_turn_fifo_within_each",
            "test_fair_by_a_group_that_starts_waiting_joins_the_turns_at_the_back",
            "test_fair_by_a_quiet_groups_key_waits_for_one_key_of_each_busy_group",
            "test_fair_by_takes_turns_within_a_priority_higher_priorities_first",
            "test_fair_by_a_group_whose_only_key_moved_up_joins_at_the_back_when_it_comes_back",
            "test_fair_by_a_key_added_while_held_comes_back_behind_its_group",
            "test_fair_by_a_key_given_up_by_hand_is_replayed_into_its_group",
            "test_fair_by_keeps_the_aging_bound_taking_turns_within_the_aged_priority",
        ),
        _PER_SHARD_FAIRNESS,
    ),
}
"""The conformance tests a sharded queue (``shards=3``) skips: the Redis
fronts' own, and those that pin a queue-wide order, which holds per shard only."""

SHARDS = 3  # the sharded fronts' shards
ON_CLUSTER = os.environ.get("KEYQUEUE_SHARDED_ON_CLUSTER") == "1"
"""The sharded fronts run on a 3-primary Valkey Cluster (``valkey_cluster``)
instead of the session's server: one run of the suite, by hand or in CI
(``KEYQUEUE_SHARDED_ON_CLUSTER=1 pytest tests/conformance -k sharded``)."""


class _RedisQueues:
    """Each Redis test starts on an empty db and closes the queues it made."""

    url = ""
    per_client_shutdown = True

    def begin(self, request: pytest.FixtureRequest) -> None:
        self.url = request.getfixturevalue("valkey_url")
        client = redis.Redis.from_url(self.url)
        client.flushdb()
        client.close()
        self.made: weakref.WeakSet[Any] = weakref.WeakSet()


class RedisFront(_RedisQueues, ThreadingFront):
    """RedisWorkQueue: the threading front's harness, on a real server."""

    name = "redis"
    queue_type = RedisWorkQueue
    skips = REDIS_SKIPS

    def begin(self, request: pytest.FixtureRequest) -> None:
        super().begin(request)
        self.client = redis.Redis.from_url(self.url)

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        q = RedisWorkQueue(name, client=self.client, **kwargs)
        self.made.add(q)
        return q

    def end(self) -> None:
        for q in list(self.made):
            q.close()
        self.client.close()


def _cluster_begin(front: Any, request: pytest.FixtureRequest) -> None:
    """A sharded front on the cluster: its URL, every primary emptied (each
    by a plain client: a closed ``RedisCluster`` leaves a socket open)."""
    cluster = request.getfixturevalue("valkey_cluster")
    front.url = cluster.url
    for host, port in cluster.addresses:
        client = redis.Redis(host=host, port=port)
        client.flushdb()
        client.close()
    front.made = weakref.WeakSet()


class ShardedRedisFront(RedisFront):
    """RedisWorkQueue(name, shards=3): the threading harness, on a real server
    (or on a 3-primary Cluster: ``ON_CLUSTER``)."""

    name = "redis-sharded"
    skips = SHARDED_SKIPS

    def begin(self, request: pytest.FixtureRequest) -> None:
        if not ON_CLUSTER:
            super().begin(request)
            return
        _cluster_begin(self, request)
        self.client = redis.RedisCluster.from_url(self.url)  # type: ignore[assignment]

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        return super().make(name, shards=SHARDS, **kwargs)


class _Loop:
    """An event loop in a daemon thread: where the async Redis queues live."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        threading.Thread(target=self.loop.run_forever, name="redis-front-loop", daemon=True).start()

    def run(self, coro: Any, timeout: float = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)


class SyncOverAsync:
    """An AsyncRedisWorkQueue behind the plain methods the conformance tests call.

    Each coroutine method runs on the queue's own loop (in another thread) and
    is waited for, so ``q.add(k)`` reads as on the other fronts; ``len(q)`` is
    ``stats().depth``. Everything else is the queue's own attribute.
    """

    _COROUTINES = frozenset(
        {"add", "add_many", "add_after", "add_rate_limited", "forget", "num_requeues", "retry"}
        | {"get_nowait", "done", "stats", "snapshot", "exists", "delete"}
        | {"give_up", "dead", "replay", "replay_all", "forget_dead"}
    )

    def __init__(self, aq: AsyncRedisWorkQueue, loop: _Loop) -> None:
        self.aq = aq
        self._loop = loop

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.aq, name)
        if name not in self._COROUTINES:
            return attr
        return lambda *args, **kwargs: self._loop.run(attr(*args, **kwargs))

    def __len__(self) -> int:
        return int(self.stats().depth)


class _AsyncOverWrapper:
    """A test's wrapper around a SyncOverAsync, as arun_workers sees a queue: its
    plain methods become coroutines (run in a worker thread, so the wrapper's
    own behaviour, such as a method that raises, still applies)."""

    def __init__(self, wrapper: Any, aq: AsyncRedisWorkQueue) -> None:
        self._wrapper, self._aq = wrapper, aq

    def __getattr__(self, name: str) -> Any:
        if name not in SyncOverAsync._COROUTINES:
            return getattr(self._aq, name)
        method = getattr(self._wrapper, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            call = functools.partial(method, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(None, call)

        return call


class AsyncRedisFront(_RedisQueues, Front):
    """AsyncRedisWorkQueue on its own loop, its coroutines hidden by SyncOverAsync."""

    name = "redis-asyncio"
    queue_type = AsyncRedisWorkQueue
    skips = REDIS_SKIPS
    _loop: _Loop | None = None

    def begin(self, request: pytest.FixtureRequest) -> None:
        super().begin(request)
        if AsyncRedisFront._loop is None:
            AsyncRedisFront._loop = _Loop()
        self.loop = AsyncRedisFront._loop
        self.client = redis.asyncio.Redis.from_url(self.url)

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        aq = AsyncRedisWorkQueue(name, client=self.client, **kwargs)
        self.made.add(aq)
        return SyncOverAsync(aq, self.loop)

    def end(self) -> None:
        for aq in list(self.made):
            self.loop.run(aq.aclose())
        self.loop.run(self.client.aclose())

    async def _await(self, q: SyncOverAsync, coro: Any) -> Any:
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(coro, q._loop.loop))

    async def get(self, q: SyncOverAsync, timeout: float = 5.0) -> Any:
        return await self._await(q, q.aq.get(timeout=timeout))

    async def shutdown(
        self, q: SyncOverAsync, drain: bool = False, timeout: float | None = None
    ) -> bool:
        return bool(await self._await(q, q.aq.shutdown(drain=drain, timeout=timeout)))

    async def drain(self, q: SyncOverAsync, timeout: float | None = None) -> bool:
        return bool(await self._await(q, q.aq.shutdown(drain=True, timeout=timeout)))

    async def join(self, q: SyncOverAsync, timeout: float | None = None) -> bool:
        return bool(await self._await(q, q.aq.join(timeout)))

    async def run_workers(
        self,
        q: SyncOverAsync,
        handler: Handler,
        workers: int = 1,
        on_give_up: Callable[[Any, BaseException], object] | None = None,
        until: Callable[[], bool] | None = None,
        timeout: float = 10.0,
    ) -> keyqueue.RunStats:
        async def ahandler(key: Any) -> Requeue | None:
            await asyncio.sleep(0)
            return handler(key)

        queue = q.aq if isinstance(q, SyncOverAsync) else _AsyncOverWrapper(q, q.aq)
        runner = asyncio.run_coroutine_threadsafe(
            keyqueue.arun_workers(
                queue,
                ahandler if callable(handler) else handler,
                workers=workers,
                on_give_up=on_give_up,
            ),
            q._loop.loop,
        )
        check = until or (lambda: idle(q))
        deadline = time.monotonic() + timeout
        try:
            while not check():
                assert time.monotonic() < deadline, "runner did not reach the expected state"
                assert not runner.done() or runner.exception() is None
                await asyncio.sleep(0.001)
            assert await self.shutdown(q, drain=True, timeout=timeout)
            return await asyncio.wait_for(asyncio.wrap_future(runner), timeout)
        finally:
            runner.cancel()


class AsyncShardedRedisFront(AsyncRedisFront):
    """AsyncRedisWorkQueue(name, shards=3), its coroutines hidden by SyncOverAsync."""

    name = "redis-asyncio-sharded"
    skips = SHARDED_SKIPS

    def begin(self, request: pytest.FixtureRequest) -> None:
        if not ON_CLUSTER:
            super().begin(request)
            return
        _cluster_begin(self, request)
        if AsyncRedisFront._loop is None:
            AsyncRedisFront._loop = _Loop()
        self.loop = AsyncRedisFront._loop
        self.client = redis.asyncio.RedisCluster.from_url(self.url)  # type: ignore[assignment]

    def make(self, name: str = "q", **kwargs: Any) -> Any:
        return super().make(name, shards=SHARDS, **kwargs)
