"""What a primary's failover costs the queue: a short chaos run on real replicas.

    PYTHONPATH=src python benchmarks/failover.py --topology sentinel|cluster
        --fault kill|lag-kill|stop|pause|isolate [--duration S] [--every S] [--processes N]
        [--threads T] [--keys K] [--down-after S] [--lease S] [--seed N]
        [--restart replica|as-configured] [--durability primary|replicated]

One topology from ``keyqueue.testing`` (``ValkeySentinelSet``: 1 primary, 2
replicas, 3 sentinels, quorum 2; ``ValkeyCluster``: 3 primaries, 3
replicas) holds the queue, and ``keyqueue.testing._chaos.chaos_run`` (the
same run ``tests/redis/test_failover_chaos.py`` judges) runs it:
``--processes`` worker processes of ``run_workers`` with ``--threads``
threads each, through the client a user would pass, each handler call
writing a fenced store (``ValkeyFence``) on a server no fault touches; a
producer adding ``--keys`` hot keys, recording every add that returned.

Every ``--every`` seconds for ``--duration`` seconds the queue's primary
gets ``--fault`` (``kill``: ``kill -9``, restarted 2 s after its failover
is seen, as a replica of the current primary or with ``--restart
as-configured`` as it was; ``lag-kill``: its replicas cut off for 0.5 s,
then ``kill -9``; ``stop``: ``SIGSTOP`` for 6 s; ``pause``: ``CLIENT
PAUSE`` 6 s; ``isolate``: 6 s from the sentinels only, in a Cluster from
the other nodes only). Each failover is confirmed from the servers. Then
the producer stops, the queue is drained (bounded), the workers stop, and
``check_history`` judges the record: tokens reissued, token regressions,
overlapping valid holds (stale wins), acknowledged adds lost, keys left
held. One JSON line with the figures (``summary``).
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import math
from typing import Any

from keyqueue.testing import ValkeyCluster, ValkeySentinelSet
from keyqueue.testing._chaos import FAULTS, ChaosRun, chaos_run

WARMUP = 3.0
"""Seconds of producing before the first fault."""


def _spans(times: list[float]) -> list[list[float]]:
    """Times (seconds since the start) as [first, last, count] runs, split at gaps over 1 s."""
    spans: list[list[float]] = []
    for t in sorted(times):
        if spans and t - spans[-1][1] <= 1.0:
            spans[-1][1] = round(t, 2)
            spans[-1][2] += 1
        else:
            spans.append([round(t, 2), round(t, 2), 1])
    return spans


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(1000 * ordered[min(len(ordered) - 1, int(len(ordered) * q))], 2)


def summary(run: ChaosRun) -> dict[str, Any]:
    """One run's figures, as the table in docs/DESIGN.md quotes them."""
    found = run.check
    holds = run.holds
    latest: dict[str, float] = {}
    for h in holds:
        if h.accepted:
            latest[h.key] = max(latest.get(h.key, -1.0), h.start)
    counts = collections.Counter(h.token for h in holds)
    tokens_twice = {t for t, n in counts.items() if n > 1}
    starts = sorted(h.start for h in holds)
    gaps = sorted((b - a for a, b in itertools.pairwise(starts)), reverse=True)
    latencies = list(run.add_latencies)
    return {
        "faults": len(run.faults),
        "failovers_seen": run.failovers_seen,
        "primary_changes": run.primary_changes,
        "fault_log": [
            {
                "fault": f.fault,
                "old": f.old,
                "new": f.new,
                "at": round(f.at - run.began, 2),
                "failover_s": f.failover_s,
                "old_role_after": f.old_role_after,
                **({"lagging": list(f.lagging)} if f.lagging else {}),
                **({"error": f.error} if f.error else {}),
            }
            for f in run.faults
        ],
        "holds": found.holds,
        "acked_adds": found.adds,
        "tokens_reissued": found.tokens_reissued,
        "token_regressions": found.token_regressions,
        "overlaps": found.overlaps,
        "stale_wins": found.stale_wins,
        "refused_writes": sum(1 for h in holds if not h.accepted),
        "adds_lost": found.adds_lost,
        "left": dict(run.left),
        "left_held": found.left_held,
        "producer_errors": dict(run.producer_errors),
        "add_p50_ms": _percentile(latencies, 0.5),
        "add_p99_ms": _percentile(latencies, 0.99),
        "longest_pauses_s": [round(g, 2) for g in gaps[:3]],
        "run_stats": list(run.run_stats),
        "lost_adds_s": _spans(
            [a.time - run.began for a in run.adds if latest.get(a.key, -1.0) <= a.time]
        ),
        "reissued_s": _spans([h.start - run.began for h in holds if h.token in tokens_twice]),
    }


def run(args: argparse.Namespace) -> dict[str, Any]:
    """One run as the command line describes it; its ``summary``."""
    topology: ValkeySentinelSet | ValkeyCluster
    if args.topology == "sentinel":
        topology = ValkeySentinelSet(down_after=args.down_after, failover_timeout=3.0)
    else:
        topology = ValkeyCluster(
            node_timeout=args.down_after, partitionable=args.fault == "isolate"
        )
    rounds = max(1, math.ceil((args.duration - WARMUP) / args.every))
    with topology:
        result = chaos_run(
            topology,
            [args.fault] * rounds,
            durability=args.durability,
            processes=args.processes,
            threads=args.threads,
            keys=args.keys,
            lease=args.lease,
            warmup=WARMUP,
            every=args.every,
            restart=args.restart,
            seed=args.seed,
        )
    return {
        "topology": args.topology,
        "fault": args.fault,
        "down_after": args.down_after,
        "durability": args.durability or "primary",
        **summary(result),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--topology", choices=["sentinel", "cluster"], default="sentinel")
    parser.add_argument("--fault", choices=FAULTS, default="kill")
    parser.add_argument("--duration", type=float, default=30.0)
    parser.add_argument("--every", type=float, default=10.0)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--keys", type=int, default=40)
    parser.add_argument("--down-after", type=float, default=1.0)
    parser.add_argument("--lease", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--restart",
        choices=["replica", "as-configured"],
        default="replica",
        help="how a killed Sentinel-set node comes back: following the current primary, "
        "or as it was configured (an old primary then returns an empty primary)",
    )
    parser.add_argument(
        "--durability",
        choices=["primary", "replicated"],
        default=None,
        help="the queues' durability= (default: not passed, the queue's default)",
    )
    print(json.dumps(run(parser.parse_args())), flush=True)


if __name__ == "__main__":
    main()
