"""The public surface: the export list, import cost, exception types, constructor errors."""

from __future__ import annotations

import asyncio
import queue
import subprocess
import sys
import textwrap
import typing
from typing import Any

import pytest

import keyqueue
import keyqueue.testing
from keyqueue import Empty, ShutDown, WorkQueue

EXPORTS = [
    "COMPILED",
    "AsyncWorkQueue",
    "BucketRateLimiter",
    "Clock",
    "DeadKey",
    "DelayedKey",
    "Empty",
    "EndpointRateLimiter",
    "Event",
    "EventKind",
    "FailingKey",
    "HeldKey",
    "ItemExponentialFailureRateLimiter",
    "ItemFastSlowRateLimiter",
    "MaxOfRateLimiter",
    "MetricsProvider",
    "MonotonicClock",
    "NoopMetrics",
    "PermanentError",
    "QueueGauges",
    "RateLimiter",
    "Requeue",
    "RunStats",
    "ShutDown",
    "Snapshot",
    "Stats",
    "WaitingKey",
    "WithMaxWaitRateLimiter",
    "WorkQueue",
    "__version__",
    "arun_workers",
    "default_controller_rate_limiter",
    "run_workers",
]


def run_python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_all_is_exactly_the_intended_export_list() -> None:
    assert sorted(keyqueue.__all__) == sorted(EXPORTS)
    assert len(keyqueue.__all__) == len(set(keyqueue.__all__))


@pytest.mark.parametrize("name", EXPORTS)
def test_every_exported_name_is_importable(name: str) -> None:
    namespace: dict[str, Any] = {}
    exec(f"from keyqueue import {name}", namespace)
    assert namespace[name] is getattr(keyqueue, name)


def test_star_import_gives_exactly_the_export_list() -> None:
    namespace: dict[str, Any] = {}
    exec("from keyqueue import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == sorted(EXPORTS)


def test_testing_module_exports_the_fake_clock_and_the_server_launchers() -> None:
    assert keyqueue.testing.__all__ == [
        "AddRecord",
        "EtcdError",
        "FakeClock",
        "HistoryCheck",
        "HoldRecord",
        "MemoryFence",
        "ValkeyCluster",
        "ValkeyError",
        "ValkeyFence",
        "ValkeyNode",
        "ValkeySentinelSet",
        "ValkeyServer",
        "Violation",
        "check_history",
        "etcd_binary",
        "free_port",
        "local_etcd",
        "local_valkey",
        "valkey_binary",
    ]


def test_import_keyqueue_does_not_import_optional_dependencies() -> None:
    result = run_python(
        """
        import sys
        import keyqueue
        q = keyqueue.WorkQueue("x")
        q.add("a")
        heavy = [m for m in ("prometheus_client", "redis") if m in sys.modules]
        print(heavy)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_prometheus_module_without_the_extra_says_how_to_install_it() -> None:
    result = run_python(
        """
        import sys
        sys.modules["prometheus_client"] = None  # as if not installed
        try:
            import keyqueue.prometheus
        except ImportError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "pip install 'keyqueue[prometheus]'" in result.stdout


def test_empty_subclasses_both_standard_empty_exceptions() -> None:
    assert issubclass(Empty, queue.Empty)
    assert issubclass(Empty, asyncio.QueueEmpty)
    with pytest.raises(queue.Empty):
        WorkQueue().get_nowait()
    with pytest.raises(asyncio.QueueEmpty):
        WorkQueue().get_nowait()


def test_shutdown_is_an_exception_but_not_an_empty() -> None:
    assert issubclass(ShutDown, Exception)
    assert not issubclass(ShutDown, queue.Empty)


def test_workqueue_can_be_subscripted_with_the_key_type() -> None:
    alias = WorkQueue[str]
    q = alias("typed")
    assert isinstance(q, WorkQueue)
    q.add("a")
    assert q.get_nowait() == "a"
    pair = WorkQueue[tuple[str, str]]
    assert (typing.get_origin(pair), typing.get_args(pair)) == (WorkQueue, (tuple[str, str],))


def test_workqueue_accepts_any_hashable_key() -> None:
    q: WorkQueue[Any] = WorkQueue()
    for key in ("a", 1, ("ns", "name"), frozenset({1}), None):
        q.add(key)
    assert [q.get_nowait() for _ in range(5)] == ["a", 1, ("ns", "name"), frozenset({1}), None]


def test_unhashable_key_is_rejected() -> None:
    q: WorkQueue[Any] = WorkQueue()
    with pytest.raises(TypeError):
        q.add(["not", "hashable"])
    assert len(q) == 0


def test_collaborators_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        WorkQueue("x", None)  # type: ignore[misc]


class _Mine(WorkQueue[str]):
    pass


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: WorkQueue("x", "y"), r"^WorkQueue\(\) takes 1 positional argument \(name\) but 2"),
        (lambda: keyqueue.AsyncWorkQueue("x", "y"), r"^AsyncWorkQueue\(\) takes 1 positional"),
        (lambda: _Mine("x", "y"), r"^_Mine\(\) takes 1 positional"),
        (
            lambda: WorkQueue("x", retries=3),
            r"^WorkQueue\(\) got an unexpected keyword argument 'retries'",
        ),
        (
            lambda: WorkQueue("x", name="y"),
            r"^WorkQueue\(\) got multiple values for argument 'name'",
        ),
    ],
)
def test_a_wrong_call_names_the_queue_class_not_an_internal_one(make: Any, message: str) -> None:
    with pytest.raises(TypeError, match=message) as raised:
        make()
    assert "QueueOptions" not in str(raised.value)


@pytest.mark.parametrize("max_retries", [0, -1, 1.5, True, "3"])
def test_bad_max_retries_raises_value_error(max_retries: Any) -> None:
    with pytest.raises(ValueError, match="max_retries"):
        WorkQueue(max_retries=max_retries)


def test_max_retries_none_and_positive_are_accepted() -> None:
    assert WorkQueue(max_retries=None).max_retries is None
    assert WorkQueue(max_retries=1).max_retries == 1


def test_rate_limiter_that_is_not_a_limiter_raises_type_error() -> None:
    with pytest.raises(TypeError, match="rate_limiter"):
        WorkQueue(rate_limiter=object())  # type: ignore[arg-type]


def test_metrics_that_is_not_a_provider_raises_type_error() -> None:
    with pytest.raises(TypeError, match="metrics"):
        WorkQueue(metrics=object())  # type: ignore[arg-type]


def test_clock_without_now_raises_type_error() -> None:
    with pytest.raises(TypeError, match="clock"):
        WorkQueue(clock=object())  # type: ignore[arg-type]


def test_name_that_is_not_a_str_raises_type_error() -> None:
    with pytest.raises(TypeError, match="name"):
        WorkQueue(42)  # type: ignore[arg-type]


def test_default_rate_limiter_is_the_controller_default() -> None:
    q: WorkQueue[str] = WorkQueue()
    limiter = q.rate_limiter
    assert isinstance(limiter, keyqueue.MaxOfRateLimiter)
    assert limiter.when("a") == 0.005
    assert limiter.when("a") == 0.01


def test_repr_names_the_queue_and_its_sizes() -> None:
    q: WorkQueue[str] = WorkQueue("pods")
    q.add("a")
    text = repr(q)
    assert "pods" in text
    assert "1 waiting" in text
