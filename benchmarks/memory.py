"""Memory per waiting key: keyqueue vs a bare set + deque holding the same keys."""

from __future__ import annotations

import collections
import gc
import tracemalloc

from keyqueue import WorkQueue

KEYS = 1_000_000


def measure(n: int = KEYS) -> dict[str, float]:
    keys = [f"namespace/pod-{i}" for i in range(n)]  # the keys themselves are not counted
    gc.collect()

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    dirty = set()
    fifo: collections.deque[str] = collections.deque()
    for key in keys:
        dirty.add(key)
        fifo.append(key)
    floor = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    del dirty, fifo
    gc.collect()

    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    q: WorkQueue[str] = WorkQueue()
    add = q.add
    for key in keys:
        add(key)
    ours = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(q) == n
    return {
        "keys": n,
        "keyqueue_bytes_per_key": ours / n,
        "floor_bytes_per_key": floor / n,
        "ratio": ours / floor,
    }


if __name__ == "__main__":
    print(measure())
