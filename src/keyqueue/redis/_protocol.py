"""The sans-I/O half of a Redis queue client: its state and every operation.

Theory of operation
-------------------
The queue's state lives on the server, in the keys ``_schema`` lists, and
every change is one Lua script named after the ``_core.py`` transition it
transcribes. The only clock is the server's ``TIME`` (a virtual clock's
reading replaces it in tests), so machines never disagree about when a delay
or a lease ends.

Per queue, shared by every client: the four per-key states (dirty, FIFO,
processing), the leases and their fencing tokens, delays, failure counts,
the server rate limiter's state, and the counters ``stats()`` reports.

Per client (a ``RedisProtocol``): the keys it holds, with their tokens; its
lease renewal loop (one for all its keys, every third of the lease); its
shutdown flag (a shut-down client takes no more keys, and its drain waits for
its own holds; everything else, adds included, still reaches the shared
queue, where other clients go on); its event subscribers and metrics, which
see the transitions its own calls made (a due key released by this client's
call is this client's event).

Leases: a holder that stops renewing (it died, stalled, or lost its
connection) loses the key to ``reap``: the holder's ``done``, then the key
waits again at once, charged nothing if its handler never started (a claimed
key no worker took), else counted as one stall (not a failure); a key that
stalls its holder more than ``max_stalls`` times in a row is given up as a
poison key. A late ``done`` or renewal with a stale token changes nothing and
raises ``LeaseLost``. Because items are keys, not payloads, recovery neither
duplicates nor loses a change: no two live holders, and every change after a
key's last hand-out leads to one more hand-out.

Starts: the server records each hold's run (``lua/lib/lease.lua``). A get's
hold is started when handed out (its caller has the key when get returns). A
claim's holds are not: the claimant hands each to a worker (``_started``) and
the client reports those starts in batches on the scripts it sends anyway
(the next claim, as settle triples of mode ``s``; the lease renewal), so a
start costs no round trip. A key whose last holder died holding it comes back
with a stall record, and a claim flags it (a suspect): its start is reported
synchronously (``_op_start``) before its handler runs, so a key that kills its
process before a batched report went out is counted all the same.

Operations
----------
Each operation (``_op_add``, ``_op_get``, ``_op_done``, ...) is a generator,
the runner's ``_settle`` idiom: it checks its arguments, yields one ``Call``
(a script's name and its ARGV; the driver adds the script's keys), is sent
the server's reply, parses it, keeps this client's holds (tokens, request
numbers, lost and unsure holds) and emits the events, and returns what the
method returns. A call that raised (a lost connection: its outcome is
unknown) is thrown into it, so a fenced call marks its hold unsure before
the error reaches the caller. ``answer`` and ``failed`` are those two moves.

The drivers, ``_sync.RedisWorkQueue`` and ``_async.AsyncRedisWorkQueue``,
subclass ``RedisProtocol`` and do the I/O: they run the calls, wait for the
doorbell (the leader/follower ``BLPOP``), renew leases and keep timers. This
module sends nothing and reads no clock but the virtual one it is given and
the times its drivers pass in.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
import threading
import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

import redis

from .._checks import (
    check_delay,
    check_flag,
    check_keys,
    check_priority,
    check_seconds,
    check_timeout,
)
from .._clock import Clock, VirtualClock
from .._events import Event, EventKind, Subscribers
from .._metrics import MetricsProvider, QueueGauges
from .._options import QueueOptions
from .._ratelimit import RateLimiter
from .._snapshot import Snapshot, check_limit
from ._getters import Getters
from ._holds import CLAIMED, REPORTED, Hold, Holds, Settle, lease_lost
from ._limiter import RedisRateLimiter
from ._replies import EMPTY as _EMPTY
from ._replies import LOST as _LOST
from ._replies import RedisStats, Reports, parse_snapshot, parse_stats, text
from ._schema import (
    KEY_NAMES,
    SCRIPTS,
    claim_record,
    get_record,
    key_names,
    script_keys,
    script_source,
    wake_key,
)
from ._send import Script

__all__ = [
    "CLAIMED",
    "Call",
    "Op",
    "RedisProtocol",
    "RedisStats",
    "Settle",
    "answer",
    "default_holder",
    "failed",
]

logger = logging.getLogger("keyqueue")

T = TypeVar("T")
Client = TypeVar("Client")

Call = tuple[str, list[str]]
"""A script call: the script's name (``_schema.SCRIPTS``) and its ARGV."""

Op = Generator[Call, Any, T]
"""An operation: yields one ``Call``, is sent its reply, returns the result."""


def answer(op: Op[T], reply: Any) -> T:
    """Send ``op`` its call's reply; its result."""
    try:
        op.send(reply)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]
    raise RuntimeError("a Redis queue operation makes one call")


def failed(op: Op[Any], exc: BaseException) -> NoReturn:
    """Throw the error of ``op``'s call into it, which raises it again."""
    op.throw(exc)
    raise exc  # not reached: no operation swallows its call's error


# -- arguments -----------------------------------------------------------------------------

