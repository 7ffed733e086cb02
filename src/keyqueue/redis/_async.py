"""``AsyncRedisWorkQueue``: the asyncio driver of a queue on a Redis/Valkey server.

It does the I/O only: every method that talks to the server is a coroutine,
and the queue binds to the event loop of its first call (as redis.asyncio's
connections do). The getters' wait for the doorbell (one leader in ``BLPOP``,
the others on futures); the get script in a shielded task, so a cancelled
get puts back the key it was handed; one task per client that renews its
leases while it holds keys (it holds the queue only weakly); a loop timer
that runs ``reap`` when something comes due. A blocked event loop misses
renewals: hand CPU-bound work to threads. What each call sends and how its
reply is read is ``_ops``'; the parts it is built of are ``_front``'s.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Coroutine, Iterable
from typing import Any, TypeVar

import redis
import redis.asyncio

from .._checks import check_timeout
from .._dead import DeadKey
from .._errors import Empty
from .._metrics import QueueGauges
from .._snapshot import Snapshot
from .._source import batch_with
from ._async_claims import AsyncClaims
from ._bell import AsyncDoorbell
from ._connection import aclose_client, server_checked, unreachable
from ._durability import areplicas_at_start
from ._ends import CLOSE_WAIT, AsyncHoldEnds, drain_timeout, end_calls, shut
from ._epoch import arun_viewed, epochs_for, hands_out
from ._front import RedisFront, logger
from ._ops import Op, answer, failed
from ._replies import RedisStats
from ._ride import Ride, areroute, misrouted
from ._send import AsyncReplicatedScript, AsyncScript
from ._timers import AsyncReapTimer, AsyncRenewer, on_loop

__all__ = ["AsyncRedisWorkQueue"]

T = TypeVar("T")


class AsyncRedisWorkQueue(RedisFront[redis.asyncio.Redis | redis.asyncio.RedisCluster]):
    """The asyncio twin of ``RedisWorkQueue``: the same queue, the same rules.

    ``add``, ``add_after``, ``add_rate_limited``, ``forget``, ``num_requeues``,
    ``retry``, ``get``, ``get_nowait``, ``done``, ``shutdown``, ``stats``,
    ``snapshot``, ``exists`` and ``delete`` are coroutines; ``len(q)`` is
    ``(await q.stats()).depth``. ``token``, ``subscribe``, ``holder`` and
    ``shutting_down`` are plain. ``arun_workers`` works on it (and takes keys
    in batches, as ``run_workers`` on a ``RedisWorkQueue``).

    Give exactly one of ``url`` (as ``RedisWorkQueue`` reads it) or
    ``client`` (a ``redis.asyncio.Redis``, ``Sentinel(...).master_for(...)``
    of ``redis.asyncio.sentinel`` among them, or a
    ``redis.asyncio.RedisCluster``). The
    constructor cannot await, so the server is checked by the first call (or
    ``async with``): unreachable raises ``redis.exceptions.ConnectionError``,
    older than Redis 6.2 ``RuntimeError``. Other parameters as
    ``RedisWorkQueue`` (``batch`` for ``arun_workers``; ``durability`` and
    ``replicas``, the replicas read by the first call's server check;
    ``shards``, the map of shards checked by each shard's first call).

    As there, the client's retry setting never re-sends a script: each is
    sent once, and a connection error raises with the outcome unknown; the
    same call asked again is safe (``arun_workers`` asks again with a
    backoff). A cancelled call is one whose outcome is unknown too.
    """

    _client_kinds = (redis.asyncio.Redis, redis.asyncio.RedisCluster)
    _client_wanted = (
        "a redis.asyncio.Redis or redis.asyncio.RedisCluster (use RedisWorkQueue for redis.Redis)"
    )
    _script = AsyncScript
    _replicated_script = AsyncReplicatedScript

    _asyncio = True
    # Seconds aclose waits for the queue's own calls before it cancels them
    # (_ends.end_calls); an instance's own value in tests.
    _close_wait: float = CLOSE_WAIT

    def _connect(self) -> None:
        """The loop's state; the server is checked by the first call."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        # Tasks the queue starts on its own (a bell passed on, a due key
        # released, a put-back): referenced until done (a done task leaves on
        # a later turn of the loop), and awaited by aclose (cancelled after
        # _close_wait seconds), so none runs on a client closed after it.
        self._background: set[asyncio.Task[None]] = set()
        self._ends = AsyncHoldEnds(self._holds)  # the drains and joiners
        self._checked = False
        # The view of the primary its hand-outs carry: None on a plain server (_epoch).
        self._epochs = epochs_for(self._client, self.name, self._script_keys["get"][0])
        self._renewer = AsyncRenewer(self._cfg, self._holds, self._reports, self._renew_once)
        self._timer = AsyncReapTimer(self._reap, self._spawn, self._is_closed, self.name)
        self._doorbell = AsyncDoorbell(
            self._client,
            self._waiting,
            self._bell,
            self._wake,
            name=self.name,
            ready=self._ready,
            spawn=self._spawn,
        )

    async def _check(self) -> None:
        """The constructor's server check, on the first call."""
        self._loop = asyncio.get_running_loop()
        try:
            info = await self._client.info("server")
            if self._replication is not None:
                self._replicas_known(await areplicas_at_start(self._client, self._stats_key))
        except redis.exceptions.ConnectionError as exc:
            raise unreachable(self.name, self._where, exc) from exc
        server_checked(self.name, self._where, info)
        self._checked = True

    async def _ready(self) -> None:
        """The server checked (on the first call)."""
        if not self._checked:
            await self._check()

    async def _run(self, script: str, args: list[str]) -> Any:
        if not self._checked:  # inline: the hot path makes no coroutine more
            await self._check()
        if self._epochs is not None and hands_out(script, args):  # a view to carry
            return await arun_viewed(
                self._epochs, self._client, self._scripts[script], self._script_keys[script], args
            )
        return await self._scripts[script](keys=self._script_keys[script], args=args)

    async def _drive(self, op: Op[T]) -> T:
        """Make ``op``'s script call; return what ``op`` makes of its reply."""
        script, args = next(op)
        try:
            reply = await self._run(script, args)
        except BaseException as exc:
            failed(op, exc)
        return answer(op, reply)

    async def _drive_ridden(self, op: Op[T], ride: Ride) -> T:
        """``_drive``, the call asked again while ``ride`` says so (an add: ``_ride``)."""
        script, args = next(op)
        while True:
            try:
                reply = await self._run(script, args)
            except BaseException as exc:
                pause = ride.pause(exc)
                if pause is None:
                    failed(op, exc)
                if misrouted(exc):
                    await areroute(self._client)
                await asyncio.sleep(pause)
            else:
                return answer(op, reply)

    def _owner(self) -> object:
        try:
            return asyncio.current_task()
        except RuntimeError:
            return threading.get_ident()

    # -- adding --------------------------------------------------------------------

    async def add(self, key: str, priority: int = 0) -> None:
        """Mark ``key`` for processing, for every client; asked again across a
        failover for up to ``add_timeout`` seconds (see ``RedisWorkQueue.add``)."""
        await self._drive_ridden(self._op_add(key, priority), self._ride())

    async def add_many(self, keys: Iterable[str], priority: int = 0) -> None:
        """``add`` each of ``keys`` (with ``priority``), in order: one round trip
        per 1,000 keys (see ``RedisWorkQueue.add_many``)."""
        for batch in self._op_add_many(keys, priority):
            await self._drive_ridden(batch, self._ride())

    async def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        """Add ``key`` once ``seconds`` have passed on the server's clock; the
        earliest ready time wins (and the highest ``priority`` asked);
        ``seconds <= 0`` adds now. Fenced when this client holds ``key`` (see
        ``RedisWorkQueue.retry``)."""
        await self._drive_ridden(self._op_add_after(key, seconds, priority), self._ride(key))

    async def add_rate_limited(self, key: str, priority: int = 0) -> None:
        """Record a failure with the rate limiter and add ``key`` (with
        ``priority``) after its backoff. Fenced when this client holds ``key``."""
        await self._drive(self._op_add_rate_limited(key, priority))

    async def forget(self, key: str) -> None:
        """``key`` succeeded: clear its backoff and failure count (for every
        client). Fenced when this client holds ``key``."""
        await self._drive(self._op_forget(key))

    async def num_requeues(self, key: str) -> int:
        """Failures the rate limiter has recorded for ``key`` since it was forgotten."""
        local = self._local_requeues(key)
        if local is not None:
            return local
        await self._ready()
        return int(await self._client.hget(self._requeues, key) or 0)

    async def retry(self, key: str) -> bool:
        """Record a failure of ``key``: False once it failed ``max_retries`` times
        (give up, then ``forget`` it), else ``add_rate_limited(key)`` and True.
        Fenced when this client holds ``key``: ``LeaseLost`` and no change if
        its lease was taken back (see ``RedisWorkQueue.retry``)."""
        return await self._drive(self._op_retry(key))

    async def give_up(self, key: str, reason: str, error: BaseException | None = None) -> None:
        """``forget`` ``key`` and keep it as a dead key (``dead()``), for every
        client: ``reason`` (the runners pass ``"retries"`` or ``"permanent"``;
        a poison key is kept by the server as ``"stalls"``), ``error``'s type
        and message, its failures, the server's time. At most 1,000
        dead keys are kept, none older than 7 days (never listed or
        replayed after that). Fenced when this client holds ``key`` (as ``retry``).
        """
        await self._drive(self._op_give_up(key, reason, error))

    async def dead(self, limit: int = 100) -> tuple[DeadKey[str], ...]:
        """The first ``limit`` dead keys, newest first (one read-only script).
        A bad ``limit`` raises."""
        return await self._drive(self._op_dead(limit))

    async def replay(self, key: str) -> bool:
        """Add a dead ``key`` back (for every client), its failures and backoff
        cleared, in one script; False if it is not dead. A key waiting or held
        meanwhile keeps its place: the add is coalesced, or marks it for one
        redelivery, as ``add``. Accepted after this client's ``shutdown``, as
        ``add``."""
        return bool(await self._drive(self._op_replay([key])))

    async def replay_all(self) -> int:
        """``replay`` every dead key, oldest first, in one script; how many."""
        return len(await self._drive(self._op_replay(None)))

    async def forget_dead(self, key: str) -> bool:
        """Drop ``key``'s dead entry without adding it; False if it had none."""
        return await self._drive(self._op_forget_dead(key))

    # -- getting -------------------------------------------------------------------

    async def get_nowait(self) -> str:
        """Take the oldest waiting key, held by this client until ``done``.

        Raises ``Empty`` if none is waiting, ``ShutDown`` once this client was
        shut down.
        """
        key, _ = await self._take()
        if key is None:
            raise Empty
        return key

    async def _take(self) -> tuple[str | None, float | None]:
        """One get script: (key, None), or (None, seconds until something is due).

        The script runs in a task of its own, shielded: if the caller is
        cancelled meanwhile, a key the server handed out is put back at once
        (``_orphaned``), not left to its lease.
        """
        op = self._op_get(time.monotonic())
        script, args = next(op)
        call = asyncio.get_running_loop().create_task(self._run(script, args))
        try:
            reply = await asyncio.shield(call)
        except asyncio.CancelledError:
            orphaned = functools.partial(self._orphaned, op)
            if call.done():
                orphaned(call)
            else:
                self._background.add(call)
                call.add_done_callback(orphaned)
            raise
        except BaseException as exc:
            failed(op, exc)
        key, due = answer(op, reply)
        if key is not None:
            self._ends.holds_taken()
        return key, due

    def _orphaned(self, op: Op[Any], call: asyncio.Task[Any]) -> None:
        """The get script of a cancelled get ended: put back what it handed out.

        ``op`` is closed either way, as a get whose outcome is unknown: if
        the call raised, the next get hands back what it may have taken."""
        self._background.discard(call)
        op.close()
        if call.cancelled() or call.exception() is not None:
            return
        orphan = self._orphaned_get(call.result())
        if orphan is not None:
            self._spawn(self._put_back(*orphan))

    async def _put_back(self, key: str, op: Op[Any]) -> None:
        try:
            await self._drive(op)
        except Exception:
            logger.warning(
                "keyqueue %r: putting back key %r of a cancelled get failed; this "
                "client's next get hands it back (else it comes back when its lease runs out)",
                self.name,
                key,
                exc_info=True,
            )

    async def get(self, timeout: float | None = None) -> str:
        """Wait for a key and hold it until ``done``.

        ``timeout`` (wall seconds) bounds the wait: ``Empty`` when it passes.
        Raises ``ShutDown`` once this client is shut down, also in a waiting
        ``get``, and ``Empty`` once ``interrupt`` is called. Cancelling a
        ``get`` loses no key: one the server handed out meanwhile is put back
        at once (no failure counted). Idle, it sends what
        ``RedisWorkQueue.get`` does.
        """
        seen, deadline = self._waiting.bounds(timeout, time.monotonic())
        while True:
            key, due = await self._take()
            if key is not None:
                return key
            if not self._waiting.look_again(due):
                await self._wait_for_bell(seen, deadline)

    async def _wait_for_bell(self, seen: int, deadline: float | None) -> None:
        """``AsyncDoorbell.wait``: until the doorbell rings or a look is due."""
        await self._doorbell.wait(seen, deadline)

    def _wake_followers(self) -> None:
        self._doorbell.wake_followers()

    async def interrupt(self) -> None:
        """Wake every ``get`` of this client waiting now: each raises ``Empty``
        (see ``RedisWorkQueue.interrupt``; cancelling a ``get`` is the asyncio
        way, and loses no key either)."""
        await self._doorbell.wake_leader(self._waiting.interrupt())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def done(self, key: str) -> None:
        """Release ``key``; if it was added meanwhile, it is queued again (once).

        Raises ``ValueError`` if this client does not hold ``key``, ``LeaseLost``
        if its lease was taken back meanwhile (then nothing changed). After a
        connection error, calling ``done`` again is safe; meanwhile the lease is
        no longer renewed (see ``RedisWorkQueue.done``).
        """
        await self._drive(self._op_done(key))

    def _nothing_held(self) -> None:
        self._ends.nothing_held()

    # -- shutdown ------------------------------------------------------------------

    async def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        """Stop this client taking keys; other clients go on (see
        ``RedisWorkQueue.shutdown``): ``drain=True`` waits until this client
        holds no key, or ``timeout`` (wall seconds) passes. Returns False
        only when a drain timed out (with a WARNING). A key that fails during
        a drain is not given up: it stays on the server, backing off, for the
        other clients or the next start."""
        timeout = drain_timeout(drain, timeout)
        await self._doorbell.wake_leader(shut(self._waiting, self._reports, self._cfg, time.time()))
        await self._hand_back_gets_lost()
        if not drain:
            return True
        if await self._ends.drain(timeout):
            return True
        self._reports.drain_timed_out(timeout, self._holds.count())
        return False

    async def join(self, timeout: float | None = None) -> bool:
        """Wait until the queue is idle on the server, for every client: nothing
        waits or is pending, is held or is delayed. True then, False if
        ``timeout`` (wall seconds) passed first. It does not busy-poll: what
        it sends and when is ``RedisWorkQueue.join``'s (one read-only script a
        look; at once, whenever this client lets go of its last hold, else
        after 50 ms doubling to one a second). Do not join from a task that
        holds a key.
        """
        return await self._ends.join(self._idle, check_timeout(timeout))

    async def _idle(self) -> bool:
        return await self._drive(self._op_idle())

    async def _hand_back_gets_lost(self) -> None:
        """As ``RedisWorkQueue._hand_back_gets_lost``."""
        for op in self._ops_gets_lost():
            try:
                await self._drive(op)
            except self.connection_errors:
                self._reports.hand_back_failed()

    async def aclose(self) -> None:
        """Shut this client down and stop renewing; close the connection pool if
        the queue made it (``url=``). Keys still held run out with their leases.

        Waits for the queue's own calls in flight (a doorbell passed on by a
        cancelled ``get``, a reap, a put-back), so none reaches the server
        after it returns, for 5 seconds at most: those still running then (a
        server that does not answer, and no socket timeout) are cancelled,
        with a WARNING, their outcome unknown (a key one would have put back
        comes back when its lease runs out). ``shutdown``'s calls, made
        first, are bounded by the client's socket timeout only.
        """
        await self.shutdown()
        self._closed = True
        self._timer.cancel()
        self._renewer.close()
        await end_calls(self._background, self.name, self._close_wait)
        if self._owns_client:
            await aclose_client(self._client)

    async def __aenter__(self) -> AsyncRedisWorkQueue:
        await self._ready()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- leases and time -------------------------------------------------------------

    def _start_renewing(self) -> None:
        self._renewer.start()

    async def _renew_once(self) -> bool:
        """Renew every live hold; False (and the loop ends) when there is none."""
        op = self._op_renew(time.monotonic())
        if isinstance(op, bool):
            return op
        await self._drive(op)
        return True

    def _arm(self, due: float) -> None:
        self._timer.arm(due)

    def _is_closed(self) -> bool:
        return self._closed

    async def _reap(self) -> None:
        await self._drive(self._op_reap())

    def _on_clock_step(self) -> None:
        self._timer.step(self._loop)

    # -- introspection -------------------------------------------------------------

    async def stats(self) -> RedisStats:
        """A frozen snapshot of the queue-wide counters and sizes (one round trip)."""
        return await self._drive(self._op_stats(time.monotonic()))

    async def snapshot(self, limit: int = 100) -> Snapshot[str]:
        """Stats and the first ``limit`` keys of each list (``keyqueue.Snapshot``),
        in one script, as ``RedisWorkQueue.snapshot``: O(limit + log n) on the
        server, each hold's holder, token and lease left; it changes nothing."""
        return await self._drive(self._op_snapshot(limit, time.monotonic()))

    async def reshard(self, shards: int) -> int:
        """As ``RedisWorkQueue.reshard``."""
        sharded: Any = self._sharded
        movers = sharded(
            self.name,
            client=self._client,
            shards=2,
            clock=self._cfg.clock,
            aging=self.aging,
            fair_by=self.fair_by,
        )
        try:
            return int(await movers.reshard(shards))
        finally:
            await movers.aclose()

    async def exists(self) -> bool:
        """``RedisWorkQueue.exists``, a coroutine: whether any client has used the queue."""
        await self._ready()
        return bool(await self._client.exists(*self._used_keys))

    async def delete(self, *, force: bool = False) -> bool:
        """``RedisWorkQueue.delete``, a coroutine: remove the queue's server state
        (refused while keys are held unless ``force``); whether it existed."""
        return await self._drive(self._op_delete(force))

    def _gauges(self) -> QueueGauges:
        """For a metrics scrape from another thread: read through the queue's loop.

        On the loop's own thread (a scrape cannot wait for it), the levels the
        last ``stats`` read.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return self._last_levels
        if not on_loop(loop):
            try:
                asyncio.run_coroutine_threadsafe(self.stats(), loop).result(timeout=10)
            except Exception:
                logger.exception("keyqueue %r: reading gauges from the server failed", self.name)
        last = self._last_levels
        return self._levels(
            last.depth,
            last.delayed,
            last.waiting_by_priority,
            last.oldest_wait_seconds,
            time.monotonic(),
        )


def _claims(queue: AsyncRedisWorkQueue, fold_forget: bool) -> AsyncClaims:
    """``arun_workers``' batched source on ``queue`` (``_source.batch_with``):
    its claims, on the parts this driver hands over."""
    wait = functools.partial(queue._doorbell.wait, deadline=None)
    return AsyncClaims(
        queue, [queue._claim_parts(queue._drive, wait, queue._ends.holds_taken)], fold_forget
    )


batch_with(AsyncRedisWorkQueue, _claims)
