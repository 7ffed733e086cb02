"""Moved: the shared formatting to ``keyqueue.lab._format``, each demonstration's
rendering to its own ``render`` module. ``Mode`` and ``Output`` stay importable
here until nothing imports them from here."""

from __future__ import annotations

from ._format import Mode, Output

__all__ = ["Mode", "Output"]
