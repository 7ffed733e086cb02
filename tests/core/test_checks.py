"""The package's validators (``keyqueue._checks``) and its options object (``_options``).

Each validator returns what it accepts as the type the code uses, and refuses
everything else with the error type and the words pinned here: the queues
(in memory and on Redis), the rate limiters and the runner all raise these.
"""

from __future__ import annotations

import math
import re
from typing import Any

import pytest

from keyqueue import NoopMetrics
from keyqueue._checks import (
    check_count,
    check_delay,
    check_finite,
    check_max_retries,
    check_name,
    check_optional_callable,
    check_rate,
    check_seconds,
    check_timeout,
)
from keyqueue._options import QueueOptions

HUGE = 10**400  # an int beyond float range


@pytest.mark.parametrize(
    ("value", "expected"), [(None, None), (0, 0.0), (1.5, 1.5), (HUGE, math.inf)]
)
def test_check_timeout_takes_none_or_seconds_at_least_zero(value: Any, expected: Any) -> None:
    assert check_timeout(value) == expected


@pytest.mark.parametrize(
    ("value", "error"),
    [(True, TypeError), ("1", TypeError), (-1, ValueError), (math.nan, ValueError)],
)
def test_check_timeout_refuses_saying_the_contract(value: Any, error: type[Exception]) -> None:
    with pytest.raises(error, match=r"^timeout must be None or a number of seconds >= 0, got "):
        check_timeout(value)


def test_check_delay_takes_any_number_and_refuses_the_rest() -> None:
    assert check_delay(-5) == -5.0
    assert check_delay(HUGE) == math.inf
    with pytest.raises(TypeError, match=r"^add_after: delay must be an int or float \(seconds\)"):
        check_delay(True)
    with pytest.raises(ValueError, match="got nan"):
        check_delay(math.nan)


@pytest.mark.parametrize(
    ("value", "positive", "error", "words"),
    [
        ("1", False, TypeError, "lease must be a number of seconds, got '1'"),
        (True, True, TypeError, "lease must be a number of seconds, got True"),
        (-1, False, ValueError, "lease must be finite seconds >= 0, got -1"),
        (0, True, ValueError, "lease must be finite seconds > 0, got 0"),
        (math.nan, True, ValueError, "lease must be finite seconds > 0, got nan"),
        (math.inf, False, ValueError, "lease must be finite seconds >= 0, got inf"),
        (HUGE, True, ValueError, "lease must be finite seconds > 0, got an int beyond float range"),
    ],
)
def test_check_seconds_refuses_naming_the_argument(
    value: Any, positive: bool, error: type[Exception], words: str
) -> None:
    with pytest.raises(error) as raised:
        check_seconds(value, "lease", positive=positive)
    assert str(raised.value) == words


def test_check_seconds_returns_a_float() -> None:
    assert check_seconds(0, "base_delay") == 0.0
    assert type(check_seconds(3, "lease", positive=True)) is float


@pytest.mark.parametrize("value", [0, -1, True, "x", math.nan, math.inf, HUGE])
def test_check_rate_refuses_with_value_error(value: Any) -> None:
    with pytest.raises(ValueError, match=r"^qps must be None or a finite number > 0, got "):
        check_rate(value, "qps", optional=True)
    with pytest.raises(ValueError, match=r"^endpoint_qps must be a finite number > 0, got "):
        check_rate(value, "endpoint_qps")


def test_check_rate_takes_none_only_when_optional() -> None:
    assert check_rate(None, "qps", optional=True) is None
    assert check_rate(2, "qps") == 2.0
    with pytest.raises(ValueError, match="endpoint_qps"):
        check_rate(None, "endpoint_qps")


@pytest.mark.parametrize("value", [0, -1, 1.0, True, "2", None])
def test_check_count_refuses_anything_but_an_int_at_least_the_minimum(value: Any) -> None:
    words = rf"^burst must be an int >= 1, got {re.escape(repr(value))}$"
    with pytest.raises(ValueError, match=words):
        check_count(value, "burst")


def test_check_count_minimum_and_finite_and_callable() -> None:
    assert check_count(0, "max_fast_attempts", 0) == 0
    with pytest.raises(ValueError, match="jitter must be a finite number, got inf"):
        check_finite(math.inf, "jitter")
    check_optional_callable(None, "endpoint")
    with pytest.raises(TypeError, match="endpoint must be None or a callable, got 3"):
        check_optional_callable(3, "endpoint")


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "3"])
def test_check_max_retries_and_name(value: Any) -> None:
    with pytest.raises(ValueError, match="max_retries must be None or an int >= 1"):
        check_max_retries(value)
    if not isinstance(value, str):
        with pytest.raises(TypeError, match="name must be a str"):
            check_name(value)


# -- QueueOptions ----------------------------------------------------------------------


def test_queue_options_check_what_every_queue_takes_and_keep_collaborators_as_given() -> None:
    options = QueueOptions("q", max_retries=3, aging=2)
    assert (options.name, options.max_retries, options.aging) == ("q", 3, 2.0)
    assert isinstance(options.metrics, NoopMetrics)
    assert options.rate_limiter is None  # the queue base resolves it, and the clock
    assert options.clock is None
    with pytest.raises(TypeError, match="metrics must have new_queue_metrics"):
        QueueOptions(metrics=object())
    with pytest.raises(ValueError, match="aging"):
        QueueOptions(aging=0)
    with pytest.raises(TypeError):
        QueueOptions("q", None)  # type: ignore[call-arg]  # collaborators are keyword-only
