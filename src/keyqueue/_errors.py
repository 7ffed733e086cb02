"""The exceptions a queue raises."""

from __future__ import annotations

import asyncio
import queue

__all__ = ["Empty", "LeaseLost", "ShutDown", "Stalled"]


class Empty(queue.Empty, asyncio.QueueEmpty):
    """No key is waiting (``get_nowait``) or none arrived in time (``get(timeout=)``).

    Subclasses both ``queue.Empty`` and ``asyncio.QueueEmpty`` so code written for
    either standard queue catches it unchanged.
    """


class ShutDown(Exception):
    """The queue was shut down and has nothing left to hand out.

    Raised by ``get`` once ``shutdown()`` was called and every key that was waiting
    or pending redelivery at that moment has been handed out.
    """


class LeaseLost(Exception):
    """A holder's lease on a key expired; another holder may have the key now.

    Raised by a backend whose holds are leases (the Redis backend) when a late
    ``done`` or ``renew`` arrives with a stale token: that call changed nothing.
    The runners count it in ``RunStats.lease_lost``, log a warning and go on;
    they never retry such a key (its new holder owns it).
    """


class Stalled(Exception):
    """A key given up as poison: it stalled its holder more than ``max_stalls``
    times in a row.

    A stall is a hold whose lease ran out after its handler started: its
    process died (a handler that crashes it, an out-of-memory kill, a lost
    machine) or stopped renewing. The Redis backend counts stalls apart from
    handler failures (``max_retries``) and gives a key up at its
    ``max_stalls + 1``-th in a row (its ``done`` or ``forget`` ends the row).
    The runners pass it to ``on_give_up`` for each key their queue client's
    calls gave up so (the client whose call took the last lease back).
    """
