"""An informer: client-go's list-then-watch loop feeding a work queue (extra ``keyqueue[kube]``).

    from kubernetes_asyncio import client, config
    from keyqueue import AsyncWorkQueue, arun_workers
    from keyqueue.informer import Informer

    await config.load_kube_config()            # or point a Configuration at any API server
    v1 = client.CoreV1Api()
    queue: AsyncWorkQueue[str] = AsyncWorkQueue("configmaps")
    informer = Informer(v1.list_namespaced_config_map, "default", queue=queue)
    asyncio.create_task(informer.run())
    await informer.wait_synced()
    await arun_workers(queue, reconcile, workers=4)   # reconcile reads informer.get(key)

Theory of operation
-------------------
``run()`` lists the resource, remembers the list's resourceVersion, and
watches from there (``watch=true&resourceVersion=N&timeoutSeconds=S``, through
``kubernetes_asyncio``'s ``Watch``, so the same code runs against a real
cluster and any Kubernetes-shaped API server). Every list and every watch event
updates a local cache keyed ``namespace/name`` (``name`` for cluster-scoped
objects) and calls the handlers with a ``Change``; ``queue=`` registers one
that calls ``queue.add(key)``. When a watch ends normally (its timeout) the
informer watches again from the last resourceVersion it saw, so nothing is
missed. When the server answers ``410 Gone`` (that version is compacted away)
or the stream breaks, it lists again and reconciles the cache with the list:
objects new to it are ADDED, objects whose resourceVersion changed are
MODIFIED, objects that vanished are DELETED; unchanged objects fire nothing.
Keys are neither lost (every change after the last event seen shows up in the
new list) nor duplicated beyond what the queue coalesces anyway.

What a real cluster needs, as client-go's reflector does it:

- Paginated lists (client-go's pager): each list asks for ``page_size``
  objects at a time (500; ``limit=`` and ``continue=``); the server reads every
  page at the first one's resourceVersion, so the pages make one snapshot and
  the cache changes only when the last has arrived. A continue token the
  server has compacted away (410 ``Expired``) restarts the list from the
  beginning as one unpaginated list, as the pager's ``FullListIfExpired``.
- Bookmarks: every watch asks for them (``allowWatchBookmarks=true``); a
  BOOKMARK moves the resourceVersion the next watch starts from without
  changing the cache, so an informer of a quiet namespace resumes from a
  recent version after its watch times out and does not hit 410 after a
  compaction.
- Streaming lists (``watch_list=True``, client-go's WatchList; off by
  default, as client-go's ``WatchListClient`` gate): instead of a list, one
  watch with ``sendInitialEvents=true&resourceVersionMatch=NotOlderThan``; its
  ADDED events fill a fresh cache, the BOOKMARK annotated
  ``k8s.io/initial-events-end: "true"`` replaces the cache with it (the same
  reconcile as a list) and marks the informer synced, and the same stream
  goes on as the watch. Nothing holds a whole list response, so the peak memory
  of a large initial sync is the cache and one event. A server that answers
  400 or 422 (without the feature), or ends the stream before that bookmark
  (it ignored the parameter), is not asked again: the informer lists and
  watches.
- Resync (``resync=`` seconds, off by default): every period re-delivers each
  cached key to the handlers as a ``RESYNC`` change (client-go's resync
  period, ``OnUpdate(obj, obj)``), spread over the period in slices at most
  ``10`` per second, so a large cache does not arrive at once; a key deleted
  meanwhile is skipped, one added waits for the next period.
- Selectors and namespaces: ``label_selector=`` and ``field_selector=`` go to
  every list and watch. ``namespace=None`` (or ``None`` as the namespace
  argument) of a ``list_namespaced_X`` call watches every namespace, through
  the API's ``list_X_for_all_namespaces`` (``list_cluster_custom_object``
  for ``list_namespaced_custom_object``).

Pacing (client-go's reflector, so a misbehaving server is not hammered):

    how a watch ends                               then
    ---------------------------------------------  ---------------------------
    normally, having lasted >= short_watch s        watch again at once
      or delivered an event
    at once: < short_watch s and no event           back off, then list again
    410 Gone (an HTTP 410 or an ERROR event)        back off, then list again
    any other error (a 5xx, a broken stream)        back off, then list again
    (and a list that fails)                         back off, then list again

A back-off waits ``rate_limiter.when(informer)`` seconds: by default
client-go's ``NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)``, that is
0.8 s doubling to a cap of 30 s, each wait stretched by a uniform factor in
``[1, 2)``. When more than ``backoff_reset`` seconds (2 min) have passed since
the last back-off began, the limiter forgets the informer first, so after a
watch that lasted the next failure waits 0.8 s again. Against a server that
answers 410 to every watch, or closes each at once, that is at most three
list+watch rounds in the first 3 s, and one every 30 to 60 s in the end. What
it trades: a server that closes each watch at once after one event is still
re-watched at once (an event is progress), as in client-go; and every error
re-lists after its back-off, where client-go keeps its resourceVersion and
watches again after a refused connection or a 429.

Handlers and queues (DESIGN.md has the theory): every change goes
to every handler in turn, and ``queue=`` is one more handler that adds the
change's key, to any of the four queues. A handler that returns an awaitable
(an ``async def``; ``AsyncRedisWorkQueue.add``) is awaited; a
``RedisWorkQueue``'s add, which blocks on the network, runs in a thread
(``asyncio.to_thread``). The changes of one key reach the handlers in the
order the watch delivered them; changes of different keys may overtake each
other. Plain handlers run in line, on the informer's task, at no extra cost;
awaited ones form a bounded pipeline: at most ``max_in_flight`` changes (16)
in flight, and while that many are the informer reads no further event, so
a slow server holds back the watch instead of piling up tasks. Choosing a
pipeline over an await in line: one round trip per event in series would
cap a relist at 1/RTT keys a second; ``max_in_flight=1`` is that await in
line. A handler that raises a connection error (the queue's server is down:
``ConnectionError``, ``TimeoutError``, a network ``OSError``, redis-py's
``ConnectionError`` and ``TimeoutError``) is called again with the same change
after a jittered back-off (0.05 s doubling to 5 s, times ``[1, 2)``), until it
returns or the informer stops; the key's later changes wait behind it. Any
other exception is logged and the change goes on to the next handler. The
informer is ``synced`` once the first list's changes have been handled by
every handler (a queue then holds every listed key). Stopped (``run()``
cancelled), it cancels what is in flight and logs how many changes were not
handled. The cache holds whatever the client returns: models (``V1ConfigMap``) for typed
APIs, dicts for ``CustomObjectsApi``. ``stats()`` counts what happened (lists,
pages, watches, events, bookmarks, re-lists by cause);
``keyqueue.prometheus.PrometheusMetrics.add_informer`` exports it under
client-go's reflector and informer metric names (``observe_processed`` times
each change for ``informer_processing_latency_seconds``).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import inspect
import logging
import math
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

try:
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.watch import Watch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "keyqueue.informer needs kubernetes_asyncio: pip install 'keyqueue[kube]'"
    ) from exc

from ._checks import check_number
from ._clock import Clock, resolve_clock
from ._delivery import Deliveries
from ._ratelimit import ItemExponentialFailureRateLimiter, RateLimiter

__all__ = [
    "INITIAL_EVENTS_END",
    "AsyncAddQueue",
    "Change",
    "ChangeKind",
    "Informer",
    "InformerStats",
    "SyncAddQueue",
    "object_key",
]

logger = logging.getLogger("keyqueue.informer")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

GONE = 410
LIST_TIMEOUT = 60.0  # seconds a list page may take before it is an error (a relist backs off)
WATCH_GRACE = 30  # seconds past the watch's own timeoutSeconds before a silent stream is an error
_UNSUPPORTED = (400, 422)  # how a server without streaming lists refuses one
# client-go's reflector: wait.NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)
# and its "very short watch" (under a second, no event).
_BACKOFF_INITIAL = 0.8
_BACKOFF_MAX = 30.0
_BACKOFF_JITTER = 1.0
_BACKOFF_RESET = 120.0
_SHORT_WATCH = 1.0
_PAGE_SIZE = 500  # client-go's pager.defaultPageSize
_MAX_IN_FLIGHT = 16  # deliveries an awaitable handler may have in flight (docs/DESIGN.md)
_RESYNC_SLICES_PER_SECOND = 10
INITIAL_EVENTS_END = "k8s.io/initial-events-end"
"""The annotation on the BOOKMARK that ends a streaming list's initial events."""

