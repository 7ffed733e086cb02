"""What both Redis queue drivers share: the parts, built, and the plain surface.

A client of a queue on Redis is made of parts, each in a module of its own:
its settings (``_config.QueueConfig``), its connection and identity
(``_connection``), its holds and their one lock (``_holds.Holds``), its
waiting getters (``_getters.Getters``), its events (``_replies.Reports``)
and its operations (``_ops`` and ``_holding``: one generator per script, no
I/O). A driver, ``_sync.RedisWorkQueue`` or ``_async.AsyncRedisWorkQueue``,
derives from ``RedisFront``, which builds the parts from the constructor's
arguments and binds each operation to them (``_op_done(key)`` is
``_holding.done`` on this client's settings and holds, for the calling
thread or task); the driver sends the calls (``_drive``) and builds its
own parts: the doorbell wait (``_bell``), the renewal loop and the reap
timer (``_timers``), the drains' and joiners' waits (``_ends``).

Per queue, shared by every client: the four per-key states (dirty, FIFO,
processing), the leases and their fencing tokens, delays, failure counts,
the server rate limiter's state, and the counters ``stats()`` reports.
Per client: the keys it holds, with their tokens; its lease renewal loop
(one for all its keys, every third of the lease); its shutdown flag (a
shut-down client takes no more keys, and its drain waits for its own holds;
everything else, adds included, still reaches the shared queue, where other
clients go on); its event subscribers and metrics, which see the
transitions its own calls made (a due key released by this client's call
is this client's event).

The holds and the getters call back what only those parts do (``Driver``),
which the driver builds at the end of construction (``_connect``).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, Protocol, TypeVar, cast

from .._checks import check_flag
from .._clock import Clock
from .._dead import DeadKey
from .._events import Event, Subscribers
from .._metrics import MetricsProvider, QueueGauges
from .._options import QueueOptions
from .._ratelimit import RateLimiter
from .._snapshot import Snapshot
from . import _holding as holding
from . import _ops as ops
from ._claim_book import ClaimParts, claim_parts
from ._config import DEFAULT_MAX_STALLS, check_key, configure
from ._connection import (
    CONNECTION_ERRORS,
    SAID_ERRORS,
    Keys,
    Unsent,
    block_limit,
    check_holder,
    client_from_url,
    default_holder,
    describe,
    name_connections,
)
from ._durability import WRITES, NotReplicated, Replication, check_durability, socket_timeout
from ._getters import Getters
from ._holds import Hold, Holds, Settle
from ._limiter import RedisRateLimiter
from ._replies import RedisStats, Reports, text
from ._ride import ADD_TIMEOUT, Ride, check_add_timeout
from ._schema import SCRIPTS, script_source
from ._send import AsyncReplicatedScript, ReplicatedScript, Script
from ._shards import check_shards

__all__ = ["Driver", "RedisFront"]

logger = logging.getLogger("keyqueue")

Client = TypeVar("Client")


class Driver(Protocol):
    """What a driver gives the parts (``RedisFront`` defines none: no default to override)."""

    def _connect(self) -> None:
        """The driver's own state (the end of construction; the threading
        driver checks the server here)."""

    def _start_renewing(self) -> None:
        """Start the renewal loop unless one runs (or the client is closed)."""

    def _nothing_held(self) -> None:
        """This client's last hold ended: wake the drains and joiners."""

    def _wake_followers(self) -> None:
        """Wake every getter waiting for the leader (the lock held)."""

    def _arm(self, due: float) -> None:
        """Run ``reap`` in ``due`` seconds (a getter waits; BLPOP's timeout is coarse)."""

    def _on_clock_step(self) -> None:
        """A virtual clock moved: run ``reap``."""

    def _gauges(self) -> QueueGauges:
        """The gauges a metrics scrape reads."""


