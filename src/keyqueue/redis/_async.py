"""``AsyncRedisWorkQueue``: the asyncio API on a Redis/Valkey server.

Every method that talks to the server is a coroutine. The queue binds to the
event loop of its first call (as redis.asyncio's connections do). One task per
client renews its leases while it holds keys; it holds the queue only weakly.
A blocked event loop misses renewals: hand CPU-bound work to threads.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref
from collections.abc import Coroutine, Iterable, Sequence
from typing import Any

import redis
import redis.asyncio

from .._clock import Clock
from .._errors import Empty, ShutDown
from .._metrics import MetricsProvider, QueueGauges
from .._ratelimit import RateLimiter
from ._base import (
    MIN_SERVER,
    REQUEUES,
    SCRIPTS,
    WAKE_TTL_MS,
    RedisQueueBase,
    RedisRateLimiter,
    RedisStats,
    block_limit,
    check_delay,
    check_key,
    check_timeout,
    key_batches,
    logger,
    parse_version,
    priority_arg,
    script_source,
    server_too_old,
    text,
    unreachable,
    where,
)

__all__ = ["AsyncRedisWorkQueue"]


class AsyncRedisWorkQueue(RedisQueueBase):
    """The asyncio twin of ``RedisWorkQueue``: the same queue, the same rules.

    ``add``, ``add_after``, ``add_rate_limited``, ``forget``, ``num_requeues``,
    ``retry``, ``get``, ``get_nowait``, ``done``, ``shutdown`` and ``stats`` are
    coroutines; ``len(q)`` is ``(await q.stats()).depth``. ``token``,
    ``subscribe`` and ``shutting_down`` are plain. ``arun_workers`` works on it.

    Give exactly one of ``url`` or ``client`` (a ``redis.asyncio.Redis`` or
    ``redis.asyncio.RedisCluster``). The
    constructor cannot await, so the server is checked by the first call (or
    ``async with``): unreachable raises ``redis.exceptions.ConnectionError``,
    older than Redis 6.2 ``RuntimeError``. Other parameters as
    ``RedisWorkQueue``.
    """

    def __init__(
        self,
        name: str,
        *,
        url: str | None = None,
        client: redis.asyncio.Redis | redis.asyncio.RedisCluster | None = None,
        lease: float = 30.0,
        rate_limiter: RedisRateLimiter | RateLimiter | None = None,
        max_retries: int | None = None,
        metrics: MetricsProvider | None = None,
        clock: Clock | None = None,
        aging: float | None = None,
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("AsyncRedisWorkQueue needs exactly one of url= or client=")
        if client is None:
            if not isinstance(url, str):
                raise TypeError(f"url must be a str, got {url!r}")
            client = redis.asyncio.Redis.from_url(url)
            self._owns_client = True
        else:
            if not isinstance(client, redis.asyncio.Redis | redis.asyncio.RedisCluster):
                raise TypeError(
                    f"client must be a redis.asyncio.Redis or redis.asyncio.RedisCluster "
                    f"(use RedisWorkQueue for redis.Redis), got {client!r}"
                )
            self._owns_client = False
        self._client: redis.asyncio.Redis | redis.asyncio.RedisCluster = client
        self._loop: asyncio.AbstractEventLoop | None = None
        self._renewer: asyncio.Task[None] | None = None
        self._closed = False
        self._timer: asyncio.TimerHandle | None = None  # runs reap when something comes due
        # Tasks the queue starts on its own (a bell passed on, a due key
        # released): referenced until done, and awaited by aclose, so none runs
        # on a client closed after it.
        self._background: set[asyncio.Task[None]] = set()
        super().__init__(
            name,
            lease=lease,
            rate_limiter=rate_limiter,
            max_retries=max_retries,
            metrics=metrics,
            clock=clock,
            aging=aging,
        )
        self._no_holds: asyncio.Event | None = None  # made on the loop, set when nothing is held
        self._where = where(client)
        self._block = block_limit(client.get_connection_kwargs())
        self._checked = False
        self._scripts = {s: client.register_script(script_source(s)) for s in SCRIPTS}
        if self._clock is not None:
            self._clock.subscribe(self._on_clock_step)

    async def _check(self) -> None:
        """The constructor's server check, on the first call."""
        self._loop = asyncio.get_running_loop()
        try:
            info = await self._client.info("server")
        except redis.exceptions.ConnectionError as exc:
            raise redis.exceptions.ConnectionError(
                unreachable(self.name, self._where, exc)
            ) from exc
        if parse_version(info) < MIN_SERVER:
            raise server_too_old(self.name, self._where, info)
        self._checked = True

    async def _run(self, script: str, args: list[str]) -> Any:
        if not self._checked:
            await self._check()
        return await self._scripts[script](keys=self._keys, args=args)

    def _owner(self) -> object:
        try:
            return asyncio.current_task()
        except RuntimeError:
            return threading.get_ident()

    # -- adding --------------------------------------------------------------------

    async def add(self, key: str, priority: int = 0) -> None:
        """Mark ``key`` for processing, for every client (see ``RedisWorkQueue.add``)."""
        args = [self._clock_arg(), priority_arg(priority), self._aging_arg, check_key(key)]
        now, _, events = await self._run("add", args)
        if events:
            self._emit(now, events)

    async def add_many(self, keys: Iterable[str], priority: int = 0) -> None:
        """``add`` each of ``keys`` (with ``priority``), in order: one round trip
        per 1,000 keys (see ``RedisWorkQueue.add_many``)."""
        head = [priority_arg(priority), self._aging_arg]
        for batch in key_batches(keys):
            now, _, events = await self._run("add", [self._clock_arg(), *head, *batch])
            if events:
                self._emit(now, events)

    async def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        """Add ``key`` once ``seconds`` have passed on the server's clock; the
        earliest ready time wins (and the highest ``priority`` asked);
        ``seconds <= 0`` adds now."""
        seconds = check_delay(seconds)
        await self._add_after(check_key(key), seconds, "delay", priority_arg(priority))

    async def _add_after(self, key: str, seconds: float, kind: str, priority: str) -> None:
        args = [self._clock_arg(), key, repr(seconds), kind, priority, self._aging_arg]
        now, _, events = await self._run("add_after", args)
        self._emit(now, events)

    async def add_rate_limited(self, key: str, priority: int = 0) -> None:
        """Record a failure with the rate limiter and add ``key`` (with
        ``priority``) after its backoff."""
        check_key(key)
        prio = priority_arg(priority)
        if self._server_limiter is None:
            seconds = check_delay(self._rate_limiter.when(key))  # type: ignore[union-attr]
            await self._add_after(key, seconds, "rate_limit", prio)
            return
        args = [self._clock_arg(), key, *self._server_limiter, prio, self._aging_arg]
        now, _, events = await self._run("add_rate_limited", args + self._endpoint_args(key))
        self._emit(now, events)

    async def forget(self, key: str) -> None:
        """``key`` succeeded: clear its backoff and failure count (for every client)."""
        check_key(key)
        if self._server_limiter is None:
            self._rate_limiter.forget(key)  # type: ignore[union-attr]
        await self._run("forget", [self._clock_arg(), key])

    async def num_requeues(self, key: str) -> int:
        """Failures the rate limiter has recorded for ``key`` since it was forgotten."""
        check_key(key)
        if self._server_limiter is None:
            return self._rate_limiter.num_requeues(key)  # type: ignore[union-attr]
        if not self._checked:
            await self._check()
        return int(await self._client.hget(self._keys[REQUEUES], key) or 0)

    async def retry(self, key: str) -> bool:
        """Record a failure of ``key``: False once it failed ``max_retries`` times
        (give up, then ``forget`` it), else ``add_rate_limited(key)`` and True."""
        check_key(key)
        if self._server_limiter is not None:
            args = [self._clock_arg(), key, *self._reap_args, *self._endpoint_args(key)]
        elif self._max_retries is not None:
            args = [self._clock_arg(), key, self._reap_args[0]]
        else:
            await self.add_rate_limited(key)
            return True
        now, again, events = await self._run("retry", args)
        self._emit(now, events)
        if again and self._server_limiter is None:
            await self.add_rate_limited(key)
        return bool(again)

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
        if self._shutting_down:
            raise ShutDown(f"this client of queue {self.name!r} is shut down")
        now, key, extra, events = await self._run(
            "get", [self._clock_arg(), repr(self._lease), *self._reap_args]
        )
        self._emit(now, events)
        if key in ("", b""):
            return None, None if extra in ("", b"") or self._clock is not None else float(extra)
        key = text(key)
        if self._hold(key, int(extra)):
            self._start_renewing()
        if self._no_holds is not None:
            self._no_holds.clear()
        return key, None

    async def get(self, timeout: float | None = None) -> str:
        """Wait for a key and hold it until ``done``.

        ``timeout`` (wall seconds) bounds the wait: ``Empty`` when it passes.
        Raises ``ShutDown`` once this client is shut down, also in a waiting
        ``get``. Cancelling a waiting ``get`` loses no key.
        """
        check_timeout(timeout)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            key, due = await self._take()
            if key is not None:
                return key
            wait = self._block
            if due is not None:
                if due <= 0:
                    continue  # more came due than one script releases
                if due < wait:
                    wait = due
                    self._arm(due)
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Empty
                wait = min(wait, remaining)
            self._enter_wait()
            try:
                # BLPOP's timeout 0 means forever: never ask for less than 1 ms.
                await self._client.blpop([self._bell, self._wake], timeout=max(wait, 0.001))
                # Python 3.11's asyncio.wait_for, which redis.asyncio sends each
                # command through, can swallow a cancellation that races its
                # inner task's end: honour it here, or this get waits on.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError
            except asyncio.CancelledError:
                # The bell we may have taken was for a waiting key: pass it on.
                self._spawn(self._ring())
                raise
            finally:
                self._leave_wait()

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _ring(self) -> None:
        try:
            await self._client.rpush(self._bell, "1")
        except redis.exceptions.RedisError:
            logger.debug("keyqueue %r: passing on a doorbell failed", self.name, exc_info=True)

    async def done(self, key: str) -> None:
        """Release ``key``; if it was added meanwhile, it is queued again (once).

        Raises ``ValueError`` if this client does not hold ``key``, ``LeaseLost``
        if its lease was taken back meanwhile (then nothing changed). After a
        connection error, calling ``done`` again is safe; meanwhile the lease is
        no longer renewed (see ``RedisWorkQueue.done``).
        """
        check_key(key)
        with self._lock:
            hold = self._find_hold(key, "done")
        if hold.lost:
            self._finish(key, hold)
            raise self._lost(key, hold, None)
        try:
            now, status, events = await self._run("done", [self._clock_arg(), key, str(hold.token)])
        except BaseException:
            hold.unsure = True  # stop renewing: the key cannot stay held by a lost done
            raise
        self._finish(key, hold)
        self._emit(now, events)
        if status in ("lost", b"lost"):
            raise self._lost(key, hold, float(now))

    def _finish(self, key: str, hold: Any) -> None:
        if self._forget_hold(key, hold) and self._no_holds is not None:
            self._no_holds.set()

    # -- shutdown ------------------------------------------------------------------

    async def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        """Stop this client taking keys; other clients go on (see
        ``RedisWorkQueue.shutdown``). Returns False only when a drain timed out."""
        check_timeout(timeout)
        getters = self._shut()
        if getters:
            if not self._checked:
                await self._check()
            async with self._client.pipeline() as pipe:
                pipe.rpush(self._wake, *["1"] * getters)
                pipe.pexpire(self._wake, WAKE_TTL_MS)
                await pipe.execute()
        if not drain:
            return True
        if self._no_holds is None:
            self._no_holds = asyncio.Event()
        with self._lock:
            idle = not self._holds and not self._stale
        if idle:
            return True
        self._no_holds.clear()
        try:
            async with asyncio.timeout(timeout):
                while True:
                    with self._lock:
                        if not self._holds and not self._stale:
                            return True
                    await self._no_holds.wait()
                    self._no_holds.clear()
        except TimeoutError:
            return False

    async def aclose(self) -> None:
        """Shut this client down and stop renewing; close the connection pool if
        the queue made it (``url=``). Keys still held run out with their leases.
        Waits for the queue's own calls in flight (a doorbell passed on by a
        cancelled ``get``), so none reaches the server after it returns."""
        await self.shutdown()
        self._closed = True
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._renewer is not None:
            self._renewer.cancel()
            self._renewer = None
        if self._background:
            await asyncio.gather(*self._background, return_exceptions=True)
        if self._owns_client:
            await self._client.aclose()

    async def __aenter__(self) -> AsyncRedisWorkQueue:
        if not self._checked:
            await self._check()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    # -- leases and time -------------------------------------------------------------

    def _renewing(self) -> bool:
        return self._renewer is not None

    def _start_renewing(self) -> None:
        if self._renewer is None and not self._closed:
            self._renewer = asyncio.get_running_loop().create_task(
                _renew_loop(weakref.ref(self), self._lease / 3),
                name=f"keyqueue-renew-{self.name}",
            )

    async def _renew_once(self) -> bool:
        """Renew every live hold; False (and the loop ends) when there is none."""
        args = self._renewal()
        if len(args) == 2:
            self._renewer = None
            return False
        self._renewed(await self._run("renew", args))
        return True

    def _arm(self, due: float) -> None:
        """Run ``reap`` in ``due`` seconds (a getter waits; BLPOP's timeout is coarse)."""
        loop = asyncio.get_running_loop()
        at = loop.time() + due
        if self._timer is not None and self._timer.when() <= at:
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(at, self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._spawn(self._tick())

    async def _tick(self) -> None:
        try:
            await self._reap()
        except Exception:
            if not self._closed:
                logger.warning("keyqueue %r: releasing due keys failed", self.name, exc_info=True)

    async def _reap(self) -> None:
        now, events = await self._run("reap", [self._clock_arg(), *self._reap_args])
        self._emit(now, events)

    def _on_clock_step(self) -> None:
        """A virtual clock moved: release due keys and reap leases.

        From another thread, before ``step`` returns; on the loop's own thread,
        on the loop's next turn (a step cannot wait for the loop it runs on).
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if running is loop:
            self._spawn(self._reap())
        else:
            asyncio.run_coroutine_threadsafe(self._reap(), loop).result()

    # -- introspection -------------------------------------------------------------

    async def stats(self) -> RedisStats:
        """A frozen snapshot of the queue-wide counters and sizes (one round trip)."""
        reply: Sequence[Any] = await self._run("stats", [self._clock_arg(), *self._reap_args])
        return self._stats(reply)

    def _gauges(self) -> QueueGauges:
        """For a metrics scrape from another thread: read through the queue's loop.

        On the loop's own thread (a scrape cannot wait for it), the levels the
        last ``stats`` read.
        """
        loop = self._loop
        if loop is None or loop.is_closed():
            return self._last_levels
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if not on_loop:
            try:
                asyncio.run_coroutine_threadsafe(self.stats(), loop).result(timeout=10)
            except Exception:
                logger.exception("keyqueue %r: reading gauges from the server failed", self.name)
        last = self._last_levels
        return self._levels(
            last.depth, last.delayed, last.waiting_by_priority, last.oldest_wait_seconds
        )


async def _renew_loop(ref: weakref.ref[AsyncRedisWorkQueue], interval: float) -> None:
    """The renewal task: every ``interval``, renew the client's leases in one call.

    Ends at ``aclose`` even if the cancellation it sends is lost (Python 3.11's
    asyncio.wait_for inside redis.asyncio can swallow one): renewing after the
    close would keep a dead client's keys held.
    """
    while True:
        await asyncio.sleep(interval)
        queue = ref()
        if queue is None or queue._closed:
            return
        try:
            if not await queue._renew_once():
                return
        except Exception:
            if queue._closed:
                return
            logger.warning(
                "keyqueue %r: renewing leases failed; retrying in %.3g s",
                queue.name,
                interval,
                exc_info=True,
            )
        finally:
            del queue