# Why a list was begun after the first sync (InformerStats.relists' keys).
_EXPIRED, _SHORT_WATCH_ENDED, _WATCH_ERROR, _LIST_ERROR, _INCOMPLETE = (
    "expired",
    "short watch",
    "watch error",
    "list error",
    "initial events incomplete",
)


class SyncAddQueue(Protocol):
    """A queue whose ``add(key)`` returns when the key is added: ``WorkQueue[str]``,
    ``AsyncWorkQueue[str]``, ``keyqueue.redis.RedisWorkQueue`` (whose blocking
    add the informer runs in a thread)."""

    def add(self, key: str, /) -> None:
        """Add ``key``."""


class AsyncAddQueue(Protocol):
    """A queue whose ``add(key)`` returns an awaitable that adds the key:
    ``keyqueue.redis.AsyncRedisWorkQueue``."""

    def add(self, key: str, /) -> Awaitable[None]:
        """Add ``key`` (when awaited)."""


class _Listed(Protocol[T_co]):
    # What a typed list call returns (V1ConfigMapList): its items give the
    # informer's T, so Informer(v1.list_namespaced_config_map, ...) needs no
    # annotation. An untyped call (Any) makes it Informer[Any].
    @property
    def items(self) -> Sequence[T_co] | None: ...


