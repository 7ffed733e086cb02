"""The oldest redis-py the ``redis`` extra allows (``redis>=5``) runs keyqueue's scripts.

The suite runs on the redis-py its venv resolves (the newest); keyqueue's own
send path (``redis/_send.py``: a pool's connection, one send, one read) uses
the connection API, which changed between majors (redis-py 5's
``get_connection`` requires the command's name; ``should_reconnect`` came
later). So once per ``make test`` (its pure pass: marked ``once``), the oldest series the extra
allows is installed beside the tree (``pip install --target``, from the
machine's configured indexes: a local mirror holds only the newest) and a process
runs both queues on it against the session's valkey-server: per-key gets and
dones, batched claims under ``run_workers`` and ``arun_workers``, a client
made as ``redis.Redis(host, port)`` (with redis-py's retries on).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import valkey_server

name = valkey_server.name
pytestmark = pytest.mark.once

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import asyncio, json, sys, threading
import redis
import keyqueue
from keyqueue.redis import AsyncRedisWorkQueue, RedisWorkQueue

url, name, keys = sys.argv[1], sys.argv[2], [f"k{i}" for i in range(40)]
host, port = url.split("//")[1].split("/")[0].split(":")
found = {"redis": redis.__version__}

q = RedisWorkQueue(name + "-get", client=redis.Redis(host=host, port=int(port)), lease=5)
q.add_many(keys[:3])
for _ in range(3):
    q.done(q.get())
found["per_key"] = q.stats().dones
q.close()

q = RedisWorkQueue(name + "-sync", url=url, lease=5)
q.add_many(keys)
seen, stop = set(), threading.Event()
def handle(key):
    seen.add(key)
    if len(seen) == len(keys):
        stop.set()
found["sync"] = keyqueue.run_workers(q, handle, workers=4, stop=stop).succeeded
found["sync_left"] = q.stats().processing + q.stats().depth
q.close()

async def main():
    q = AsyncRedisWorkQueue(name + "-async", url=url, lease=5)
    await q.add_many(keys)
    seen, stop = set(), asyncio.Event()
    async def handle(key):
        seen.add(key)
        if len(seen) == len(keys):
            stop.set()
    found["async"] = (await keyqueue.arun_workers(q, handle, workers=4, stop=stop)).succeeded
    s = await q.stats()
    found["async_left"] = s.processing + s.depth
    await q.aclose()

asyncio.run(main())
print(json.dumps(found))
"""


def oldest_series() -> str:
    """``5.0.*`` from the extra's ``redis>=5``: the oldest series it allows."""
    text = (ROOT / "pyproject.toml").read_text()
    found = re.search(r'^redis = \["redis>=(\d+)(?:\.(\d+))?', text, re.M)
    assert found, "pyproject.toml's redis extra names no minimum"
    return f"{found[1]}.{found[2] or 0}.*"


def test_the_oldest_redis_py_the_extra_allows_runs_both_queues(
    tmp_path: Path, valkey_url: str, name: str
) -> None:
    series = oldest_series()
    target = tmp_path / "site"
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--target",
            str(target),
            f"redis=={series}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(target), str(ROOT / "src")]),
        "KEYQUEUE_PURE": "1",
    }
    ran = subprocess.run(
        [sys.executable, "-c", SCRIPT, valkey_url, name],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr[-3000:]
    found = json.loads(ran.stdout.splitlines()[-1])
    assert found.pop("redis").startswith(series.rstrip("*")), found
    assert found == {"per_key": 3, "sync": 40, "sync_left": 0, "async": 40, "async_left": 0}
