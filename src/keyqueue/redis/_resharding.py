"""A sharded queue's map and how its clients follow a reshard, without I/O.

Theory of operation
-------------------
Each shard's ``stats`` hash holds the queue's map: ``map_shards`` (N),
``map_epoch`` and, while a reshard moves keys from N' shards to N,
``map_from`` (N'). Shard 0, whose slot is the unsharded queue's (``{name}``),
is the authority: the mover writes it first. A queue made by unsharded
clients has no map: one shard at epoch 0. A queue made by a sharded client
starts at epoch 1, so an unsharded client (which sends no epoch) is refused
by it.

Every call of a sharded client carries its map's epoch (``tag``: after the
clock, in the scripts' first argument). A script that reads the key's state
(``lua/lib/map.lua``, from the flags it reads anyway: no command more, and
none at all for an unsharded queue) refuses an older epoch, ``MAPCHANGED``,
before changing anything: the client reloads the map and asks again. A call
not routed by its key (a get, a done of a held key, a renewal) is asked
again of the same shard; a routed one is routed again (``MapChanged``).

While keys move (``_shard_map.ShardMap.route``), a call for a key whose
shard changes goes to its old shard first, marked as moving. The old shard
serves it only if the key is held there (a held key stays until its holder
is done); else it answers ``KEYMOVED`` and nothing changes (``KeyMoved``). The client then
moves the key itself: ``export`` on the old shard (the key's whole state
and the shard's ``seq``, kept in ``moving``; refused while held), ``import``
on the new one (``seq`` raised to at least the old one first, so the key's
tokens keep increasing; the state merged by the add rule; once per key and
reshard), ``finish`` on the old one (drops the kept state), and asks the new
shard. The mover does the same for every key with state in an old shard
(``redis/_mover.py``). So a moving key has state in one shard at a time,
except between export and import, when it has none anywhere that a getter
can take: no two holders, nothing lost.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

import redis

__all__ = [
    "ROUTE",
    "KeyMoved",
    "MapChanged",
    "ask_again",
    "map_answer",
    "refused",
    "routed",
    "tag",
]

ROUTE: contextvars.ContextVar[str] = contextvars.ContextVar("keyqueue_route", default="")
"""How the calling thread's or task's script calls are routed: ``''`` not by
their key (refused for an older map: asked again of the same shard), ``'r'``
by their key (refused: ``MapChanged``), ``'m'`` by their key, which moves
(and the old shard does not hold it: ``KeyMoved``)."""


class MapChanged(Exception):
    """A call routed by its key was refused for an older map: the map is
    reloaded, route it again. Internal to the sharded clients."""


class KeyMoved(Exception):
    """A call for a moving key was refused by its old shard, which does not
    hold it: move the key, then ask its new shard. Internal."""


def map_answer(exc: BaseException) -> str | None:
    """``'MAPCHANGED'`` or ``'KEYMOVED'`` if ``exc`` is that refusal of a script, else None."""
    if isinstance(exc, redis.exceptions.ResponseError):
        code = str(exc).split(" ", 1)[0]
        if code in ("MAPCHANGED", "KEYMOVED"):
            return code
    return None


def refused(exc: BaseException) -> None:
    """Raise what a shard's error ``exc`` means to a sharded client, unless it
    is a refusal for an older map (``MAPCHANGED``: the client reloads its
    map, then ``ask_again``): ``KeyMoved`` for ``KEYMOVED``, ``exc`` itself
    for any other error."""
    answer = map_answer(exc)
    if answer is None:
        raise exc
    if answer == "KEYMOVED":
        raise KeyMoved from None


def ask_again(exc: BaseException, epoch: int, reloaded: int, route: str) -> None:
    """After ``MAPCHANGED`` (``exc``) for a call made at ``epoch`` and the
    map reloaded (now at epoch ``reloaded``): ``exc`` raised if the map is
    no newer, ``MapChanged`` if the call is routed by its key (route it
    again); else return: ask the same shard again."""
    if reloaded <= epoch:
        raise exc
    if route:
        raise MapChanged from None


def tag(args: list[str], epoch: int, route: str) -> list[str]:
    """A script's arguments with the client's map added to the first (its
    clock): ``@epoch``, and ``m`` if its key moves."""
    if not args:
        return args
    return [f"{args[0]}@{epoch}{'m' if route == 'm' else ''}", *args[1:]]


@contextlib.contextmanager
def routed(how: str) -> Iterator[None]:
    """``ROUTE`` set to ``how`` for the calls made in the block."""
    token = ROUTE.set(how)
    try:
        yield
    finally:
        ROUTE.reset(token)
