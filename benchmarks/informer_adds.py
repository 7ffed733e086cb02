"""The informer handing changes to a queue: what adds in flight pay, what the pipeline costs.

    .venv/bin/python benchmarks/informer_adds.py [--keys 2000] [--runs 3]

Two measurements, each a ratio within one run (this machine is shared and noisy):

- ``async``: ``--keys`` changes (a relist) through the informer's delivery
  (``keyqueue._delivery.Deliveries``) into an ``AsyncRedisWorkQueue`` on a
  private valkey-server, at each ``max_in_flight`` of 1 (an await in line), 4,
  16 (the default) and 64: keys/s, and the ratio to 1. Once on loopback, and
  once through a proxy in a process of its own that holds every chunk
  ``--delay-ms`` each way (a server a network away: 2 x 0.25 ms by default,
  a round trip inside one data centre).
- ``plain``: the same changes into a ``WorkQueue`` (a plain add): the
  delivery's cost per change against calling the handlers in a loop, which
  awaits nothing.

Medians of ``--runs``; one JSON document on stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

from keyqueue import WorkQueue
from keyqueue._delivery import Deliveries
from keyqueue.redis import AsyncRedisWorkQueue
from keyqueue.testing import local_valkey

LIMITS = (1, 4, 16, 64)

# A TCP proxy (argv: listen port 0, target port, delay in seconds): each chunk
# is forwarded ``delay`` after it arrived, in order. Prints its port.
_PROXY = r"""
import asyncio, sys

async def pipe(reader, writer, delay):
    chunks = asyncio.Queue()
    async def forward():
        while True:
            due, data = await chunks.get()
            if data is None:
                writer.close()
                return
            wait = due - loop.time()
            if wait > 0:
                await asyncio.sleep(wait)
            writer.write(data)
    task = asyncio.create_task(forward())
    while True:
        data = await reader.read(65536)
        chunks.put_nowait((loop.time() + delay, data or None))
        if not data:
            break
    await task

async def main():
    global loop
    loop = asyncio.get_running_loop()
    target, delay = int(sys.argv[1]), float(sys.argv[2])
    async def handle(reader, writer):
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", target)
        await asyncio.gather(pipe(reader, up_writer, delay), pipe(up_reader, writer, delay))
    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    await server.serve_forever()

asyncio.run(main())
"""


class _Change:
    __slots__ = ("key",)

    def __init__(self, key: str) -> None:
        self.key = key


async def _deliver_all(
    handler: Callable[[_Change], Awaitable[None] | None], limit: int, changes: list[_Change]
) -> float:
    deliveries: Deliveries[_Change] = Deliveries([handler], limit, asyncio.sleep)
    started = time.perf_counter()
    for change in changes:
        waiting = deliveries.deliver(change.key, change)
        if waiting is not None:
            await waiting
    await deliveries.join()
    return time.perf_counter() - started


async def _async_run(url: str, keys: int, run: int) -> dict[int, float]:
    rates = {}
    for limit in LIMITS:
        queue = AsyncRedisWorkQueue(f"bench-{run}-{limit}", url=url)
        try:
            await queue.add("warm-up")  # the server check and the scripts loaded
            changes = [_Change(f"default/obj-{i:05d}") for i in range(keys)]
            seconds = await _deliver_all(lambda c, q=queue: q.add(c.key), limit, changes)
            assert (await queue.stats()).depth == keys + 1
            await queue.delete(force=True)
        finally:
            await queue.aclose()
        rates[limit] = keys / seconds
    return rates


async def _plain_run(keys: int) -> tuple[float, float]:
    changes = [_Change(f"default/obj-{i % 500:05d}") for i in range(keys * 50)]
    queue: WorkQueue[str] = WorkQueue("plain")
    handlers: list[Callable[[_Change], Any]] = [lambda c: queue.add(c.key)]
    started = time.perf_counter()
    for change in changes:  # the handlers called in a loop, nothing awaited
        for handler in list(handlers):
            try:
                handler(change)
            except Exception:  # pragma: no cover - never raises here
                pass
    before = (time.perf_counter() - started) / len(changes)
    seconds = await _deliver_all(lambda c: queue.add(c.key), 16, changes)
    return before, seconds / len(changes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--keys", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--delay-ms", type=float, default=0.25)
    args = parser.parse_args()
    runs: dict[str, list[dict[int, float]]] = {"loopback": [], "delayed": []}
    plain: list[tuple[float, float]] = []
    with local_valkey() as url:
        port = int(url.rsplit(":", 1)[1].split("/")[0])
        proxy = subprocess.Popen(
            [sys.executable, "-c", _PROXY, str(port), str(args.delay_ms / 1000)],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert proxy.stdout is not None
            delayed = f"redis://127.0.0.1:{int(proxy.stdout.readline())}/0"
            for run in range(args.runs):
                runs["loopback"].append(asyncio.run(_async_run(url, args.keys, run)))
                runs["delayed"].append(asyncio.run(_async_run(delayed, args.keys, run)))
                plain.append(asyncio.run(_plain_run(args.keys)))
        finally:
            proxy.kill()
            proxy.wait()
    report: dict[str, Any] = {"keys": args.keys, "runs": args.runs, "delay_ms": args.delay_ms}
    for way, measured in runs.items():
        report[f"{way}_keys_per_second"] = {
            str(limit): round(statistics.median(r[limit] for r in measured)) for limit in LIMITS
        }
        report[f"{way}_ratio_to_in_line"] = {
            str(limit): round(statistics.median(r[limit] / r[1] for r in measured), 2)
            for limit in LIMITS
        }
    before = statistics.median(p[0] for p in plain)
    after = statistics.median(p[1] for p in plain)
    print(
        json.dumps(
            {
                **report,
                "plain_us_per_change": {
                    "loop_before": round(before * 1e6, 3),
                    "deliveries": round(after * 1e6, 3),
                    "ratio": round(statistics.median(p[1] / p[0] for p in plain), 2),
                },
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
