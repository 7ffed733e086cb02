"""Offline checks of a queue's recorded history, and the fenced store a handler writes to.

Theory of operation
-------------------
A fault test records what happened and judges it afterwards, so the
judging cannot be disturbed by the faults: each *hold* (a key handed to a
holder with a fencing token, from its handler's start to its end, how it
ended, whether the fenced store took its write), each *acknowledged add*
(a producer's ``add`` that returned, stamped with when it was sent), and
the keys still held when everything stopped. ``check_history`` then checks
the promises of a work queue with fencing tokens:

``token-reused``
    No token is handed out twice (per queue, or per key for a queue whose
    tokens are counted per shard).
``token-order``
    Per key, tokens strictly increase in the order the holds started.
``overlap``
    No two *valid* holds of one key overlap in time. A hold is valid while
    it runs and its holder does not know it lost the key (up to ``lost_at``)
    and only if the fenced store took its write: a holder told in time, or
    refused by the store, did no harm. An overlap in which the hold that
    started later has the lower token is also a *stale win*: a store that
    keeps the highest token sides with the older holder.
``add-lost``
    Every acknowledged add is processed: some hold of its key that the
    store accepted and that was not lost started after the add was sent.
``left-held``
    Nothing is left held.

Times are any one clock all recorders share (``time.monotonic()`` is one
clock for every process of a Linux machine). An add's time is when it was
sent: a hold that started after that may have missed it only if the add
took effect after the hold's start, which a correct queue answers with one
more hold, so the check is lenient by at most one add's round trip.

``MemoryFence`` (one process) and ``ValkeyFence`` (on a server of its own,
for many processes) are the fenced store: per key, a write whose token is
below the highest one accepted is refused (``strict``: also one equal to
it, for stores where a token writes once).
"""

from __future__ import annotations

import itertools
import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

__all__ = [
    "AddRecord",
    "HistoryCheck",
    "HoldRecord",
    "MemoryFence",
    "ValkeyFence",
    "Violation",
    "check_history",
]


@dataclass(frozen=True)
class HoldRecord:
    """One hold of ``key`` by ``holder`` with fencing ``token``, from ``start`` to ``end``.

    ``outcome``: how it ended for its holder (``"done"``; ``"lost"``: a
    renewal or an outcome said the lease was taken back; ``"error"``: the
    handler raised; ``"unknown"``: the holder died or never heard).
    ``accepted``: whether the fenced store took its write (a hold that
    wrote nothing counts as accepted). ``lost_at``: when its holder learned
    it had lost the key, if it did while running.
    """

    key: str
    """The key held."""
    token: int
    """Its fencing token."""
    holder: str
    """Who held it (a client's ``holder``, a process)."""
    start: float
    """When its handler started."""
    end: float
    """When its handler ended (or its holder stopped)."""
    outcome: str = "done"
    """``done``, ``lost``, ``error`` or ``unknown``."""
    accepted: bool = True
    """Whether the fenced store took its write."""
    lost_at: float | None = None
    """When its holder learned the key was taken back, if it did while running."""

    @property
    def valid_until(self) -> float:
        """The end of the time the holder could act on the key."""
        return self.end if self.lost_at is None else min(self.end, self.lost_at)


@dataclass(frozen=True)
class AddRecord:
    """An ``add`` of ``key`` that was acknowledged (returned), sent at ``time``."""

    key: str
    """The key added."""
    time: float
    """When the add was sent."""


@dataclass(frozen=True)
class Violation:
    """One broken promise: ``rule`` (see the module), the key, and what was seen."""

    rule: str
    """``token-reused``, ``token-order``, ``overlap``, ``add-lost`` or ``left-held``."""
    key: str
    """The key concerned."""
    detail: str
    """What was seen: the holds, tokens and times."""


@dataclass(frozen=True)
class HistoryCheck:
    """What ``check_history`` found: every violation, and counts by kind."""

    violations: tuple[Violation, ...]
    """Every broken promise, by rule then key."""
    holds: int
    """How many holds the history had."""
    adds: int
    """How many acknowledged adds it had."""
    tokens_reissued: int
    """Holds whose token an earlier hold already had (one per extra use)."""
    token_regressions: int
    """Consecutive holds of one key whose tokens did not increase."""
    overlaps: int
    """Pairs of valid holds of one key that overlapped."""
    stale_wins: int
    """Overlaps in which the later hold had the lower token."""
    adds_lost: int
    """Acknowledged adds no accepted hold started after."""
    left_held: int
    """Keys still held at the end."""
    by_rule: Mapping[str, int] = field(default_factory=dict)
    """Rule -> how many violations of it."""

    @property
    def ok(self) -> bool:
        """Whether no promise was broken."""
        return not self.violations

    def summary(self) -> str:
        """One line of the counts."""
        return (
            f"{self.holds} holds, {self.adds} acknowledged adds: "
            f"{self.tokens_reissued} tokens reissued, {self.token_regressions} token "
            f"regressions, {self.overlaps} overlapping valid holds ({self.stale_wins} stale "
            f"wins), {self.adds_lost} acknowledged adds lost, {self.left_held} keys left held"
        )