class RedisFront(Generic[Client]):
    """Construction, checks, the parts and their bindings, for both drivers.
    ``Client`` is the driver's redis-py client type."""

    connection_errors: tuple[type[BaseException], ...] = (*CONNECTION_ERRORS, NotReplicated)
    """What a call raises when its outcome is unknown (the server did not
    answer, or, with ``durability="replicated"``, the replicas did not
    acknowledge: ``NotReplicated``): the runner asks such a call again, with
    a backoff."""

    said_errors: tuple[type[BaseException], ...] = (*SAID_ERRORS, NotReplicated)
    """Errors this client logs itself, once: redis-py's pool had no free
    connection (a pool too small for the workers; nothing was sent), or
    writes the replicas did not acknowledge (once per episode). The runners
    ask such a call again without a warning each time."""

    # The driver's: the clients it takes, what a TypeError says they must be,
    # whether it makes a redis.asyncio client from a URL, its script objects (``_send``).
    _client_kinds: ClassVar[tuple[type, ...]]
    _client_wanted: ClassVar[str]
    _asyncio: ClassVar[bool] = False
    _script: ClassVar[type[Script]] = Script
    _replicated_script: ClassVar[type[ReplicatedScript | AsyncReplicatedScript]]

    _sharded: ClassVar[type | None] = None
    """The driver's sharded facade, which ``shards=N`` (N > 1) makes (``_sharded``)."""

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """Check the call against the constructor's signature, so that a bad
        one's ``TypeError`` names the class called, not this base; with
        ``shards`` above 1, make the driver's sharded facade (a subclass)."""
        if cls.__init__ is RedisFront.__init__:  # a subclass's own __init__ says its own
            try:
                _SIGNATURE.bind(None, *args, **kwargs)
            except TypeError as exc:
                raise TypeError(f"{cls.__name__}(): {exc}") from None
            shards = kwargs.get("shards", 1)
            if shards != 1 or type(shards) is not int:
                try:
                    shards = check_shards(shards)
                except ValueError as exc:
                    raise ValueError(f"{cls.__name__}(): {exc}") from None
                if shards != 1 and cls._sharded is not None:
                    return super().__new__(cls._sharded)
        return super().__new__(cls)

    def __init__(
        self,
        name: str,
        *,
        url: str | None = None,
        client: Client | None = None,
        lease: float = 30.0,
        rate_limiter: RedisRateLimiter | RateLimiter | None = None,
        max_retries: int | None = None,
        metrics: MetricsProvider | None = None,
        clock: Clock | None = None,
        aging: float | None = None,
        fair_by: Callable[[str], str] | None = None,
        holder: str | None = None,
        batch: bool = True,
        max_stalls: int = DEFAULT_MAX_STALLS,
        add_timeout: float = ADD_TIMEOUT,
        durability: str = "primary",
        replicas: int | None = None,
        shards: int = 1,
    ) -> None:
        replicated, asked = check_durability(durability, replicas)
        self._batch = check_flag(batch, "batch")
        self._add_timeout = check_add_timeout(add_timeout)
        if (url is None) == (client is None):
            raise TypeError(f"{type(self).__name__} needs exactly one of url= or client=")
        holder = default_holder() if holder is None else check_holder(holder)
        if client is None:
            try:  # TypeError for a url that is not a str
                client = client_from_url(cast("str", url), asyncio=self._asyncio)
            except ValueError as exc:
                raise ValueError(f"{type(self).__name__}(url=...): {exc}") from None
            self._owns_client = True
        else:
            if not isinstance(client, self._client_kinds):
                raise TypeError(f"client must be {self._client_wanted}, got {client!r}")
            self._owns_client = False
        name_connections(client, holder)
        self._client: Client = client
        options = QueueOptions(
            name,
            rate_limiter=rate_limiter,
            max_retries=max_retries,
            clock=clock,
            metrics=metrics,
            aging=aging,
            fair_by=fair_by,
        )
        unsent = Unsent(options.name)
        cfg = self._cfg = configure(
            options, holder=holder, lease=lease, max_stalls=max_stalls, unsent=unsent
        )
        self.name = cfg.name
        """The queue's name, as given (its keys' hash tag on the server, its metrics label)."""
        # The replicated mode's WAIT (None: durability="primary", no WAIT sent).
        self._replication = (
            Replication(cfg.name, asked, cfg.lease, socket_timeout=socket_timeout(client))
            if replicated
            else None
        )
        keys = Keys(cfg.name)
        self._keys, self._script_keys = keys.queue, keys.scripts
        self._bell, self._wake = keys.bell, keys.wake
        self._requeues, self._stats_key = keys.requeues, keys.stats
        # What ``exists`` looks for: the stats (any use) or dead keys.
        self._used_keys = (keys.stats, keys.dead)
        self._last_levels = QueueGauges(0, 0, 0.0, 0.0)
        driver = cast("Driver", self)
        # This client's subscribers and metrics: its observer is theirs
        # (callbacks run under no lock: they may call the queue).
        self._events = Subscribers(name, options.metrics.new_queue_metrics(name, driver._gauges))
        self._reports = Reports(name, self._events, cfg.max_stalls)
        replication = self._replication
        self._holds = Holds(
            self._reports,
            virtual=cfg.clock is not None,
            start_renewing=driver._start_renewing,
            nothing_held=driver._nothing_held,
            keep=None if replication is None or cfg.clock is not None else replication.keep,
        )
        self._waiting = Getters(
            name,
            self._holds.lock,
            lease=cfg.lease,
            block=block_limit(client),
            wake_followers=driver._wake_followers,
            arm=driver._arm,
        )
        # The scripts, each call sent once: never re-sent by redis-py's retry
        # (_send); in the replicated mode, those that write with WAIT behind them.
        self._scripts: dict[str, Any] = {
            s: self._script(client, script_source(s))
            if replication is None or s not in WRITES
            else self._replicated_script(client, script_source(s), replication)
            for s in SCRIPTS
        }
        driver._connect()
        if cfg.clock is not None:
            cfg.clock.subscribe(driver._on_clock_step)

    # -- read-only -----------------------------------------------------------------

    @property
    def _where(self) -> str:
        """The server, as errors name it now (``describe``)."""
        return describe(self._client)

    @property
    def lease(self) -> float:
        """Seconds a ``get`` holds a key without renewal."""
        return self._cfg.lease

    @property
    def holder(self) -> str:
        """This client's identity (``holder=``, default ``hostname:pid``): recorded
        with each lease it takes (a snapshot's ``HeldKey.holder``), and the client
        name of its connections (``CLIENT LIST``) unless the client had one."""
        return self._cfg.holder

    @property
    def max_retries(self) -> int | None:
        """Failures after which ``retry`` gives a key up (None: never); this client's setting."""
        return self._cfg.max_retries

    @property
    def add_timeout(self) -> float:
        """Seconds an ``add``, ``add_many`` batch or unfenced ``add_after`` goes
        on asking across a failover, then raises its last error (0: its first).
        An add coalesces, so asking again is harmless; which errors are asked
        again: ``RedisWorkQueue.add``."""
        return self._add_timeout

    @property
    def durability(self) -> str:
        """``"primary"`` (the default: a reply is acted on once the primary
        answered) or ``"replicated"`` (once every replica acknowledged the
        write too: ``WAIT``); see ``RedisWorkQueue``."""
        return "primary" if self._replication is None else "replicated"

    @property
    def replicas(self) -> int | None:
        """The replicas a write must reach (``durability="replicated"``: as
        given, or the primary's replicas at start once it was checked);
        None in the default mode."""
        replication = self._replication
        return None if replication is None else replication.replicas

    @property
    def max_stalls(self) -> int:
        """Stalls in a row after which a key is given up as poison (this
        client's setting, applied by its calls that reap): a stall is a hold
        taken back after its handler started (its holder died, or stopped
        renewing, with the handler running). A key is given up at its
        ``max_stalls + 1``-th stall in a row; its ``done`` or ``forget`` ends
        the row. Holds whose handler never started cost nothing."""
        return self._cfg.max_stalls

    @property
    def aging(self) -> float | None:
        """This client's ``aging`` (None: strict). The queue keeps the aging of
        the client whose priority made it ranked: every client of one queue
        should pass the same."""
        return self._cfg.aging

    @property
    def fair_by(self) -> Callable[[str], str] | None:
        """This client's ``fair_by`` (None: none): keys are handed out
        round-robin across groups within a priority, FIFO within a group
        (docs/fairness.md). The client computes a key's group at add; every
        client of one queue should pass the same (as ``aging``)."""
        return self._cfg.fair_by

    @property
    def rate_limiter(self) -> RedisRateLimiter | RateLimiter:
        """A ``RedisRateLimiter`` (state on the server) or this client's local limiter."""
        return self._cfg.rate_limiter

    @property
    def shutting_down(self) -> bool:
        """True once this client's ``shutdown`` was called (other clients go on)."""
        return self._waiting.shutting_down

    @property
    def shards(self) -> int:
        """How many shards the queue has (``shards=``; 1: one slot, ``{name}``)."""
        return 1

    @property
    def batch(self) -> bool:
        """Whether ``run_workers``/``arun_workers`` take this client's keys in
        batches (``batch=`` of the constructor)."""
        return self._batch

    def token(self, key: str) -> int:
        """The fencing token of ``key``, which this client holds.

        Tokens strictly increase per queue: a handler can pass its token along
        with its writes downstream, and a store that remembers the highest token
        seen can refuse a write from a holder whose lease was taken back. With
        a Sentinel or Cluster client a token is ``epoch * 2**32 + n`` (the
        epoch: Sentinel's ``config-epoch``, the serving Cluster node's
        ``cluster_my_epoch``), so a primary a failover promoted hands out
        tokens above every token an earlier primary handed out; below 2**53.
        Raises ``ValueError`` if this client does not hold ``key``.
        """
        return self._holds.token(check_key(key), self._owner())

    def abandon(self, key: str) -> None:
        """Let go of this client's hold of ``key`` without releasing it on the
        server: it is no longer renewed, so its lease runs out and the key is
        handed out again (as a holder that died: a stall if its start was
        reported, ``max_stalls``). Later
        calls of the hold raise ``ValueError``; ``shutdown(drain=True)`` no
        longer waits for it. For a worker that stops while it cannot tell the
        server how the key ended (``run_workers`` calls it). Raises
        ``ValueError`` if this client does not hold ``key``.
        """
        self._holds.abandon(check_key(key), self._owner())

    def subscribe(self, callback: Callable[[Event[str]], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every transition this client's calls make.

        Transitions of other clients are theirs to report. Callbacks run in the
        calling thread (or task), after the server applied the change; an
        exception in one is logged. Returns an unsubscribe function.
        """
        return self._events.subscribe(callback)

    def __repr__(self) -> str:
        state = "shutting down" if self._waiting.shutting_down else "running"
        return (
            f"<{type(self).__name__} {self.name!r} {state}: {len(self._holds)} held by this client>"
        )

    # -- the operations, bound to this client's parts ------------------------------------

    def _owner(self) -> object:
        """Who takes a hold: the calling thread (the asyncio driver: its task)."""
        return threading.get_ident()

    def _op_add(self, key: str, priority: int) -> ops.Op[None]:
        return ops.add(self._cfg, self._reports, key, priority)

    def _op_add_many(self, keys: Iterable[str], priority: int) -> Iterator[ops.Op[None]]:
        return ops.add_many(self._cfg, self._reports, keys, priority)

    def _ride(self, key: str | None = None) -> Ride:
        """One add's attempts (an ``add_after`` of a held ``key`` is fenced: none)."""
        return Ride(0.0 if key is not None and key in self._holds else self._add_timeout)

    def _op_add_after(self, key: str, seconds: float, priority: int) -> ops.Op[None]:
        return ops.add_after(self._cfg, self._holds, self._owner(), key, seconds, priority)

    def _op_add_rate_limited(self, key: str, priority: int) -> ops.Op[None]:
        return ops.add_rate_limited(self._cfg, self._holds, self._owner(), key, priority)

    def _op_forget(self, key: str) -> ops.Op[None]:
        return ops.forget(self._cfg, self._holds, self._owner(), key)

    def _op_retry(self, key: str) -> ops.Op[bool]:
        return ops.retry(self._cfg, self._holds, self._owner(), key)

    def _op_give_up(self, key: str, reason: str, error: BaseException | None) -> ops.Op[None]:
        return ops.give_up(self._cfg, self._holds, self._owner(), key, reason, error)

    def _op_dead(self, limit: int) -> ops.Op[tuple[DeadKey[str], ...]]:
        return ops.dead(self._cfg, limit)

    def _op_replay(self, keys: list[str] | None) -> ops.Op[list[str]]:
        return ops.replay(self._cfg, self._reports, keys)

    def _op_forget_dead(self, key: str) -> ops.Op[bool]:
        return ops.forget_dead(self._cfg, key)

    def _op_get(self, now: float) -> ops.Op[tuple[str | None, float | None]]:
        return holding.get(self._cfg, self._holds, self._waiting, self._owner(), now)

    def _op_done(self, key: str) -> ops.Op[None]:
        return holding.done(self._cfg, self._holds, self._owner(), key)

    def _op_claim(
        self, want: int, settles: Sequence[Settle], now: float
    ) -> ops.Op[tuple[holding.Taken, list[str], float | None]]:
        return holding.claim(self._cfg, self._holds, self._waiting, want, settles, now)

    def _op_start(self, key: str, hold: Hold) -> ops.Op[bool] | bool:
        return holding.start(self._cfg, self._holds, key, hold)

    def _op_put_back(self, held: Sequence[tuple[str, int]]) -> ops.Op[tuple[float, list[bool]]]:
        return holding.put_back(self._cfg, self._reports, held)

    def _op_reap(self) -> ops.Op[None]:
        return ops.reap(self._cfg, self._reports)

    def _op_renew(self, now: float) -> ops.Op[None] | bool:
        return holding.renew(self._cfg, self._holds, now)

    def _op_idle(self) -> ops.Op[bool]:
        return ops.idle(self._cfg)

    def _op_delete(self, force: object) -> ops.Op[bool]:
        return ops.delete(self._cfg, force)

    def _op_stats(self, now: float) -> ops.Op[RedisStats]:
        """The queue's stats; ``now`` (monotonic) dates this client's gauges."""
        stats, dirty = yield from ops.stats(self._cfg, self._reports, self._waiting)
        self._keep_levels(stats, dirty, now)
        return self._with_client_counts(stats)

    def _op_snapshot(self, limit: object, now: float) -> ops.Op[Snapshot[str]]:
        """The queue's snapshot; ``now`` (monotonic) dates this client's gauges."""
        snap, dirty = yield from ops.snapshot(self._cfg, self._reports, self._waiting, limit)
        stats = cast("RedisStats", snap.stats)
        self._keep_levels(stats, dirty, now)
        if self._replication is None:
            return snap
        return dataclasses.replace(snap, stats=self._with_client_counts(stats))

    def _with_client_counts(self, stats: RedisStats) -> RedisStats:
        """``stats`` with this client's own counts (``writes_not_replicated``)."""
        if self._replication is None:
            return stats
        return dataclasses.replace(stats, writes_not_replicated=self._replication.not_replicated)

    def _ops_gets_lost(self) -> list[ops.Op[None]]:
        """At shutdown (no get follows): for each slot whose gets were not
        answered, the get script that only hands back what they took."""
        lost = self._holds.take_gets_lost()
        return [holding.hand_back(self._cfg, self._holds, slot, numbers) for slot, numbers in lost]

    def _orphaned_get(self, reply: Sequence[Any]) -> tuple[str, ops.Op[Any]] | None:
        """A cancelled get's reply: its events, then the key it handed out and
        that key's put_back (None if it handed out none)."""
        self._reports.emit(reply[0], reply[-1])
        if not int(reply[1]):
            return None
        key = text(reply[2])
        return key, self._op_put_back([(key, int(reply[3]))])

    def _replicas_known(self, connected: int) -> None:
        """The server check read the primary's ``connected`` replicas (the
        replicated mode's): its ``WAIT`` is set, and a shortfall said once."""
        if self._replication is not None:
            self._replication.start(connected, self._where)

    def _local_requeues(self, key: str) -> int | None:
        """``num_requeues`` from this client's local limiter; None: ask the server."""
        check_key(key)
        limiter = self._cfg.local_limiter
        return None if limiter is None else limiter.num_requeues(key)

    def _renewal(self) -> tuple[list[str], list[Hold]]:
        return holding.renewal(self._cfg, self._holds)

    def _renewed(self, reply: Sequence[Any]) -> None:
        holding.renewed(self._cfg, self._holds, reply)

    # -- gauges --------------------------------------------------------------------

    def _keep_levels(self, stats: RedisStats, dirty: int, now: float) -> None:
        self._last_levels = self._levels(
            dirty, stats.delayed, stats.waiting_by_priority, stats.oldest_wait_seconds, now
        )

    def _levels(
        self, dirty: int, delayed: int, waiting: Mapping[int, int], oldest_wait: float, now: float
    ) -> QueueGauges:
        """Gauges: the queue's depth, delayed keys, waiting keys by priority and
        oldest wait; this client's unfinished work at ``now`` (monotonic)."""
        total, longest = self._holds.ages(self._cfg.local(now))
        return QueueGauges(dirty, delayed, total, longest, waiting, oldest_wait)

    # -- the parts, as the runners, the claims and the tests reach them -----------------

    @property
    def _getters(self) -> int:
        """Getters blocked in ``get`` on this client (``Getters.blocked``)."""
        return self._waiting.blocked

    def _claim_parts(
        self,
        drive: Callable[[ops.Op[Any]], Any],
        wait: Callable[[int], Any],
        taken: Callable[[], None],
    ) -> ClaimParts:
        """What the runners' claims use of this client, with its driver's I/O (``claim_parts``)."""
        return claim_parts(self._cfg, self._reports, self._holds, self._waiting, drive, wait, taken)

    def _started(self, key: str, hold: Hold) -> None:
        """``Holds.started``: a claimed hold handed to its worker."""
        self._holds.started(key, hold)

    def _finish(self, key: str, hold: Hold) -> None:
        """``Holds.finish``: the hold ended."""
        self._holds.finish(key, hold)

    def _watch_poison(self, watcher: Callable[[str], object]) -> Callable[[], None]:
        """``Reports.watch_poison``: the runners' ``on_give_up`` for poison keys."""
        return self._reports.watch_poison(watcher)


_SIGNATURE = inspect.signature(RedisFront.__init__)
