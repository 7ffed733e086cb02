"""A Redis queue's keys and its scripts: the schema, in one place.

The queue's state lives on the server, in the thirty-one keys of ``KEY_NAMES``
below, which share one hash tag, ``{name}`` (so a queue lives in one cluster
slot). Every change is one Lua script of ``SCRIPTS``, named after the
``_core.py`` transition it transcribes, so it is atomic without WATCH/MULTI.

A script is ``lua/<name>.lua`` and the small libraries under ``lua/lib/`` it
names with ``--- @include "lib"`` lines (BullMQ's includes): each library
once, after the ones it includes itself. Its ``-- KEYS:`` header names the
keys it touches, in ``KEY_NAMES`` order; the libraries name them in upper
case (``DIRTY``, ``FIFO``), and ``script_source`` writes each name as its
place in ``KEYS`` (``KEYS[1]``, ``KEYS[2]``: the first line says which is
which), and refuses a script whose code uses a key its header does not name,
or names one it does not use. So each script is sent only the keys and the Lua
it needs. Not locals: a script defines its functions anew on every call, and
each upvalue a function captures costs a walk of the chunk's open upvalues,
so the thirty-odd key names captured by most functions cost several µs a call
(a claim of ten keys, about 6% of its server time).
"""

from __future__ import annotations

import hashlib
import importlib.resources
import re

__all__ = [
    "KEY_NAMES",
    "SCRIPTS",
    "claim_record",
    "get_record",
    "hash_tag",
    "key_names",
    "script_keys",
    "script_source",
]

KEY_NAMES = (
    "dirty",  # HASH key -> time of the add that made it dirty (Core.dirty)
    "fifo",  # LIST waiting keys, oldest first; each dirty and not processing
    "processing",  # ZSET key -> lease expiry (Core.processing, plus leases)
    # HASH key -> "<token> <time of its get> <priority> <seq> <result> <holder>
    # <run>": the hold; seq and result are those of the last fenced outcome its
    # holder applied (0 and - before any); run says whether its handler started
    # (lua/lib/lease.lua)
    "lease",
    "delayed",  # ZSET key -> ready time; the earliest asked wins (ZADD LT)
    "delay_seq",  # HASH key -> order of its delay request: ties come out in it
    "failures",  # HASH key -> failures recorded for max_retries (Core.failures)
    "requeues",  # HASH key -> failures the server rate limiter has seen
    "stats",  # HASH the counters Stats reports, and seq (fencing tokens)
    "bell",  # LIST the doorbell: one element per push, BLPOPped by getters
    # HASH key -> the highest token of it that reap took back (one field per
    # key, cleared by forget): tells a late done asked again from one that ran
    "taken_back",
    # HASH waiting key -> time done pushed it back (FIFO only): when it entered
    # the waiting set (FifoWaiting.repushed)
    "repushed",
    # Priorities (docs/fairness.md). The queue starts as the FIFO list; the
    # first non-zero priority makes it ranked for good (stats' ranked = 1, and
    # aging, '' for strict), as Core.rank:
    # ZSET waiting keys, "<seq, 16 hex digits><key>" scored by -priority
    # (strict) or arrival - priority * aging: lowest first, ties in arrival order
    "ranked",
    "rank",  # HASH waiting key -> "<priority> <seq>"
    "arrivals",  # ZSET waiting key -> when it entered the waiting set
    "by_priority",  # HASH priority -> waiting keys with it
    "pending_priority",  # HASH key pending redelivery -> its priority (if not 0)
    "delayed_priority",  # HASH delayed key -> the priority it is added with (if not 0)
    # ZSET key -> failures recorded for it until its forget, with or without
    # max_retries (Core.failing): a snapshot's failing keys, most first
    "failing",
    # HASH key -> its stalls in a row: holds of it taken back by reap after its
    # handler started (its holder died or stopped renewing). 0: taken back
    # before its handler started (no stall), so its next claimant reports the
    # start before the handler runs. Cleared by its done and by forget; past
    # max_stalls the key is given up (lib/reap.lua)
    "stalls",
    # ZSET given-up key -> when it was given up (Core.dead, oldest first); at
    # most keyqueue._dead.DEAD_LIMIT of them, none older than DEAD_MAX_AGE
    # (lua/lib/dead.lua trims at each give-up, replay and forget_dead; the
    # readers skip older entries)
    "dead",
    "dead_info",  # HASH given-up key -> JSON [reason, error type, message, failures]
    # fair_by (docs/fairness.md, lua/lib/fair.lua): a fair queue's keys' groups
    # and the rotation. HASH key -> its group, the client's fair_by(key), kept
    # while the key is waiting, delayed, held or dead
    "groups",
    # ZSET (by member) "<priority> <#group> <group><seq, 16 hex><key>": each
    # waiting key in its group's keys at its priority, by arrival
    "fair_keys",
    # ZSET (by member) "<priority> <turn, 16 hex><#group> <group>": the groups
    # with keys waiting at a priority, in turn order
    "fair_turns",
    "fair_turn_of",  # HASH "<priority> <#group> <group>" -> its fair_turns member
    "bucket",  # HASH tokens, last: the server rate limiter's token bucket
    # HASH endpoint -> "<tokens> <last>": the server limiter's per-endpoint
    # buckets, at most max_endpoints of them
    "endpoints",
    # ZSET endpoint -> order of its last use (the least recent is dropped
    # beyond max_endpoints)
    "endpoint_lru",
    # HASH key -> its state (JSON) as export took it out of this shard, until
    # finish: the keys a reshard moves away and has not finished (lua/export.lua)
    "moving",
    # HASH key -> the reshard's epoch, for a key imported into this shard in the
    # reshard under way: an import asked again changes nothing (lua/import.lua)
    "imported",
)
"""Every key of a queue, in the order the scripts take the ones they need."""

