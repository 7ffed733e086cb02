"""The dashboard as a test runs it: ``keyqueue dashboard`` in a process of its own, its API.

``running`` starts the command on a free port and stops it as Ctrl-C does
(it must exit 130); ``request`` and ``state_until`` read its JSON API.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

__all__ = ["WAIT", "page_token", "request", "running", "state_until"]

WAIT = 10.0
"""Generous bound, in wall seconds, for the dashboard to start or stop."""

# As a background job of a shell without job control starts: SIGINT ignored, through exec.
_SIGINT_IGNORED = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_IGN); "
    "os.execv(sys.executable, [sys.executable, *sys.argv[1:]])"
)


@contextmanager
def running(
    valkey_url: str, *names: str, args: tuple[str, ...] = (), sigint_ignored: bool = False
) -> Iterator[str]:
    """The dashboard of ``names`` in its own process, on a free port: yields its URL.
    Stopped by SIGINT, as Ctrl-C does (``sigint_ignored``: started as a script's
    background job is, with SIGINT ignored), and it must exit 130."""
    python = [sys.executable, "-c", _SIGINT_IGNORED] if sigint_ignored else [sys.executable]
    proc = subprocess.Popen(
        [
            *python,
            "-m",
            "keyqueue",
            "dashboard",
            *names,
            "--redis-url",
            valkey_url,
            "--port",
            "0",
            "--no-open",
            *args,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        line = proc.stdout.readline() if proc.stdout else ""
        assert " on http://" in line, (line, proc.stderr.read() if proc.stderr else "")
        yield line.split(" on ")[1].split()[0]
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            out, err = proc.communicate(timeout=WAIT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise
        assert proc.returncode == 130, (proc.returncode, out, err)


def request(
    url: str, body: object = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=WAIT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read())


def page_token(url: str) -> str:
    with urllib.request.urlopen(url, timeout=WAIT) as response:
        html = response.read().decode()
    return html.split('name="keyqueue-token" content="')[1].split('"')[0]


def state_until(
    url: str, ready: Callable[[dict[str, Any]], bool], timeout: float = WAIT * 2
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Poll ``api/state`` until ``ready(state)``: the state, and every state seen."""
    seen: list[dict[str, Any]] = []
    deadline = time.monotonic() + timeout
    while True:
        status, state = request(f"{url}api/state")
        assert status == 200, state
        seen.append(state)
        if ready(state):
            return state, seen
        assert time.monotonic() < deadline, json.dumps(state, indent=1)[:3000]
        time.sleep(0.2)