MIN_SERVER = (6, 2)
JOIN_FIRST = 0.05  # seconds: join's first look again, after a look that found work
JOIN_MAX = 1.0  # join's looks slow down to one a second while the queue stays busy
DEFAULT_MAX_STALLS = 1
"""``max_stalls``' default (docs/DESIGN.md, "What a crash costs")."""
DEFAULT_BLOCK = 30.0  # longest single BLPOP, in seconds, when the socket timeout and lease allow it
WAKE_TTL_MS = 60_000  # a shut-down client's wake-up list outlives it by this much
ADD_BATCH = 1000
"""Keys per script run in ``add_many``: the server runs nothing else meanwhile."""
MAX_CLAIM = 1000
"""Most keys one claim takes (``Claims`` also settles at most this many holds
in one: the script works in chunks either way, but runs nothing else meanwhile)."""


def check_key(key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"keys of a Redis queue must be str, got {key!r}")
    return key


def key_batches(keys: Iterable[str]) -> list[list[str]]:
    """``add_many``'s keys, checked, in batches of at most ``ADD_BATCH``.

    Raises ``TypeError`` (before anything is sent) for a key that is not a
    ``str``, or for a ``str`` passed as the iterable (its characters are not
    meant as keys).
    """
    checked = [check_key(key) for key in check_keys(keys)]
    return [checked[i : i + ADD_BATCH] for i in range(0, len(checked), ADD_BATCH)]


def priority_arg(priority: object) -> str:
    """A priority as the scripts take it (``check_priority``: an int, 32-bit;
    as on the in-memory fronts, a false value is 0)."""
    return str(check_priority(priority)) if priority else "0"


# -- the connection --------------------------------------------------------------------------


def default_holder() -> str:
    """This process's identity, ``hostname:pid``, as a client name takes it
    (any character but printable ASCII without spaces becomes ``-``)."""
    raw = f"{socket.gethostname()}:{os.getpid()}"
    return "".join(c if "!" <= c <= "~" else "-" for c in raw)


def check_holder(holder: object) -> str:
    """``holder=``: a non-empty ``str`` of printable ASCII without spaces
    (what Redis takes as a client name; a lease records it as one word)."""
    if not isinstance(holder, str):
        raise TypeError(f"holder must be a str, got {holder!r}")
    if not holder or not all("!" <= c <= "~" for c in holder):
        raise ValueError(
            f"holder must be printable ASCII without spaces (a Redis client name), got {holder!r}"
        )
    return holder


def check_max_stalls(max_stalls: object) -> int:
    """``max_stalls=``: an ``int >= 0`` (0: a key's first stall gives it up)."""
    if isinstance(max_stalls, bool) or not isinstance(max_stalls, int) or max_stalls < 0:
        raise ValueError(f"max_stalls must be an int >= 0, got {max_stalls!r}")
    return max_stalls


def name_connections(client: Any, holder: str) -> None:
    """Make ``holder`` the client name of the connections ``client`` opens
    from now on, unless it has a name already (the caller's choice stands).
    A cluster client's nodes keep their own settings."""
    pool = getattr(client, "connection_pool", None)
    kwargs = getattr(pool, "connection_kwargs", None)
    if isinstance(kwargs, dict) and not kwargs.get("client_name"):
        kwargs["client_name"] = holder


def parse_version(info: dict[str, Any]) -> tuple[int, ...]:
    raw = str(info.get("redis_version", "0"))
    try:
        return tuple(int(part) for part in raw.split(".")[:2])
    except ValueError:
        return (0,)


def describe(kwargs: dict[str, Any]) -> str:
    """host:port/db (or the socket path) of a connection pool, without secrets."""
    if kwargs.get("path"):
        return f"unix:{kwargs['path']}"
    return f"{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def where(client: Any) -> str:
    """What a client talks to, for errors: host:port/db, or a cluster client's
    startup nodes; never a password."""
    nodes = getattr(getattr(client, "nodes_manager", None), "startup_nodes", None)
    if nodes:
        return "the cluster at " + ", ".join(sorted(nodes))
    return describe(client.get_connection_kwargs())


def block_limit(client: Any) -> float:
    """The longest single BLPOP: well inside the client's socket timeout.

    Servers end a blocking call's timeout on their cron tick (``hz``, 10 a
    second by default), so a BLPOP may return up to ~100 ms after its timeout:
    keep that much margin, and more.
    """
    kwargs = client.get_connection_kwargs()
    socket_timeout = kwargs.get("socket_timeout", 5.0)  # redis-py's default
    if socket_timeout is None:
        return DEFAULT_BLOCK
    socket_timeout = float(socket_timeout)
    return max(0.001, min(DEFAULT_BLOCK, max(socket_timeout / 4, socket_timeout - 0.5)))


# -- holds -----------------------------------------------------------------------------------


# The methods the batched runners do not call (``_batching``): a client that
# overrides one (in its class or on the instance) is refused with batch=True.
_BYPASSED = ("get", "done")

_Hold = Hold


