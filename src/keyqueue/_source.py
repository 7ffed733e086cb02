"""Where a runner's workers take keys from: the ``WorkerSource`` seam, no I/O.

A worker takes a key (``source.queue.get()``), runs its handler, applies the
outcome through ``source.queue`` (``_outcome.outcome_flow``), then reports
the outcome (``source.report``): the key's ``done``, made now or queued to go
with a later call. A worker that stops calls ``leave``; the run calls
``close`` once every worker has left. Each step that may wait is a ``Flow``
(``_flow``), which the runner drives (``drive`` in a thread, ``adrive`` on a
loop), so one source serves both runners and each runner says each rule once.

Two sources:

- ``OneAtATime``: the queue's own ``get`` and ``done``, once per key. For the
  in-memory queues, a proxy of any queue, and a Redis queue whose batching
  is off.
- a batched source, registered for its queue type with ``batch_with``:
  ``keyqueue.redis`` registers its claims (keys claimed and dones sent in
  batches, one script for many keys).

``worker_source`` picks one, explicitly: ``batch=None`` (the runners'
default) means the queue's own choice (a registered type's ``batch``
property), ``True`` a batched source (``TypeError`` for a queue type none is
registered for), ``False`` one at a time. The type is looked up by its
class's MRO: a subclass of a registered queue is batched too, and a proxy
object (whatever its ``__getattr__`` forwards) is not. A batched source calls
neither the queue's ``get`` nor its ``done``: a queue that replaces either
(a subclass overriding it, or an attribute set on the instance) is refused
with ``TypeError`` rather than silently skipped; pass ``batch=False`` to have
the workers call them. A replaced ``forget`` is called by the batched source
instead of being folded into its batched ``done``.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

from ._checks import check_flag
from ._flow import Flow, Pause
from ._outcome import Queue, Taking, done_flow

__all__ = ["OneAtATime", "WorkerSource", "batch_with", "worker_source"]

K = TypeVar("K")
K_contra = TypeVar("K_contra", contravariant=True)
G = TypeVar("G")
G_co = TypeVar("G_co", covariant=True)

_BYPASSED = ("get", "done")  # what a batched source does not call on its queue


class WorkerSource(Protocol[K_contra, G_co]):
    """What a runner's workers take keys from and report outcomes to."""

    @property
    def queue(self) -> Taking[K_contra, G_co]:
        """What a worker calls: ``get`` (a key, or an awaitable of one) and the
        outcome's calls (``forget``, ``retry``, ``add_after``...)."""
        ...

    def report(self, key: K_contra, outcome: str, pause: Pause | None) -> Flow[str]:
        """The worker is finished with ``key`` (its outcome applied): its
        ``done``. Returns the outcome to count (a failed ``done`` may change it)."""
        ...

    def requeue(self, key: K_contra) -> Flow[None]:
        """The handler of ``key`` was cancelled: the key is to be handed out
        again (``add``), before its ``report``."""
        ...

    def leave(self) -> Flow[None]:
        """A worker stops (called once per worker, whatever ended it)."""
        ...

    def close(self, abort: bool) -> Flow[Counter[str]]:
        """The run ended, every worker left (``abort``: not waited for). Returns
        the outcome counts a late answer changed, to add to the run's tallies."""
        ...


class OneAtATime(Generic[K, G]):
    """The queue itself, one ``get`` and one ``done`` per key."""

    __slots__ = ("queue",)

    def __init__(self, queue: Queue[K, G]) -> None:
        self.queue: Queue[K, G] = queue

    def report(self, key: K, outcome: str, pause: Pause | None) -> Flow[str]:
        return done_flow(self.queue, key, outcome, pause)

    def requeue(self, key: K) -> Flow[None]:
        yield functools.partial(self.queue.add, key)

    def leave(self) -> Flow[None]:
        return
        yield  # a generator: nothing to call

    def close(self, abort: bool) -> Flow[Counter[str]]:
        return Counter()
        yield  # a generator: nothing to call


BatchedSource = Callable[[Any, bool], WorkerSource[Any, Any]]
"""Makes a queue's batched source; the bool: whether it folds ``forget`` into
its batched ``done`` (False when the queue's ``forget`` is replaced)."""

_BATCHED: dict[type, BatchedSource] = {}


def batch_with(queue_type: type, make: BatchedSource) -> None:
    """Register ``make`` as the batched source of ``queue_type`` and its
    subclasses. ``queue_type`` has a ``batch`` property: the default choice."""
    _BATCHED[queue_type] = make


def worker_source(queue: Any, batch: bool | None) -> WorkerSource[Any, Any]:
    """The source a run's workers use on ``queue`` (the module's docstring).
    ``TypeError``: ``batch`` not a bool or None; ``batch=True`` on a queue of
    no batched type; a batched queue whose ``get`` or ``done`` is replaced."""
    if batch is not None:
        check_flag(batch, "batch")
    for base in type(queue).__mro__:
        make = _BATCHED.get(base)
        if make is not None:
            break
    else:
        if batch:
            raise TypeError(
                f"batch=True: {type(queue).__name__} has no batched workers (a Redis "
                "queue has); leave batch unset or False"
            )
        return OneAtATime(queue)
    if not (queue.batch if batch is None else batch):
        return OneAtATime(queue)
    for method in _BYPASSED:
        if _replaced(queue, base, method):
            where = (
                f"{method} is set on the instance"
                if method in vars(queue)
                else f"{type(queue).__name__} overrides {method}"
            )
            raise TypeError(
                f"{base.__name__} {queue.name!r}: {where}, which the runners do not call "
                "on a batched queue (they claim keys and send their dones in batches); pass "
                f"batch=False (to the runner, or to {type(queue).__name__}(...)) to have them "
                "call get and done per key"
            )
    return make(queue, not _replaced(queue, base, "forget"))


def _replaced(queue: object, base: type, method: str) -> bool:
    """Whether ``queue`` replaces ``base``'s ``method`` (its class or the instance)."""
    return method in vars(queue) or getattr(type(queue), method) is not getattr(base, method)
