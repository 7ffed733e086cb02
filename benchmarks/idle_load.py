"""What an idle worker pool costs its server: commands a second, nothing queued.

``run_workers(q, handler, workers=4)`` on an empty ``RedisWorkQueue`` (a
private valkey-server on loopback, default lease), then INFO commandstats
over a window: top-level calls (scripts, BLPOPs) and every command counted
(the scripts' inner commands too). Run it on a checkout of any commit:

    .venv/bin/python benchmarks/idle_load.py [--seconds 10] [--workers 4]
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time

import redis

from keyqueue import run_workers
from keyqueue.redis import RedisWorkQueue
from keyqueue.testing import ValkeyServer

TOP_LEVEL = ("cmdstat_evalsha", "cmdstat_eval", "cmdstat_blpop", "cmdstat_rpush", "cmdstat_pexpire")


def counts(client: redis.Redis) -> tuple[int, int]:
    """(top-level calls, every command) the server has run, INFO itself left out."""
    stats = client.info("commandstats")
    every = sum(int(v["calls"]) for k, v in stats.items() if k != "cmdstat_info")
    top = sum(int(stats[k]["calls"]) for k in TOP_LEVEL if k in stats)
    return top, every


def measure(seconds: float, workers: int) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as directory, ValkeyServer(directory) as server:
        probe = redis.Redis.from_url(server.url)
        q = RedisWorkQueue("idle", url=server.url)
        stop = threading.Event()
        runner = threading.Thread(target=run_workers, args=(q, lambda key: None, workers, stop))
        runner.start()
        time.sleep(1.0)  # the workers start and settle into waiting
        top0, every0 = counts(probe)
        time.sleep(seconds)
        top1, every1 = counts(probe)
        stop.set()
        started = time.monotonic()
        runner.join()
        stopped = time.monotonic() - started
        q.close()
        probe.close()
    return {
        "calls_per_s": (top1 - top0) / seconds,
        "commands_per_s": (every1 - every0) / seconds,
        "stop_s": stopped,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--workers", type=int, default=4)
    args = parser.parse_args()
    result = measure(args.seconds, args.workers)
    print(
        f"idle pool of {args.workers} workers over {args.seconds:g} s: "
        f"{result['calls_per_s']:.2f} calls/s, {result['commands_per_s']:.2f} commands/s "
        f"(scripts' inner commands counted); stop returned in {result['stop_s']:.3f} s"
    )


if __name__ == "__main__":
    main()
