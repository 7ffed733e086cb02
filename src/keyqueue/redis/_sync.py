"""``RedisWorkQueue``: the threading driver of a queue on a Redis/Valkey server.

It does the I/O only: each call is one script round trip on redis-py's
connection pool (one connection per thread that is in a call), so the queue
is thread-safe; the getters' wait for the doorbell (one leader in ``BLPOP``,
the others on a condition); one daemon thread per client that renews its
leases while it holds keys (it holds the queue only weakly, so a dropped
queue's leases run out); a timer thread that runs ``reap`` when something
comes due. What each call sends and how its reply is read is ``_ops``';
the parts it is built of are ``_front``'s.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable
from typing import Any, TypeVar

import redis

from .._checks import check_timeout
from .._dead import DeadKey
from .._errors import Empty
from .._metrics import QueueGauges
from .._snapshot import Snapshot
from .._source import batch_with
from ._bell import Doorbell
from ._claims import Claims
from ._connection import close_client, server_checked, unreachable
from ._durability import replicas_at_start
from ._ends import HoldEnds, drain_timeout, shut
from ._epoch import epochs_for, hands_out, run_viewed
from ._front import RedisFront, logger
from ._ops import Op, answer, failed
from ._replies import RedisStats
from ._ride import Ride, misrouted, reroute
from ._send import ReplicatedScript, Script
from ._timers import ReapTimer, Renewer

__all__ = ["RedisWorkQueue"]

T = TypeVar("T")


class RedisWorkQueue(RedisFront[redis.Redis | redis.RedisCluster]):
    """A work queue shared by every process that names it on one Redis/Valkey server.

    The same rules and methods as ``WorkQueue`` (coalescing, one redelivery,
    per-key exclusion, delays, backoff, ``max_retries``, stats, events), for
    ``str`` keys; ``run_workers`` works on it unchanged, and takes keys in
    batches (one script settles the keys its workers finished and claims as
    many as wait, each with its own lease and token).

    Give exactly one of ``url`` or ``client``. ``url`` is read by
    ``client_from_url``: ``redis://host:port/db``, a Sentinel service
    (``redis+sentinel://host:port[,host:port...]/service[/db]``) or a Cluster
    (``redis+cluster://host:port[,...]``); ``client`` is a ``redis.Redis``
    (``Sentinel(...).master_for(service)`` is one: it follows a failover), or
    a ``redis.RedisCluster`` (every key of a queue is in one slot); its
    socket timeout bounds each blocking call. The
    constructor checks the server: unreachable raises
    ``redis.exceptions.ConnectionError``, older than Redis 6.2 ``RuntimeError``.

    ``get`` takes a lease of ``lease`` seconds, renewed by this client every
    third of it while the key is held; a holder that stops renewing (its
    process died) loses the key and its late ``done`` raises ``LeaseLost``.
    ``token(key)`` is the hold's fencing token. Such a key waits again at
    once, charged no failure: nothing at all if its handler never started (a
    key ``run_workers`` claimed for a worker that had not taken it yet), else
    one stall; a key that stalls its holder more than ``max_stalls`` times in
    a row (default 1, as BullMQ's ``maxStalledCount``; ``done`` or ``forget``
    ends the row) is given up as a poison key (``EventKind.POISON``, and
    ``on_give_up`` with ``Stalled`` in the runner whose call gave it up).

    ``rate_limiter``: ``None`` or a ``RedisRateLimiter`` keeps the backoff state
    on the server, shared by every client; a local ``RateLimiter`` (the
    in-memory limiters) keeps it in this process only. ``max_retries`` counts
    failures on the server. ``clock`` is for tests only: a virtual clock
    (``keyqueue.testing.FakeClock``) that replaces the server's time for this
    client; leases are then not renewed and run out when it is stepped past
    them. ``aging`` as ``WorkQueue``'s: the queue keeps the aging of the client
    whose priority made it ranked, so every client should pass the same.
    ``fair_by`` as ``WorkQueue``'s (docs/fairness.md): this client computes a
    key's group at each add (``add``, ``add_many``, ``add_after``,
    ``add_rate_limited``; a ``TypeError`` or ``fair_by``'s exception before
    anything is sent) and the server keeps it with the key until the key is
    gone; the queue is fair from the first such add, so every client should
    pass the same. A sharded queue takes turns within each shard.

    ``holder`` names this client (default ``hostname:pid``; printable ASCII,
    no spaces): it is recorded with every lease the client takes, so a
    ``snapshot`` shows who holds each key, and it is the client name of the
    connections (``CLIENT LIST``), unless a ``client`` passed in has a name.

    ``batch`` (default True): ``run_workers`` takes this client's keys in
    batches (claims) and settles them in batches; its workers then call
    neither ``get`` nor ``done``, so a subclass or an instance that replaces
    either is refused there with a ``TypeError`` (a replaced ``forget`` is
    called). ``batch=False``: one ``get``, ``forget`` and ``done`` per key,
    through the queue's own methods.

    The client's retry setting (``retry=``, redis-py's ``Retry``: ten retries
    for ``redis.Redis(host, port)`` and ``RedisCluster``, none for
    ``from_url``) applies to connecting and to the commands that are safe to
    send twice (``INFO``, the doorbell's ``BLPOP`` and ``RPUSH``, ``HGET``,
    ``EXISTS``), never to the queue's scripts: each is sent once, on a
    connection of the client's pool, and a connection error raises
    (``connection_errors``). Its outcome is then unknown, and asking the same
    call again is safe: a lost reply costs no key, no failure and no false
    ``LeaseLost`` (a get's key, a claim's keys are handed back by the next
    get or claim; a ``done`` or fenced outcome asked again is applied once).
    ``run_workers`` asks again with a backoff; so should a direct caller.

    ``durability`` says when a reply is acted on. ``"primary"`` (the
    default): once the primary answered; a failover may lose what the
    replicas had not copied yet (docs/DESIGN.md, "What each mode promises").
    ``"replicated"``: once every replica acknowledged it too: each script
    that writes is followed by ``WAIT replicas timeout`` on the same
    connection (one round trip, one command more), ``replicas`` being the
    primary's replicas at start unless given (all of them, not a majority:
    the promoted replica is any one of them). A write fewer acknowledged
    within the timeout (a twentieth of the lease, at most 1 s) raises
    ``NotReplicated``, one of the ``connection_errors``: its outcome is
    unknown, as after a lost connection, and asking again is safe (an add
    asks again itself, within ``add_timeout``). While fewer replicas are
    in sync every write waits that long and raises: said once per episode
    (``RedisStats.writes_not_replicated`` counts them), and a primary with
    fewer replicas than asked at start is said once. A hold then also has a
    local deadline: the send time of its last confirmed hand-out or
    renewal, plus the lease less a tenth; past it the hold is lost here
    (``done`` and the fenced calls raise ``LeaseLost``), before the next
    primary can hand the key out. ``replicas`` is for the replicated mode
    only; a bad value of either raises ``ValueError`` before anything connects.

    ``shards`` (default 1: one slot, ``{name}``): with N > 1 the queue is N
    queues ``name/0`` ... ``name/N-1``, each in its own slot (on a Cluster,
    spread over the primaries), and the constructor returns a subclass
    with the same methods. A key lives in shard ``shard_of(key, N)``, so
    every per-key rule holds as on one queue; hand-out order, priorities
    and the server bucket (qps/N, burst/N each) are per shard, the getters
    taking from the shards that have work in turn; ``stats`` and
    ``snapshot`` add the shards up; ``run_workers`` takes one key at a
    time. Every client must pass the same N (the first one writes it into
    each shard; another N raises ``ValueError``), and a bad N raises
    ``ValueError`` before anything connects (docs/redis.md, "Sharding").
    """

    _client_kinds = (redis.Redis, redis.RedisCluster)
    _client_wanted = (
        "a redis.Redis or redis.RedisCluster (use AsyncRedisWorkQueue for redis.asyncio)"
    )
    _script = Script
    _replicated_script = ReplicatedScript

    def _connect(self) -> None:
        """Threads' state; the server checked (the constructor raises)."""
        self._stop_renewing = threading.Event()  # set at close (and by tests: a stall)
        self._renewer = Renewer(
            self._cfg, self._holds, self._reports, self._renew_once, self._stop_renewing
        )
        self._timer = ReapTimer(
            self._holds.lock, self._on_clock_step, self._stop_renewing.is_set, self.name
        )
        self._ends = HoldEnds(self._holds)  # the drains and joiners
        self._doorbell = Doorbell(self._client, self._waiting, self._bell, self._wake)
        # The view of the primary its hand-outs carry: None on a plain server (_epoch).
        self._epochs = epochs_for(self._client, self.name, self._script_keys["get"][0])
        try:
            info = self._client.info("server")
            if self._replication is not None:
                self._replicas_known(replicas_at_start(self._client, self._stats_key))
        except redis.exceptions.ConnectionError as exc:
            raise unreachable(self.name, self._where, exc) from exc
        server_checked(self.name, self._where, info)

    def _run(self, script: str, args: list[str]) -> Any:
        if self._epochs is not None and hands_out(script, args):  # a view to carry
            return run_viewed(
                self._epochs, self._client, self._scripts[script], self._script_keys[script], args
            )
        return self._scripts[script](keys=self._script_keys[script], args=args)

    def _drive(self, op: Op[T]) -> T:
        """``op``'s script call, made: what it returns."""
        script, args = next(op)
        try:
            reply = self._run(script, args)
        except BaseException as exc:
            failed(op, exc)
        return answer(op, reply)

    def _drive_ridden(self, op: Op[T], ride: Ride) -> T:
        """``_drive``, the call asked again while ``ride`` says so (an add: ``_ride``)."""
        script, args = next(op)
        while True:
            try:
                reply = self._run(script, args)
            except BaseException as exc:
                pause = ride.pause(exc)
                if pause is None:
                    failed(op, exc)
                if misrouted(exc):
                    reroute(self._client)
                time.sleep(pause)
            else:
                return answer(op, reply)

    # -- adding --------------------------------------------------------------------

    def add(self, key: str, priority: int = 0) -> None:
        """Mark ``key`` for processing, for every client. Never blocks on the queue.

        Higher ``priority`` is handed out first (as ``WorkQueue.add``). Still
        accepted after this client's ``shutdown``: other clients go on.

        An add coalesces, so asking it again is harmless: across a failover
        this client asks again for up to ``add_timeout`` seconds, then raises
        the last error. Asked again: no answer (connection errors,
        ``MasterNotFoundError``, ``TimeoutError``) and ``READONLY``,
        ``NOREPLICAS``, ``MASTERDOWN``, ``TRYAGAIN``, ``CLUSTERDOWN``,
        ``LOADING`` (nothing ran), after a pause of 0.05 s doubling to 1 s; a
        node that says it is not the primary sends the client back to
        Sentinel (idle connections closed) or the Cluster (slot map reloaded).
        """
        self._drive_ridden(self._op_add(key, priority), self._ride())

    def add_many(self, keys: Iterable[str], priority: int = 0) -> None:
        """``add`` each of ``keys`` (with ``priority``), in order: one round trip
        per 1,000 keys.

        Each batch is one atomic script run, with the same effect and events as
        that many ``add`` calls. Every key is checked before any is sent: one
        that is not a ``str`` raises ``TypeError`` and nothing is added. Each
        batch is asked again across a failover as ``add`` is.
        """
        for batch in self._op_add_many(keys, priority):
            self._drive_ridden(batch, self._ride())

    def add_after(self, key: str, seconds: float, priority: int = 0) -> None:
        """Add ``key`` once ``seconds`` have passed on the server's clock.

        One delayed entry per key, the earliest ready time wins (and the
        highest ``priority`` asked); ``seconds <= 0`` adds now. An ``add``
        meanwhile does not cancel it. Fenced when this client holds ``key``
        (as ``retry``); else asked again across a failover as ``add`` is.
        """
        self._drive_ridden(self._op_add_after(key, seconds, priority), self._ride(key))

    def add_rate_limited(self, key: str, priority: int = 0) -> None:
        """Record a failure with the rate limiter and add ``key`` (with
        ``priority``) after its backoff. Fenced when this client holds ``key``
        (as ``retry``)."""
        self._drive(self._op_add_rate_limited(key, priority))

    def forget(self, key: str) -> None:
        """``key`` succeeded: clear its backoff and failure count (for every client).

        Fenced when this client holds ``key`` (as ``retry``).
        """
        self._drive(self._op_forget(key))

    def num_requeues(self, key: str) -> int:
        """Failures the rate limiter has recorded for ``key`` since it was forgotten."""
        local = self._local_requeues(key)
        if local is not None:
            return local
        return int(self._client.hget(self._requeues, key) or 0)

    def retry(self, key: str) -> bool:
        """Record a failure of ``key``: False once it failed ``max_retries`` times
        (give up, then ``forget`` it), else ``add_rate_limited(key)`` and True.

        When this client holds ``key``, the call is fenced by the hold's token
        (so are ``forget``, ``add_after`` and ``add_rate_limited``): if the
        lease was taken back meanwhile it changes nothing and raises
        ``LeaseLost`` (another holder may have the key), and asked again after
        a connection error it is applied at most once.
        """
        return self._drive(self._op_retry(key))

    def give_up(self, key: str, reason: str, error: BaseException | None = None) -> None:
        """``forget`` ``key`` and keep it as a dead key (``dead()``), for every
        client: ``reason`` (the runners pass ``"retries"`` or ``"permanent"``;
        a poison key is kept by the server as ``"stalls"``), ``error``'s type
        and message, its failures, the server's time. At most 1,000
        dead keys are kept, none older than 7 days (never listed or
        replayed after that). Fenced when this client holds ``key`` (as ``retry``).
        """
        self._drive(self._op_give_up(key, reason, error))

    def dead(self, limit: int = 100) -> tuple[DeadKey[str], ...]:
        """The first ``limit`` dead keys, newest first (one read-only script).
        A bad ``limit`` raises."""
        return self._drive(self._op_dead(limit))

    def replay(self, key: str) -> bool:
        """Add a dead ``key`` back (for every client), its failures and backoff
        cleared, in one script; False if it is not dead. A key waiting or held
        meanwhile keeps its place: the add is coalesced, or marks it for one
        redelivery, as ``add``. Accepted after this client's ``shutdown``, as
        ``add``."""
        return bool(self._drive(self._op_replay([key])))

    def replay_all(self) -> int:
        """``replay`` every dead key, oldest first, in one script; how many."""
        return len(self._drive(self._op_replay(None)))

    def forget_dead(self, key: str) -> bool:
        """Drop ``key``'s dead entry without adding it; False if it had none."""
        return self._drive(self._op_forget_dead(key))

    # -- getting -------------------------------------------------------------------

    def get_nowait(self) -> str:
        """Take the next waiting key (the oldest, or by priority), held by this
        client until ``done``.

        Raises ``Empty`` if none is waiting, ``ShutDown`` once this client was
        shut down.
        """
        key, _ = self._drive(self._op_get(time.monotonic()))
        if key is None:
            raise Empty
        return key

    def get(self, timeout: float | None = None) -> str:
        """Like ``get_nowait``, but waits until a key is waiting.

        ``timeout`` (wall seconds) bounds the wait: ``Empty`` when it passes.
        Raises ``ShutDown`` once this client is shut down, also in a blocked
        ``get``, and ``Empty`` once ``interrupt`` is called. Wakes within a
        round trip of an add on any client. An idle getter sends one
        ``BLPOP`` per lease (at most 30 s), and the client's getters together
        run one get script per lease, to reap another client's expired lease.
        """
        seen, deadline = self._waiting.bounds(timeout, time.monotonic())
        while True:
            key, due = self._drive(self._op_get(time.monotonic()))
            if key is not None:
                return key
            if not self._waiting.look_again(due):
                self._wait_for_bell(seen, deadline)

    def _wait_for_bell(self, seen: int, deadline: float | None) -> None:
        """``Doorbell.wait``: until the doorbell rings or a look is due."""
        self._doorbell.wait(seen, deadline)

    def interrupt(self) -> None:
        """Wake every ``get`` of this client blocked now: each raises ``Empty``.

        A ``get`` that starts later waits as usual. The queue and its other
        clients are untouched. ``run_workers`` calls it when its ``stop`` is
        set, so its workers wait in ``get`` without polling.
        """
        self._doorbell.wake_leader(self._waiting.interrupt())

    def _wake_followers(self) -> None:
        self._doorbell.wake_followers()

    def done(self, key: str) -> None:
        """Release ``key``; if it was added meanwhile, it is queued again (once).

        Raises ``ValueError`` if this client does not hold ``key`` (also after
        ``done`` returned), ``LeaseLost`` if its lease was taken back meanwhile
        (then nothing changed). After a connection error, calling ``done``
        again is safe: it releases the key at most once. Meanwhile the lease is
        no longer renewed: if the failed call did not release the key, it runs
        out and the key is handed out again (``run_workers`` asks again).
        """
        self._drive(self._op_done(key))

    def _nothing_held(self) -> None:
        self._ends.nothing_held()

    # -- shutdown ------------------------------------------------------------------

    def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool:
        """Stop this client taking keys; other clients of the queue go on.

        ``get`` raises ``ShutDown`` from now on, in this client only (blocked
        ones are woken); adds, retries and ``done`` still work, so nothing a
        shutting-down process learns is lost. With ``drain=True``, wait until
        this client holds no key, or ``timeout`` (wall seconds) passes. Returns
        False only when a drain timed out (then a WARNING counts the keys this
        client still holds). Safe to call more than once; do not drain from a
        thread that holds a key.

        A drain loses no key: a key that fails during it is retried as on a
        live client (``retry`` backs it off on the server; ``max_retries``
        still gives up), so it stays queued on the server, with the keys still
        waiting and delayed, for the other clients or the next start (a shut
        down client takes no more keys). To wait until the whole queue is
        done, ``join``.
        """
        timeout = drain_timeout(drain, timeout)
        self._doorbell.wake_leader(shut(self._waiting, self._reports, self._cfg, time.time()))
        self._hand_back_gets_lost()
        if not drain:
            return True
        if self._ends.drain(None if timeout is None else time.monotonic() + timeout):
            return True
        self._reports.drain_timed_out(timeout, self._holds.count())
        return False

    def join(self, timeout: float | None = None) -> bool:
        """Block until the queue is idle on the server, for every client:
        nothing waits or is pending, is held or is delayed. True then, False if
        ``timeout`` (wall seconds) passed first. ``queue.Queue.join``'s
        counterpart; it neither shuts down nor takes keys, and other clients'
        work counts (a process that only produces can join too).

        It does not busy-poll. Each look is one read-only script (``idle``:
        three O(1) reads, one round trip). It looks at once; again at once
        whenever this client lets go of its last hold (its own ``done`` may
        have left the queue idle); otherwise after 50 ms, doubling to one look
        a second while the queue stays busy. So a join costs the server at most
        about one tiny script a second, plus one per time this client's workers
        run out of keys. Other clients' dones are seen by the next look
        (within a second). Do not join from a thread that holds a key.
        """
        return self._ends.join(lambda: self._drive(self._op_idle()), check_timeout(timeout))

    def _hand_back_gets_lost(self) -> None:
        """Hand back the keys this client's gets whose reply was lost took (no
        get of this client follows to do it); if that fails, their leases run out."""
        for op in self._ops_gets_lost():
            try:
                self._drive(op)
            except self.connection_errors:
                self._reports.hand_back_failed()

    def close(self) -> None:
        """Shut this client down and stop renewing; close the connection pool if
        the queue made it (``url=``). Keys still held run out with their leases."""
        self.shutdown()
        self._stop_renewing.set()
        self._timer.cancel()
        if self._owns_client:
            close_client(self._client)

    def __enter__(self) -> RedisWorkQueue:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- leases and time -------------------------------------------------------------

    def _start_renewing(self) -> None:
        self._renewer.start()

    def _renew_once(self) -> bool:
        """Renew every live hold; False (and the loop ends) when there is none."""
        op = self._op_renew(time.monotonic())
        if isinstance(op, bool):
            return op
        self._drive(op)
        return True

    def _arm(self, due: float) -> None:
        self._timer.arm(due)

    def _on_clock_step(self) -> None:
        """Release due keys and reap leases (a virtual clock moved, or the timer fired)."""
        self._drive(self._op_reap())

    # -- introspection -------------------------------------------------------------

    def stats(self) -> RedisStats:
        """A frozen snapshot of the queue-wide counters and sizes (one round trip)."""
        return self._drive(self._op_stats(time.monotonic()))

    def snapshot(self, limit: int = 100) -> Snapshot[str]:
        """Stats and the first ``limit`` keys of each list (``keyqueue.Snapshot``),
        read in one script (consistent: nothing else runs on the server meanwhile).

        Each list is read from its head with a range and a few reads per row:
        O(limit + log n) on the server, however long the queue is. Rows carry
        each hold's holder (its client's ``holder``), fencing token and lease
        left; times are the server's. It changes nothing (``stats`` releases
        due keys and takes back expired leases first; a snapshot does not): a
        key due but not yet released shows ``due_in <= 0``, an expired lease
        not yet taken back ``lease_left < 0``. A bad ``limit`` raises.
        """
        return self._drive(self._op_snapshot(limit, time.monotonic()))

    def reshard(self, shards: int) -> int:
        """Move the queue's keys to ``shards`` shards while it runs, as
        ``ShardedRedisWorkQueue.reshard`` (a sharded client of the queue, on
        this client's connections, moves them). This client, made with
        ``shards=1``, routes nothing: once the map changes its adds and gets
        are refused (``MAPCHANGED``; holds it has end as usual). Run clients
        made with ``shards`` >= 2, which follow the queue's map.
        """
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
            return int(movers.reshard(shards))
        finally:
            movers.close()

    def exists(self) -> bool:
        """Whether any client has used the queue (added, got, gave a key up,
        ... anything but reading it) since it was created or last
        ``delete``d, or it holds dead keys."""
        return bool(self._client.exists(*self._used_keys))

    def delete(self, *, force: bool = False) -> bool:
        """Remove the queue from the server: every key of its state, for every
        client. Returns whether it existed (``exists``).

        Refused while any key is held (``RuntimeError``, nothing changed)
        unless ``force=True``: then the holders' ``done`` raises ``LeaseLost``.
        A client that goes on using the queue afterwards starts it anew, empty.
        A shut-down client's wake-up list is not deleted; it expires within a
        minute.
        """
        return self._drive(self._op_delete(force))

    def __len__(self) -> int:
        """Keys waiting in the queue (all clients). Informational under concurrency."""
        return self.stats().depth

    def _gauges(self) -> QueueGauges:
        try:
            self.stats()
        except redis.exceptions.RedisError:
            logger.exception("keyqueue %r: reading gauges from the server failed", self.name)
        return self._last_levels


def _claims(queue: RedisWorkQueue, fold_forget: bool) -> Claims:
    """``run_workers``' batched source on ``queue`` (``_source.batch_with``): its
    claims, on the parts this driver hands over."""
    wait = functools.partial(queue._doorbell.wait, deadline=None)
    return Claims(queue, [queue._claim_parts(queue._drive, wait, _nothing)], fold_forget)


def _nothing() -> None:
    """A claim took keys: a thread's drain waits for them as they are (``HoldEnds``)."""


batch_with(RedisWorkQueue, _claims)