SCRIPTS = (
    "add",
    "add_after",
    "add_rate_limited",
    "claim",
    "delete",
    "done",
    "dead",
    "export",
    "finish",
    "forget",
    "forget_dead",
    "get",
    "give_up",
    "holdings",
    "idle",
    "import",
    "map",
    "put_back",
    "raise_seq",
    "reap",
    "renew",
    "replay",
    "retry",
    "set_map",
    "snapshot",
    "stats",
)
"""The scripts, one per core transition (and ``claim``: many dones and gets in
one round trip; ``put_back``, ``renew``, ``stats``, ``snapshot``, ``idle``
(``join``'s read) and ``delete``; and a reshard's: ``map``, ``set_map``,
``holdings``, ``export``, ``import``, ``finish``, ``raise_seq``: ``_mover``;
``give_up`` and the dead keys' ``dead``, ``replay`` and ``forget_dead``)."""

KEY_PREFIX = "keyqueue:"


def hash_tag(name: str) -> str:
    """The hash tag of the queue ``name``'s keys, braces included: ``{name}``.

    A name with a ``}`` in it would end the tag early (a name starting with
    one makes an empty tag, and the keys land in as many cluster slots), so
    such a name's tag is ``{#`` and the first 24 hex digits of its SHA-256
    ``}``: every name works, and two names never share their keys.
    """
    if "}" in name:
        return "{#" + hashlib.sha256(name.encode()).hexdigest()[:24] + "}"
    return "{" + name + "}"


def key_names(name: str) -> list[str]:
    """The Redis keys of the queue ``name``, in ``KEY_NAMES`` order."""
    tag = hash_tag(name)
    return [f"{KEY_PREFIX}{tag}:{part}" for part in KEY_NAMES]


def wake_key(name: str, client_id: str) -> str:
    """One client's wake-up list (``shutdown`` and ``interrupt`` ring it)."""
    return f"{KEY_PREFIX}{hash_tag(name)}:wake:{client_id}"


def claim_record(name: str, client_id: str) -> str:
    """One client's record of its last claim (the ``claim`` script's last key):
    what a claim whose reply was lost took, to hand back."""
    return f"{KEY_PREFIX}{hash_tag(name)}:claimed:{client_id}"


def get_record(name: str, client_id: str) -> str:
    """One client's record of its gets, per slot (the ``get`` script's last
    key): what a get whose reply was lost took, to hand back."""
    return f"{KEY_PREFIX}{hash_tag(name)}:got:{client_id}"


# -- assembling the scripts ------------------------------------------------------------

_INCLUDE = re.compile(r'^--- @include "([a-z_]+)"$', re.MULTILINE)
_KEYS_HEADER = re.compile(r"^-- KEYS:(.*(?:\n--   .*)*)", re.MULTILINE)
_KEY_USED = re.compile(r"\b(" + "|".join(k.upper() for k in KEY_NAMES) + r")\b")
_COMMENT = re.compile(r"--.*$", re.MULTILINE)

_ASSEMBLED: dict[str, tuple[tuple[str, ...], str]] = {}


def _read(path: str) -> str:
    return (importlib.resources.files("keyqueue.redis") / "lua" / path).read_text(encoding="utf-8")


def _with_libraries(body: str, done: set[str], parts: list[str]) -> None:
    """Append the libraries ``body`` includes to ``parts`` (theirs first), each once."""
    for lib in _INCLUDE.findall(body):
        if lib not in done:
            done.add(lib)
            text = _read(f"lib/{lib}.lua")
            _with_libraries(text, done, parts)
            parts.append(text)


def _assemble(name: str) -> tuple[tuple[str, ...], str]:
    body = _read(f"{name}.lua")
    header = _KEYS_HEADER.search(body)
    if header is None:
        raise RuntimeError(f"lua/{name}.lua has no '-- KEYS:' header")
    keys = tuple(header.group(1).replace("--", " ").split())
    parts: list[str] = []
    _with_libraries(body, set(), parts)
    parts.append(body)
    code = "\n".join(parts)
    used = set(_KEY_USED.findall(_COMMENT.sub("", code)))
    if {key.upper() for key in keys} != used or list(keys) != sorted(keys, key=KEY_NAMES.index):
        raise RuntimeError(
            f"lua/{name}.lua: its KEYS header {' '.join(keys)} is not the keys its code "
            f"uses ({' '.join(sorted(k.lower() for k in used))}) in KEY_NAMES order"
        )
    place = {key.upper(): f"KEYS[{i}]" for i, key in enumerate(keys, 1)}
    names = ", ".join(f"{name} = {at}" for name, at in place.items())
    return keys, f"-- {names}\n" + _KEY_USED.sub(lambda m: place.get(m.group(1), m.group(1)), code)


def script_source(name: str) -> str:
    """The text of the script ``name``: its keys' locals, its libraries, its body."""
    if name not in _ASSEMBLED:
        _ASSEMBLED[name] = _assemble(name)
    return _ASSEMBLED[name][1]


def script_keys(name: str) -> tuple[str, ...]:
    """The names (of ``KEY_NAMES``) of the keys the script ``name`` takes, in order."""
    if name not in _ASSEMBLED:
        _ASSEMBLED[name] = _assemble(name)
    return _ASSEMBLED[name][0]