class ChangeKind(enum.Enum):
    """What happened to an object, as the informer's cache saw it."""

    ADDED = "ADDED"
    """A new object (a watch's ADDED, or a list finding one not cached)."""
    MODIFIED = "MODIFIED"
    """A cached object changed (a watch's MODIFIED, or a list finding it changed)."""
    DELETED = "DELETED"
    """An object went (a watch's DELETED, or a re-list no longer finding it)."""
    RESYNC = "RESYNC"
    """Nothing: a periodic resync re-delivers the cached object (``old`` is it too)."""


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One change handed to the handlers."""

    kind: ChangeKind
    """What happened to the object."""
    key: str
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    obj: T
    """The object now (for DELETED: its last state)."""
    old: T | None
    """The cached object before this change (None for ADDED)."""
    resource_version: str
    """The object's ``metadata.resourceVersion`` in this change."""
    received: float
    """The informer's clock when the change arrived (the decoded watch event, or the list)."""
    relisted: bool = False
    """True if a list found it (start-up, or a re-list after 410 or a broken stream)."""


_Handler = Callable[[Change[T]], Awaitable[None] | None]
# What a handler is: plain, or returning an awaitable the informer awaits.


@dataclass(frozen=True, slots=True)
class InformerStats:
    """A snapshot of what the informer has done so far."""

    lists: int
    """Successful lists (the first, then one per re-list), streaming lists included."""
    watches: int
    """Watch streams opened (streaming lists included)."""
    events: int
    """Watch events received (bookmarks and a streaming list's initial events included)."""
    expired: int
    """Watches the server ended with 410 Gone."""
    errors: int
    """Failed lists and broken watch streams."""
    short_watches: int
    """Watches that ended within ``short_watch`` seconds having delivered no event."""
    backoffs: int
    """Back-offs begun: after a failed list, and a watch that ended at once, failed or got 410."""
    resource_version: str
    """The resource version the informer has seen up to (a watch resumes from it)."""
    cached: int
    """Objects in the informer's cache now."""
    pages: int = 0
    """List responses received (one per page; one for an unpaginated list)."""
    bookmarks: int = 0
    """BOOKMARK events received (a streaming list's initial-events-end included)."""
    list_restarts: int = 0
    """Lists restarted from the beginning because their continue token expired (410)."""
    streamed_lists: int = 0
    """Of ``lists``, those done as streaming lists (``watch_list=True``)."""
    watch_list: bool | None = None
    """Streaming lists: None if not asked for (or not tried yet), True if the
    server has served one, False once it refused one and the informer lists instead."""
    relists: Mapping[str, int] = field(default_factory=dict)
    """Lists begun after the first sync, by cause: ``"expired"`` (410 Gone),
    ``"short watch"``, ``"watch error"``, ``"list error"`` (the last list failed),
    ``"initial events incomplete"`` (a streaming list ended before its bookmark)."""
    resynced: int = 0
    """RESYNC changes delivered."""
    last_sync_seconds: float = 0.0
    """How long the last successful list took, all pages (or a streaming list, to its bookmark)."""
    handler_retries: int = 0
    """Handler calls made again because the last one could not connect (a queue's
    server down or restarting)."""
    in_flight: int = 0
    """Changes whose handlers have not all finished yet (an awaited add, say)."""


def _seconds(name: str, value: float) -> float:
    seconds = check_number(value, f"{name} must be a finite number of seconds", finite=True)
    if seconds < 0:
        raise ValueError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return seconds


def object_key(obj: Any) -> str:
    """``namespace/name`` (``name`` without a namespace), from a model or a dict."""
    namespace, name, _ = _meta(obj)
    return f"{namespace}/{name}" if namespace else name


def _meta(obj: Any) -> tuple[str | None, str, str]:
    if isinstance(obj, dict):
        meta = obj.get("metadata") or {}
        return meta.get("namespace"), meta["name"], meta.get("resourceVersion") or ""
    meta = obj.metadata
    return meta.namespace, meta.name, meta.resource_version or ""


