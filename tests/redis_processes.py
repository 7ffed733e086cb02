"""Worker and producer processes for the multi-process and fault tests of the Redis queue.

The entry points run in children of multiprocessing's forkserver, which has
``keyqueue.redis`` imported already, so a child starts in milliseconds (a fresh
interpreter needs ~0.3 s of CPU to import redis-py). Each child watches the
test process (a pidfd, Linux) and exits when it goes, so a test run that is
killed leaves no process behind. (``PR_SET_PDEATHSIG`` would not do: a child's
parent is the forkserver, which lives as long as any of its children.)
``Processes`` owns the children of one test and kills every one on every exit
path.

What the children did goes to the server, as lines in lists (``Names``), so
the test reads it whatever happened to the process afterwards: one line per
handler call, ``key token start end version pid`` (``time.monotonic()``, one
clock for every process on Linux); one per write of a producer,
``key version written``; one per key a handler holds on purpose,
``key token pid``; and each worker's ``RunStats``, as JSON.
"""

from __future__ import annotations

import dataclasses
import json
import multiprocessing
import os
import random
import select
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from multiprocessing.synchronize import Event as ProcessEvent
from typing import Any

import redis

import keyqueue
from keyqueue.redis import RedisWorkQueue

__all__ = ["CONTEXT", "Names", "Processes", "Record", "producer", "worker"]

CONTEXT = multiprocessing.get_context("forkserver")
# Children fork from a server that has this module (and so keyqueue.redis)
# imported. Takes effect if no test started the forkserver before.
CONTEXT.set_forkserver_preload([__name__])

STOP_TIMEOUT = 30.0  # generous bound, wall seconds, on a child finishing its part


@dataclass(frozen=True)
class Names:
    """The Redis keys through which the children of one test report."""

    queue: str

    @property
    def records(self) -> str:
        return f"test:{self.queue}:records"

    @property
    def writes(self) -> str:
        return f"test:{self.queue}:writes"

    @property
    def held(self) -> str:
        return f"test:{self.queue}:held"

    @property
    def go(self) -> str:
        return f"test:{self.queue}:go"

    @property
    def stats(self) -> str:
        return f"test:{self.queue}:stats"

    def version(self, key: str) -> str:
        return f"test:{self.queue}:version:{key}"


@dataclass(frozen=True)
class Record:
    """One handler call: the key, its fencing token, when it ran, what it saw."""

    key: str
    token: int
    start: float
    end: float
    version: int
    pid: int

    @classmethod
    def parse(cls, line: bytes | str) -> Record:
        key, token, start, end, version, pid = (
            line.decode() if isinstance(line, bytes) else line
        ).split()
        return cls(key, int(token), float(start), float(end), int(version), int(pid))


def _child(test_pid: int, target: Callable[..., None], *args: Any, **kwargs: Any) -> None:
    """Run ``target`` in a child that exits at once if the test process goes."""
    if hasattr(os, "pidfd_open"):  # Linux
        try:
            pidfd = os.pidfd_open(test_pid)
        except ProcessLookupError:
            os._exit(1)

        def watch() -> None:
            select.select([pidfd], [], [])  # readable once the process has exited
            os._exit(1)

        threading.Thread(target=watch, name="watch-test-process", daemon=True).start()
    target(*args, **kwargs)


def worker(
    url: str,
    names: Names,
    stop: ProcessEvent,
    workers: int = 4,
    lease: float = 10.0,
    hold: tuple[str, ...] = (),
    work: float = 0.0,
) -> None:
    """``run_workers`` on one client of ``names.queue`` until ``stop`` is set.

    Each handler call reads the key's version, spends ``work`` seconds, and
    records itself. A key in ``hold`` is reported to ``names.held`` and then
    kept until the test pushes to ``names.go`` (for the fault tests). At the
    end the ``RunStats`` go to ``names.stats``.
    """
    r = redis.Redis.from_url(url)
    q = RedisWorkQueue(names.queue, url=url, lease=lease)
    pid = os.getpid()

    def handle(key: str) -> None:
        start = time.monotonic()
        version = int(r.get(names.version(key)) or 0)
        if key in hold:
            r.rpush(names.held, f"{key} {q.token(key)} {pid}")
            r.blpop([names.go], timeout=60)
        elif work:
            time.sleep(work)
        r.rpush(names.records, f"{key} {q.token(key)} {start} {time.monotonic()} {version} {pid}")

    stopping = threading.Event()
    threading.Thread(target=lambda: (stop.wait(), stopping.set()), daemon=True).start()
    stats = keyqueue.run_workers(q, handle, workers=workers, stop=stopping)
    r.rpush(names.stats, json.dumps(dataclasses.asdict(stats)))
    q.close()
    r.close()


def producer(url: str, names: Names, keys: list[str], rounds: int, seed: int) -> None:
    """``rounds`` times, for every key in a shuffled order: bump its version on
    the server, note when, then ``add`` it."""
    r = redis.Redis.from_url(url)
    q = RedisWorkQueue(names.queue, url=url)
    order = list(keys)
    shuffle = random.Random(seed).shuffle
    writes = []
    for _ in range(rounds):
        shuffle(order)
        for key in order:
            version = r.incr(names.version(key))
            writes.append(f"{key} {version} {time.monotonic()}")
            q.add(key)
    r.rpush(names.writes, *writes)
    q.close()
    r.close()


class Processes:
    """The child processes of one test, and the event that stops the workers."""

    def __init__(self) -> None:
        self.stop = CONTEXT.Event()
        self.children: list[BaseProcess] = []

    def start(self, target: Callable[..., None], *args: Any, **kwargs: Any) -> BaseProcess:
        child = CONTEXT.Process(
            target=_child, args=(os.getpid(), target, *args), kwargs=kwargs, daemon=True
        )
        child.start()
        self.children.append(child)
        return child

    def join(self, children: list[BaseProcess], timeout: float = STOP_TIMEOUT) -> None:
        """Wait for ``children`` to exit; each must have exited cleanly."""
        deadline = time.monotonic() + timeout
        for child in children:
            child.join(max(0.0, deadline - time.monotonic()))
            assert child.exitcode == 0, f"{child.name} (pid {child.pid}): exit {child.exitcode}"

    def kill_all(self) -> None:
        for child in self.children:
            if child.is_alive():
                child.kill()  # SIGKILL also ends a stopped (SIGSTOP) process
        for child in self.children:
            child.join(5)


@contextmanager
def processes() -> Iterator[Processes]:
    """A ``Processes`` whose children are all killed on leaving, however it is left."""
    owned = Processes()
    try:
        yield owned
    finally:
        owned.kill_all()
