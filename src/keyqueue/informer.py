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
``kubernetes_asyncio``'s ``Watch``, so the same code runs against a real cluster
and any Kubernetes-shaped API server). Every list and every watch event updates
a local cache keyed ``namespace/name`` (``name`` for cluster-scoped objects) and
calls the handlers with a ``Change``; ``queue=`` registers one that calls
``queue.add(key)``. When a watch ends normally (its timeout) the informer
watches again from the last resourceVersion it saw, so nothing is missed. When
the server answers ``410 Gone`` (that version is compacted away) or the stream
breaks, it lists again and reconciles the cache with the list: objects new to
it are ADDED, objects whose resourceVersion changed are MODIFIED, objects that
vanished are DELETED; unchanged objects fire nothing. Keys are neither lost
(every change after the last event seen shows up in the new list) nor
duplicated beyond what the queue coalesces anyway.

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

Handlers run on the informer's task, one change at a time, in the order the
server sent them; a raising handler is logged and the informer goes on. The
cache holds whatever the client returns: models (``V1ConfigMap``) for typed
APIs, dicts for ``CustomObjectsApi``. There is no periodic resync.
"""

from __future__ import annotations

import asyncio
import enum
import inspect
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

try:
    from kubernetes_asyncio.client.exceptions import ApiException
    from kubernetes_asyncio.watch import Watch
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "keyqueue.informer needs kubernetes_asyncio: pip install 'keyqueue[kube]'"
    ) from exc

from ._clock import Clock, resolve_clock
from ._core import check_number
from ._ratelimit import ItemExponentialFailureRateLimiter, RateLimiter

__all__ = ["Change", "ChangeKind", "Informer", "InformerStats", "object_key"]

logger = logging.getLogger("keyqueue.informer")

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)

GONE = 410
# client-go's reflector: wait.NewExponentialBackoffManager(800ms, 30s, 2m, 2.0, 1.0)
# and its "very short watch" (under a second, no event).
_BACKOFF_INITIAL = 0.8
_BACKOFF_MAX = 30.0
_BACKOFF_JITTER = 1.0
_BACKOFF_RESET = 120.0
_SHORT_WATCH = 1.0


class _Adds(Protocol):
    def add(self, key: str) -> None: ...


class _Listed(Protocol[T_co]):
    # What a typed list call returns (V1ConfigMapList): its items give the
    # informer's T, so Informer(v1.list_namespaced_config_map, ...) needs no
    # annotation. An untyped call (Any) makes it Informer[Any].
    @property
    def items(self) -> Sequence[T_co] | None: ...


class ChangeKind(enum.Enum):
    """What happened to an object, as the informer's cache saw it."""

    ADDED = "ADDED"
    MODIFIED = "MODIFIED"
    DELETED = "DELETED"


@dataclass(frozen=True, slots=True)
class Change(Generic[T]):
    """One change handed to the handlers."""

    kind: ChangeKind
    key: str
    """``namespace/name``, or ``name`` for a cluster-scoped object."""
    obj: T
    """The object now (for DELETED: its last state)."""
    old: T | None
    """The cached object before this change (None for ADDED)."""
    resource_version: str
    received: float
    """The informer's clock when the change arrived (the decoded watch event, or the list)."""
    relisted: bool = False
    """True if a list found it (start-up, or a re-list after 410 or a broken stream)."""


@dataclass(frozen=True, slots=True)
class InformerStats:
    """A snapshot of what the informer has done so far."""

    lists: int
    """Successful lists (the first, then one per re-list)."""
    watches: int
    """Watch streams opened."""
    events: int
    """Watch events received (bookmarks included)."""
    expired: int
    """Watches the server ended with 410 Gone."""
    errors: int
    """Failed lists and broken watch streams."""
    short_watches: int
    """Watches that ended within ``short_watch`` seconds having delivered no event."""
    backoffs: int
    """Back-offs begun: after a failed list, and a watch that ended at once, failed or got 410."""
    resource_version: str
    cached: int


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


