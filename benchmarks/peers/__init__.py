"""The libraries the distributed benchmark runs, one adapter each, behind one interface.

An adapter is a module here (``keyqueue``, ``bullmq``, ``streaq``, ``saq``,
``arq``, ``rq``) with:

- ``NAME``, the library's name in the report, and ``SETTINGS``, how it is run
  (the report prints them); every library runs as documented, on its own
  fastest settings;
- ``Producer(url, queue)``: a client, a subclass of ``BaseProducer`` below;
- ``serve(url, queue, handler, ready)``: the library's worker, run in a
  worker process until the process is killed; it calls ``ready()`` once set
  up (``ready`` returns when every worker process of the run is ready) and
  then runs ``handler`` for each key, ``CONCURRENCY`` at a time.

``floor`` is the lower bound, not a library: the same keys on a bare list, popped
one per round trip; it has ``NAME``, a ``Producer`` that only loads, and ``serve``.

An adapter imports its library inside its functions, so every ``NAME`` and
``SETTINGS`` can be read in a virtualenv without that library (BullMQ has a
virtualenv of its own).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from types import ModuleType

LIBS = ("keyqueue", "bullmq", "streaq", "saq", "arq", "rq")
CONCURRENCY = 10  # handlers at once per worker process: arq's and SAQ's default
BATCH = 100  # keys per batched add, and per call when a producer loads distinct keys
SIMPLE = "-simple"  # "bullmq-simple": BullMQ with its simple deduplication


@dataclass(frozen=True)
class Handler:
    """The workload's handler, for a worker process: ``sync`` for threaded
    workers (keyqueue's ``run_workers``, rq, the floor), ``aio`` for asyncio
    ones (BullMQ, streaq, SAQ, arq). Both do the same for a key."""

    sync: Callable[[str], None]
    aio: Callable[[str], Awaitable[None]]


class BaseProducer:
    """A library's client: ``add`` one key (deduplicated), ``add_batch`` many,
    ``load`` the drain's distinct keys. ``open`` before use, ``close`` after."""

    async def open(self) -> None:
        pass

    async def add(self, key: str) -> None:
        raise NotImplementedError

    async def add_batch(self, keys: list[str]) -> None:
        """Many deduplicated adds; by default at once, under ``asyncio.gather``."""
        await asyncio.gather(*(self.add(key) for key in keys))

    async def load(self, keys: list[str]) -> None:
        """Distinct keys, ``BATCH`` a call."""
        for i in range(0, len(keys), BATCH):
            await self.add_batch(keys[i : i + BATCH])

    async def close(self) -> None:
        pass


def adapter(lib: str) -> ModuleType:
    """The adapter module of ``lib`` (``bullmq-simple``: BullMQ's)."""
    return importlib.import_module(f".{lib.removesuffix(SIMPLE)}", __name__)


def name(lib: str) -> str:
    """``lib``'s name in the report."""
    base: str = adapter(lib).NAME
    return f"{base}, simple dedup" if lib.endswith(SIMPLE) else base


async def producer(lib: str, url: str, queue: str) -> BaseProducer:
    """An open client of ``lib`` on ``queue``."""
    made: BaseProducer
    if lib.endswith(SIMPLE):
        made = adapter(lib).Producer(url, queue, keep_last=False)
    else:
        made = adapter(lib).Producer(url, queue)
    await made.open()
    return made
