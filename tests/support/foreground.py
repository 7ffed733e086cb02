"""Running ``keyqueue`` as a command a terminal started, for the Ctrl-C tests.

A child of a suite started in the background (``make test &``, nohup, some CI
runners) starts with SIGINT ignored, and Python keeps that: ``FOREGROUND``
gives the child Python's own handler first, as a terminal's job has.
``first_line`` reads the child's output up to a line, and fails the test
(never hangs it) if the child ends first: ``readline`` returns "" at its end.
``top`` starts ``keyqueue top --plain`` on a queue, ``running_top`` for a
block (with a watchdog), ``interrupt`` ends it with Ctrl-C; ``top_line`` is
its first line, as its fields.
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

FOREGROUND = (
    "import signal, sys; signal.signal(signal.SIGINT, signal.default_int_handler); "
    "from keyqueue.cli import main; main(sys.argv[1:])"
)
"""``python -c FOREGROUND *args`` runs ``keyqueue *args`` with SIGINT as a terminal's."""


def first_line(proc: subprocess.Popen[str], prefix: str) -> str:
    """The child's first stdout line starting with ``prefix``; the test fails
    (with its stderr) if the child ends without one."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    while line and not line.startswith(prefix):
        line = proc.stdout.readline()
    if not line:
        _, err = proc.communicate(timeout=30)
        pytest.fail(f"no {prefix} line before the command ended (status {proc.returncode}):\n{err}")
    return line


def top(valkey_url: str, queue: str, *options: str) -> subprocess.Popen[str]:
    """``keyqueue top QUEUE --plain [options]`` started, its stdout and stderr piped (text)."""
    return subprocess.Popen(
        [
            *(sys.executable, "-c", FOREGROUND, "top", queue),
            *("--redis-url", valkey_url, *options, "--plain"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@contextlib.contextmanager
def running_top(
    valkey_url: str, queue: str, *options: str, seconds: float = 30.0
) -> Iterator[subprocess.Popen[str]]:
    """``top`` for the block: killed when it ends, or after ``seconds`` (a
    watchdog: a test reading its output fails instead of hanging)."""
    proc = top(valkey_url, queue, *options)
    watchdog = threading.Timer(seconds, proc.kill)
    watchdog.start()
    try:
        yield proc
    finally:
        watchdog.cancel()
        proc.kill()


def interrupt(proc: subprocess.Popen[str]) -> str:
    """Ctrl-C to the child: its stderr once it ended (10 s at most)."""
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=10)
    return err


def top_line(valkey_url: str, queue: str) -> dict[str, str]:
    """``keyqueue top QUEUE --plain``'s first line, as its ``name=value`` fields
    (then Ctrl-C ends it)."""
    proc = top(valkey_url, queue)
    try:
        line = first_line(proc, "")
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    return dict(pair.split("=", 1) for pair in line.split()[1:])
