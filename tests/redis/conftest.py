"""The failover tests run once, in ``make test``'s pure pass.

They drive replicated servers through kills, freezes and partitions; what they
test (the Redis client, its scripts, the failover harness) is the same code in
both builds, since mypyc compiles only the in-memory queues
(``keyqueue._build.COMPILED_MODULES``). The compiled passes (``make test``'s
first, and the other CPythons' in ``.ci/run``) skip them.
"""

from __future__ import annotations

import os

import pytest

ONCE = frozenset(
    {
        "test_durability.py",
        "test_failover_chaos.py",
        "test_failover_epochs.py",
        "test_failover_follow.py",
        "test_failover_harness.py",
    }
)

_SKIP = pytest.mark.skip(
    reason="the failover tests test no compiled module: tested once, in make test's pure pass"
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("KEYQUEUE_REQUIRE_COMPILED") != "1":
        return
    for item in items:
        if item.path.name in ONCE:
            item.add_marker(_SKIP)
