"""The chaos run on a sharded queue: ``kill -9`` of the primary that holds one shard.

A ``ValkeyCluster`` of 3 primaries with a replica each (node timeout 1 s),
shard ``i`` of a 3-shard queue placed on primary ``i``; ``chaos_run`` (as
``test_failover_chaos.py``: 2 worker processes of ``run_workers``, a
producer of 12 hot keys, every handler's hold fenced and reported) in the
``replicated`` mode, one fault: ``kill -9`` of shard 0's primary, restarted
as a replica. The fault counts only if it happened (the servers named
another primary for shard 0, and the old one came back a replica); then
the replicated mode's promises hold for the whole queue: no add raised,
every acknowledged add processed, no token handed out twice nor lower than
an earlier one of its key, no two valid holds overlapping, nothing left
held; and every shard's keys were handled.
"""

from __future__ import annotations

import sys

import pytest

from keyqueue.redis import shard_of
from keyqueue.redis._schema import hash_tag
from keyqueue.redis._shards import shard_name
from keyqueue.testing import ValkeyCluster
from keyqueue.testing._chaos import ChaosRun, chaos_run

pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="the harness reads /proc"),
    pytest.mark.timeout(120),
]

SHARDS = 3
QUEUE = "chaos-sharded"


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> ChaosRun:
    with ValkeyCluster(tmp_path_factory.mktemp("sharded"), node_timeout=1.0) as cluster:
        for i in range(SHARDS):
            cluster.move_slot(cluster.slot(hash_tag(shard_name(QUEUE, i))), cluster.nodes[i])
        result = chaos_run(
            cluster,
            ("kill",),
            queue=QUEUE,
            durability="replicated",
            shards=SHARDS,
            processes=2,
            threads=2,
            keys=12,
            warmup=1.5,
            restart_after=0.2,
            settled=True,
            cooldown=1.0,
            drain_timeout=20.0,
        )
    print(f"\nsharded: {result.check.summary()}; faults {result.faults}")
    return result


def test_the_kill_failed_shard_0_s_primary_over(run: ChaosRun) -> None:
    (fault,) = run.faults
    assert fault.fault == "kill"
    assert fault.old == "node-0"  # shard 0's primary
    assert fault.error is None, fault
    assert fault.new not in (None, fault.old), fault
    assert fault.old_role_after == "slave", fault
    assert run.failovers_seen == 1
    assert run.primaries[0] == "node-0"
    assert run.primary_changes >= 1, run.primaries


def test_the_replicated_promises_hold_for_the_whole_queue(run: ChaosRun) -> None:
    assert run.producer_errors == {}, "an add raised within add_timeout"
    assert len(run.adds) > 200, "the producer hardly produced"
    check = run.check
    assert (check.adds_lost, check.tokens_reissued, check.token_regressions) == (0, 0, 0), (
        check.summary()
    )
    assert check.overlaps == 0, check.summary()
    assert run.left_held == (), check.summary()
    assert dict(run.left) == {"depth": 0, "processing": 0, "delayed": 0}
    assert {shard_of(h.key, SHARDS) for h in run.holds} == set(range(SHARDS))