def _page(result: Any) -> tuple[Sequence[Any], str, str]:
    """A list response's ``(items, resourceVersion, continue token)``."""
    if isinstance(result, dict):
        meta = result["metadata"]
        return result.get("items") or [], meta["resourceVersion"], meta.get("continue") or ""
    meta = result.metadata
    return result.items or [], meta.resource_version, getattr(meta, "_continue", None) or ""


def _all_namespaces(
    list_func: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Callable[..., Any], tuple[Any, ...]]:
    """``list_func`` and ``args`` for every namespace, when the namespace given is None.

    ``list_namespaced_X`` on an API object becomes its ``list_X_for_all_namespaces``
    (``list_namespaced_custom_object``: ``list_cluster_custom_object``), the None
    dropped from ``args`` or ``kwargs``; anything else is returned as it is.
    """
    name = getattr(list_func, "__name__", "")
    if not name.startswith("list_namespaced_"):
        return list_func, args
    try:
        params = [
            p.name
            for p in inspect.signature(list_func).parameters.values()
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        ]
    except (TypeError, ValueError):  # pragma: no cover - a call without a signature
        return list_func, args
    at = params.index("namespace") if "namespace" in params else -1
    if "namespace" in kwargs and kwargs["namespace"] is None:
        del kwargs["namespace"]
    elif 0 <= at < len(args) and args[at] is None:
        args = args[:at] + args[at + 1 :]
    else:
        return list_func, args
    resource = name[len("list_namespaced_") :]
    other = (
        "list_cluster_custom_object"
        if resource == "custom_object"
        else f"list_{resource}_for_all_namespaces"
    )
    found = getattr(getattr(list_func, "__self__", None), other, None)
    if found is None:
        raise ValueError(f"namespace=None: {name}'s API has no {other} to list every namespace")
    return found, args


def _queue_handler(queue: object) -> _Handler[Any]:
    """The handler that adds each change's key to ``queue``; ``TypeError`` if it has
    no ``add`` the informer can call with a key.

    A ``keyqueue.redis.RedisWorkQueue``'s add blocks on the network: it runs in
    a thread (``asyncio.to_thread``), so the informer's loop goes on meanwhile.
    """
    add = getattr(queue, "add", None)
    if not callable(add):
        raise TypeError(
            "queue must have an add(key) method (a WorkQueue, AsyncWorkQueue, "
            f"RedisWorkQueue or AsyncRedisWorkQueue), got {type(queue).__name__}"
        )
    try:
        signature = inspect.signature(add)
    except (TypeError, ValueError):  # pragma: no cover - a callable without a signature
        signature = None
    if signature is not None:
        try:
            signature.bind("key")
        except TypeError:
            raise TypeError(
                f"queue.add must take a key as its one argument, but it is "
                f"{type(queue).__name__}.add{signature.replace(return_annotation=signature.empty)}"
            ) from None
    redis_queues = sys.modules.get("keyqueue.redis")
    blocking = redis_queues is not None and isinstance(queue, redis_queues.RedisWorkQueue)
    return _AddKey(add, f"{type(queue).__name__}.add", blocking)


class _AddKey:
    """The handler ``queue=`` installs: ``add(change.key)``, in a thread if ``blocking``."""

    __slots__ = ("_add", "_blocking", "_name")

    def __init__(self, add: Callable[[str], Any], name: str, blocking: bool) -> None:
        self._add, self._name, self._blocking = add, name, blocking

    def __call__(self, change: Change[Any]) -> Awaitable[None] | None:
        if self._blocking:
            return asyncio.to_thread(self._add, change.key)
        result: Awaitable[None] | None = self._add(change.key)
        return result

    def __repr__(self) -> str:
        return self._name


class _Refused(Exception):
    """The server does not serve streaming lists (it said 400/422, or ignored the ask)."""


