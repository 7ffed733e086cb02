"""The exceptions a queue raises."""

from __future__ import annotations

import asyncio
import queue

__all__ = ["Empty", "ShutDown"]


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