class RedisProtocol(Generic[Client]):
    """Construction, validation, holds, events and every operation of a Redis
    queue client, without I/O: what both drivers share. ``Client`` is the
    driver's redis-py client type."""

    connection_errors: tuple[type[BaseException], ...] = (
        redis.exceptions.ConnectionError,
        redis.exceptions.TimeoutError,
        OSError,
    )
    """What a call raises when the server did not answer (its outcome is
    unknown): the runner asks such a call again, with a backoff."""

    said_errors: tuple[type[BaseException], ...] = (redis.exceptions.MaxConnectionsError,)
    """Connection errors this client logs itself, once: redis-py's pool had no
    free connection (a pool too small for the workers; nothing was sent). The
    runners ask such a call again without a warning each time."""

    # The driver's: the clients it takes, what a TypeError says they must be,
    # its script objects (``_send``).
    _client_kinds: ClassVar[tuple[type, ...]]
    _client_wanted: ClassVar[str]
    _script: ClassVar[type[Script]] = Script

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
        holder: str | None = None,
        batch: bool = True,
        max_stalls: int = DEFAULT_MAX_STALLS,
    ) -> None:
        front = type(self).__name__
        self._batch = check_flag(batch, "batch")
        if (url is None) == (client is None):
            raise TypeError(f"{front} needs exactly one of url= or client=")
        self._holder = default_holder() if holder is None else check_holder(holder)
        if client is None:
            if not isinstance(url, str):
                raise TypeError(f"url must be a str, got {url!r}")
            client = self._from_url(url)
            self._owns_client = True
        else:
            if not isinstance(client, self._client_kinds):
                raise TypeError(f"client must be {self._client_wanted}, got {client!r}")
            self._owns_client = False
        name_connections(client, self._holder)
        self._client: Client = client
        options = QueueOptions(
            name,
            rate_limiter=rate_limiter,
            max_retries=max_retries,
            clock=clock,
            metrics=metrics,
            aging=aging,
        )
        if not name:
            raise ValueError("a Redis queue needs a non-empty name (its keys' hash tag)")
        self.name = name
        """The queue's name, as given (its keys' hash tag on the server, its metrics label)."""
        self._lease = check_seconds(lease, "lease", positive=True)
        self._max_retries = options.max_retries
        self._aging = options.aging
        # What the scripts that take a priority pass as aging ('' for strict).
        self._aging_arg = "" if self._aging is None else repr(self._aging)
        limiter = RedisRateLimiter() if rate_limiter is None else rate_limiter
        # The server limiter's arguments ([] with a local limiter, which keeps the state).
        self._server_limiter_args: list[str] = []
        self._local_limiter: RateLimiter | None = None  # None: the server keeps the state
        if isinstance(limiter, RedisRateLimiter):
            self._server_limiter_args = limiter.args()
        elif isinstance(limiter, RateLimiter):
            self._local_limiter = limiter
        else:
            raise TypeError(
                "rate_limiter must be a RedisRateLimiter (state on the server) or a "
                f"local RateLimiter (when/forget/num_requeues), got {limiter!r}"
            )
        self._rate_limiter = limiter
        self._max_stalls = check_max_stalls(max_stalls)
        # What reaping scripts take (lua/lib/reap.lua reap_config): max_stalls.
        self._reap_args = [str(self._max_stalls)]
        self._max_retries_arg = "" if max_retries is None else str(max_retries)
        if clock is not None and not isinstance(clock, VirtualClock):
            raise TypeError(
                "a Redis queue reads time from the server; clock= takes only a virtual "
                f"clock for tests (keyqueue.testing.FakeClock), got {clock!r}"
            )
        self._clock = clock
        self._keys = key_names(name)
        by_name = dict(zip(KEY_NAMES, self._keys, strict=True))
        # The keys each script takes, in its KEYS order (_schema.script_keys).
        self._script_keys = {s: [by_name[k] for k in script_keys(s)] for s in SCRIPTS}
        self._bell = by_name["bell"]
        self._requeues = by_name["requeues"]
        self._stats_key = by_name["stats"]  # exists once any client used the queue
        client_id = uuid.uuid4().hex
        self._wake = wake_key(name, client_id)
        # The claim script's last key: this client's record of its last claim.
        self._script_keys["claim"].append(claim_record(name, client_id))
        self._pool_said = False  # a MaxConnectionsError was logged (once per client)
        self._script_keys["get"].append(get_record(name, client_id))
        self._where = where(client)
        self._last_levels = QueueGauges(0, 0, 0.0, 0.0)
        # This client's subscribers and metrics: its observer is theirs
        # (callbacks run under no lock: they may call the queue).
        self._events = Subscribers(name, options.metrics.new_queue_metrics(name, self._gauges))
        self._reports = Reports(name, self._events, self._max_stalls)
        self._holds = Holds(
            self._reports,
            virtual=clock is not None,
            start_renewing=self._start_renewing,
            nothing_held=self._nothing_held,
        )
        self._waiting = Getters(
            name,
            self._holds.lock,
            lease=self._lease,
            block=block_limit(self._client),
            wake_followers=self._wake_followers,
            arm=self._arm,
        )
        # The scripts, each call sent once: never re-sent by redis-py's retry (_send).
        self._scripts: dict[str, Any] = {s: self._script(client, script_source(s)) for s in SCRIPTS}
        self._connect()
        if self._clock is not None:
            self._clock.subscribe(self._on_clock_step)

    @staticmethod
    def _from_url(url: str) -> Any:
        """The driver's client for ``url`` (the queue closes it at close)."""
        raise NotImplementedError

    def _connect(self) -> None:
        """The driver's own state, and its scripts on ``_client`` (the end of
        construction; the sync driver checks the server here)."""
        raise NotImplementedError

    def _on_clock_step(self) -> None:
        """A virtual clock moved: the driver runs ``reap``."""
        raise NotImplementedError

    # -- read-only -----------------------------------------------------------------

    @property
    def lease(self) -> float:
        """Seconds a ``get`` holds a key without renewal."""
        return self._lease

    @property
    def holder(self) -> str:
        """This client's identity (``holder=``, default ``hostname:pid``): recorded
        with each lease it takes (a snapshot's ``HeldKey.holder``), and the client
        name of its connections (``CLIENT LIST``) unless the client had one."""
        return self._holder

    @property
    def max_retries(self) -> int | None:
        """Failures after which ``retry`` gives a key up (None: never); this client's setting."""
        return self._max_retries

    @property
    def max_stalls(self) -> int:
        """Stalls in a row after which a key is given up as poison (this
        client's setting, applied by its calls that reap): a stall is a hold
        taken back after its handler started (its holder died, or stopped
        renewing, with the handler running). A key is given up at its
        ``max_stalls + 1``-th stall in a row; its ``done`` or ``forget`` ends
        the row. Holds whose handler never started cost nothing."""
        return self._max_stalls

    @property
    def aging(self) -> float | None:
        """This client's ``aging`` (None: strict). The queue keeps the aging of
        the client whose priority made it ranked: every client of one queue
        should pass the same."""
        return self._aging

    @property
    def rate_limiter(self) -> RedisRateLimiter | RateLimiter:
        """A ``RedisRateLimiter`` (state on the server) or this client's local limiter."""
        return self._rate_limiter

    @property
    def shutting_down(self) -> bool:
        """True once this client's ``shutdown`` was called (other clients go on)."""
        return self._waiting.shutting_down

    def token(self, key: str) -> int:
        """The fencing token of ``key``, which this client holds.

        Tokens strictly increase per queue: a handler can pass its token along
        with its writes downstream, and a store that remembers the highest token
        seen can refuse a write from a holder whose lease was taken back.
        Raises ``ValueError`` if this client does not hold ``key``.
        """
        return self._holds.token(check_key(key), self._owner())

    # -- the server ----------------------------------------------------------------

    def _server_checked(self, info: dict[str, Any]) -> None:
        """Raise ``RuntimeError`` if the server's INFO says it is too old."""
        if parse_version(info) < MIN_SERVER:
            raise RuntimeError(
                f"keyqueue.redis queue {self.name!r}: the server at {self._where} speaks "
                f"Redis {info.get('redis_version')}; keyqueue needs Redis >= 6.2 or Valkey >= 7.2"
            )

    def _unreachable(self, exc: BaseException) -> str:
        return (
            f"keyqueue.redis queue {self.name!r}: cannot reach the server at {self._where}: {exc}"
        )

    # -- operations ----------------------------------------------------------------

    def _clock_arg(self) -> str:
        return "" if self._clock is None else repr(self._clock.now())

    def _op_add(self, key: str, priority: int) -> Op[None]:
        prio = priority_arg(priority)
        return self._op_add_keys([check_key(key)], prio)

    def _op_add_many(self, keys: Iterable[str], priority: int) -> Iterator[Op[None]]:
        """``add_many``: one ``add`` script a batch, every key checked first."""
        prio = priority_arg(priority)
        for batch in key_batches(keys):
            yield self._op_add_keys(batch, prio)

    def _op_add_keys(self, keys: list[str], priority: str) -> Op[None]:
        now, _, events = yield "add", [self._clock_arg(), priority, self._aging_arg, *keys]
        if events:
            self._reports.emit(now, events)

    def _op_add_after(self, key: str, seconds: float, priority: int) -> Op[None]:
        seconds = check_delay(seconds)
        return self._op_delay(check_key(key), seconds, "delay", priority_arg(priority), "add_after")

    def _op_delay(self, key: str, seconds: float, kind: str, priority: str, what: str) -> Op[None]:
        tail = [repr(seconds), kind, priority, self._aging_arg]
        yield from self._op_fenced(key, what, "add_after", tail)

    def _op_add_rate_limited(self, key: str, priority: int) -> Op[None]:
        check_key(key)
        prio = priority_arg(priority)
        if self._local_limiter is not None:
            seconds = check_delay(self._local_limiter.when(key))
            return self._op_delay(key, seconds, "rate_limit", prio, "add_rate_limited")
        tail = [*self._server_limiter_args, prio, self._aging_arg]
        return self._op_fenced(key, "add_rate_limited", "add_rate_limited", tail, endpoint=True)

    def _op_forget(self, key: str) -> Op[None]:
        check_key(key)
        if self._local_limiter is not None:
            self._local_limiter.forget(key)
        return self._op_fenced(key, "forget", "forget", [])

    def _local_requeues(self, key: str) -> int | None:
        """``num_requeues`` from this client's local limiter; None: ask the server."""
        check_key(key)
        if self._local_limiter is not None:
            return self._local_limiter.num_requeues(key)
        return None

    def _op_retry(self, key: str) -> Op[bool]:
        check_key(key)
        if self._local_limiter is not None:
            delay = repr(check_delay(self._local_limiter.when(key)))
            tail = [self._max_retries_arg, delay]
        else:
            tail = [self._max_retries_arg, "", *self._server_limiter_args]
        endpoint = self._local_limiter is None
        return bool(int((yield from self._op_fenced(key, "retry", "retry", tail, endpoint))))

    def _op_get(self, now: float) -> Op[tuple[str | None, float | None]]:
        """One get script at monotonic time ``now``: (key, None), its hold
        recorded, or (None, seconds until something is due: None if nothing
        will, or on a virtual clock)."""
        self._waiting.refuse_if_shut()
        holds = self._holds
        slot, number, lost = holds.get_slot()  # the record slot to make it in (the get script's)
        args = [self._clock_arg(), repr(self._lease), *self._reap_args, self._holder]
        try:
            reply = yield "get", [*args, slot, number, lost, self._aging_arg, ""]
        except BaseException:  # its outcome unknown (or its caller went away)
            holds.get_raised(slot, f"{lost} {number}".lstrip())  # in order, since one answered
            raise
        holds.get_answered(slot)
        if not int(reply[1]):
            at, _, due, events = reply
            self._reports.emit(at, events)
            return None, self._found_none(due, now)
        at, _, key, token, events = reply
        self._reports.emit(at, events)
        key = text(key)
        holds.take(key, int(token), self._local(now), self._owner())
        return key, None

    def _op_done(self, key: str) -> Op[None]:
        check_key(key)
        holds = self._holds
        with holds.lock:
            hold = holds.find(key, "done", self._owner())
            before = hold.unanswered
            again = "1" if before == "done" else ""
            hold.unanswered = "done"
        if hold.lost:
            holds.finish(key, hold)
            raise lease_lost(key, hold)
        try:
            now, status, events = yield "done", [self._clock_arg(), key, str(hold.token), again]
        except BaseException as exc:
            if self._unsent(exc):
                hold.unanswered = before
            else:
                hold.unsure = True  # stop renewing: the key cannot stay held by a lost done
            raise
        holds.finish(key, hold)
        self._reports.emit(now, events)
        if status in _LOST:
            holds.mark_lost(key, hold, float(now))
            raise lease_lost(key, hold)

    def _ops_gets_lost(self) -> list[Op[None]]:
        """At shutdown (no get follows): for each slot whose gets were not
        answered, the get script that only hands back what they took."""
        return [self._op_hand_back(slot, numbers) for slot, numbers in self._holds.take_gets_lost()]

    def _op_hand_back(self, slot: str, numbers: str) -> Op[None]:
        args = [self._clock_arg(), repr(self._lease), *self._reap_args, self._holder]
        try:
            at, _, _, events = yield "get", [*args, slot, "", numbers, self._aging_arg, "1"]
        except BaseException:  # asked again at the next shutdown or get
            self._holds.get_raised(slot, numbers)
            raise
        self._holds.get_answered(slot)
        self._reports.emit(at, events)

    def _op_claim(
        self, want: int, settles: Sequence[Settle], now: float
    ) -> Op[tuple[list[tuple[str, Hold]], list[str], float | None]]:
        """One claim script at monotonic time ``now``: settle ``settles`` (each
        hold's done, after its forget if asked), then take up to ``want`` keys
        (none once this client is shut down), held as ``CLAIMED`` until the
        claimant hands each to its worker (``Hold.owner``).

        Returns the keys taken with their holds, the settled holds' statuses in
        order (``ok``, ``repeat`` or ``lost``: then the hold is marked lost; its
        done changed nothing), and, when it took none, the seconds until
        something is due (as ``_op_get``). Every settled hold is finished.
        The claim also reports the starts of this client's holds handed to a
        worker since its last claim or renewal (``Holds.started``). A key taken
        whose last holder died holding it is a suspect (``Hold.suspect``):
        its claimant reports its start (``_op_start``) before its handler
        runs. If the call raises, the settled holds' outcome is unknown: they
        are no longer renewed, and asked again they are sent as such (upper
        case); the starts go with the next; the keys it took, if it ran, are
        handed back by the next claim (the claim record: no failure counted).
        """
        want = 0 if self._waiting.shutting_down else min(want, MAX_CLAIM)
        limiter = self._local_limiter
        if limiter is not None:  # a local limiter forgets here, as _op_forget
            for key, _, forget in settles:
                if forget:
                    limiter.forget(key)
        holds = self._holds
        with holds.lock:
            # Only a claim that takes keys writes the record or hands back
            # what it holds: those are one at a time per client (claim_turn).
            number, lost = holds.claim_number(bool(want))
            args = [self._clock_arg(), repr(self._lease), *self._reap_args, self._holder]
            args += (str(want), number, " ".join(lost), self._aging_arg)
            before = [hold.unanswered for _, hold, _ in settles]
            for key, hold, forget in settles:
                mode = "f" if forget else "d"
                args += (key, str(hold.token), mode.upper() if hold.unanswered == "done" else mode)
                hold.unanswered = "done"
            starts = holds.starts(settles)
            for key, hold in starts:
                args += (key, str(hold.token), "s")
        try:
            at, statuses, handed, due, events, suspects = yield "claim", args
        except BaseException as exc:
            holds.unreport(starts)  # reported with the next
            if self._unsent(exc):  # not sent: as if never asked
                for (_, hold, _), unanswered in zip(settles, before, strict=True):
                    hold.unanswered = unanswered
                raise
            for _, hold, _ in settles:
                hold.unsure = True  # stop renewing: the key cannot stay held by a lost done
            if want:  # what it took, if it ran, is handed back by the next claim
                holds.claim_raised(number)
            raise
        for _, hold in starts:
            hold.run = REPORTED
        if lost:
            holds.claims_handed_back(lost)
        results = [text(status) for status in statuses]
        for (key, hold, _), status in zip(settles, results, strict=True):
            if status == "lost":
                holds.mark_lost(key, hold, float(at))  # the LEASE_LOST event, as done's
            holds.finish(key, hold)
        self._reports.emit(at, events)
        taken: list[tuple[str, Hold]] = []
        started = self._local(now)
        for i in range(0, len(handed), 2):
            key = text(handed[i])
            taken.append((key, holds.take(key, int(handed[i + 1]), started, CLAIMED)))
        if suspects:
            for key in map(text, suspects):
                holds.live[key].suspect = True
        seconds = self._found_none(due, now) if want and not taken else None
        return taken, results, seconds

    def _found_none(self, due: Any, now: float) -> float | None:
        """A get or claim found no key at ``now`` (monotonic): the seconds
        until something is due (None if nothing will, or on a virtual clock),
        noted for the getters (``Getters.looked``)."""
        seconds = None if due in _EMPTY or self._clock is not None else float(due)
        self._waiting.looked(seconds, now)
        return seconds

    def _started(self, key: str, hold: Hold) -> None:
        """``Holds.started``."""
        self._holds.started(key, hold)

    def _op_start(self, key: str, hold: Hold) -> Op[bool] | bool:
        """A suspect's start, reported before its handler runs (one renewal of
        its hold alone, recording the start): True once recorded. False if
        its lease was taken back meanwhile (then without a call if this
        client knows it already): the hold is lost and finished (it goes to
        no worker). If the call raises, the hold is let go (not renewed: it
        runs out unstarted and comes back, charged nothing)."""
        if hold.lost:
            self._holds.finish(key, hold)
            return False
        return self._op_start_call(key, hold)

    def _op_start_call(self, key: str, hold: Hold) -> Op[bool]:
        try:
            reply = yield "renew", [self._clock_arg(), repr(self._lease), key, str(hold.token), "S"]
        except BaseException:
            hold.unsure = True
            self._holds.finish(key, hold)
            raise
        self._renewed(reply)
        if hold.lost:
            self._holds.finish(key, hold)
            return False
        hold.run, hold.suspect = REPORTED, False
        return True

    def _orphaned_get(self, reply: Sequence[Any]) -> tuple[str, Op[Any]] | None:
        """A cancelled get's reply: its events, then the key it handed out and
        that key's put_back (None if it handed out none)."""
        self._reports.emit(reply[0], reply[-1])
        if not int(reply[1]):
            return None
        key = text(reply[2])
        return key, self._op_put_back([(key, int(reply[3]))])

    def _op_put_back(self, held: Sequence[tuple[str, int]]) -> Op[tuple[float, list[bool]]]:
        """One put_back script for every ``(key, token)`` of ``held``: each key
        whose lease is still that token's waits again at once, no failure.
        Returns the server's time and, in order, whether each key was put back
        (False: its lease had been taken back)."""
        args = [self._clock_arg(), self._aging_arg]
        for key, token in held:
            args += (key, str(token))
        now, put, events = yield "put_back", args
        self._reports.emit(now, events)
        return float(now), [bool(int(flag)) for flag in put]

    def _unsent(self, exc: BaseException) -> bool:
        """Whether a call that raised ``exc`` was never sent: redis-py found no
        free connection in the client's pool (``MaxConnectionsError``), a
        configuration error said once, at ERROR. Its outcome is known (nothing
        happened), so no hold stops being renewed; the runners ask again."""
        if not isinstance(exc, redis.exceptions.MaxConnectionsError):
            return False
        if not self._pool_said:
            self._pool_said = True
            logger.error(
                "keyqueue %r: the redis connection pool has no free connection "
                "(MaxConnectionsError: %s): it is too small for this client's workers; "
                "give it at least one connection per worker, plus two (BLPOP and "
                "renewals). Calls that found none are asked again",
                self.name,
                exc,
            )
        return True

    def _op_reap(self) -> Op[None]:
        """Release due keys and reap leases (a virtual clock moved, or a timer fired)."""
        now, events = yield "reap", [self._clock_arg(), *self._reap_args]
        self._reports.emit(now, events)

    def _op_renew(self) -> Op[None] | bool:
        """The renewal of every live hold (neither lost nor after a failed
        call), reporting the starts not reported yet; with none, whether the
        renewal loop goes on (False: it ends)."""
        args, starts = self._renewal()
        if len(args) > 2:
            return self._op_renew_call(args, starts)
        return not self._holds.renewals_end()

    def _op_renew_call(self, args: list[str], starts: list[Hold]) -> Op[None]:
        self._renewed((yield "renew", args))
        for hold in starts:
            hold.run = REPORTED

    def _op_stats(self, now: float) -> Op[RedisStats]:
        """The queue's stats; ``now`` (monotonic) dates this client's gauges."""
        reply = yield "stats", [self._clock_arg(), *self._reap_args]
        return self._stats(reply, now)

    def _op_snapshot(self, limit: object, now: float) -> Op[Snapshot[str]]:
        """The queue's snapshot (``Snapshot``); ``now`` (monotonic) dates this
        client's gauges. A bad ``limit`` raises before anything is sent."""
        rows = check_limit(limit)
        reply = yield "snapshot", [self._clock_arg(), str(rows)]
        return parse_snapshot(self._stats(reply[0], now), reply, rows)

    def _op_delete(self, force: object) -> Op[bool]:
        """Delete the queue: whether it existed. ``RuntimeError`` (nothing
        changed) while keys are held, unless ``force``."""
        check_flag(force, "force")
        _, held, deleted, existed = yield "delete", [self._clock_arg(), "1" if force else ""]
        if not int(deleted):
            raise RuntimeError(
                f"keyqueue.redis queue {self.name!r}: {int(held)} key(s) are held; not "
                "deleted (delete(force=True) deletes it anyway: their holders' done "
                "then raises LeaseLost)"
            )
        return bool(int(existed))

    # -- replies -------------------------------------------------------------------

    def _endpoint_args(self, key: str) -> list[str]:
        """The server limiter's endpoint arguments for ``key`` (see ``RedisRateLimiter``)."""
        limiter = self._rate_limiter
        if isinstance(limiter, RedisRateLimiter):
            return limiter.endpoint_args(key)
        return ["", "", "", ""]

    def _owner(self) -> object:
        return threading.get_ident()

    def _watch_poison(self, watcher: Callable[[str], object]) -> Callable[[], None]:
        """``Reports.watch_poison``: the runners' ``on_give_up`` for poison keys."""
        return self._reports.watch_poison(watcher)

    def _stats(self, reply: Sequence[Any], now: float) -> RedisStats:
        """A stats reply: its events reported, the gauges' levels kept."""
        self._reports.emit(reply[0], reply[6])
        stats, _, dirty = parse_stats(reply, self._waiting.shutting_down)
        self._last_levels = self._levels(
            dirty, stats.delayed, stats.waiting_by_priority, stats.oldest_wait_seconds, now
        )
        return stats

    def _local(self, now: float) -> float:
        """This client's time for hold ages: the virtual clock's, else ``now``
        (monotonic, passed by the driver)."""
        return self._clock.now() if self._clock is not None else now

    def _levels(
        self, dirty: int, delayed: int, waiting: Mapping[int, int], oldest_wait: float, now: float
    ) -> QueueGauges:
        """Gauges: the queue's depth, delayed keys, waiting keys by priority and
        oldest wait; this client's unfinished work at ``now`` (monotonic)."""
        total, longest = self._holds.ages(self._local(now))
        return QueueGauges(dirty, delayed, total, longest, waiting, oldest_wait)

    def _gauges(self) -> QueueGauges:
        raise NotImplementedError

    # -- holds ---------------------------------------------------------------------

    def _start_renewing(self) -> None:
        """Start the renewal loop unless one runs (or the client is closed)."""
        raise NotImplementedError

    def _finish(self, key: str, hold: Hold) -> None:
        """``Holds.finish``."""
        self._holds.finish(key, hold)

    def _nothing_held(self) -> None:
        """This client's last hold ended: wake the drains (the driver's)."""
        raise NotImplementedError

    def _renewal(self) -> tuple[list[str], list[Hold]]:
        """ARGV of a renewal: clock, lease, then key, token, start triples of
        live holds (``Holds.renewal``); and the holds whose start it reports."""
        args = [self._clock_arg(), repr(self._lease)]
        return args, self._holds.renewal(args)

    def _renewed(self, reply: Sequence[Any]) -> None:
        """Mark the holds a renewal found taken back: their ``done`` raises LeaseLost."""
        now, lost = reply
        for i in range(0, len(lost), 2):
            key = text(lost[i])
            hold = self._holds.taken_back(key, int(lost[i + 1]))
            if hold is None:
                continue  # done since, or a newer hold of the key
            # Debug only: the holder learns it as LeaseLost from its next call
            # on the key (the runner logs that, once).
            logger.debug(
                "keyqueue %r: the lease of key %r was taken back (this client stalled "
                "past its lease?); its done will raise LeaseLost",
                self.name,
                key,
            )
            self._holds.mark_lost(key, hold, float(now))

    def _mark_lost(self, key: str, hold: Hold, now: float) -> None:
        """``Holds.mark_lost``."""
        self._holds.mark_lost(key, hold, now)

    # -- fenced outcomes -------------------------------------------------------------

    def _op_fenced(
        self, key: str, what: str, script: str, tail: list[str], endpoint: bool = False
    ) -> Op[Any]:
        """A fenced script (clock, token, seq, key, ``tail``, and the endpoint's
        arguments if ``endpoint``): its result, after its events; ``LeaseLost``
        (the hold marked lost, nothing changed) if the lease was taken back.

        If the call raises, its outcome is unknown: the hold is no longer
        renewed (if the call is never answered, the lease runs out and the key
        comes back) until a later call on it answers.
        """
        holds = self._holds
        hold, fence = holds.fence(key, what, self._owner())
        args = [self._clock_arg(), *fence, key, *tail]
        if endpoint:
            args += self._endpoint_args(key)
        try:
            now, result, events, status = yield script, args
        except BaseException as exc:
            if hold is not None and not self._unsent(exc):
                hold.unsure = True
            raise
        self._reports.emit(now, events)
        if hold is None:
            return result
        lost = status in _LOST
        if holds.answered(hold, lost):
            self._start_renewing()
        if lost:
            holds.mark_lost(key, hold, float(now))
            raise lease_lost(key, hold, what)
        return result

    @property
    def batch(self) -> bool:
        """Whether ``run_workers``/``arun_workers`` take this client's keys in
        batches (``batch=`` of the constructor)."""
        return self._batch

    def _batching(self, driver: type) -> bool:
        """Whether the runners batch this client (``batch``). Raises ``TypeError``
        if they would and its class (a subclass of ``driver``) or the instance
        replaces a method they then do not call (``get``, ``done``): what the
        user installed is never silently skipped."""
        if not self._batch:
            return False
        cls, own = type(self), vars(self)
        for method in _BYPASSED:
            if method in own:
                where = f"{method} is set on the instance"
            elif getattr(cls, method) is not getattr(driver, method):
                where = f"{cls.__name__} overrides {method}"
            else:
                continue
            raise TypeError(
                f"{driver.__name__} {self.name!r}: {where}, which the runners do not call "
                "on a batched queue (they claim and settle keys in claim scripts); pass "
                f"batch=False to {cls.__name__}(...) to have them call get and done per key"
            )
        return True

    def _forget_replaced(self, driver: type) -> bool:
        """Whether ``forget`` is replaced (class or instance): the batched
        runners then call it rather than fold it into the claim."""
        forget = "forget"
        return forget in vars(self) or getattr(type(self), forget) is not getattr(driver, forget)

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

    # -- events --------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Event[str]], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every transition this client's calls make.

        Transitions of other clients are theirs to report. Callbacks run in the
        calling thread (or task), after the server applied the change; an
        exception in one is logged. Returns an unsubscribe function.
        """
        return self._events.subscribe(callback)

    # -- shutdown and waiting ----------------------------------------------------------

    def _shut(self, wall: float) -> int:
        """Set this client's shutdown flag (emitting SHUTDOWN the first time,
        at ``wall``, the driver's ``time.time()``, or the virtual clock's now).

        Wakes the waiting getters that are not in ``BLPOP`` and returns how
        many are (0 or 1: the leader): each must be woken through the wake-up
        list. A getter checks the flag under the same lock before it waits, so
        none can block unseen after this.
        """
        first, leading = self._waiting.shut()
        if first:
            now = self._clock.now() if self._clock is not None else wall
            self._reports.report(EventKind.SHUTDOWN, None, now)
        return leading

    def _wake_followers(self) -> None:
        """Wake every getter waiting for the leader (called with ``_lock`` held)."""
        raise NotImplementedError

    def _look_again(self, due: float | None) -> bool:
        """``Getters.look_again``."""
        return self._waiting.look_again(due)

    def _arm(self, due: float) -> None:
        """Run ``reap`` in ``due`` seconds (a getter waits; BLPOP's timeout is coarse)."""
        raise NotImplementedError

    def _drain_timed_out(self, timeout: float | None) -> None:
        """Say that this client's drain timed out, and what it leaves on the server."""
        logger.warning(
            "keyqueue %r: the drain timed out after %.3g s with %d key(s) still held by this "
            "client; left queued, not given up: they stay on the server (released by their "
            "done, or handed out again once their lease runs out), for the other clients or "
            "the next start",
            self.name,
            timeout,
            self._holds.count(),
        )

    def _op_idle(self) -> Op[bool]:
        """``join``'s look: whether the queue (every client's) has nothing
        waiting or pending, held or delayed. One read-only script: three O(1)
        reads, atomic."""
        dirty, held, delayed = yield "idle", []
        return not (int(dirty) or int(held) or int(delayed))

    def _join_pause(self, previous: float) -> float:
        """How long ``join`` waits before it looks again unless this client
        lets go of its last hold first: ``JOIN_FIRST`` after a look that
        follows such a release (``previous`` 0), doubling to ``JOIN_MAX``."""
        return JOIN_FIRST if previous <= 0 else min(previous * 2, JOIN_MAX)

    def _drain_timeout(self, drain: bool, timeout: float | None) -> float | None:
        """``shutdown``'s arguments, checked: its drain's ``timeout``."""
        check_flag(drain, "drain")
        return check_timeout(timeout)

    def _renewal_failed(self, interval: float) -> None:
        """Log the error of a renewal (in an except block): the loop goes on.
        A pool without a free connection is said once (``_unsent``)."""
        exc = sys.exc_info()[1]
        if exc is not None and self._unsent(exc):
            return
        logger.warning(
            "keyqueue %r: renewing leases failed; retrying in %.3g s",
            self.name,
            interval,
            exc_info=True,
        )

    def _is_bell(self, popped: Any) -> bool:
        """A ``BLPOP`` took the doorbell (not a wake-up, nor nothing)."""
        return popped is not None and text(popped[0]) == self._bell

    def __repr__(self) -> str:
        state = "shutting down" if self._waiting.shutting_down else "running"
        return (
            f"<{type(self).__name__} {self.name!r} {state}: {len(self._holds)} held by this client>"
        )

    # -- the parts, under the names the claim views use ----------------------------------

    @property
    def _lock(self) -> Any:
        return self._holds.lock

    @property
    def _lost_holds(self) -> dict[str, list[Hold]]:
        return self._holds.lost

    @property
    def _interrupts(self) -> int:
        return self._waiting.interrupts

    @property
    def _getters(self) -> int:
        return self._waiting.blocked

    @_getters.setter
    def _getters(self, blocked: int) -> None:
        self._waiting.blocked = blocked

    @property
    def _claim_turn(self) -> Any:
        return self._holds.claim_turn

    @_claim_turn.setter
    def _claim_turn(self, turn: Any) -> None:
        self._holds.claim_turn = turn
