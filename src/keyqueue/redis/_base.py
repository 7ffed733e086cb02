"""What ``RedisWorkQueue`` and ``AsyncRedisWorkQueue`` share: everything but the I/O.

Theory of operation
-------------------
The queue's state lives on the server, in twenty-one Redis keys that share one
hash tag, ``{name}`` (so a queue lives in one cluster slot); ``lua/common.lua``
lists them. Every change is one Lua script, named after the ``_core.py``
transition it transcribes, so it is atomic without WATCH/MULTI. The only
clock is the server's ``TIME`` (a virtual clock's reading replaces it in
tests), so machines never disagree about when a delay or a lease ends.

Per queue, shared by every client: the four per-key states (dirty, FIFO,
processing), the leases and their fencing tokens, delays, failure counts,
the server rate limiter's state, and the counters ``stats()`` reports.

Per client (this object): the keys it holds, with their tokens; its lease
renewal loop (one for all its keys, every third of the lease); its shutdown
flag (a shut-down client takes no more keys, and its drain waits for its own
holds; everything else, adds included, still reaches the shared queue, where
other clients go on); its event subscribers and metrics, which see the
transitions its own calls made (a due key released by this client's call is
this client's event).

Waiting: a getter that finds nothing waits for the doorbell. One getter of
the client (the leader) runs ``BLPOP`` on the queue's doorbell list (and on
this client's own wake-up list, which ``shutdown`` and ``interrupt`` ring), in
slices well inside the client's socket timeout; the others wait in the
process until it leaves, and one takes its place. Every push rings the
doorbell, so a get wakes within a round trip of an add on another machine;
each get first releases due keys and reaps expired leases, so no client is
special. With no bell, the get script runs again only at a due time it
reported, or once a lease (a key another client takes meanwhile cannot
expire sooner): an idle client costs the server one ``BLPOP`` a slice. A
server ends BLPOP timeouts only on its cron tick (every 100 ms by default),
so a client whose getter waits arms a local timer for the next due
delayed key or lease (when it is due within a slice) that runs ``reap``: the
release rings the doorbell on time.

Leases: a holder that stops renewing (it died, stalled, or lost its
connection) loses the key to ``reap``: the holder's ``done``, then one failure
of the key (backoff, ``max_retries``). A late ``done`` or renewal with a stale
token changes nothing and raises ``LeaseLost``. Because items are keys, not
payloads, recovery neither duplicates nor loses a change: no two live holders,
and every change after a key's last hand-out leads to one more hand-out.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import math
import threading
import time
import uuid
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .._clock import Clock, VirtualClock
from .._core import (
    PriorityCounts,
    Stats,
    check_aging,
    check_keys,
    check_number,
    check_priority,
)
from .._errors import Empty, LeaseLost, ShutDown
from .._events import Event, EventKind, Observer, fan_out
from .._metrics import MetricsProvider, NoopMetrics, QueueGauges
from .._ratelimit import RateLimiter

__all__ = ["RedisQueueBase", "RedisRateLimiter", "RedisStats"]

logger = logging.getLogger("keyqueue")

MIN_SERVER = (6, 2)
SCRIPTS = (
    "add",
    "add_after",
    "add_rate_limited",
    "done",
    "forget",
    "get",
    "put_back",
    "reap",
    "renew",
    "retry",
    "stats",
)
KEY_NAMES = (
    "dirty",
    "fifo",
    "processing",
    "lease",
    "delayed",
    "delay_seq",
    "failures",
    "requeues",
    "bucket",
    "stats",
    "bell",
    "taken_back",
    "repushed",
    "ranked",
    "rank",
    "arrivals",
    "by_priority",
    "pending_priority",
    "delayed_priority",
    "endpoints",
    "endpoint_lru",
)
DEFAULT_BLOCK = 30.0  # longest single BLPOP, in seconds, when the socket timeout and lease allow it
WAKE_TTL_MS = 60_000  # a shut-down client's wake-up list outlives it by this much

_SOURCES: dict[str, str] = {}


def script_source(name: str) -> str:
    """common.lua followed by ``name``.lua: the text of one script."""
    source = _SOURCES.get(name)
    if source is None:
        lua = importlib.resources.files("keyqueue.redis") / "lua"
        common = (lua / "common.lua").read_text(encoding="utf-8")
        source = common + "\n" + (lua / f"{name}.lua").read_text(encoding="utf-8")
        _SOURCES[name] = source
    return source


def hash_tag(name: str) -> str:
    """The hash tag of the queue ``name``'s keys, braces included: ``{name}``.

    A name with a ``}`` in it would end the tag early (a name starting with
    one makes an empty tag, and the keys land in as many cluster slots), so
    such a name's tag is ``{#`` and the first 24 hex digits of its SHA-256
    ``}``: every name works, and two names never share their keys.
    """
    if "}" in name:
        return "{#" + hashlib.sha256(name.encode()).hexdigest()[:24] + "}"
    return "{" + name + "}"


def key_names(name: str) -> list[str]:
    """The Redis keys of the queue ``name``, in the order the scripts expect."""
    tag = hash_tag(name)
    return [f"keyqueue:{tag}:{part}" for part in KEY_NAMES]


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
    max_delay: float = 1000.0
    qps: float | None = 10.0
    burst: int = 100
    endpoint: Callable[[str], Hashable] | None = None
    endpoint_qps: float = 10.0
    endpoint_burst: int = 100
    max_endpoints: int = 10_000

    def __post_init__(self) -> None:
        for field, value in (("base_delay", self.base_delay), ("max_delay", self.max_delay)):
            if isinstance(value, bool) or not isinstance(value, int | float):
                raise TypeError(f"{field} must be a number of seconds, got {value!r}")
            if not 0 <= value < math.inf:
                raise ValueError(f"{field} must be finite seconds >= 0, got {value!r}")
        if self.max_delay < self.base_delay:
            raise ValueError(
                f"max_delay ({self.max_delay!r}) must be >= base_delay ({self.base_delay!r})"
            )
        qps = self.qps
        if qps is not None and (
            isinstance(qps, bool) or not isinstance(qps, int | float) or not 0 < qps < math.inf
        ):
            raise ValueError(f"qps must be None or a finite number > 0, got {qps!r}")
        if isinstance(self.burst, bool) or not isinstance(self.burst, int) or self.burst < 1:
            raise ValueError(f"burst must be an int >= 1, got {self.burst!r}")
        if self.endpoint is not None and not callable(self.endpoint):
            raise TypeError(f"endpoint must be None or a callable, got {self.endpoint!r}")
        eqps = self.endpoint_qps
        if isinstance(eqps, bool) or not isinstance(eqps, int | float) or not 0 < eqps < math.inf:
            raise ValueError(f"endpoint_qps must be a finite number > 0, got {eqps!r}")
        for field, count in (
            ("endpoint_burst", self.endpoint_burst),
            ("max_endpoints", self.max_endpoints),
        ):
            if isinstance(count, bool) or not isinstance(count, int) or count < 1:
                raise ValueError(f"{field} must be an int >= 1, got {count!r}")

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


@dataclass(frozen=True, slots=True)
class RedisStats(Stats):
    """``Stats`` of a queue on Redis: queue-wide counters, kept on the server.

    Every field but ``shutting_down`` (this client's) counts all clients.
    ``adds == enqueued + coalesced + marked_while_processing`` holds, each
    counted on its own; ``dones`` counts ``done`` calls that released a key, so
    ``gets == dones + processing + leases_expired``.
    """

    leases_expired: int
    """Leases that ran out and were taken back by ``reap`` (each one failure)."""
    leases_lost: int
    """Holders that learned their lease was taken back (late ``done`` or renewal)."""


REQUEUES = KEY_NAMES.index("requeues")

_KINDS: dict[str | bytes, EventKind] = {}
for _kind in EventKind:
    _KINDS[_kind.value] = _KINDS[_kind.value.encode()] = _kind
_GIVE_UP = ("give_up", b"give_up")


def text(value: str | bytes) -> str:
    """A reply element as ``str`` (clients may or may not decode responses)."""
    return value.decode() if isinstance(value, bytes) else value


def check_key(key: object) -> str:
    if type(key) is not str:
        raise TypeError(f"keys of a Redis queue must be str, got {key!r}")
    return key


ADD_BATCH = 1000
"""Keys per script run in ``add_many``: the server runs nothing else meanwhile."""


def key_batches(keys: Iterable[str]) -> list[list[str]]:
    """``add_many``'s keys, checked, in batches of at most ``ADD_BATCH``.

    Raises ``TypeError`` (before anything is sent) for a key that is not a
    ``str``, or for a ``str`` passed as the iterable (its characters are not
    meant as keys).
    """
    checked = [check_key(key) for key in check_keys(keys)]
    return [checked[i : i + ADD_BATCH] for i in range(0, len(checked), ADD_BATCH)]


def check_timeout(timeout: float | None) -> float | None:
    """A timeout as the in-memory fronts take it (``_core.check_number``): None,
    or seconds >= 0 (an int beyond float range is ``inf``: for ever)."""
    if timeout is None:
        return None
    seconds = check_number(timeout, "timeout must be None or a number of seconds")
    if not seconds >= 0:
        raise ValueError(f"timeout must be None or a number of seconds >= 0, got {timeout!r}")
    return seconds


def check_delay(seconds: float) -> float:
    """A delay (``_core.check_number``): an int beyond float range is ``inf``."""
    return check_number(seconds, "add_after: delay must be a number of seconds")


def priority_arg(priority: object) -> str:
    """A priority as the scripts take it (``check_priority``: an int, 32-bit;
    as on the in-memory fronts, a false value is 0)."""
    return str(check_priority(priority)) if priority else "0"


def parse_version(info: dict[str, Any]) -> tuple[int, ...]:
    raw = str(info.get("redis_version", "0"))
    try:
        return tuple(int(part) for part in raw.split(".")[:2])
    except ValueError:
        return (0,)


def server_too_old(name: str, where: str, info: dict[str, Any]) -> RuntimeError:
    return RuntimeError(
        f"keyqueue.redis queue {name!r}: the server at {where} speaks Redis "
        f"{info.get('redis_version')}; keyqueue needs Redis >= 6.2 or Valkey >= 7.2"
    )


def unreachable(name: str, where: str, exc: BaseException) -> str:
    return f"keyqueue.redis queue {name!r}: cannot reach the server at {where}: {exc}"


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


def block_limit(kwargs: dict[str, Any]) -> float:
    """The longest single BLPOP: well inside the client's socket timeout.

    Servers end a blocking call's timeout on their cron tick (``hz``, 10 a
    second by default), so a BLPOP may return up to ~100 ms after its timeout:
    keep that much margin, and more.
    """
    socket_timeout = kwargs.get("socket_timeout", 5.0)  # redis-py's default
    if socket_timeout is None:
        return DEFAULT_BLOCK
    socket_timeout = float(socket_timeout)
    return max(0.001, min(DEFAULT_BLOCK, max(socket_timeout / 4, socket_timeout - 0.5)))


class _Hold:
    """A key this client holds: its fencing token and when it was taken."""

    __slots__ = ("lost", "owner", "seq", "started", "token", "unanswered", "unsure")

    def __init__(self, token: int, started: float, owner: object) -> None:
        self.token = token
        self.started = started  # local clock reading at the get (for unfinished work)
        self.owner = owner  # the thread or task that took it
        self.lost = False  # the lease was taken back (a renewal or an outcome learned it)
        # A call on the hold raised (a lost connection): whether it reached the
        # server is unknown, so the lease is no longer renewed. If the call did
        # not release the key, the lease runs out and the key comes back;
        # asking the same call again is safe (the scripts apply it once).
        self.unsure = False
        # Fenced outcomes (retry, add_after, add_rate_limited, forget) carry a
        # request number, per hold: the server applies each number once. A call
        # asked again after it raised (``unanswered`` names it) reuses its number.
        self.seq = 0
        self.unanswered = ""


class RedisQueueBase:
    """Construction, validation, holds and events shared by both Redis fronts."""

    def __init__(
        self,
        name: str,
        *,
        lease: float,
        rate_limiter: RedisRateLimiter | RateLimiter | None,
        max_retries: int | None,
        metrics: MetricsProvider | None,
        clock: Clock | None,
        aging: float | None = None,
    ) -> None:
        if not isinstance(name, str):
            raise TypeError(f"name must be a str, got {name!r}")
        self._aging = check_aging(aging)
        # What the scripts that take a priority pass as aging ('' for strict).
        self._aging_arg = "" if self._aging is None else repr(self._aging)
        if not name:
            raise ValueError("a Redis queue needs a non-empty name (its keys' hash tag)")
        self.name = name
        if isinstance(lease, bool) or not isinstance(lease, int | float):
            raise TypeError(f"lease must be a number of seconds, got {lease!r}")
        if not 0 < lease < math.inf:
            raise ValueError(f"lease must be finite seconds > 0, got {lease!r}")
        self._lease = float(lease)
        if max_retries is not None and (
            isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1
        ):
            raise ValueError(f"max_retries must be None or an int >= 1, got {max_retries!r}")
        self._max_retries = max_retries
        if rate_limiter is None:
            rate_limiter = RedisRateLimiter()
        if isinstance(rate_limiter, RedisRateLimiter):
            self._server_limiter: list[str] | None = rate_limiter.args()
        elif isinstance(rate_limiter, RateLimiter):
            self._server_limiter = None
        else:
            raise TypeError(
                "rate_limiter must be a RedisRateLimiter (state on the server) or a "
                f"local RateLimiter (when/forget/num_requeues), got {rate_limiter!r}"
            )
        self._rate_limiter = rate_limiter
        # What reaping scripts take: max_retries, then the server limiter or ''s.
        self._reap_args = ["" if max_retries is None else str(max_retries)] + (
            self._server_limiter or ["", "", "", ""]
        )
        if clock is not None and not isinstance(clock, VirtualClock):
            raise TypeError(
                "a Redis queue reads time from the server; clock= takes only a virtual "
                f"clock for tests (keyqueue.testing.FakeClock), got {clock!r}"
            )
        self._clock = clock
        self._local_now: Callable[[], float] = time.monotonic if clock is None else clock.now
        self._keys = key_names(name)
        self._bell = self._keys[KEY_NAMES.index("bell")]
        self._client_id = uuid.uuid4().hex
        self._wake = f"keyqueue:{hash_tag(name)}:wake:{self._client_id}"
        # Holds: key -> the live hold; key -> holds whose lease was taken back
        # and whose holder has not called done yet. Guarded by _lock.
        self._lock = threading.Lock()
        self._holds: dict[str, _Hold] = {}
        self._stale: dict[str, list[_Hold]] = {}
        self._shutting_down = False
        # Getters blocked in get on this client. One of them, the leader, waits
        # in BLPOP on the doorbell (so an idle client sends one BLPOP a slice,
        # however many getters it has); the others wait for it to leave, and
        # the first to wake takes its place. Guarded by _lock.
        self._getters = 0
        self._leading = False
        self._interrupts = 0  # interrupt() calls: a get that began before one raises Empty
        # Monotonic time by which some getter of this client is to run the get
        # script again though no doorbell rang (a lease of another client may
        # run out meanwhile): the getters share it, so an idle client looks once.
        self._look_at = 0.0
        self._last_levels = QueueGauges(0, 0, 0.0, 0.0)
        provider = NoopMetrics() if metrics is None else metrics
        if not isinstance(provider, MetricsProvider):
            raise TypeError(f"metrics must have new_queue_metrics(), got {metrics!r}")
        self._metrics_observer = provider.new_queue_metrics(name, self._gauges)
        self._subscribe_lock = threading.Lock()
        self._subscribers: tuple[Callable[[Event[str]], None], ...] = ()
        self._observer: Observer | None = None
        self._rewire()

    # -- read-only -----------------------------------------------------------------

    @property
    def lease(self) -> float:
        """Seconds a ``get`` holds a key without renewal."""
        return self._lease

    @property
    def max_retries(self) -> int | None:
        """Failures after which ``retry`` gives a key up (None: never); this client's setting."""
        return self._max_retries

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
        return self._shutting_down

    def token(self, key: str) -> int:
        """The fencing token of ``key``, which this client holds.

        Tokens strictly increase per queue: a handler can pass its token along
        with its writes downstream, and a store that remembers the highest token
        seen can refuse a write from a holder whose lease was taken back.
        Raises ``ValueError`` if this client does not hold ``key``.
        """
        with self._lock:
            return self._find_hold(check_key(key), "token").token

    # -- arguments and replies -------------------------------------------------------

    def _clock_arg(self) -> str:
        return "" if self._clock is None else repr(self._clock.now())

    def _endpoint_args(self, key: str) -> list[str]:
        """The server limiter's endpoint arguments for ``key`` (see ``RedisRateLimiter``)."""
        limiter = self._rate_limiter
        if isinstance(limiter, RedisRateLimiter):
            return limiter.endpoint_args(key)
        return ["", "", "", ""]

    def _owner(self) -> object:
        return threading.get_ident()

    def _emit(self, now: Any, events: Sequence[Any]) -> None:
        """Report a script's events to this client's observer, in order."""
        if not events:
            return
        observer = self._observer
        at = float(now)
        for i in range(0, len(events), 3):
            kind = _KINDS.get(events[i])
            key = text(events[i + 1])
            if kind is None:
                if events[i] in _GIVE_UP:
                    logger.warning(
                        "keyqueue %r: the lease of key %r ran out and it has failed "
                        "max_retries times: given up",
                        self.name,
                        key,
                    )
                continue
            if observer is not None:
                duration = events[i + 2]
                observer(kind, key, at, float(duration) if duration not in ("", b"") else None)

    def _stats(self, reply: Sequence[Any]) -> RedisStats:
        now, raw, depth, processing, delayed, dirty, events, by_priority, oldest = reply
        self._emit(now, events)
        counters = {text(raw[i]): raw[i + 1] for i in range(0, len(raw), 2)}

        def count(field: str) -> int:
            return int(counters.get(field, 0))

        def seconds(field: str) -> float:
            return float(counters.get(field, 0.0))

        if by_priority:  # ranked: the server's counts
            pairs = (
                (int(by_priority[i]), int(by_priority[i + 1]))
                for i in range(0, len(by_priority), 2)
            )
            waiting = PriorityCounts(sorted(pairs, reverse=True))
        else:
            waiting = PriorityCounts({0: int(depth)} if int(depth) else ())
        oldest_wait = 0.0 if oldest in ("", b"") else float(now) - float(oldest)
        self._last_levels = self._levels(int(dirty), int(delayed), waiting, oldest_wait)
        return RedisStats(
            adds=count("adds"),
            enqueued=count("enqueued"),
            coalesced=count("coalesced"),
            marked_while_processing=count("marked_while_processing"),
            redeliveries=count("redeliveries"),
            gets=count("gets"),
            dones=count("dones"),
            retries=count("retries"),
            rate_limited=count("rate_limited"),
            depth=int(depth),
            max_depth=count("max_depth"),
            processing=int(processing),
            delayed=int(delayed),
            queue_wait_seconds=seconds("queue_wait_seconds"),
            work_seconds=seconds("work_seconds"),
            shutting_down=self._shutting_down,
            waiting_by_priority=waiting,
            oldest_wait_seconds=oldest_wait,
            leases_expired=count("leases_expired"),
            leases_lost=count("leases_lost"),
        )

    def _levels(
        self, dirty: int, delayed: int, waiting: Mapping[int, int], oldest_wait: float
    ) -> QueueGauges:
        """Gauges: the queue's depth, delayed keys, waiting keys by priority and
        oldest wait; this client's unfinished work."""
        now = self._local_now()
        total = longest = 0.0
        with self._lock:
            holds = list(self._holds.values())
        for hold in holds:
            held = now - hold.started
            total += held
            if held > longest:
                longest = held
        return QueueGauges(dirty, delayed, total, longest, waiting, oldest_wait)

    def _gauges(self) -> QueueGauges:
        raise NotImplementedError

    # -- holds ---------------------------------------------------------------------

    def _hold(self, key: str, token: int) -> bool:
        """Record a hold; True if the renewal loop must be started."""
        hold = _Hold(token, self._local_now(), self._owner())
        with self._lock:
            old = self._holds.get(key)
            if old is not None and old.owner != hold.owner:
                # The server handed the key out again, so the old lease is gone;
                # its holder's done must raise LeaseLost, not release this hold.
                # (The same thread or task getting it again has moved on.)
                self._stale.setdefault(key, []).append(old)
            self._holds[key] = hold
            return self._clock is None and not self._renewing()

    def _renewing(self) -> bool:
        raise NotImplementedError

    def _start_renewing(self) -> None:
        raise NotImplementedError

    def _taken(self, reply: Sequence[Any]) -> tuple[str | None, float | None]:
        """A get script's reply: (key, None) with its hold recorded, or (None,
        seconds until something is due, None if nothing will or on a virtual
        clock)."""
        if not int(reply[1]):
            now, _, due, events = reply
            self._emit(now, events)
            seconds = None if due in ("", b"") or self._clock is not None else float(due)
            self._looked(seconds)
            return None, seconds
        now, _, key, token, events = reply
        self._emit(now, events)
        key = text(key)
        if self._hold(key, int(token)):
            self._start_renewing()
        return key, None

    def _find_hold(self, key: str, what: str) -> _Hold:
        """The caller's hold on ``key``.

        The live hold, unless another thread or task holds that one and the
        caller's own hold was taken back (then that one: its done raises
        LeaseLost). Holds are told apart by owner only when a key was handed out
        again while its old holder had not called done.
        """
        hold = self._holds.get(key)
        stale = self._stale.get(key)
        if stale:
            owner = self._owner()
            if hold is None or hold.owner != owner:
                for lost in stale:
                    if lost.owner == owner:
                        return lost
                if hold is None:
                    return stale[0]
        if hold is None:
            raise ValueError(f"{what}({key!r}): key is not being processed by this client")
        return hold

    def _forget_hold(self, key: str, hold: _Hold) -> bool:
        """Drop a finished hold; True if this client now holds nothing."""
        with self._lock:
            if self._holds.get(key) is hold:
                del self._holds[key]
            else:
                stale = self._stale.get(key, [])
                if hold in stale:
                    stale.remove(hold)
                    if not stale:
                        del self._stale[key]
            return not self._holds and not self._stale

    def _renewal(self) -> list[str]:
        """ARGV of a renewal: clock, lease, then key, token pairs of live holds
        (neither lost nor after a failed done)."""
        args = [self._clock_arg(), repr(self._lease)]
        with self._lock:
            for key, hold in self._holds.items():
                if not (hold.lost or hold.unsure):
                    args += (key, str(hold.token))
        return args

    def _renewed(self, reply: Sequence[Any]) -> None:
        """Mark the holds a renewal found taken back: their ``done`` raises LeaseLost."""
        now, lost = reply
        for i in range(0, len(lost), 2):
            key, token = text(lost[i]), int(lost[i + 1])
            with self._lock:
                hold = self._holds.get(key)
                if hold is None or hold.lost or hold.token != token:
                    continue  # done since, or a newer hold of the key
                hold.lost = True
            # Debug only: the holder learns it as LeaseLost from its next call
            # on the key (the runner logs that, once).
            logger.debug(
                "keyqueue %r: the lease of key %r was taken back (this client stalled "
                "past its lease?); its done will raise LeaseLost",
                self.name,
                key,
            )
            if self._observer is not None:
                self._observer(EventKind.LEASE_LOST, key, float(now), None)

    def _lost(self, key: str, hold: _Hold, now: float | None, what: str = "done") -> LeaseLost:
        if now is not None and self._observer is not None:
            self._observer(EventKind.LEASE_LOST, key, now, None)
        return LeaseLost(
            f"{what}({key!r}): the lease (token {hold.token}) ran out and was taken back; "
            "another holder may have the key. Nothing changed."
        )

    # -- fenced outcomes -------------------------------------------------------------

    def _fence(self, key: str, what: str) -> tuple[_Hold | None, list[str]]:
        """The caller's hold on ``key`` (None if it holds none: the call is not
        fenced) and the token and request number the script takes.

        Raises ``LeaseLost`` (nothing sent) if the hold's lease is known to be
        taken back. The request number is the last one again if the last call
        on the hold was this one and it raised (its outcome is unknown).
        """
        with self._lock:
            if key not in self._holds and key not in self._stale:
                return None, ["", "0"]
            hold = self._find_hold(key, what)
            if hold.lost:
                raise self._lost(key, hold, None, what)
            if hold.unanswered != what:
                hold.seq += 1
            hold.unanswered = what
            return hold, [str(hold.token), str(hold.seq)]

    def _fence_failed(self, hold: _Hold | None) -> None:
        """A fenced call raised: its outcome is unknown; stop renewing the hold
        (if the call is never answered, the lease runs out and the key comes back)."""
        if hold is not None:
            hold.unsure = True

    def _fenced(self, key: str, hold: _Hold | None, reply: Sequence[Any], what: str) -> Any:
        """A fenced script's reply: its result, after its events; ``LeaseLost``
        (the hold marked lost, nothing changed) if the lease was taken back."""
        now, result, events, status = reply
        self._emit(now, events)
        if hold is None:
            return result
        with self._lock:
            hold.unanswered = ""
            renew = hold.unsure and not hold.lost
            hold.unsure = False
            if status in ("lost", b"lost"):
                hold.lost = True
                renew = False
        if status in ("lost", b"lost"):
            raise self._lost(key, hold, float(now), what)
        if renew and self._clock is None:
            self._restart_renewing()
        return result

    def abandon(self, key: str) -> None:
        """Let go of this client's hold of ``key`` without releasing it on the
        server: it is no longer renewed, so its lease runs out and the key is
        handed out again (counted as one failure, as a holder that died). Later
        calls of the hold raise ``ValueError``; ``shutdown(drain=True)`` no
        longer waits for it. For a worker that stops while it cannot tell the
        server how the key ended (``run_workers`` calls it). Raises
        ``ValueError`` if this client does not hold ``key``.
        """
        check_key(key)
        with self._lock:
            hold = self._find_hold(key, "abandon")
            hold.unsure = True
        self._finish(key, hold)

    def _finish(self, key: str, hold: _Hold) -> None:
        raise NotImplementedError

    def _restart_renewing(self) -> None:
        """Renew the holds again (a hold whose call raised was answered since)."""
        raise NotImplementedError

    # -- events --------------------------------------------------------------------

    def subscribe(self, callback: Callable[[Event[str]], None]) -> Callable[[], None]:
        """Call ``callback(event)`` for every transition this client's calls make.

        Transitions of other clients are theirs to report. Callbacks run in the
        calling thread (or task), after the server applied the change; an
        exception in one is logged. Returns an unsubscribe function.
        """
        if not callable(callback):
            raise TypeError(f"subscribe needs a callable, got {callback!r}")
        with self._subscribe_lock:
            self._subscribers = (*self._subscribers, callback)
            self._rewire()
        return lambda: self._unsubscribe(callback)

    def _unsubscribe(self, callback: Callable[[Event[str]], None]) -> None:
        with self._subscribe_lock:
            subscribers = list(self._subscribers)
            if callback in subscribers:
                subscribers.remove(callback)
                self._subscribers = tuple(subscribers)
                self._rewire()

    def _rewire(self) -> None:
        """Point ``_observer`` at exactly what is subscribed (as QueueBase._rewire)."""
        self._observer = fan_out(self.name, self._metrics_observer, self._subscribers)

    def _shut(self) -> int:
        """Set this client's shutdown flag (emitting SHUTDOWN the first time).

        Wakes the waiting getters that are not in ``BLPOP`` and returns how
        many are (0 or 1: the leader): each must be woken through the wake-up
        list. A getter checks the flag under the same lock before it waits, so
        none can block unseen after this.
        """
        with self._lock:
            first = not self._shutting_down
            self._shutting_down = True
            self._wake_followers()
            leading = 1 if self._leading else 0
        if first and self._observer is not None:
            now = self._clock.now() if self._clock is not None else time.time()
            self._observer(EventKind.SHUTDOWN, None, now, None)
        return leading

    def _interrupt(self) -> int:
        """Count an interrupt and wake the waiting getters (as ``_shut``; each
        then raises ``Empty``); returns how many are in ``BLPOP``."""
        with self._lock:
            self._interrupts += 1
            self._wake_followers()
            return 1 if self._leading else 0

    def _wake_followers(self) -> None:
        """Wake every getter waiting for the leader (called with ``_lock`` held)."""
        raise NotImplementedError

    def _check_wait(self, seen: int) -> None:
        """A getter may block: not if this client is shut down (``ShutDown``) or
        ``interrupt`` was called since its get began (``Empty``). Under ``_lock``."""
        if self._shutting_down:
            raise ShutDown(f"this client of queue {self.name!r} is shut down")
        if self._interrupts != seen:
            raise Empty

    def _looked(self, due: float | None) -> None:
        """A get found nothing waiting: the getters need not run it again
        before ``due`` unless the doorbell rings, nor for longer than a lease
        (another client's lease may run out: a get reaps it)."""
        wait = self._lease
        if due is not None and due < wait:
            wait = due
        self._look_at = time.monotonic() + wait

    def __repr__(self) -> str:
        state = "shutting down" if self._shutting_down else "running"
        return (
            f"<{type(self).__name__} {self.name!r} {state}: {len(self._holds)} held by this client>"
        )
