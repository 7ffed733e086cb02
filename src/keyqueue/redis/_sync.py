"""``RedisWorkQueue``: the threading API on a Redis/Valkey server.

Each call is one script round trip on redis-py's connection pool (one
connection per thread that is in a call), so the queue is thread-safe. One
daemon thread per client renews its leases; it exists while the client holds
keys and holds the queue only weakly, so a dropped queue's leases run out.
"""

from __future__ import annotations

import threading
import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any

import redis

from .._clock import Clock
from .._core import check_flag
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

__all__ = ["RedisWorkQueue"]


class RedisWorkQueue(RedisQueueBase):
    """A work queue shared by every process that names it on one Redis/Valkey server.

    The same rules and methods as ``WorkQueue`` (coalescing, one redelivery,
    per-key exclusion, delays, backoff, ``max_retries``, stats, events), for
    ``str`` keys; ``run_workers`` works on it unchanged.

    Give exactly one of ``url`` (``redis://host:port/db``) or ``client`` (a
    ``redis.Redis``, or a ``redis.RedisCluster``: every key of a queue is in one
    slot; its socket timeout bounds each blocking call). The
    constructor checks the server: unreachable raises
    ``redis.exceptions.ConnectionError``, older than Redis 6.2 ``RuntimeError``.

    ``get`` takes a lease of ``lease`` seconds, renewed by this client every
    third of it while the key is held; a holder that stops renewing loses the
    key (it counts as a failure of the key) and its late ``done`` raises
    ``LeaseLost``. ``token(key)`` is the hold's fencing token.

    ``rate_limiter``: ``None`` or a ``RedisRateLimiter`` keeps the backoff state
    on the server, shared by every client; a local ``RateLimiter`` (the
    in-memory limiters) keeps it in this process only, and a key whose lease
    ran out is then retried without backoff. ``max_retries`` counts failures on
    the server. ``clock`` is for tests only: a virtual clock
    (``keyqueue.testing.FakeClock``) that replaces the server's time for this
    client; leases are then not renewed and run out when it is stepped past
    them. ``aging`` as ``WorkQueue``'s: the queue keeps the aging of the client
    whose priority made it ranked, so every client should pass the same.
    """

    connection_errors: tuple[type[BaseException], ...] = (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        OSError,
    )
    """What a call raises when the server did not answer (its outcome is
    unknown): the runner asks such a call again, with a backoff."""

    def __init__(
        self,
        name: str,
        *,
        url: str | None = None,
        client: redis.Redis | redis.RedisCluster | None = None,
        lease: float = 30.0,
        rate_limiter: RedisRateLimiter | RateLimiter | None = None,
        max_retries: int | None = None,
        metrics: MetricsProvider | None = None,
        clock: Clock | None = None,
        aging: float | None = None,
    ) -> None:
        if (url is None) == (client is None):
            raise TypeError("RedisWorkQueue needs exactly one of url= or client=")
        if client is None:
            if not isinstance(url, str):
                raise TypeError(f"url must be a str, got {url!r}")
            client = redis.Redis.from_url(url)
            self._owns_client = True
        else:
            if not isinstance(client, redis.Redis | redis.RedisCluster):
                raise TypeError(
                    f"client must be a redis.Redis or redis.RedisCluster (use "
                    f"AsyncRedisWorkQueue for redis.asyncio), got {client!r}"
                )
            self._owns_client = False
        self._client: redis.Redis | redis.RedisCluster = client
        self._renewer: threading.Thread | None = None
        self._stop_renewing = threading.Event()
        self._timer: threading.Timer | None = None  # runs reap when something comes due
        self._timer_at = 0.0  # monotonic time the timer fires
        super().__init__(
            name,
            lease=lease,
            rate_limiter=rate_limiter,
            max_retries=max_retries,
            metrics=metrics,
            clock=clock,
            aging=aging,
        )
        # Notified (all) when this client's last hold ends; drainers wait.
        self._no_holds = threading.Condition(self._lock)
        # Notified (one) when the leader leaves BLPOP, (all) at shutdown and
        # interrupt; the getters that wait for the leader wait on it.
        self._followers = threading.Condition(self._lock)
        server = where(client)
        self._block = block_limit(client.get_connection_kwargs())
        try:
            info = client.info("server")
        except redis.exceptions.ConnectionError as exc:
            raise redis.exceptions.ConnectionError(unreachable(name, server, exc)) from exc
        if parse_version(info) < MIN_SERVER:
            raise server_too_old(name, server, info)
        self._scripts = {s: client.register_script(script_source(s)) for s in SCRIPTS}
        if self._clock is not None:
            self._clock.subscribe(self._on_clock_step)

    def _run(self, script: str, args: list[str]) -> Any:
        return self._scripts[script](keys=self._keys, args=args)

    # -- adding --------------------------------------------------------------------

    def add(self, key: str, priority: int = 0) -> None:
        """Mark ``key`` for processing, for every client. Never blocks on the queue.

        Higher ``priority`` is handed out first (as ``WorkQueue.add``). Retrying
        an add whose reply was lost is harmless (it coalesces). Still accepted
        after this client's ``shutdown``: other clients go on.
        """
        args = [self._clock_arg(), priority_arg(priority), self._aging_arg, check_key(key)]
        now, _, events = self._run("add", args)
        if events:
            self._emit(now, events)

    def add_many(self, keys: Iterable[str], priority: int = 0) -> None:
        """``add`` each of ``keys`` (with ``priority``), in order: one round trip
        per 1,000 keys.

        Each batch is one atomic script run, with the same effect and events as
        that many ``add`` calls. Every key is checked before any is sent: one
        that is not a ``str`` raises ``TypeError`` and nothing is added.
        """
        head = [priority_arg(priority), self._aging_arg]
        for batch in key_batches(keys):
            now, _, events = self._run("add", [self._clock_arg(), *head, *batch])
            if events:
                self._emit(now, events)

    def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        """Add ``key`` once ``seconds`` have passed on the server's clock.

        One delayed entry per key, the earliest ready time wins (and the
        highest ``priority`` asked); ``seconds <= 0`` adds now. An ``add``
        meanwhile does not cancel it. Fenced when this client holds ``key``
        (as ``retry``).
        """
        seconds = check_delay(seconds)
        self._add_after(check_key(key), seconds, "delay", priority_arg(priority), "add_after")

    def _add_after(self, key: str, seconds: float, kind: str, priority: str, what: str) -> None:
        hold, fence = self._fence(key, what)
        args = [self._clock_arg(), *fence, key, repr(seconds), kind, priority, self._aging_arg]
        self._fenced(key, hold, self._call_fenced(hold, "add_after", args), what)

    def _call_fenced(self, hold: Any, script: str, args: list[str]) -> Any:
        try:
            return self._run(script, args)
        except BaseException:
            self._fence_failed(hold)
            raise

    def add_rate_limited(self, key: str, priority: int = 0) -> None:
        """Record a failure with the rate limiter and add ``key`` (with
        ``priority``) after its backoff. Fenced when this client holds ``key``
        (as ``retry``)."""
        check_key(key)
        prio = priority_arg(priority)
        if self._server_limiter is None:
            seconds = check_delay(self._rate_limiter.when(key))  # type: ignore[union-attr]
            self._add_after(key, seconds, "rate_limit", prio, "add_rate_limited")
            return
        hold, fence = self._fence(key, "add_rate_limited")
        args = [self._clock_arg(), *fence, key, *self._server_limiter, prio, self._aging_arg]
        reply = self._call_fenced(hold, "add_rate_limited", args + self._endpoint_args(key))
        self._fenced(key, hold, reply, "add_rate_limited")

    def forget(self, key: str) -> None:
        """``key`` succeeded: clear its backoff and failure count (for every client).

        Fenced when this client holds ``key`` (as ``retry``).
        """
        check_key(key)
        if self._server_limiter is None:
            self._rate_limiter.forget(key)  # type: ignore[union-attr]
        hold, fence = self._fence(key, "forget")
        reply = self._call_fenced(hold, "forget", [self._clock_arg(), *fence, key])
        self._fenced(key, hold, reply, "forget")

    def num_requeues(self, key: str) -> int:
        """Failures the rate limiter has recorded for ``key`` since it was forgotten."""
        check_key(key)
        if self._server_limiter is None:
            return self._rate_limiter.num_requeues(key)  # type: ignore[union-attr]
        return int(self._client.hget(self._keys[REQUEUES], key) or 0)

    def retry(self, key: str) -> bool:
        """Record a failure of ``key``: False once it failed ``max_retries`` times
        (give up, then ``forget`` it), else ``add_rate_limited(key)`` and True.

        When this client holds ``key``, the call is fenced by the hold's token
        (so are ``forget``, ``add_after`` and ``add_rate_limited``): if the
        lease was taken back meanwhile it changes nothing and raises
        ``LeaseLost`` (another holder may have the key), and asked again after
        a connection error it is applied at most once.
        """
        check_key(key)
        delay = ""
        if self._server_limiter is None:
            delay = repr(check_delay(self._rate_limiter.when(key)))  # type: ignore[union-attr]
        hold, fence = self._fence(key, "retry")
        args = [self._clock_arg(), *fence, key, self._reap_args[0], delay]
        if self._server_limiter is not None:
            args += [*self._server_limiter, *self._endpoint_args(key)]
        return bool(int(self._fenced(key, hold, self._call_fenced(hold, "retry", args), "retry")))

    # -- getting -------------------------------------------------------------------

    def get_nowait(self) -> str:
        """Take the next waiting key (the oldest, or by priority), held by this
        client until ``done``.

        Raises ``Empty`` if none is waiting, ``ShutDown`` once this client was
        shut down.
        """
        key, _ = self._take()
        if key is None:
            raise Empty
        return key

    def _take(self) -> tuple[str | None, float | None]:
        """One get script: (key, None), or (None, seconds until something is due)."""
        if self._shutting_down:
            raise ShutDown(f"this client of queue {self.name!r} is shut down")
        return self._taken(
            self._run("get", [self._clock_arg(), repr(self._lease), *self._reap_args])
        )

    def get(self, timeout: float | None = None) -> str:
        """Like ``get_nowait``, but waits until a key is waiting.

        ``timeout`` (wall seconds) bounds the wait: ``Empty`` when it passes.
        Raises ``ShutDown`` once this client is shut down, also in a blocked
        ``get``, and ``Empty`` once ``interrupt`` is called. Wakes within a
        round trip of an add on any client. An idle getter sends one
        ``BLPOP`` per lease (at most 30 s), and the client's getters together
        run one get script per lease, to reap another client's expired lease.
        """
        timeout = check_timeout(timeout)
        seen = self._interrupts
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            key, due = self._take()
            if key is not None:
                return key
            if due is not None:
                if due <= 0:
                    continue  # more came due than one script releases
                if due < self._block:
                    self._arm(due)
            self._wait_for_bell(seen, deadline)

    def _wait_for_bell(self, seen: int, deadline: float | None) -> None:
        """Block until the doorbell rings or a look is due (then return: the
        caller runs the get script), ``deadline`` passes (``Empty``), this client
        shuts down (``ShutDown``) or is interrupted (``Empty``).

        One getter of the client (the leader) waits in ``BLPOP``; the others
        wait here until it leaves, and one of them takes its place.
        """
        with self._lock:
            self._check_wait(seen)
            self._getters += 1
            try:
                while self._leading:
                    if deadline is None:
                        self._followers.wait()
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise Empty
                        self._followers.wait(min(remaining, threading.TIMEOUT_MAX))
                    self._check_wait(seen)
            except BaseException:
                self._getters -= 1
                raise
            self._leading = True
        try:
            self._lead(seen, deadline)
        finally:
            with self._lock:
                self._getters -= 1
                self._leading = False
                self._followers.notify()

    def _lead(self, seen: int, deadline: float | None) -> None:
        """The leader's wait: ``BLPOP`` slices until a bell, a look or the end."""
        while True:
            now = time.monotonic()
            wait = min(self._block, self._look_at - now)
            if deadline is not None:
                if deadline <= now:
                    raise Empty
                wait = min(wait, deadline - now)
            # BLPOP's timeout 0 means forever: never ask for less than 1 ms.
            popped = self._client.blpop([self._bell, self._wake], timeout=max(wait, 0.001))
            if self._shutting_down or self._interrupts != seen:
                if popped is not None and text(popped[0]) == self._bell:
                    self._client.rpush(self._bell, "1")  # the key it rang for is someone's
                with self._lock:
                    self._check_wait(seen)
            if popped is not None or time.monotonic() >= self._look_at:
                return

    def interrupt(self) -> None:
        """Wake every ``get`` of this client blocked now: each raises ``Empty``.

        A ``get`` that starts later waits as usual. The queue and its other
        clients are untouched. ``run_workers`` calls it when its ``stop`` is
        set, so its workers wait in ``get`` without polling.
        """
        self._wake_leader(self._interrupt())

    def _wake_leader(self, getters: int) -> None:
        """Ring this client's wake-up list for ``getters`` getters in BLPOP."""
        if getters:
            pipe = self._client.pipeline()
            pipe.rpush(self._wake, *["1"] * getters)
            pipe.pexpire(self._wake, WAKE_TTL_MS)
            pipe.execute()

    def done(self, key: str) -> None:
        """Release ``key``; if it was added meanwhile, it is queued again (once).

        Raises ``ValueError`` if this client does not hold ``key`` (also after
        ``done`` returned), ``LeaseLost`` if its lease was taken back meanwhile
        (then nothing changed). After a connection error, calling ``done``
        again is safe: it releases the key at most once. Meanwhile the lease is
        no longer renewed: if the failed call did not release the key, it runs
        out and the key is handed out again (``run_workers`` asks again).
        """
        check_key(key)
        with self._lock:
            hold = self._find_hold(key, "done")
            again = "1" if hold.unanswered == "done" else ""
            hold.unanswered = "done"
        if hold.lost:
            self._finish(key, hold)
            raise self._lost(key, hold, None)
        try:
            now, status, events = self._run(
                "done", [self._clock_arg(), key, str(hold.token), again]
            )
        except BaseException:
            hold.unsure = True  # stop renewing: the key cannot stay held by a lost done
            raise
        self._finish(key, hold)
        self._emit(now, events)
        if status in ("lost", b"lost"):
            raise self._lost(key, hold, float(now))

    def _finish(self, key: str, hold: Any) -> None:
        if self._forget_hold(key, hold):
            with self._lock:
                self._no_holds.notify_all()

    # -- shutdown ------------------------------------------------------------------

    def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        """Stop this client taking keys; other clients of the queue go on.

        ``get`` raises ``ShutDown`` from now on, in this client only (blocked
        ones are woken); adds, retries and ``done`` still work, so nothing a
        shutting-down process learns is lost. With ``drain=True``, wait until
        this client holds no key, or ``timeout`` (wall seconds) passes. Returns
        False only when a drain timed out. Safe to call more than once; do not
        drain from a thread that holds a key.
        """
        check_flag(drain, "drain")
        timeout = check_timeout(timeout)
        self._wake_leader(self._shut())
        if not drain:
            return True
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._holds or self._stale:
                if deadline is None:
                    self._no_holds.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    self._no_holds.wait(min(remaining, threading.TIMEOUT_MAX))
        return True

    def close(self) -> None:
        """Shut this client down and stop renewing; close the connection pool if
        the queue made it (``url=``). Keys still held run out with their leases."""
        self.shutdown()
        self._stop_renewing.set()
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
        if self._owns_client:
            self._client.close()

    def __enter__(self) -> RedisWorkQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- leases and time -------------------------------------------------------------

    def _renewing(self) -> bool:
        return self._renewer is not None

    def _wake_followers(self) -> None:
        self._followers.notify_all()

    def _restart_renewing(self) -> None:
        self._start_renewing()

    def _start_renewing(self) -> None:
        with self._lock:
            if self._renewer is not None or self._stop_renewing.is_set():
                return
            self._renewer = threading.Thread(
                target=_renew_loop,
                args=(weakref.ref(self), self._lease / 3, self._stop_renewing),
                name=f"keyqueue-renew-{self.name}",
                daemon=True,
            )
            self._renewer.start()

    def _renew_once(self) -> bool:
        """Renew every live hold; False (and the loop ends) when there is none."""
        args = self._renewal()
        if len(args) == 2:
            with self._lock:
                if all(hold.lost or hold.unsure for hold in self._holds.values()):
                    self._renewer = None
                    return False
            return True  # a hold arrived meanwhile: renew it next time
        self._renewed(self._run("renew", args))
        return True

    def _arm(self, due: float) -> None:
        """Run ``reap`` in ``due`` seconds (a getter waits; BLPOP's timeout is coarse)."""
        at = time.monotonic() + due
        with self._lock:
            if self._timer is not None and self._timer_at <= at:
                return
            if self._timer is not None:
                self._timer.cancel()
            self._timer = threading.Timer(due, _tick, args=(weakref.ref(self),))
            self._timer_at = at
        self._timer.daemon = True
        self._timer.start()

    def _on_clock_step(self) -> None:
        """Release due keys and reap leases (a virtual clock moved, or the timer fired)."""
        now, events = self._run("reap", [self._clock_arg(), *self._reap_args])
        self._emit(now, events)

    # -- introspection -------------------------------------------------------------

    def stats(self) -> RedisStats:
        """A frozen snapshot of the queue-wide counters and sizes (one round trip)."""
        reply: Sequence[Any] = self._run("stats", [self._clock_arg(), *self._reap_args])
        return self._stats(reply)

    def __len__(self) -> int:
        """Keys waiting in the queue (all clients). Informational under concurrency."""
        return self.stats().depth

    def _gauges(self) -> QueueGauges:
        try:
            self.stats()
        except redis.exceptions.RedisError:
            logger.exception("keyqueue %r: reading gauges from the server failed", self.name)
        return self._last_levels


def _tick(ref: weakref.ref[RedisWorkQueue]) -> None:
    """The timer: release what came due, which rings the doorbell for the getters."""
    queue = ref()
    if queue is None:
        return
    with queue._lock:
        queue._timer = None
    try:
        queue._on_clock_step()
    except Exception:
        if not queue._stop_renewing.is_set():  # not closed meanwhile
            logger.warning("keyqueue %r: releasing due keys failed", queue.name, exc_info=True)


def _renew_loop(ref: weakref.ref[RedisWorkQueue], interval: float, stop: threading.Event) -> None:
    """The renewal thread: every ``interval``, renew the client's leases in one call.

    Holds the queue only while renewing, so a dropped queue is collected (and
    its leases run out). Ends when the client holds nothing, or at close.
    """
    while not stop.wait(interval):
        queue = ref()
        if queue is None:
            return
        try:
            if not queue._renew_once():
                return
        except Exception:
            if stop.is_set():  # closed meanwhile
                return
            logger.warning(
                "keyqueue %r: renewing leases failed; retrying in %.3g s",
                queue.name,
                interval,
                exc_info=True,
            )
        finally:
            del queue
