"""The mover of an online reshard, without I/O: one generator both drivers run.

Theory of operation
-------------------
``reshard(M)`` on a queue whose map is N shards at epoch E (``_resharding``):

1. The map becomes "M, moving from N" at epoch E + 1, written on shard 0
   first (only if it is still at E: of two movers racing, one writes it and
   the other resumes the move), then on every other shard of both maps.
   From then on every shard refuses a client that routes by an older map,
   and clients route a moving key to its old shard first.
2. Passes over the old shards. Each pass reads every key with state in a
   shard (``holdings``) and, for each whose shard under M is another one,
   runs ``export`` there, ``import`` on the new shard, ``finish`` on the
   old. A held key is refused by ``export`` and stays until its holder is
   done; the pass notes it and the next one tries again, after a pause
   and a reap of that shard (a holder that died loses its key once its
   lease runs out; the mover looks again: a move ends after the longest
   hold). Keys that
   an earlier mover exported and did not finish (kept in ``moving``) are
   imported and finished first: this is how a mover that died is resumed.
3. A pass in which no moving key was held ends the move: a key with no
   state in its old shard gets none there any more (a call for it is
   refused, ``KEYMOVED``, unless the key is held there). The map becomes "M"
   at epoch E + 2, shard 0 first, and each shard drops its ``imported``
   marks.

Each step is one atomic script on one shard and asking it again changes
nothing, so a mover killed anywhere is resumed by the next ``reshard(M)``
(of any client), and several movers may run at once. Shrinking is the same
with M < N: the shards M..N-1 end empty.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any

from ._replies import text
from ._shard_map import ShardMap
from ._shards import shard_of

__all__ = ["Step", "move", "reshard"]

Step = tuple[str, int, str, list[str]]
"""What the mover asks its driver: ``("call", shard, script, args)`` (sent
the reply), ``("reap", shard, "", [])`` (the shard's expired leases taken
back, as any client's get does; sent None), ``("reload", 0, "", [])`` (the
client's map read again, sent None), or ``("pause", 0, seconds, [])`` (sent
None)."""

FIRST_PAUSE = 0.02
LONGEST_PAUSE = 0.5


def _call(shard: int, script: str, args: list[str]) -> Step:
    return ("call", shard, script, args)


def reshard(target: int, clock: Callable[[], str], aging: str) -> Generator[Step, Any, int]:
    """Move the queue to ``target`` shards (see the module); returns how many
    keys this mover moved. ``ValueError`` if another reshard, to another
    count, is under way (finish that one first)."""
    while True:
        found = ShardMap.parse((yield _call(0, "map", [clock(), str(target)])))
        if found.moving_from is not None:
            if found.shards != target:
                raise ValueError(
                    f"a reshard to {found.shards} shards (from {found.moving_from}) is under way: "
                    f"finish it first (reshard({found.shards}))"
                )
            moving = found
            break
        if found.shards == target:
            return 0
        moving = ShardMap(target, found.epoch + 1, found.shards)
        written = yield _call(0, "set_map", _map_args(clock, moving, found.epoch))
        if int(written[0]):
            break
    assert moving.moving_from is not None
    for shard in range(1, moving.width):
        yield _call(shard, "set_map", _map_args(clock, moving, None))
    yield ("reload", 0, "", [])
    moved = 0
    pause = 0.0
    floor = 0  # the old shards' highest seq
    while True:
        held: set[int] = set()  # the old shards where a moving key was held
        for old in range(moving.moving_from):
            keys, _, kept, seq = yield _call(old, "holdings", [])
            floor = max(floor, int(seq))
            for key in dict.fromkeys([text(k) for k in kept] + [text(k) for k in keys]):
                new = shard_of(key, target)
                if new == old:
                    continue
                finished = yield from move(key, old, new, moving, clock, aging)
                if finished is None:
                    held.add(old)
                    continue
                moved += finished > 0
        if not held:
            break
        pause = FIRST_PAUSE if pause <= 0 else min(pause * 2, LONGEST_PAUSE)
        yield ("pause", 0, repr(pause), [])
        for old in sorted(held):  # a holder that died: its lease, once run out, is taken back
            yield ("reap", old, "", [])
    for shard in range(target):
        yield _call(shard, "raise_seq", [clock(), str(floor)])
    settled = ShardMap(target, moving.epoch + 1)
    yield _call(0, "set_map", _map_args(clock, settled, moving.epoch))
    for shard in range(1, moving.width):  # written where not yet (another mover may have)
        yield _call(shard, "set_map", _map_args(clock, settled, None))
    yield ("reload", 0, "", [])
    return moved


def move(
    key: str, old: int, new: int, shard_map: ShardMap, clock: Callable[[], str], aging: str
) -> Generator[Step, Any, int | None]:
    """``key`` moved from shard ``old`` to ``new`` under ``shard_map`` (the
    mover's or the client's): ``export`` there (refused while held: None,
    nothing changed), ``import`` on ``new`` (its ``seq`` raised first),
    ``finish`` on ``old``; then its reply (1 if this call dropped the kept
    state, 0 if another mover or client had). An old shard not yet given
    ``shard_map`` (export answers 'behind') is given it first, so a client
    with the old map is refused there from before the key leaves (else its
    add would give the key state in two shards). A client moving a key it
    was refused for (``KEYMOVED``) runs this, as the mover does."""
    exported = yield _call(old, "export", [clock(), key])
    if text(exported[1]) == "behind":  # the mover has not written its map there yet
        yield _call(old, "set_map", _map_args(clock, shard_map, None))
        exported = yield _call(old, "export", [clock(), key])
    if text(exported[1]) == "held":
        return None
    yield _call(new, "import", [clock(), key, text(exported[2]), aging])
    return int((yield _call(old, "finish", [clock(), key])))


def _map_args(clock: Callable[[], str], shard_map: ShardMap, expected: int | None) -> list[str]:
    """``set_map``'s arguments: ``shard_map`` (on shard 0, replacing epoch ``expected``)."""
    moving = "" if shard_map.moving_from is None else str(shard_map.moving_from)
    return [
        clock(),
        str(shard_map.shards),
        str(shard_map.epoch),
        moving,
        "" if expected is None else str(expected),
    ]
