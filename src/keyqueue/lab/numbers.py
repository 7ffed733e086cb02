"""Moved to ``keyqueue.lab._format``; these names stay here until nothing imports them."""

from __future__ import annotations

from ._format import count, counted, duration, number, numbered

__all__ = ["count", "counted", "duration", "number", "numbered"]
