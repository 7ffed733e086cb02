"""Replicated Valkey for failover tests: a Sentinel set and a Cluster, each real processes.

Theory of operation
-------------------
``ValkeySentinelSet`` runs one primary, its replicas and the sentinels that
watch it; ``ValkeyCluster`` runs a Cluster of primaries, each with its
replicas. Every server is a ``ValkeyNode``: one ``valkey-server`` process
(the binary ``valkey_binary()`` finds), on a free port of 127.0.0.1, with
its own directory and a config file written there (a sentinel rewrites
its own; a Cluster node keeps ``nodes.conf``), started in a session of its
own and killed by the kernel if its owner dies (``_processes.spawn``).
Leaving the ``with`` block stops every node, however the block ends; an
``atexit`` hook stops any node still running when the interpreter exits
(a set or node never closed). A node that is frozen (``SIGSTOP``) is
resumed before it is stopped.

Each step of a start is bounded in seconds: a node answers PING within
``READY_TIMEOUT``, the set or the Cluster converges (replicas online,
sentinels that know each other, every slot served) within
``converge_timeout``; past either, the start raises ``ValkeyError`` with
the end of the logs, having stopped what it started.

Faults, on a chosen node: ``kill()`` (``kill -9``) and ``start()`` again on
the same port and directory (a Sentinel set's old primary comes back
believing it is a primary, empty, and the sentinels demote it some seconds
later; ``restart_as_replica`` brings it back following the current primary,
as an orchestrator would; a Cluster node reads its ``nodes.conf`` and
rejoins as a replica), ``freeze()`` /
``thaw()`` (``SIGSTOP`` / ``SIGCONT``: a primary frozen past its failover
comes back to clients that may still reach it), ``pause_clients(seconds)``
(``CLIENT PAUSE ... ALL``), ``drop_replicas()`` (its replicas' links cut:
repeated, they lag), and, on the Sentinel set,
``isolate_from_sentinels(node)`` / ``rejoin_sentinels(node)``: the node
keeps serving its clients and its replicas but answers no sentinel; on a
``ValkeyCluster(partitionable=True)``, ``isolate(node)`` / ``rejoin(node)``:
the node keeps its clients and replication links but loses the cluster bus
(each node listens and dials from its own loopback address, and its bus
port is behind a ``_proxy.Relay`` that can cut by source address).

How a node is cut off from the sentinels only, on loopback, without root:
on a Sentinel set's data nodes the ``default`` user is off, and every
party logs in as its own ACL user: the clients as ``keyqueue``
(``credentials``, ``client_kwargs``), the replicas as ``replicator``
(``masteruser``; ``cut_replication`` turns it off the same way, to make the
replicas lag), the sentinels as ``sentinel`` (``sentinel auth-user``). Isolating a node turns the
sentinels' user off there and kills their connections (``ACL SETUSER
sentinel off``, ``CLIENT KILL USER sentinel``): a sentinel's new
connection cannot log in, its PING is answered ``NOAUTH``, which a sentinel
counts as no answer, so the sentinels find the node down after
``down-after-milliseconds`` and fail it over, while its clients keep
their connections and make new ones: two primaries, as a network partition
between the sentinels and the primary makes them. A TCP proxy in front of
the primary would cut its clients too (the sentinels hand clients the
address they monitor), and ``DEBUG SLEEP`` or ``SIGSTOP`` freeze it for
everyone; the ACL needs neither and leaves every address real. (With the
``default`` user on, a sentinel whose login fails would simply be
``default``: hence the users.) ``rejoin_sentinels`` turns the user back on
and kills the connections whose login it refused (a sentinel would keep
them, unauthenticated, for as long as the node answers); the sentinels then
demote the node if it was failed over, once it has reported itself a
primary to them for 8 s, at their next ``INFO`` to it (every 10 s): up to
18 s after the rejoin (10 to 12 s measured); ``demote`` sends it their
``REPLICAOF`` at once (a frozen primary resumed is the same case).

Roles are read from the servers themselves: ``node.role()`` is the first
word of ``ROLE``; ``ValkeySentinelSet.primary()`` is the node the sentinels
name (``SENTINEL get-master-addr-by-name``) and that says it is a primary;
``ValkeyCluster.primary_for(key)`` is the node that serves the key's slot.
``wait_for_failover`` waits (bounded) until the primary is another node,
so a test proves the failover it meant to cause happened.
"""

from __future__ import annotations

import atexit
import contextlib
import secrets
import signal
import subprocess
import tempfile
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Self

from ._processes import free_port, spawn, stop
from ._proxy import Relay
from ._resp import Reply, ReplyError, call
from ._valkey import READY_TIMEOUT, STOP_TIMEOUT, ValkeyError, _free, valkey_binary

__all__ = ["ValkeyCluster", "ValkeyNode", "ValkeySentinelSet"]

