"""The failover tests run once, in ``make test``'s pure pass; a 6-primary Cluster.

They drive replicated servers through kills, freezes and partitions; what they
test (the Redis client, its scripts, the failover harness) is the same code in
both builds, since mypyc compiles only the in-memory queues
(``keyqueue._build.COMPILED_MODULES``). They are marked ``once``: the compiled
runs (``make test``'s, and the other CPythons' in ``.ci/run``) leave them out.

``valkey_cluster6``: a Valkey Cluster of 6 primaries and no replicas, for the
tests of a queue whose 6 shards each have a primary of their own (the
3-primary one is the session's ``valkey_cluster``). ``cluster``: one of 3
primaries and no replicas that a module's tests have to themselves (a module
that wants another kind defines its own).
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator

import pytest

from keyqueue.testing import ValkeyCluster

ONCE = frozenset(
    {
        "test_durability.py",
        "test_failover_chaos.py",
        "test_failover_epochs.py",
        "test_failover_follow.py",
        "test_failover_harness.py",
        "test_failover_sharded.py",
    }
)


@pytest.hookimpl(tryfirst=True)  # before -m selects by the marks
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.path.name in ONCE:
            item.add_marker(pytest.mark.once)


def _cluster(primaries: int) -> Iterator[ValkeyCluster]:
    """A Valkey Cluster of ``primaries`` primaries, no replicas, in a directory of its own."""
    with (
        tempfile.TemporaryDirectory(prefix=f"keyqueue-cluster{primaries}-") as directory,
        ValkeyCluster(directory, primaries=primaries, replicas=0) as cluster,
    ):
        yield cluster


@pytest.fixture(scope="module")
def valkey_cluster6() -> Iterator[ValkeyCluster]:
    """A Valkey Cluster of 6 primaries, no replicas, for one module's tests."""
    yield from _cluster(6)


@pytest.fixture(scope="module")
def cluster() -> Iterator[ValkeyCluster]:
    """A Valkey Cluster of 3 primaries, no replicas, for one module's tests."""
    yield from _cluster(3)
