"""What the server launchers share: a free port, a child that dies with its owner, a stop.

``_valkey.ValkeyServer`` and ``_etcd.local_etcd`` each run one server process
on 127.0.0.1. ``dying_with_parent`` wraps its command line so that, on Linux,
the kernel kills it if its owner dies without cleaning up (SIGKILL included);
``stop`` ends it in order; ``spawn`` starts it in its own session, so a
terminal's Ctrl-C reaches only Python, which then stops the server after its
clients have let go.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import IO

__all__ = ["dying_with_parent", "free_port", "spawn", "stop"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago.

    Another process may take it before the caller binds it: the launchers try
    again with a new port when their server cannot listen.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


_EXEC_DYING_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
if os.getppid() == int(sys.argv[1]):  # else the parent is already gone
    os.execv(sys.argv[2], sys.argv[2:])
"""


def dying_with_parent(args: list[str]) -> list[str]:
    """On Linux, ``args`` run through a fresh interpreter that asks the kernel to
    kill the process when its parent dies (even by SIGKILL), then execs ``args``
    in place: the pid stays the same. No ``preexec_fn``, which is unsafe in a
    threaded process. The death signal follows the *thread* that started the
    process, so start it from a thread that outlives it (the main thread)."""
    if sys.platform != "linux":
        return args
    return [sys.executable, "-I", "-S", "-c", _EXEC_DYING_WITH_PARENT, str(os.getpid()), *args]


def spawn(
    args: list[str], *, cwd: Path | None = None, output: IO[bytes] | None = None
) -> subprocess.Popen[bytes]:
    """Start ``args`` dying with this process, in a session of its own, with no
    stdin; its stdout and stderr go to ``output`` (default: nowhere)."""
    return subprocess.Popen(
        dying_with_parent(args),
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=output if output is not None else subprocess.DEVNULL,
        stderr=subprocess.STDOUT if output is not None else subprocess.DEVNULL,
        start_new_session=True,
    )


def stop(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, wait up to ``timeout`` seconds, SIGKILL if it lingers (or if a
    second Ctrl-C cuts the wait short). Nothing if it has already exited."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except (subprocess.TimeoutExpired, KeyboardInterrupt):
        process.kill()
        process.wait()