CONVERGE_TIMEOUT = 20.0
"""Seconds a set or a Cluster gets to converge after its servers answer PING."""
SENTINEL_USER = "sentinel"
"""The ACL user the sentinels log in as on a Sentinel set's data nodes."""
CLIENT_USER = "keyqueue"
"""The ACL user clients log in as on a Sentinel set's data nodes."""
REPLICA_USER = "replicator"
"""The ACL user replicas log in as on a Sentinel set's data nodes."""
CLUSTER_SLOTS = 16384
PARTITION_HOST_BASE = 10
"""A partitionable Cluster's node ``i`` listens on ``127.0.0.(10 + i)``."""

_running: weakref.WeakSet[ValkeyNode] = weakref.WeakSet()


@atexit.register
def _stop_leftovers() -> None:
    for node in list(_running):
        with contextlib.suppress(Exception):
            node.stop(timeout=1.0)


def _wait(what: str, ready: Callable[[], bool], timeout: float, logs: Iterable[Path] = ()) -> None:
    """Call ``ready`` until it says True; ``ValkeyError`` naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(OSError, ReplyError):
            if ready():
                return
        if time.monotonic() >= deadline:
            tails = []
            for log in logs:
                text = log.read_text(errors="replace")[-800:] if log.exists() else "(no log)"
                tails.append(f"--- {log}:\n{text}")
            raise ValkeyError(f"{what} within {timeout} s\n" + "\n".join(tails))
        time.sleep(0.05)


class ValkeyNode:
    """One valkey-server (or sentinel) process of a replicated set, with faults to inject.

    ``lines`` are its config file's lines (``port``, ``bind``, ``dir`` and
    the log file are added); ``sentinel=True`` runs it as a sentinel. The
    config file is written at the first start only (a sentinel rewrites it
    as it learns), so ``start()`` after ``kill()`` or ``stop()`` brings the
    node back on the same port and directory with what it had saved.
    ``auth`` (user, password) is how ``command`` logs in (default: none).
    """

    def __init__(
        self,
        name: str,
        directory: str | Path,
        lines: Sequence[str] = (),
        *,
        sentinel: bool = False,
        binary: str | None = None,
        auth: tuple[str, str] | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        self.name = name
        """A label for messages: ``primary``, ``replica-1``, ``sentinel-0``, ``node-3``."""
        self.directory = Path(directory)
        """Where its config, data and log (``server.log``) live."""
        self.lines = list(lines)
        """Its config file's lines, besides port, bind, dir and logfile."""
        self.sentinel = sentinel
        """Whether it runs as a sentinel."""
        self.binary = binary
        """The server binary; None: ``valkey_binary()`` at each start."""
        self.auth = auth
        """``(user, password)`` that ``command`` and ``url`` log in with, or None."""
        self.host = host
        """The loopback address it listens on (and, in a partitionable Cluster,
        connects from)."""
        self.port: int | None = None
        """Its port on 127.0.0.1, once started (kept across restarts)."""
        self.process: subprocess.Popen[bytes] | None = None
        """The running process, or None."""
        self._frozen = False

    def __repr__(self) -> str:
        return f"<ValkeyNode {self.name} {self.host}:{self.port}>"

    @property
    def address(self) -> tuple[str, int]:
        """``(host, port)``; ``ValkeyError`` before the first start."""
        if self.port is None:
            raise ValkeyError(f"{self.name} was never started")
        return (self.host, self.port)

    @property
    def url(self) -> str:
        """``redis://[user:password@]127.0.0.1:PORT/0`` (with ``auth``'s credentials);
        ``ValkeyError`` before the first start."""
        login = "{}:{}@".format(*self.auth) if self.auth is not None else ""
        return "redis://{}{}:{}/0".format(login, *self.address)

    @property
    def log(self) -> Path:
        """The node's log file."""
        return self.directory / "server.log"

    @property
    def running(self) -> bool:
        """Whether its process is alive (frozen counts as alive)."""
        return self.process is not None and self.process.poll() is None

    @property
    def frozen(self) -> bool:
        """Whether ``freeze`` stopped it and ``thaw`` has not resumed it yet."""
        return self._frozen and self.running

    def _config(self, port: int) -> Path:
        path = self.directory / ("sentinel.conf" if self.sentinel else "valkey.conf")
        if path.exists() and self.port == port:
            return path
        head = [
            f"port {port}",
            f"bind {self.host}",
            f'dir "{self.directory}"',
            'logfile "server.log"',
        ]
        path.write_text("\n".join([*head, *self.lines]) + "\n")
        return path

    def reconfigure(self, lines: Sequence[str]) -> None:
        """Replace the config lines; the next ``start`` writes the file afresh (the
        node must be stopped)."""
        if self.running:
            raise ValkeyError(f"{self.name} is running: stop it before reconfiguring it")
        self.lines = list(lines)
        (self.directory / ("sentinel.conf" if self.sentinel else "valkey.conf")).unlink(
            missing_ok=True
        )

    def start(self, attempts: int = 3) -> Self:
        """Start the node (a no-op while it runs) and wait until it answers PING.

        The first start tries ``attempts`` free ports; a restart uses the
        node's port only. Raises ``ValkeyError`` with the end of its log if
        it does not answer within ``READY_TIMEOUT`` seconds, having stopped it.
        """
        if self.running:
            return self
        self.directory.mkdir(parents=True, exist_ok=True)
        binary = self.binary or valkey_binary()
        restart = self.port is not None
        for _ in range(1 if restart else attempts):
            port = self.port if self.port is not None else free_port()
            if restart and not _free(port):
                raise ValkeyError(f"127.0.0.1:{port} is taken: {self.name} cannot restart there")
            config = self._config(port)
            args = [binary, str(config)] + (["--sentinel"] if self.sentinel else [])
            self.process = spawn(args, cwd=self.directory)
            self.port = port
            self._frozen = False
            _running.add(self)
            try:
                if self._wait_ready():
                    return self
            except BaseException:
                self.stop()
                raise
            self.stop()
            if not restart:
                self.port = None
        detail = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else "(no log)"
        raise ValkeyError(f"{self.name} did not answer PING on 127.0.0.1:{port}:\n{detail}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        assert self.port is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(OSError, ReplyError):
                if call(self.port, "PING", host=self.host, timeout=1.0, auth=self.auth) == "PONG":
                    return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the node (SIGCONT if frozen, SIGTERM, SIGKILL after ``timeout`` s)."""
        process, self.process = self.process, None
        _running.discard(self)
        if process is not None:
            if self._frozen and process.poll() is None:
                process.send_signal(signal.SIGCONT)
            self._frozen = False
            stop(process, timeout)

    def kill(self) -> None:
        """``kill -9`` the node; ``start()`` brings it back on the same port."""
        process, self.process = self.process, None
        _running.discard(self)
        self._frozen = False
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def freeze(self) -> None:
        """``SIGSTOP`` the node: it answers nobody until ``thaw``."""
        if self.process is None or not self.running:
            raise ValkeyError(f"{self.name} is not running")
        self.process.send_signal(signal.SIGSTOP)
        self._frozen = True

    def thaw(self) -> None:
        """``SIGCONT`` a frozen node."""
        if self.process is not None and self.running:
            self.process.send_signal(signal.SIGCONT)
        self._frozen = False

    def command(self, *args: str | int, timeout: float = 2.0) -> Reply:
        """One command to the node (its reply, parsed); ``ReplyError``, ``OSError``."""
        host, port = self.address
        return call(port, *args, host=host, timeout=timeout, auth=self.auth)

    def role(self, timeout: float = 2.0) -> str:
        """``master``, ``slave`` or ``sentinel`` (``ROLE``), or ``down`` if it does not
        answer within ``timeout`` seconds."""
        try:
            reply = self.command("ROLE", timeout=timeout)
        except (OSError, ReplyError, ValkeyError):
            return "down"
        assert isinstance(reply, list)
        return str(reply[0])

    def info(self, section: str = "replication", timeout: float = 2.0) -> dict[str, str]:
        """``INFO section`` as a dict of its ``name:value`` lines."""
        text = self.command("INFO", section, timeout=timeout)
        assert isinstance(text, str)
        fields = {}
        for line in text.splitlines():
            name, sep, value = line.partition(":")
            if sep and not line.startswith("#"):
                fields[name] = value
        return fields

    def drop_replicas(self) -> int:
        """``CLIENT KILL TYPE replica``: its replicas' links drop, and each stays down
        until the replica retries (within about a second) and resyncs. Called
        repeatedly before a ``kill``, it makes the replicas lag the primary
        they lose. Returns how many links were dropped."""
        return int(str(self.command("CLIENT", "KILL", "TYPE", "replica")))

    def pause_clients(self, seconds: float) -> None:
        """``CLIENT PAUSE <ms> ALL``: every client's command waits, replicas' included not."""
        self.command("CLIENT", "PAUSE", int(seconds * 1000), "ALL")


class _Topology:
    """What the two topologies share: their nodes, a directory, the ``with`` block."""

    def __init__(self, directory: str | Path | None) -> None:
        self._own_directory: tempfile.TemporaryDirectory[str] | None = None
        if directory is None:
            self._own_directory = tempfile.TemporaryDirectory(prefix="keyqueue-replicated-")
            directory = self._own_directory.name
        self.directory = Path(directory)
        """Where each node has its directory."""

    def _all(self) -> list[ValkeyNode]:
        raise NotImplementedError

    def _start(self) -> None:
        raise NotImplementedError

    def start(self) -> Self:
        """Start every node and wait until the topology has converged; on any error
        (``ValkeyError`` past a time bound) stop what started and raise."""
        try:
            self._start()
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop every node (a frozen one is resumed first) and remove a temporary
        directory the topology made."""
        for node in self._all():
            with contextlib.suppress(Exception):
                node.stop(timeout=2.0)
        if self._own_directory is not None:
            with contextlib.suppress(OSError):
                self._own_directory.cleanup()

    def wait_for_role(self, node: ValkeyNode, role: str, timeout: float = 15.0) -> None:
        """Wait until ``node.role()`` is ``role`` (a restarted old primary turning
        ``slave``); ``ValkeyError`` after ``timeout`` seconds."""
        _wait(f"{node!r} is not {role}", lambda: node.role(timeout=0.5) == role, timeout)

    def roles(self) -> dict[str, str]:
        """Each node's name → its role (``master``, ``slave``, ``sentinel``, ``down``)."""
        return {node.name: node.role(timeout=0.5) for node in self._all()}

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class ValkeySentinelSet(_Topology):
    """A primary, ``replicas`` replicas of it, and ``sentinels`` sentinels watching it.

    The sentinels monitor the primary as ``service`` with ``quorum``;
    ``down_after`` and ``failover_timeout`` (seconds) are their
    ``down-after-milliseconds`` and ``failover-timeout``. Persistence is
    off; diskless replication starts at once. ``config`` adds lines to
    every data node's config (``{"min-replicas-to-write": "1"}``).
    ``directory`` (default: a temporary one, removed at ``stop``) holds one
    directory per node. A context manager: ``start()`` on entry, ``stop()``
    on every exit.

    Clients reach it as a user's would: ``redis.sentinel.Sentinel(
    s.sentinel_addresses).master_for(s.service)``.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        replicas: int = 2,
        sentinels: int = 3,
        quorum: int = 2,
        down_after: float = 1.0,
        failover_timeout: float = 3.0,
        service: str = "keyqueue",
        config: Mapping[str, str] | None = None,
        binary: str | None = None,
        converge_timeout: float = CONVERGE_TIMEOUT,
    ) -> None:
        super().__init__(directory)
        if replicas < 0 or sentinels < 1 or not 1 <= quorum <= sentinels:
            raise ValueError("need replicas >= 0, sentinels >= 1 and 1 <= quorum <= sentinels")
        self.service = service
        """The name the sentinels monitor the primary under."""
        self.quorum = quorum
        """How many sentinels must agree the primary is down."""
        self.down_after = down_after
        """Seconds without an answer before a sentinel finds a node down."""
        self.failover_timeout = failover_timeout
        """The sentinels' ``failover-timeout``, in seconds."""
        self.converge_timeout = converge_timeout
        """Seconds ``start`` waits for replicas and sentinels to find each other."""
        self._password = secrets.token_hex(8)
        self.credentials = (CLIENT_USER, secrets.token_hex(8))
        """The ``(user, password)`` clients log in with on the data nodes (the
        ``default`` user is off there; the sentinels need none)."""
        extra = [f"{name} {value}" for name, value in (config or {}).items()]
        data_lines = [
            'save ""',
            "appendonly no",
            "repl-diskless-sync yes",
            "repl-diskless-sync-delay 0",
            "user default off",
            f"user {CLIENT_USER} on >{self.credentials[1]} +@all ~* &*",
            f"user {SENTINEL_USER} on >{self._password} +@all ~* &*",
            f"user {REPLICA_USER} on >{self._password} +@all ~* &*",
            f"masteruser {REPLICA_USER}",
            f"masterauth {self._password}",
            *extra,
        ]
        self.nodes = [
            ValkeyNode(
                "primary" if i == 0 else f"replica-{i}",
                self.directory / f"data-{i}",
                data_lines,
                binary=binary,
                auth=self.credentials,
            )
            for i in range(replicas + 1)
        ]
        """The data nodes; ``nodes[0]`` is the primary at the start."""
        self.sentinels = [
            ValkeyNode(
                f"sentinel-{i}", self.directory / f"sentinel-{i}", sentinel=True, binary=binary
            )
            for i in range(sentinels)
        ]
        """The sentinels."""

    def _all(self) -> list[ValkeyNode]:
        return [*self.sentinels, *self.nodes]

    @property
    def client_kwargs(self) -> dict[str, str]:
        """``{"username": ..., "password": ...}``: what a client of the data nodes
        passes (``Sentinel(s.sentinel_addresses, **s.client_kwargs)``)."""
        return {"username": self.credentials[0], "password": self.credentials[1]}

    @property
    def sentinel_addresses(self) -> list[tuple[str, int]]:
        """The sentinels' ``(host, port)``: what ``redis.sentinel.Sentinel`` takes."""
        return [s.address for s in self.sentinels]

    def _start(self) -> None:
        primary, *replicas = self.nodes
        primary.start()
        for replica in replicas:
            replica.lines.append("replicaof {} {}".format(*primary.address))
            replica.start()
        for sentinel in self.sentinels:
            sentinel.lines = [
                "sentinel monitor {} {} {} {}".format(self.service, *primary.address, self.quorum),
                f"sentinel down-after-milliseconds {self.service} {int(self.down_after * 1000)}",
                f"sentinel failover-timeout {self.service} {int(self.failover_timeout * 1000)}",
                f"sentinel parallel-syncs {self.service} {max(1, len(replicas))}",
                f"sentinel auth-user {self.service} {SENTINEL_USER}",
                f"sentinel auth-pass {self.service} {self._password}",
            ]
            sentinel.start()
        _wait(
            f"{len(replicas)} replicas online and {len(self.sentinels)} sentinels that know "
            "each other and every replica",
            self._converged,
            self.converge_timeout,
            [n.log for n in self._all()],
        )

    def _converged(self) -> bool:
        primary = self.nodes[0]
        if primary.info().get("connected_slaves") != str(len(self.nodes) - 1):
            return False
        for sentinel in self.sentinels:
            state = _pairs(sentinel.command("SENTINEL", "MASTER", self.service))
            if int(state.get("num-slaves", "0")) != len(self.nodes) - 1:
                return False
            if int(state.get("num-other-sentinels", "0")) != len(self.sentinels) - 1:
                return False
        return all(r.info().get("master_link_status") == "up" for r in self.nodes[1:])

    def sentinel_view(self) -> list[tuple[str, int] | None]:
        """Each sentinel's answer to ``get-master-addr-by-name``: an address, or None
        (it does not answer, or knows no primary)."""
        view: list[tuple[str, int] | None] = []
        for sentinel in self.sentinels:
            try:
                reply = sentinel.command(
                    "SENTINEL", "GET-MASTER-ADDR-BY-NAME", self.service, timeout=0.5
                )
            except (OSError, ReplyError, ValkeyError):
                view.append(None)
                continue
            view.append((str(reply[0]), int(str(reply[1]))) if isinstance(reply, list) else None)
        return view

    def node_at(self, address: tuple[str, int]) -> ValkeyNode:
        """The data node listening at ``address``."""
        for node in self.nodes:
            if node.port is not None and node.address == address:
                return node
        raise ValkeyError(f"no data node at {address}")

    def primary(self) -> ValkeyNode | None:
        """The node a majority of the sentinels name and whose ``ROLE`` says primary,
        or None (no majority, or the node named does not say so)."""
        view = [a for a in self.sentinel_view() if a is not None]
        for address in set(view):
            if view.count(address) * 2 > len(self.sentinels):
                node = self.node_at(address)
                return node if node.role(timeout=0.5) == "master" else None
        return None

    def wait_for_primary(self, timeout: float = 10.0) -> ValkeyNode:
        """The primary once ``primary()`` names one; ``ValkeyError`` after ``timeout`` s."""
        found: list[ValkeyNode] = []

        def named() -> bool:
            node = self.primary()
            if node is not None:
                found.append(node)
            return node is not None

        _wait("no primary named by a majority of sentinels", named, timeout)
        return found[-1]

    def wait_for_failover(self, old: ValkeyNode, timeout: float = 15.0) -> ValkeyNode:
        """Wait until a majority of sentinels name a primary other than ``old`` and it
        says so (``ROLE``); return it. ``ValkeyError`` after ``timeout`` seconds."""
        found: list[ValkeyNode] = []

        def moved() -> bool:
            node = self.primary()
            if node is not None and node is not old:
                found.append(node)
                return True
            return False

        _wait(
            f"no failover away from {old!r} (sentinels: {self.sentinel_view()})",
            moved,
            timeout,
            [s.log for s in self.sentinels],
        )
        return found[-1]

    def restart_as_replica(self, node: ValkeyNode, timeout: float = 10.0) -> None:
        """Start a stopped (killed) data node as a replica of the primary the
        sentinels name now, as an orchestrator that asks Sentinel first does.

        ``node.start()`` instead brings it back as it was configured: an old
        primary then comes back a primary, empty (persistence is off), until
        the sentinels demote it some seconds later; meanwhile a replica that
        still follows it copies its empty data set (Valkey's documentation
        warns against restarting a primary without persistence for this).
        """
        primary = self.wait_for_primary(timeout)
        lines = [line for line in node.lines if not line.startswith("replicaof ")]
        node.reconfigure([*lines, "replicaof {} {}".format(*primary.address)])
        node.start()

    def demote(self, node: ValkeyNode, timeout: float = 10.0) -> None:
        """Make ``node``, a failed-over primary that came back a primary (resumed,
        rejoined), a replica of the primary the sentinels name now: the
        ``REPLICAOF`` the sentinels send it themselves once their next ``INFO``
        to it shows its role, up to 10 s later (their period for a replica),
        sent now. ``ValkeyError`` if they name no primary within ``timeout``
        seconds, or name ``node``."""
        primary = self.wait_for_primary(timeout)
        if primary is node:
            raise ValkeyError(f"{node!r} is the primary the sentinels name")
        node.command("REPLICAOF", *primary.address)

    def isolate_from_sentinels(self, node: ValkeyNode) -> None:
        """Cut ``node`` off from every sentinel, and from nothing else: its clients
        and replicas keep their connections and make new ones. The sentinels'
        user is turned off on the node and their connections killed, so they
        see it down after ``down_after`` seconds (see the module's docstring)."""
        node.command("ACL", "SETUSER", SENTINEL_USER, "off")
        node.command("CLIENT", "KILL", "USER", SENTINEL_USER)

    def cut_replication(self, node: ValkeyNode) -> None:
        """Cut ``node``'s replicas off from it, and nothing else: the replicas'
        user is turned off on it and their links killed, so they cannot
        resync, and they lag it until ``restore_replication`` (then a
        ``kill`` is a crash while the replicas lag)."""
        node.command("ACL", "SETUSER", REPLICA_USER, "off")
        node.command("CLIENT", "KILL", "USER", REPLICA_USER)

    def restore_replication(self, node: ValkeyNode) -> None:
        """Undo ``cut_replication``: its replicas log in and resync."""
        node.command("ACL", "SETUSER", REPLICA_USER, "on")

    def rejoin_sentinels(self, node: ValkeyNode) -> None:
        """Undo ``isolate_from_sentinels``: the sentinels reach the node again, within
        a second, as after a partition heals.

        A sentinel's connection made during the cut stays open with its login
        refused, and the sentinel keeps it as long as the node answers its
        PINGs, ``NOAUTH`` included: turning the user on alone would leave the
        sentinels unable to see the node for 10 to 15 s more (measured), so
        the node's demotion with it. Those connections are killed: on the
        set's data nodes ``default`` is off, so every connection still
        ``default`` is one whose login was refused; each sentinel reconnects
        and logs in."""
        node.command("ACL", "SETUSER", SENTINEL_USER, "on")
        node.command("CLIENT", "KILL", "USER", "default")


class ValkeyCluster(_Topology):
    """A Valkey Cluster of ``primaries`` primaries with ``replicas`` replicas each.

    The slots are split evenly over the primaries; ``node_timeout``
    (seconds) is ``cluster-node-timeout``, which bounds how soon a replica
    replaces a primary that stopped answering. Persistence is off; each
    node keeps its ``nodes.conf``, so a node killed and started again rejoins
    (a failed-over primary as a replica). ``config`` adds lines to every
    node's config. ``partitionable=True`` puts node ``i`` on
    ``127.0.0.(10 + i)`` and its cluster bus behind a relay, so that
    ``isolate(node)`` cuts it off from the other nodes only (the relay
    refuses by source address); off by default (the relays are Python
    threads). ``directory``
    as ``ValkeySentinelSet``'s. Built with
    ``CLUSTER ADDSLOTSRANGE``, ``MEET`` and ``REPLICATE`` (the wheel ships
    no valkey-cli). A context manager.

    Clients reach it as a user's would: ``redis.RedisCluster.from_url(c.url)``
    or ``startup_nodes`` built from ``c.addresses``.
    """

    def __init__(
        self,
        directory: str | Path | None = None,
        *,
        primaries: int = 3,
        replicas: int = 1,
        node_timeout: float = 1.0,
        partitionable: bool = False,
        config: Mapping[str, str] | None = None,
        binary: str | None = None,
        converge_timeout: float = CONVERGE_TIMEOUT,
    ) -> None:
        super().__init__(directory)
        if primaries < 1 or replicas < 0:
            raise ValueError("need primaries >= 1 and replicas >= 0")
        self.primary_count = primaries
        """How many primaries the Cluster starts with."""
        self.replica_count = replicas
        """How many replicas each primary starts with."""
        self.node_timeout = node_timeout
        """``cluster-node-timeout``, in seconds."""
        self.converge_timeout = converge_timeout
        """Seconds ``start`` waits for every slot to be served and every replica synced."""
        self._lines = [
            'save ""',
            "appendonly no",
            "repl-diskless-sync yes",
            "repl-diskless-sync-delay 0",
            "cluster-enabled yes",
            'cluster-config-file "nodes.conf"',
            f"cluster-node-timeout {int(node_timeout * 1000)}",
            *(f"{name} {value}" for name, value in (config or {}).items()),
        ]
        count = primaries * (1 + replicas)
        self._bus_ports: dict[str, int] = {}  # node name -> the bus port the others dial
        self._relays: dict[str, Relay] = {}  # node name -> the relay in front of its bus
        self.partitionable = partitionable
        """Whether ``isolate`` can cut a node off from the other nodes (each node on
        its own loopback address, the bus through a relay per node)."""
        self.nodes = [
            ValkeyNode(
                f"node-{i}",
                self.directory / f"node-{i}",
                binary=binary,
                host=f"127.0.0.{PARTITION_HOST_BASE + i}" if partitionable else "127.0.0.1",
            )
            for i in range(count)
        ]
        """Every node; ``nodes[:primaries]`` are the primaries at the start, and
        ``nodes[primaries + r * primaries + i]`` is replica ``r`` of primary ``i``."""

    def _all(self) -> list[ValkeyNode]:
        return list(self.nodes)

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """Every node's ``(host, port)``."""
        return [n.address for n in self.nodes]

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0`` of the first node: ``RedisCluster.from_url`` finds
        the others."""
        return self.nodes[0].url

    def _start(self) -> None:
        for node in self.nodes:
            bus = free_port()
            node.lines = [*self._lines, f"cluster-port {bus}"]
            self._bus_ports[node.name] = bus
            if self.partitionable:
                relay = _relay_for(node.host, bus)
                self._relays[node.name] = relay
                self._bus_ports[node.name] = relay.listen[1]
                node.lines += [
                    f"bind-source-addr {node.host}",
                    f"cluster-announce-bus-port {relay.listen[1]}",
                ]
            node.start()
        ids = [str(node.command("CLUSTER", "MYID")) for node in self.nodes]
        per = CLUSTER_SLOTS // self.primary_count
        for i, node in enumerate(self.nodes[: self.primary_count]):
            first = i * per
            last = CLUSTER_SLOTS - 1 if i == self.primary_count - 1 else first + per - 1
            node.command("CLUSTER", "SET-CONFIG-EPOCH", i + 1)
            node.command("CLUSTER", "ADDSLOTSRANGE", first, last)
        first_node = self.nodes[0]
        for node in self.nodes[1:]:
            first_node.command("CLUSTER", "MEET", *node.address, self._bus_ports[node.name])
        logs = [n.log for n in self.nodes]
        _wait(
            f"{len(self.nodes)} cluster nodes that all know each other",
            lambda: all(_known(n) == len(self.nodes) for n in self.nodes),
            self.converge_timeout,
            logs,
        )
        for j, node in enumerate(self.nodes[self.primary_count :]):
            node.command("CLUSTER", "REPLICATE", ids[j % self.primary_count])
        _wait("a cluster whose every slot is served", self._converged, self.converge_timeout, logs)

    def _converged(self) -> bool:
        for node in self.nodes:
            info = _cluster_info(node)
            if info.get("cluster_state") != "ok" or info.get("cluster_known_nodes") != str(
                len(self.nodes)
            ):
                return False
        for node in self.nodes[: self.primary_count]:
            if node.info().get("connected_slaves") != str(self.replica_count):
                return False
        return all(
            n.info().get("master_link_status") == "up" for n in self.nodes[self.primary_count :]
        )

    def slot(self, key: str) -> int:
        """The slot of ``key`` (``CLUSTER KEYSLOT``, asked of any node that answers)."""
        for node in self.nodes:
            with contextlib.suppress(OSError, ReplyError, ValkeyError):
                return int(str(node.command("CLUSTER", "KEYSLOT", key, timeout=0.5)))
        raise ValkeyError("no cluster node answers")

    def primary_for(self, key: str) -> ValkeyNode | None:
        """The node that serves ``key``'s slot as most answering nodes see it, if it
        says it is a primary; else None."""
        slot = self.slot(key)
        votes: dict[int, int] = {}
        for node in self.nodes:
            with contextlib.suppress(OSError, ReplyError, ValkeyError):
                shards = node.command("CLUSTER", "SLOTS", timeout=0.5)
                assert isinstance(shards, list)
                for shard in shards:
                    assert isinstance(shard, list)
                    if int(str(shard[0])) <= slot <= int(str(shard[1])):
                        owner = shard[2]
                        assert isinstance(owner, list)
                        port = int(str(owner[1]))
                        votes[port] = votes.get(port, 0) + 1
        if not votes:
            return None
        port = max(votes, key=lambda p: votes[p])
        for node in self.nodes:
            if node.port == port:
                return node if node.role(timeout=0.5) == "master" else None
        return None

    def move_slot(self, slot: int, to: ValkeyNode, timeout: float = 10.0) -> None:
        """Give ``slot``, which holds no keys, to the primary ``to``, as an
        operator places a slot: ``CLUSTER SETSLOT slot NODE`` on ``to``, then
        ``CLUSTER BUMPEPOCH`` on it (so that its claim outranks the old
        owner's on the bus), then ``SETSLOT`` on every other running primary,
        again on each that still names another owner (the replicas learn it
        from the bus); returns once every running node's ``CLUSTER SLOTS``
        names ``to`` (``ValkeyError`` after ``timeout`` seconds). The owner of
        a slot that holds keys refuses (``ReplyError``). Clients that cached
        the old owner are redirected (``MOVED``)."""
        node_id = str(to.command("CLUSTER", "MYID"))
        to.command("CLUSTER", "SETSLOT", slot, "NODE", node_id)
        to.command("CLUSTER", "BUMPEPOCH")

        def placed() -> bool:
            agree = True
            for node in self.nodes:
                if not node.running or _owner_port(node, slot) == to.port:
                    continue
                agree = False
                if node.role(timeout=0.5) == "master":
                    node.command("CLUSTER", "SETSLOT", slot, "NODE", node_id)
            return agree

        _wait(f"slot {slot} on {to!r} as every node sees it", placed, timeout, [to.log])

    def wait_for_failover(self, key: str, old: ValkeyNode, timeout: float = 15.0) -> ValkeyNode:
        """Wait until ``key``'s slot is served by a primary other than ``old`` (and
        it says so); return it. ``ValkeyError`` after ``timeout`` seconds."""
        found: list[ValkeyNode] = []

        def moved() -> bool:
            node = self.primary_for(key)
            if node is not None and node is not old:
                found.append(node)
                return True
            return False

        _wait(f"no failover of {key!r}'s slot away from {old!r}", moved, timeout, [old.log])
        return found[-1]

    def isolate(self, node: ValkeyNode) -> None:
        """Cut ``node`` off from every other node of the Cluster, and from nothing
        else: its clients and its replication links stay (a partition of the
        cluster bus). Needs ``partitionable=True``. After ``node_timeout`` the
        others find it failed and promote a replica of it; it stops taking
        writes once it finds itself in the minority."""
        if not self.partitionable:
            raise ValkeyError("isolate needs ValkeyCluster(partitionable=True)")
        for name, relay in self._relays.items():
            if name == node.name:
                relay.cut_all()
            else:
                relay.cut({node.host})

    def rejoin(self, node: ValkeyNode) -> None:
        """Undo ``isolate``: ``node`` reaches the other nodes again."""
        del node  # every relay accepts everyone again
        for relay in self._relays.values():
            relay.heal()

    def stop(self) -> None:
        """Stop every node and relay, then remove a temporary directory it made."""
        super().stop()
        for relay in self._relays.values():
            relay.stop()

    def wait_until_ok(self, timeout: float = 15.0) -> None:
        """Wait until every running node says ``cluster_state:ok`` and every running
        replica's link to its primary is up (a replica that has not synced yet
        cannot replace its primary); ``ValkeyError`` after ``timeout`` seconds."""

        def ok() -> bool:
            running = [n for n in self.nodes if n.running and not n.frozen]
            if any(_cluster_info(n).get("cluster_state") != "ok" for n in running):
                return False
            replicas = [n for n in running if n.role(timeout=0.5) == "slave"]
            return all(n.info().get("master_link_status") == "up" for n in replicas)

        _wait("a cluster in state ok, its replicas synced", ok, timeout)


def _pairs(reply: Reply) -> dict[str, str]:
    """A flat ``[name, value, ...]`` reply as a dict."""
    assert isinstance(reply, list)
    return {str(reply[i]): str(reply[i + 1]) for i in range(0, len(reply) - 1, 2)}


def _cluster_info(node: ValkeyNode) -> dict[str, str]:
    text = node.command("CLUSTER", "INFO", timeout=0.5)
    assert isinstance(text, str)
    return dict(line.split(":", 1) for line in text.splitlines() if ":" in line)


def _owner_port(node: ValkeyNode, slot: int) -> int | None:
    """The port of the primary that serves ``slot`` as ``node`` sees it, if any."""
    ranges = node.command("CLUSTER", "SLOTS", timeout=0.5)
    assert isinstance(ranges, list)
    for served in ranges:
        assert isinstance(served, list)
        if int(str(served[0])) <= slot <= int(str(served[1])):
            owner = served[2]
            assert isinstance(owner, list)
            return int(str(owner[1]))
    return None


def _known(node: ValkeyNode) -> int:
    """How many nodes ``node`` knows that have finished their handshake."""
    text = node.command("CLUSTER", "NODES", timeout=0.5)
    assert isinstance(text, str)
    return sum(1 for line in text.splitlines() if line and "handshake" not in line)


def _relay_for(host: str, bus: int, attempts: int = 3) -> Relay:
    """A started relay on ``host`` in front of the bus port ``bus``."""
    for attempt in range(attempts):
        try:
            return Relay((host, free_port()), (host, bus)).start()
        except OSError:
            if attempt == attempts - 1:
                raise
    raise AssertionError("unreachable")
