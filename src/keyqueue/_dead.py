"""Dead keys: the keys a queue gave up, kept so that they can be looked at and replayed.

A key is given up when its handler's failures end in no retry: ``retry``
said no (``max_retries`` reached, or an in-memory queue shut down without a
drain), the handler raised ``PermanentError``, or (Redis) its holders kept
stalling on it (a poison key). The runners then call ``give_up(key, reason,
error)``, which forgets the key as ``forget`` does and keeps a ``DeadKey``:
why, the error's type and message, the failures it had, and when.

The dead-key set is bounded, so a flood of failures cannot grow it without
end: at most ``DEAD_LIMIT`` keys per queue (the oldest dropped first), and on
Redis none older than ``DEAD_MAX_AGE`` seconds. A key given up again replaces
its entry (it becomes the newest). A queue that never gives a key up pays
nothing: the set is touched only by ``give_up`` and the calls that read or
replay it.

``replay(key)`` drops the entry and adds the key as ``add`` would, with its
failures and its rate limiter's backoff cleared; a key that is waiting or held
meanwhile is coalesced or marked as any add. Public type: ``DeadKey``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final, Generic, TypeVar

__all__ = [
    "DEAD_LIMIT",
    "DEAD_MAX_AGE",
    "ERROR_MESSAGE_MAX",
    "PERMANENT",
    "REASONS",
    "RETRIES",
    "SHUTDOWN",
    "STALLS",
    "DeadKey",
    "check_reason",
    "describe",
]

K = TypeVar("K")

DEAD_LIMIT: Final = 1000
"""The most dead keys a queue keeps (per shard on a sharded Redis queue); the
oldest is dropped when another is given up."""
DEAD_MAX_AGE: Final = 7 * 24 * 3600.0
"""Redis: seconds a dead key is kept (never listed or replayed after that;
dropped from the server by the next give-up, ``replay`` or ``forget_dead``)."""
ERROR_MESSAGE_MAX: Final = 500
"""The most characters of an error's message a dead key keeps."""

RETRIES: Final = "retries"
"""Given up by ``retry``: it failed ``max_retries`` times."""
PERMANENT: Final = "permanent"
"""Its handler raised ``PermanentError``."""
STALLS: Final = "stalls"
"""Redis: a poison key, its holders stalled on it more than ``max_stalls``
times in a row."""
SHUTDOWN: Final = "shutdown"
"""In memory: it failed while the queue shut down without a drain."""
REASONS: Final = (RETRIES, PERMANENT, STALLS, SHUTDOWN)
"""Why the library gives a key up (``DeadKey.reason``)."""


@dataclass(frozen=True, slots=True)
class DeadKey(Generic[K]):
    """A key the queue gave up, newest first (``dead()``, ``Snapshot.dead``)."""

    key: K
    """The key."""
    reason: str
    """Why: ``"retries"`` (``max_retries`` failures), ``"permanent"``
    (``PermanentError``), ``"stalls"`` (Redis: a poison key), ``"shutdown"``
    (in memory: failed during a shutdown without a drain), or what a caller
    of ``give_up`` passed."""
    error_type: str | None
    """The last error's type (its qualified name), None without one."""
    error: str | None
    """The last error's message (``str(error)``, at most 500 characters),
    None without one."""
    failures: int
    """The failures recorded for it (``retry`` calls since its last
    ``forget``) when it was given up; for a poison key, its stalls."""
    at: float
    """When it was given up: wall seconds since the epoch (``time.time()`` in
    memory; the server's clock on Redis)."""


def describe(error: BaseException | None) -> tuple[str | None, str | None]:
    """An error's type name and message as a dead key keeps them."""
    if error is None:
        return None, None
    return type(error).__qualname__, str(error)[:ERROR_MESSAGE_MAX]


def check_reason(reason: object) -> str:
    """``give_up``'s reason: a non-empty str (``TypeError``/``ValueError`` otherwise)."""
    if not isinstance(reason, str):
        raise TypeError(f"reason must be a str, got {reason!r}")
    if not reason:
        raise ValueError("reason must not be empty")
    return reason