class Informer(Generic[T]):
    """List, then watch, ``list_func(*args, **kwargs)``; keep a cache; call handlers.

    ``list_func`` is a ``kubernetes_asyncio`` list call such as
    ``CoreV1Api().list_namespaced_config_map``; ``args`` and ``kwargs`` go to
    every list and watch call (a namespace, a label selector). ``T``, the
    cached objects' type, comes from the items of what ``list_func`` returns
    (``Informer[V1ConfigMap]`` for ``list_namespaced_config_map``); annotate
    it for a call that returns dicts (``Informer[dict[str, Any]]``). ``queue``: any
    object with ``add(key)`` (``AsyncWorkQueue``, ``WorkQueue``); each change
    adds its key. ``watch_timeout``: seconds each watch asks the server to
    stay open.

    Pacing (see the module docstring for the rules): ``rate_limiter`` says how
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
    every back-off awaits that instead of ``asyncio.sleep``: a test's clock
    that jumps makes back-offs take no wall time. ``TypeError`` or
    ``ValueError`` for a bad argument, naming it.
    """

    def __init__(
        self,
        list_func: Callable[..., Awaitable[_Listed[T] | Mapping[str, Any]]],
        *args: Any,
        queue: _Adds | None = None,
        watch_timeout: int = 300,
        rate_limiter: RateLimiter | None = None,
        backoff_reset: float = _BACKOFF_RESET,
        short_watch: float = _SHORT_WATCH,
        clock: Clock | None = None,
        **kwargs: Any,
    ) -> None:
        if isinstance(watch_timeout, bool) or not isinstance(watch_timeout, int):
            raise TypeError(f"watch_timeout must be an int of seconds, got {watch_timeout!r}")
        if watch_timeout < 1:
            raise ValueError(f"watch_timeout must be >= 1 second, got {watch_timeout!r}")
        if rate_limiter is None:
            rate_limiter = ItemExponentialFailureRateLimiter(
                _BACKOFF_INITIAL, _BACKOFF_MAX, jitter=_BACKOFF_JITTER
            )
        elif not isinstance(rate_limiter, RateLimiter):
            raise TypeError(f"rate_limiter must be a RateLimiter, got {rate_limiter!r}")
        self._list_func = list_func
        self._args = args
        self._kwargs = kwargs
        self._watch_timeout = watch_timeout
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
        self._handlers: list[Callable[[Change[T]], None]] = []
        self._synced = asyncio.Event()
        self._rv = ""  # the last resourceVersion seen: where the next watch starts
        self._lists = self._watches = self._events = self._expired = self._errors = 0
        self._short_watches = self._backoffs = 0
        if queue is not None:
            add = queue.add
            self.add_handler(lambda change: add(change.key))

    # -- handlers and the cache ----------------------------------------------------

    def add_handler(self, handler: Callable[[Change[T]], None]) -> Callable[[], None]:
        """Call ``handler(change)`` for every change; returns a function that removes it.

        Added before ``run()``, it also sees the first list's objects as ADDED.
        """
        self._handlers.append(handler)

        def remove() -> None:
            if handler in self._handlers:
                self._handlers.remove(handler)

        return remove

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
        """True once the first list has filled the cache."""
        return self._synced.is_set()

    async def wait_synced(self) -> None:
        """Wait until the first list has filled the cache (bound it with ``asyncio.timeout``)."""
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
        )

    def _emit(self, change: Change[T]) -> None:
        for handler in list(self._handlers):
            try:
                handler(change)
            except Exception:
                logger.exception("informer handler %r raised for %s", handler, change.key)

    # -- the loop ------------------------------------------------------------------

    async def run(self) -> None:
        """List and watch until cancelled. Never returns on its own.

        Every failure (a list that fails; a watch that ends at once, fails or
        gets 410) backs off before the next list; a watch that ends normally
        is reopened at once from the last resourceVersion seen.
        """
        while True:
            try:
                await self._list()
            except Exception as exc:  # whatever the cause: back off, list again
                self._errors += 1
                await self._back_off(logging.WARNING, f"list failed ({exc}); listing again")
                continue
            while (failure := await self._watch()) is None:
                pass
            await self._back_off(*failure)

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
        result: Any = await self._list_func(*self._args, **self._kwargs)
        received = self._clock.now()
        if isinstance(result, dict):
            items, rv = result.get("items") or [], result["metadata"]["resourceVersion"]
        else:
            items, rv = result.items or [], result.metadata.resource_version
        old_cache, cache = self._cache, {object_key(obj): obj for obj in items}
        self._cache, self._rv = cache, rv
        self._lists += 1
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
        self._synced.set()
        for change in changes:
            self._emit(change)

    async def _watch(self) -> tuple[int, str] | None:
        """One watch stream from the last resourceVersion.

        None: it ended normally, watch again. Otherwise it failed: the log
        level and the reason, for the back-off before the re-list.
        """
        self._watches += 1
        started, events = self._clock.now(), self._events
        try:
            async with Watch() as watch:
                stream = watch.stream(
                    self._list_func,
                    *self._args,
                    resource_version=self._rv,
                    timeout_seconds=self._watch_timeout,
                    allow_watch_bookmarks=True,
                    **self._kwargs,
                )
                async for event in stream:
                    self._on_event(event, self._clock.now())
        except ApiException as exc:
            if exc.status == GONE:
                self._expired += 1
                return logging.INFO, f"resourceVersion {self._rv} is gone (410); re-listing"
            self._errors += 1
            return logging.WARNING, f"watch failed ({exc}); re-listing"
        except Exception as exc:  # a broken stream, a malformed event: list again
            self._errors += 1
            return logging.WARNING, f"watch stream broke ({exc!r}); re-listing"
        lasted = self._clock.now() - started
        if lasted < self._short_watch and self._events == events:
            self._short_watches += 1
            return logging.WARNING, f"watch ended at once ({lasted:.2f}s, no event); re-listing"
        return None

    def _on_event(self, event: dict[str, Any], received: float) -> None:
        self._events += 1
        kind, obj = event["type"], event["object"]
        if kind == "BOOKMARK":
            self._rv = event["raw_object"]["metadata"]["resourceVersion"]
            return
        key, rv = object_key(obj), _meta(obj)[2]
        if kind == "DELETED":
            old = self._cache.pop(key, None)
            self._rv = rv
            self._emit(Change(ChangeKind.DELETED, key, obj, old, rv, received))
            return
        old = self._cache.get(key)
        self._rv = rv
        if old is not None and _meta(old)[2] == rv:
            return  # seen already (a watch restarted from an older version)
        self._cache[key] = obj
        change_kind = ChangeKind.ADDED if old is None else ChangeKind.MODIFIED
        self._emit(Change(change_kind, key, obj, old, rv, received))
