"""Argument validators: every check of a caller's input, for the whole package.

Each one returns the value it accepts (as the type the code then uses) or
raises ``TypeError``/``ValueError`` with a message that names the argument,
states the contract and shows what was given. The in-memory fronts, the rate
limiters, the runner and the Redis clients all check with these, so one
argument is refused with the same words wherever it is passed.

``check_number`` is the one test of "a number": an int or a float, never a
bool, never NaN, an int beyond float range as ``±inf`` (or refused, where the
contract says finite). The others are built on it; range checks sit beside
the message they raise.

No validator reads a clock, takes a lock or imports anything beyond the
standard library; this module is compiled with the core (``_build``).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any, Final

__all__ = [
    "PRIORITY_MAX",
    "PRIORITY_MIN",
    "check_add_after",
    "check_aging",
    "check_count",
    "check_delay",
    "check_finite",
    "check_flag",
    "check_keys",
    "check_max_retries",
    "check_name",
    "check_number",
    "check_optional_callable",
    "check_priority",
    "check_rate",
    "check_seconds",
    "check_timeout",
]

PRIORITY_MIN: Final = -(2**31)
PRIORITY_MAX: Final = 2**31 - 1
"""Priorities are 32-bit signed ints, as Kubernetes PriorityClass values."""


def check_number(
    value: object, must: str, *, finite: bool = False, error: type[Exception] = TypeError
) -> float:
    """``value``, an int or a float (a bool is neither), as a float.

    The one check for every number of seconds (delays, timeouts, aging,
    ``Requeue(after=)``) and every numeric argument of a rate limiter. ``must``
    states the contract ("timeout must be None or a number of seconds"); each
    error says it, then what was given: ``error`` (``TypeError`` unless the
    caller's contract says otherwise) for anything but an int or float,
    ``ValueError`` for NaN, and with ``finite=True`` for ``±inf`` and an int
    beyond float range, which is otherwise ``±inf``. Range checks (``>= 0``,
    ``> 0``) are the caller's.
    """
    if isinstance(value, float):
        number = value
    elif isinstance(value, int) and not isinstance(value, bool):
        try:
            number = float(value)
        except OverflowError:
            if finite:
                raise ValueError(f"{must}, got an int beyond float range") from None
            number = math.inf if value > 0 else -math.inf
    else:
        raise error(f"{must}, got {value!r}")
    if math.isnan(number):
        raise ValueError(f"{must}, got nan")
    if finite and math.isinf(number):
        raise ValueError(f"{must}, got {value!r}")
    return number


# -- queue operations ---------------------------------------------------------------


def check_priority(priority: object) -> int:
    """``priority`` if it is an int in the 32-bit range; ``TypeError`` (a bool, a
    float, anything else) or ``ValueError`` (out of range) otherwise."""
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise TypeError(f"priority must be an int, got {priority!r}")
    if not PRIORITY_MIN <= priority <= PRIORITY_MAX:
        raise ValueError(
            f"priority must be an int from {PRIORITY_MIN} to {PRIORITY_MAX}, got {priority!r}"
        )
    return priority


def check_flag(value: object, name: str) -> bool:
    """``value`` if it is a bool; ``TypeError`` naming the argument otherwise
    (``drain='yes'`` is a mistake, not a true value)."""
    if not isinstance(value, bool):
        raise TypeError(f"{name} must be True or False, got {value!r}")
    return value


def check_keys(keys: Iterable[Any]) -> list[Any]:
    """``add_many``'s keys as a list, each one hashed (``TypeError`` if one is
    not hashable), so a bad key raises before any is added. A ``str`` or
    ``bytes`` passed as the iterable raises ``TypeError`` too: its characters
    are not meant as keys (the Redis fronts' ``key_batches`` uses it too)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(f"add_many takes an iterable of keys, got {keys!r}: for one key use add")
    checked = list(keys)
    for key in checked:
        hash(key)
    return checked


def check_timeout(timeout: Any) -> float | None:
    """``None``, or wall seconds >= 0 as a float (an int beyond float range is
    ``inf``: for ever): ``TypeError`` for a bool or a non-number, ``ValueError``
    otherwise. ``get``'s and ``shutdown``'s ``timeout`` on every queue."""
    if timeout is None:
        return None
    if timeout.__class__ is float and timeout >= 0.0:  # the common case, at C speed
        return timeout
    must = "timeout must be None or a number of seconds >= 0"
    seconds = check_number(timeout, must)
    if not seconds >= 0:
        raise ValueError(f"{must}, got {timeout!r}")
    return seconds


def check_delay(delay: object) -> float:
    """``add_after``'s delay as a float: ``TypeError`` for a bool or a
    non-number, ``ValueError`` for NaN; an int beyond float range is as good
    as infinite, and a delay <= 0 means now."""
    return check_number(delay, "add_after: delay must be an int or float (seconds)")


def check_add_after(key: object, delay: object) -> float:
    """Validate an in-memory ``add_after`` request; return the delay as a float.

    Raises ``TypeError`` for an unhashable key (first, before anything is
    counted), then as ``check_delay``. A front calls it once, before anything
    else (a foreign thread's call raises in that thread).
    """
    hash(key)
    return check_delay(delay)


# -- queue construction ---------------------------------------------------------------


def check_name(name: object) -> str:
    """A queue's ``name``: a str (``TypeError`` otherwise)."""
    if not isinstance(name, str):
        raise TypeError(f"name must be a str, got {name!r}")
    return name


def check_max_retries(max_retries: Any) -> int | None:
    """``None`` (never give up), or an int >= 1 (``ValueError`` otherwise, a bool too)."""
    if max_retries is not None and (
        isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 1
    ):
        raise ValueError(f"max_retries must be None or an int >= 1, got {max_retries!r}")
    return max_retries


def check_aging(aging: object) -> float | None:
    """``None`` (strict priorities), or seconds per priority step as a finite float > 0."""
    if aging is None:
        return None
    must = "aging must be None or finite seconds > 0"
    seconds = check_number(aging, must, finite=True)
    if not seconds > 0:
        raise ValueError(f"{must}, got {aging!r}")
    return seconds


def check_seconds(value: object, name: str, *, positive: bool = False) -> float:
    """Finite seconds ``>= 0`` (``> 0`` with ``positive``) as a float: a Redis
    queue's ``lease``, a ``RedisRateLimiter``'s ``base_delay``/``max_delay``.

    ``TypeError`` for a bool or a non-number; ``ValueError`` for NaN, ``±inf``,
    an int beyond float range, or out of range.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise TypeError(f"{name} must be a number of seconds, got {value!r}")
    must = f"{name} must be finite seconds {'>' if positive else '>='} 0"
    return _in_range(value, must, value > 0 if positive else value >= 0)


def check_rate(value: object, name: str, *, optional: bool = False) -> float | None:
    """A rate (``qps``) as a finite float > 0, or None if ``optional`` allows it;
    ``ValueError`` for anything else (a bool and a non-number too), naming ``name``."""
    if value is None and optional:
        return None
    must = f"{name} must be {'None or ' if optional else ''}a finite number > 0"
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{must}, got {value!r}")
    return _in_range(value, must, value > 0)


def _in_range(value: int | float, must: str, above_bound: bool) -> float:
    """``value`` as a float if it is above its lower bound and finite (NaN is
    neither); ``ValueError`` saying ``must`` otherwise."""
    if not (above_bound and value < math.inf):
        raise ValueError(f"{must}, got {value!r}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{must}, got an int beyond float range") from None


def check_count(value: object, name: str, minimum: int = 1) -> int:
    """An int ``>= minimum`` (``burst``, ``max_tracked``, ``max_endpoints``...);
    ``ValueError`` naming ``name`` for anything else, a bool too."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_finite(value: object, name: str) -> float:
    """``value`` as a finite float; ``ValueError`` naming ``name`` otherwise (a
    rate limiter's parameters)."""
    return check_number(value, f"{name} must be a finite number", finite=True, error=ValueError)


def check_optional_callable(value: object, name: str) -> None:
    """``None`` or a callable; ``TypeError`` naming ``name`` otherwise."""
    if value is not None and not callable(value):
        raise TypeError(f"{name} must be None or a callable, got {value!r}")