class Informer(Generic[T]):
    """List, then watch, ``list_func(*args, **kwargs)``; keep a cache; call handlers.

    ``list_func`` is a ``kubernetes_asyncio`` list call such as
    ``CoreV1Api().list_namespaced_config_map``; ``args`` and ``kwargs`` go to
    every list and watch call (a namespace, a label selector). ``T``, the
    cached objects' type, comes from the items of what ``list_func`` returns
    (``Informer[V1ConfigMap]`` for ``list_namespaced_config_map``); annotate
    it for a call that returns dicts (``Informer[dict[str, Any]]``). ``queue``:
    a ``WorkQueue[str]``, ``AsyncWorkQueue[str]``, ``RedisWorkQueue`` or
    ``AsyncRedisWorkQueue`` (any object with ``add(key)``, returning None or
    an awaitable); each change adds its key, awaited if ``add`` returns an
    awaitable, in a thread for a ``RedisWorkQueue`` (its add blocks), again
    after a back-off while the queue's server cannot be reached. A ``TypeError``
    if it has no ``add`` that takes a key. ``max_in_flight`` (16): most changes
    whose awaited handlers (that add, an ``async def`` handler) may be in
    flight at once; the informer reads no further event meanwhile (1: each is
    awaited in line). ``watch_timeout``: seconds each watch asks the server to
    stay open.

    What to list (see ``keyqueue.informer``): ``label_selector`` and
    ``field_selector`` go to every list and watch (``"app=web"``,
    ``"metadata.name=x"``); a namespace of None (``Informer(v1.list_namespaced_config_map,
    None)`` or ``namespace=None``) lists and watches every namespace.
    ``page_size`` (500): objects per list page, None for one response.
    ``watch_list`` (False): sync with a streaming list when the server serves
    one. ``resync`` (None: never): seconds between re-deliveries of every
    cached key to the handlers, spread over the period.

    Pacing (the rules: see ``keyqueue.informer``): ``rate_limiter`` says how
    long each back-off waits, ``rate_limiter.when(informer)`` (default
    ``ItemExponentialFailureRateLimiter(0.8, 30.0, jitter=1.0)``: 0.8 s
    doubling to 30 s, times a uniform ``[1, 2)``; pass ``rng=`` to it for
    reproducible jitter, or any ``RateLimiter``, say a ``MaxOfRateLimiter``
    with a bucket). ``backoff_reset`` (120 s): when more than this has passed
    since the last back-off began, ``rate_limiter.forget(informer)`` runs
    first, so the next wait is the shortest again. ``short_watch`` (1 s): a
    watch that ends sooner having delivered no event counts as a failure.

    ``clock`` stamps ``Change.received`` and times watches and the reset
    (default: monotonic). If it also has an ``async def sleep(seconds)``,
    every back-off and resync pause awaits that instead of ``asyncio.sleep``:
    a test's clock that jumps makes them take no wall time. ``TypeError`` or
    ``ValueError`` for a bad argument, naming it.
    """

    def __init__(
        self,
        list_func: Callable[..., Awaitable[_Listed[T] | Mapping[str, Any]]],
        *args: Any,
        queue: SyncAddQueue | AsyncAddQueue | None = None,
        max_in_flight: int = _MAX_IN_FLIGHT,
        watch_timeout: int = 300,
        rate_limiter: RateLimiter | None = None,
        backoff_reset: float = _BACKOFF_RESET,
        short_watch: float = _SHORT_WATCH,
        clock: Clock | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        page_size: int | None = _PAGE_SIZE,
        watch_list: bool = False,
        resync: float | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(watch_timeout, bool) or not isinstance(watch_timeout, int):
            raise TypeError(f"watch_timeout must be an int of seconds, got {watch_timeout!r}")
        if watch_timeout < 1:
            raise ValueError(f"watch_timeout must be >= 1 second, got {watch_timeout!r}")
        if page_size is not None:
            if isinstance(page_size, bool) or not isinstance(page_size, int):
                raise TypeError(f"page_size must be None or an int, got {page_size!r}")
            if page_size < 1:
                raise ValueError(f"page_size must be None or >= 1, got {page_size!r}")
        if not isinstance(watch_list, bool):
            raise TypeError(f"watch_list must be a bool, got {watch_list!r}")
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            raise TypeError(f"max_in_flight must be an int, got {max_in_flight!r}")
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight!r}")
        queue_handler = None if queue is None else _queue_handler(queue)
        for name, selector in (
            ("label_selector", label_selector),
            ("field_selector", field_selector),
        ):
            if selector is not None and not isinstance(selector, str):
                raise TypeError(f"{name} must be None or a str, got {selector!r}")
            if selector:
                kwargs[name] = selector
        if resync is not None:
            resync = _seconds("resync", resync)
            if resync == 0:
                raise ValueError("resync must be None (no resync) or a number of seconds > 0")
        if rate_limiter is None:
            rate_limiter = ItemExponentialFailureRateLimiter(
                _BACKOFF_INITIAL, _BACKOFF_MAX, jitter=_BACKOFF_JITTER
            )
        elif not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter, got {rate_limiter!r}")
        list_func, args = _all_namespaces(list_func, args, kwargs)
        self._list_func = list_func
        self._args = args
        self._kwargs = kwargs
        self._watch_timeout = watch_timeout
        self._page_size = page_size
        self._resync = resync
        # Sync with streaming lists: asked for, and the server has not refused one.
        self._watch_list = watch_list
        # What InformerStats.watch_list says: None until the server served (True)
        # or refused (False) a streaming list.
        self._watch_list_state: bool | None = None
        self._rate_limiter = rate_limiter
        self._backoff_reset = _seconds("backoff_reset", backoff_reset)
        self._short_watch = _seconds("short_watch", short_watch)
        self._clock = resolve_clock(clock)
        sleep = getattr(self._clock, "sleep", None)
        self._sleep: Callable[[float], Awaitable[object]] = (
            sleep if inspect.iscoroutinefunction(sleep) else asyncio.sleep
        )
        # The clock's time when the last back-off began (None: none yet). More
        # than backoff_reset before now: the next back-off forgets first.
        self._backoff_began: float | None = None
        # key -> the latest object seen; replaced whole by each list.
        self._cache: dict[str, T] = {}
        self._handlers: list[_Handler[T]] = []
        self._deliveries: Deliveries[Change[T]] = Deliveries(
            self._handlers,
            max_in_flight,
            self._sleep,
            self._clock.now,
        )
        self._synced = asyncio.Event()
        self._rv = ""  # the last resourceVersion seen: where the next watch starts
        self._lists = self._watches = self._events = self._expired = self._errors = 0
        self._short_watches = self._backoffs = 0
        self._pages = self._bookmarks = self._list_restarts = self._streamed = 0
        self._resynced = 0
        self._last_sync = 0.0
        self._relists: dict[str, int] = {}
        # Why the next list is needed (set by each failure; counted when it begins).
        self._cause = ""
        if queue_handler is not None:
            self.add_handler(queue_handler)

    # -- handlers and the cache ----------------------------------------------------

    def add_handler(self, handler: _Handler[T]) -> Callable[[], None]:
        """Call ``handler(change)`` for every change; returns a function that removes it.

        Added before ``run()``, it also sees the first list's objects as ADDED.
        ``handler`` may return an awaitable (an ``async def``): the informer
        awaits it, the changes of one key in order, at most ``max_in_flight``
        changes at once (see the class docstring). ``TypeError`` if it is not
        callable.
        """
        if not callable(handler):
            raise TypeError(f"an informer handler must be callable, got {handler!r}")
        self._handlers.append(handler)

        def remove() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return remove

    def observe_processed(self, observer: Callable[[float], None]) -> Callable[[], None]:
        """Call ``observer(seconds)`` for each change once every handler has handled
        it: the seconds on ``clock`` from its hand-over to the handlers until the
        last returned (or its awaited add completed; a change cancelled by stopping
        reports nothing). Returns the function that stops it. Each change is timed
        only while an observer is installed. ``TypeError`` if it is not callable;
        an exception from it is logged. ``PrometheusMetrics.add_informer`` installs
        one (``informer_processing_latency_seconds``).
        """
        if not callable(observer):
            raise TypeError(f"observe_processed needs a callable, got {observer!r}")
        return self._deliveries.observe_processed(observer)

    def get(self, key: str) -> T | None:
        """The cached object for ``key`` (``namespace/name``), or None."""
        return self._cache.get(key)

    def keys(self) -> list[str]:
        """The cached keys, sorted."""
        return sorted(self._cache)

    def __len__(self) -> int:
        return len(self._cache)

    @property
    def synced(self) -> bool:
        """True once the first list has filled the cache and every handler has
        handled its changes (a queue holds every listed key)."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        """Wait until ``synced`` (bound it with ``asyncio.timeout``): the first list
        is in the cache and its keys in the queue."""
        await self._synced.wait()

    def stats(self) -> InformerStats:
        """A frozen snapshot of the counts so far (an ``InformerStats``)."""
        return InformerStats(
            lists=self._lists,
            watches=self._watches,
            events=self._events,
            expired=self._expired,
            errors=self._errors,
            short_watches=self._short_watches,
            backoffs=self._backoffs,
            resource_version=self._rv,
            cached=len(self._cache),
            pages=self._pages,
            bookmarks=self._bookmarks,
            list_restarts=self._list_restarts,
            streamed_lists=self._streamed,
            watch_list=self._watch_list_state,
            relists=dict(self._relists),
            resynced=self._resynced,
            last_sync_seconds=self._last_sync,
            handler_retries=self._deliveries.retries,
            in_flight=self._deliveries.in_flight,
        )

    async def _emit(self, change: Change[T]) -> None:
        """Hand ``change`` to the handlers (``_delivery``): awaits only while
        ``max_in_flight`` changes are in flight."""
        waiting = self._deliveries.deliver(change.key, change)
        if waiting is not None:
            await waiting

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never returns on its own.

        Every failure (a list that fails; a watch that ends at once, fails or
        gets 410) backs off before the next list; a watch that ends normally
        is reopened at once from the last resourceVersion seen. With
        ``resync``, a second task re-delivers the cache meanwhile.
        """
        resync = asyncio.create_task(self._resync_loop()) if self._resync else None
        try:
            while True:
                await self._back_off(*await self._sync_and_watch())
        finally:
            if resync is not None:
                resync.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await resync
            await self._deliveries.close()

    async def _sync_and_watch(self) -> tuple[int, str]:
        """Fill the cache (a streaming list, else a list), then watch until a watch
        fails; how it failed (the log level and the reason)."""
        if self._synced.is_set():
            self._relists[self._cause] = self._relists.get(self._cause, 0) + 1
        if self._watch_list:
            try:
                failure = await self._watch(initial=True)
            except _Refused as refused:
                self._watch_list, self._watch_list_state = False, False
                logger.info("informer: %s; listing and watching instead", refused)
            else:
                while failure is None:
                    failure = await self._watch()
                return failure
        try:
            await self._list()
        except Exception as exc:  # whatever the cause: back off, list again
            self._errors += 1
            self._cause = _LIST_ERROR
            return logging.WARNING, f"list failed ({exc}); listing again"
        while (failure := await self._watch()) is None:
            pass
        return failure

    async def _back_off(self, level: int, why: str) -> None:
        now = self._clock.now()
        began, self._backoff_began = self._backoff_began, now
        if began is not None and now - began > self._backoff_reset:
            self._rate_limiter.forget(self)  # healthy for a while: start over
        delay = self._rate_limiter.when(self)
        self._backoffs += 1
        logger.log(level, "informer: %s in %.2fs", why, delay)
        await self._sleep(delay)

    async def _list(self) -> None:
        """Every page of a list (one unpaginated list if a continue token expires),
        then the cache replaced by it."""
        started = self._clock.now()
        items: list[Any] = []
        limit, token = self._page_size, ""
        while True:
            kwargs = dict(self._kwargs)
            if limit:
                kwargs["limit"] = limit
            if token:
                kwargs["_continue"] = token
            kwargs.setdefault("_request_timeout", LIST_TIMEOUT)  # a server that stalls is an error
            try:
                result: Any = await self._list_func(*self._args, **kwargs)
            except ApiException as exc:
                if exc.status != GONE or not token:
                    raise
                self._list_restarts += 1
                logger.info("informer: the list's continue token expired (410); listing again")
                items, limit, token = [], None, ""  # as client-go's pager: one full list
                continue
            self._pages += 1
            page_items, rv, token = _page(result)
            items.extend(page_items)
            if not token:
                break
        await self._replace(items, rv, started)

    async def _replace(self, items: Sequence[T], rv: str, started: float) -> None:
        """The cache becomes ``items`` at ``rv``; what changed fires, as relisted.

        The first time, the informer is synced once every handler has handled
        every change (a queue holds every listed key)."""
        received = self._clock.now()
        old_cache, cache = self._cache, {object_key(obj): obj for obj in items}
        self._cache, self._rv = cache, rv
        self._lists += 1
        self._last_sync = received - started
        changes = []
        for key, obj in cache.items():
            old = old_cache.get(key)
            obj_rv = _meta(obj)[2]
            if old is None:
                changes.append(Change(ChangeKind.ADDED, key, obj, None, obj_rv, received, True))
            elif _meta(old)[2] != obj_rv:
                changes.append(Change(ChangeKind.MODIFIED, key, obj, old, obj_rv, received, True))
        for key in old_cache.keys() - cache.keys():
            old = old_cache[key]
            changes.append(Change(ChangeKind.DELETED, key, old, old, _meta(old)[2], received, True))
        for change in changes:
            await self._emit(change)
        if not self._synced.is_set():
            await self._deliveries.join()
            self._synced.set()

    async def _watch(self, *, initial: bool = False) -> tuple[int, str] | None:
        """One watch stream from the last resourceVersion (``initial``: a streaming
        list, whose initial events fill the cache before it goes on as a watch).

        None: it ended normally, watch again. Otherwise it failed: the log
        level and the reason, for the back-off before the re-list. Raises
        ``_Refused`` if a streaming list is not served.
        """
        self._watches += 1
        started, events = self._clock.now(), self._events
        # A streaming list's initial events, until its bookmark (None: that came).
        fresh: dict[str, Any] | None = {} if initial else None
        # The server ends the watch at timeout_seconds; a connection that goes
        # half-open before it would otherwise hang the informer for good.
        kwargs = {"_request_timeout": self._watch_timeout + WATCH_GRACE, **self._kwargs}
        if initial:
            kwargs.update(send_initial_events=True, resource_version_match="NotOlderThan")
            rv = "" if self._cause == _EXPIRED else self._rv
        else:
            rv = self._rv
        try:
            async with Watch() as watch:
                stream = watch.stream(
                    self._list_func,
                    *self._args,
                    resource_version=rv,
                    timeout_seconds=self._watch_timeout,
                    allow_watch_bookmarks=True,
                    **kwargs,
                )
                async for event in stream:
                    if fresh is None:
                        waiting = self._on_event(event, self._clock.now())
                        if waiting is not None:  # max_in_flight changes in flight
                            await waiting
                    elif self._on_initial_event(event, fresh):
                        await self._replace(list(fresh.values()), self._rv, started)
                        self._streamed += 1
                        self._watch_list_state = True
                        fresh = None
        except ApiException as exc:
            if fresh is not None and exc.status in _UNSUPPORTED:
                raise _Refused(f"the server refused a streaming list ({exc.status})") from exc
            if exc.status == GONE:
                self._expired += 1
                self._cause = _EXPIRED
                return logging.INFO, f"resourceVersion {self._rv} is gone (410); re-listing"
            self._errors += 1
            self._cause = _WATCH_ERROR
            return logging.WARNING, f"watch failed ({exc}); re-listing"
        except Exception as exc:  # a broken stream, a malformed event: list again
            self._errors += 1
            self._cause = _WATCH_ERROR
            return logging.WARNING, f"watch stream broke ({exc!r}); re-listing"
        if fresh is not None:
            if not self._watch_list_state:
                raise _Refused("the streaming list ended without its initial-events-end bookmark")
            self._cause = _INCOMPLETE
            return logging.WARNING, "the streaming list ended before its initial events did"
        lasted = self._clock.now() - started
        if lasted < self._short_watch and self._events == events:
            self._short_watches += 1
            self._cause = _SHORT_WATCH_ENDED
            return logging.WARNING, f"watch ended at once ({lasted:.2f}s, no event); re-listing"
        return None

    def _on_initial_event(self, event: dict[str, Any], fresh: dict[str, Any]) -> bool:
        """One event of a streaming list's initial events, into ``fresh``; True at the
        bookmark that ends them."""
        self._events += 1
        kind, obj = event["type"], event["object"]
        if kind == "BOOKMARK":
            self._bookmarks += 1
            meta = event["raw_object"]["metadata"]
            self._rv = meta["resourceVersion"]
            return (meta.get("annotations") or {}).get(INITIAL_EVENTS_END) == "true"
        if kind == "DELETED":
            fresh.pop(object_key(obj), None)
        else:
            fresh[object_key(obj)] = obj
        return False

    def _on_event(self, event: dict[str, Any], received: float) -> Awaitable[None] | None:
        """One watch event into the cache and to the handlers; what to await
        before the next (see ``Deliveries.deliver``), or None."""
        self._events += 1
        kind, obj = event["type"], event["object"]
        if kind == "BOOKMARK":
            self._bookmarks += 1
            self._rv = event["raw_object"]["metadata"]["resourceVersion"]
            return None
        key, rv = object_key(obj), _meta(obj)[2]
        if kind == "DELETED":
            old = self._cache.pop(key, None)
            self._rv = rv
            return self._deliveries.deliver(
                key, Change(ChangeKind.DELETED, key, obj, old, rv, received)
            )
        old = self._cache.get(key)
        self._rv = rv
        if old is not None and _meta(old)[2] == rv:
            return None  # seen already (a watch restarted from an older version)
        self._cache[key] = obj
        change_kind = ChangeKind.ADDED if old is None else ChangeKind.MODIFIED
        return self._deliveries.deliver(key, Change(change_kind, key, obj, old, rv, received))

    # -- resync --------------------------------------------------------------------

    async def _resync_loop(self) -> None:
        """Each ``resync`` period, every key cached when it began, in evenly spaced
        slices (at most ``_RESYNC_SLICES_PER_SECOND`` a second, one per key at most)."""
        period = self._resync
        assert period is not None
        await self._synced.wait()
        most = max(1, math.floor(period * _RESYNC_SLICES_PER_SECOND))
        while True:
            keys = list(self._cache)
            slices = max(1, min(len(keys), most))
            for i in range(slices):
                await self._sleep(period / slices)
                now = self._clock.now()
                for key in keys[i * len(keys) // slices : (i + 1) * len(keys) // slices]:
                    obj = self._cache.get(key)
                    if obj is not None:  # deleted meanwhile: nothing to re-deliver
                        self._resynced += 1
                        await self._emit(
                            Change(ChangeKind.RESYNC, key, obj, obj, _meta(obj)[2], now)
                        )