def check_history(
    holds: Iterable[HoldRecord],
    adds: Iterable[AddRecord] = (),
    *,
    left_held: Iterable[str] = (),
    tokens: Literal["queue", "key"] = "queue",
) -> HistoryCheck:
    """Check a recorded history against the module's rules; see ``HistoryCheck``.

    ``tokens``: whether a token must be unique in the whole queue (one
    counter) or only per key (a queue split in shards, each with its own
    counter). Pure: reads its arguments only.
    """
    all_holds = list(holds)
    all_adds = list(adds)
    violations: list[Violation] = []
    reissued = regressions = overlaps = stale_wins = lost = 0

    seen: dict[tuple[str, int], HoldRecord] = {}
    for hold in sorted(all_holds, key=lambda h: (h.start, h.token)):
        scope = (hold.key if tokens == "key" else "", hold.token)
        first = seen.setdefault(scope, hold)
        if first is not hold:
            reissued += 1
            violations.append(
                Violation(
                    "token-reused",
                    hold.key,
                    f"token {hold.token} to {hold.holder} at {hold.start:.3f}, "
                    f"already given to {first.holder} for {first.key!r} at {first.start:.3f}",
                )
            )

    by_key: dict[str, list[HoldRecord]] = defaultdict(list)
    for hold in all_holds:
        by_key[hold.key].append(hold)
    for key, key_holds in by_key.items():
        key_holds.sort(key=lambda h: (h.start, h.token))
        for earlier, later in itertools.pairwise(key_holds):
            if later.token <= earlier.token:
                regressions += 1
                violations.append(
                    Violation(
                        "token-order",
                        key,
                        f"token {later.token} ({later.holder}, {later.start:.3f}) after "
                        f"{earlier.token} ({earlier.holder}, {earlier.start:.3f})",
                    )
                )
        valid = [h for h in key_holds if h.accepted]
        active: list[HoldRecord] = []
        for hold in valid:
            active = [a for a in active if a.valid_until > hold.start]
            for other in active:
                overlaps += 1
                stale = hold.token < other.token
                stale_wins += stale
                violations.append(
                    Violation(
                        "overlap",
                        key,
                        f"{other.holder} (token {other.token}, {other.start:.3f} to "
                        f"{other.valid_until:.3f}) and {hold.holder} (token {hold.token}, "
                        f"from {hold.start:.3f})"
                        + (": the later hold had the lower token" if stale else ""),
                    )
                )
            active.append(hold)

    latest: dict[str, float] = {}
    for hold in all_holds:
        if hold.accepted and hold.outcome != "lost":
            latest[hold.key] = max(latest.get(hold.key, float("-inf")), hold.start)
    for add in all_adds:
        if latest.get(add.key, float("-inf")) <= add.time:
            lost += 1
            violations.append(
                Violation("add-lost", add.key, f"added at {add.time:.3f}; no accepted hold after")
            )

    held = sorted(set(left_held))
    violations.extend(Violation("left-held", key, "still held at the end") for key in held)
    by_rule: dict[str, int] = defaultdict(int)
    for violation in violations:
        by_rule[violation.rule] += 1
    return HistoryCheck(
        violations=tuple(violations),
        holds=len(all_holds),
        adds=len(all_adds),
        tokens_reissued=reissued,
        token_regressions=regressions,
        overlaps=overlaps,
        stale_wins=stale_wins,
        adds_lost=lost,
        left_held=len(held),
        by_rule=dict(by_rule),
    )


class MemoryFence:
    """A fenced store in this process: per key, the highest token that wrote it.

    ``write`` refuses a token below it (``strict``: also one equal to it)
    and says whether it took the write. Thread-safe.
    """

    def __init__(self, *, strict: bool = False) -> None:
        self.strict = strict
        """Whether a token equal to the highest is refused too."""
        self._lock = threading.Lock()
        self._tokens: dict[str, int] = {}  # key -> highest token accepted
        self._values: dict[str, object] = {}

    def write(self, key: str, token: int, value: object = None) -> bool:
        """Write ``value`` to ``key`` with ``token``; False (nothing written) if refused."""
        with self._lock:
            held = self._tokens.get(key)
            if held is not None and (token < held or (self.strict and token == held)):
                return False
            self._tokens[key] = token
            self._values[key] = value
            return True

    def token(self, key: str) -> int | None:
        """The highest token that wrote ``key``, or None."""
        with self._lock:
            return self._tokens.get(key)

    def value(self, key: str) -> object:
        """What the last accepted write of ``key`` wrote (None if none)."""
        with self._lock:
            return self._values.get(key)


class _Evaluating(Protocol):
    def eval(self, script: str, numkeys: int, *keys_and_args: Any) -> Any: ...


_FENCE_SCRIPT = """
local held = redis.call('HGET', KEYS[1], ARGV[1])
local token = tonumber(ARGV[2])
if held and (token < tonumber(held) or (ARGV[4] == '1' and token == tonumber(held))) then
  return 0
end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return 1
"""


class ValkeyFence:
    """A fenced store on a server of its own, shared by many processes.

    ``client`` is a ``redis.Redis`` (any object with its ``eval``) of a
    server that no fault touches. The tokens and values live in two hashes,
    ``<name>:tokens`` and ``<name>:values``; ``write`` is one script, so the
    check and the write are one step. The same rule as ``MemoryFence``.
    """

    def __init__(self, client: _Evaluating, name: str = "fence", *, strict: bool = False) -> None:
        self.client = client
        """The server's client."""
        self.name = name
        """The prefix of its two hashes."""
        self.strict = strict
        """Whether a token equal to the highest is refused too."""

    def write(self, key: str, token: int, value: str = "") -> bool:
        """Write ``value`` to ``key`` with ``token``; False (nothing written) if refused."""
        reply = self.client.eval(
            _FENCE_SCRIPT,
            2,
            f"{self.name}:tokens",
            f"{self.name}:values",
            key,
            token,
            value,
            "1" if self.strict else "0",
        )
        return bool(int(reply))
