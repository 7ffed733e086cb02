"""A queue's options, checked once: what every queue takes besides its keys.

``QueueOptions`` is the one place the common constructor arguments are
written out (as fields) and checked. The fronts' constructors take
``*args, **options`` and hand them to ``options_for``, which refuses a call
the public signature would refuse, naming the queue's class (``WorkQueue()
takes ...``), not this one, then to ``QueueOptions``; the public classes
declare the key-typed signature users see (``_queues``' stubs, shown by
``help`` and ``inspect``), and a Redis queue adds what only it has (``url``,
``client``, ``lease``) beside the same object.

What each backend makes of a collaborator is the backend's: ``rate_limiter``
and ``clock`` are kept as given here (``None`` included), and each queue base
resolves them (an in-memory queue: client-go's default limiter on the
monotonic clock; a Redis queue: ``RedisRateLimiter()`` on the server's clock,
``clock=`` for a virtual clock only). ``name``, ``max_retries``, ``aging``,
``fair_by`` and ``metrics`` mean the same everywhere and are checked here, in
that order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

from ._checks import check_aging, check_max_retries, check_name
from ._metrics import MetricsProvider, NoopMetrics

__all__ = ["QueueOptions", "options_for"]


@dataclass(frozen=True, slots=True, init=False)
class QueueOptions:
    """The common constructor arguments of every queue, checked.

    ``QueueOptions(name, rate_limiter=..., max_retries=..., clock=...,
    metrics=..., aging=..., fair_by=...)``: arguments as a queue's constructor takes them
    (``Any``: checked here, with the errors the queues document).
    """

    name: str
    """The queue's name (metrics label, a Redis queue's hash tag)."""
    rate_limiter: Any
    """As given (``None``: the backend's default); resolved by the queue base."""
    max_retries: int | None
    """Failures after which ``retry`` gives a key up (None: never)."""
    clock: Any
    """As given (``None``: the backend's clock); resolved by the queue base."""
    metrics: MetricsProvider
    """The metrics provider (``NoopMetrics()`` when none was given)."""
    aging: float | None
    """Seconds a waiting key takes to gain one priority step (None: strict)."""
    fair_by: Callable[[Any], str] | None
    """A key's group (a str): round-robin across groups within a priority (None: FIFO)."""

    def __init__(
        self,
        name: Any = "",
        *,
        rate_limiter: Any = None,
        max_retries: Any = None,
        clock: Any = None,
        metrics: Any = None,
        aging: Any = None,
        fair_by: Any = None,
    ) -> None:
        set_field = object.__setattr__  # frozen: fields are set once, here
        set_field(self, "name", check_name(name))
        set_field(self, "max_retries", check_max_retries(max_retries))
        set_field(self, "aging", check_aging(aging))
        if fair_by is not None and not callable(fair_by):
            raise TypeError(f"fair_by must be a callable (key -> str) or None, got {fair_by!r}")
        set_field(self, "fair_by", fair_by)
        provider = NoopMetrics() if metrics is None else metrics
        if not isinstance(provider, MetricsProvider):
            raise TypeError(f"metrics must have new_queue_metrics(), got {metrics!r}")
        set_field(self, "metrics", provider)
        set_field(self, "rate_limiter", rate_limiter)
        set_field(self, "clock", clock)


_KEYWORDS = frozenset(field.name for field in fields(QueueOptions))


def options_for(queue: object, args: tuple[Any, ...], options: dict[str, Any]) -> QueueOptions:
    """``QueueOptions(*args, **options)`` for ``queue``'s constructor: a call
    its signature refuses (``name`` is the one positional argument, the rest
    are keywords) is the ``TypeError`` Python would raise, naming its class."""
    if len(args) > 1:
        raise TypeError(
            f"{type(queue).__name__}() takes 1 positional argument (name) but {len(args)} "
            f"were given; the others are keyword-only: {', '.join(sorted(_KEYWORDS - {'name'}))}"
        )
    for keyword in options:
        if keyword not in _KEYWORDS:
            raise TypeError(
                f"{type(queue).__name__}() got an unexpected keyword argument {keyword!r}"
            )
    if args and "name" in options:
        raise TypeError(f"{type(queue).__name__}() got multiple values for argument 'name'")
    return QueueOptions(*args, **options)
