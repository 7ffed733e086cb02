"""The public queues: ``WorkQueue`` and ``AsyncWorkQueue``.

Theory of operation
-------------------
Each public queue is its front (``_threading.ThreadingFront``,
``_asyncio.AsyncioFront``) and nothing more: every call runs the front's method,
compiled or not, with no layer in between. What this module adds is what a
class compiled by mypyc cannot have, so it is the one module of the queues
that is never compiled:

- the key type. A compiled generic class gets a weakref slot its deallocator
  never clears (mypyc/mypyc#1102: a weak reference to a dropped queue would
  dangle), so the fronts are not generic and take ``Any``; the classes here
  are ``Generic[K]`` and declare the key-typed signatures for type checkers
  only (``if TYPE_CHECKING``), so nothing stands between a call and the front.
- weak references. Being interpreted, these classes get a ``__weakref__``
  slot that CPython clears as usual: a dropped queue is collected even while
  its timer or a ``FakeClock`` still refers to it weakly.
- methods held weakly. ``weakref.WeakMethod`` takes only Python functions, so
  the two callbacks held that way (a virtual clock's ``_on_clock_step``, a
  metrics provider's ``_gauges``) are Python methods here, calling the front's.
- subclassing. Users may subclass these classes; an override is seen by the
  front's own calls too (mypyc looks methods up by name on an interpreted
  subclass).
- help. mypyc keeps no docstrings or annotations; the metaclass
  (``_help.Documented``) shows, on class look-ups only (``help``, ``inspect``),
  the front's docstrings with the stubs' signatures, so both builds read alike
  and an instance's calls still go straight to the front.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Generic, TypeVar

from ._asyncio import AsyncioFront
from ._help import Documented
from ._metrics import QueueGauges
from ._threading import ThreadingFront

if TYPE_CHECKING:
    from ._clock import Clock
    from ._dead import DeadKey
    from ._events import Event
    from ._metrics import MetricsProvider
    from ._ratelimit import RateLimiter
    from ._snapshot import Snapshot

__all__ = ["AsyncWorkQueue", "WorkQueue"]

K = TypeVar("K")


class WorkQueue(ThreadingFront, Generic[K], metaclass=Documented):
    """A thread-safe work queue with client-go's semantics (see DESIGN.md).

    Keys are any hashable. A key added while it waits is stored once; a key
    added while a worker holds it is handed out once more after that worker's
    ``done``; no two workers ever hold the same key.

    ``rate_limiter=None`` means ``default_controller_rate_limiter()`` on this
    queue's clock. ``max_retries=N`` makes ``retry`` give up on a key's N-th
    failure. ``clock`` governs delays, backoff and metrics; ``get(timeout=)`` and
    drain timeouts are wall time.

    Priorities: ``add(key, priority=p)`` (and ``add_after``,
    ``add_rate_limited``): higher is handed out first, first come first served
    within a priority; a key keeps the highest priority it was added with
    until its ``get``. ``aging=None`` is strict; ``aging=a`` (seconds) raises a
    waiting key's effective priority by one every ``a`` seconds it waits, so
    it waits at most ``(P_max - p) * a`` plus the time to serve what was ahead
    of it (docs/fairness.md). ``fair_by=fn`` (``fn(key) -> str``, the key's
    group, e.g. a namespace) hands keys out round-robin across the groups
    with keys waiting, within a priority, FIFO within a group.
    """

    if TYPE_CHECKING:  # the signatures with the key type; the front's methods run

        def __init__(
            self,
            name: str = "",
            *,
            rate_limiter: RateLimiter | None = None,
            max_retries: int | None = None,
            clock: Clock | None = None,
            metrics: MetricsProvider | None = None,
            aging: float | None = None,
            fair_by: Callable[[K], str] | None = None,
        ) -> None: ...
        def add(self, key: K, priority: int = 0) -> None: ...
        def add_many(self, keys: Iterable[K], priority: int = 0) -> None: ...
        def add_after(self, key: K, seconds: float, priority: int = 0) -> None: ...
        def add_rate_limited(self, key: K, priority: int = 0) -> None: ...
        def forget(self, key: K) -> None: ...
        def retry(self, key: K) -> bool: ...
        def give_up(self, key: K, reason: str, error: BaseException | None = None) -> None: ...
        def dead(self, limit: int = 100) -> tuple[DeadKey[K], ...]: ...
        def replay(self, key: K) -> bool: ...
        def replay_all(self) -> int: ...
        def forget_dead(self, key: K) -> bool: ...
        def get_nowait(self) -> K: ...
        def get(self, timeout: float | None = None) -> K: ...
        def interrupt(self) -> None: ...
        def done(self, key: K) -> None: ...
        def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool: ...
        def join(self, timeout: float | None = None) -> bool: ...
        def num_requeues(self, key: K) -> int: ...
        def snapshot(self, limit: int = 100) -> Snapshot[K]: ...
        def subscribe(self, callback: Callable[[Event[K]], None]) -> Callable[[], None]: ...

    def _on_clock_step(self) -> None:  # a Python method: a virtual clock holds it weakly
        super()._on_clock_step()

    def _gauges(self) -> QueueGauges:  # a Python method: a metrics provider holds it weakly
        return super()._gauges()


class AsyncWorkQueue(AsyncioFront, Generic[K], metaclass=Documented):
    """An asyncio work queue with client-go's semantics (see DESIGN.md).

    The same rules as ``WorkQueue``, on the same core: coalescing, one
    redelivery, per-key exclusion, delays, priorities and ``aging``, rate
    limiting, retries, stats, events and metrics. ``get`` and ``shutdown`` are
    coroutines of the queue's loop; everything else is a plain method, safe
    from any thread.

    On the loop's thread no plain method blocks. From another thread, ``add``,
    ``add_after`` and ``add_rate_limited`` check their arguments, hand the call
    to the loop and return; ``done``, ``get_nowait``, ``retry``, ``forget``,
    ``stats`` and ``snapshot`` block until the loop has run them and return
    their result or raise their exception, or raise ``RuntimeError`` (changing
    nothing) if the loop is not running. Shut down from another thread with
    ``asyncio.run_coroutine_threadsafe(q.shutdown(drain=True), loop).result()``.
    """

    if TYPE_CHECKING:  # the signatures with the key type; the front's methods run

        def __init__(
            self,
            name: str = "",
            *,
            rate_limiter: RateLimiter | None = None,
            max_retries: int | None = None,
            clock: Clock | None = None,
            metrics: MetricsProvider | None = None,
            aging: float | None = None,
            fair_by: Callable[[K], str] | None = None,
        ) -> None: ...
        def add(self, key: K, priority: int = 0) -> None: ...
        def add_many(self, keys: Iterable[K], priority: int = 0) -> None: ...
        def add_after(self, key: K, seconds: float, priority: int = 0) -> None: ...
        def add_rate_limited(self, key: K, priority: int = 0) -> None: ...
        def forget(self, key: K) -> None: ...
        def retry(self, key: K) -> bool: ...
        def give_up(self, key: K, reason: str, error: BaseException | None = None) -> None: ...
        def dead(self, limit: int = 100) -> tuple[DeadKey[K], ...]: ...
        def replay(self, key: K) -> bool: ...
        def replay_all(self) -> int: ...
        def forget_dead(self, key: K) -> bool: ...
        def get_nowait(self) -> K: ...
        async def get(self, timeout: float | None = None) -> K: ...
        def interrupt(self) -> None: ...
        def done(self, key: K) -> None: ...
        async def shutdown(self, drain: bool = False, timeout: float | None = None) -> bool: ...
        async def join(self, timeout: float | None = None) -> bool: ...
        def num_requeues(self, key: K) -> int: ...
        def snapshot(self, limit: int = 100) -> Snapshot[K]: ...
        def subscribe(self, callback: Callable[[Event[K]], None]) -> Callable[[], None]: ...

    def _on_clock_step(self) -> None:  # a Python method: a virtual clock holds it weakly
        super()._on_clock_step()

    def _gauges(self) -> QueueGauges:  # a Python method: a metrics provider holds it weakly
        return super()._gauges()
