"""How the lab writes numbers: thousands separators, never an exponent.

Every number the lab prints for a person goes through one of these (``--json``
keeps plain numbers for scripts). The one exception is the seed, an identifier
to copy back into ``--seed``.
"""

from __future__ import annotations

import math
from decimal import Decimal

__all__ = ["count", "counted", "duration", "number", "numbered"]


def count(n: float) -> str:
    """A whole number: ``12,345``."""
    return f"{round(n):,}"


def counted(n: float, one: str, many: str | None = None) -> str:
    """``n`` as ``count`` writes it, and the noun that agrees with it:
    ``1 retry coming due``, ``2 retries coming due``, ``1,000 keys``. ``many``
    is ``one`` with an ``s`` unless given."""
    noun = one if round(n) == 1 else (many if many is not None else one + "s")
    return f"{count(n)} {noun}"


def numbered(x: float, one: str, many: str | None = None, digits: int = 6) -> str:
    """``x`` as ``number`` writes it, and the noun that agrees with it:
    ``1 event``, ``2.5 events``, ``40,000 events``."""
    text = number(x, digits)
    noun = one if text == "1" else (many if many is not None else one + "s")
    return f"{text} {noun}"


def number(x: float, digits: int = 6) -> str:
    """``x`` to ``digits`` significant digits, without trailing zeros or an
    exponent: ``4``, ``0.0125``, ``2.5``, ``3,600``, ``1,000,000,000,000``."""
    if x == 0 or not math.isfinite(x):
        return f"{x:g}"
    decimals = digits - 1 - math.floor(math.log10(abs(x)))
    rounded = Decimal(repr(round(x, decimals)))  # exact digits, no binary noise
    text = f"{rounded:,.{max(0, decimals)}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def duration(seconds: float) -> str:
    """A short human duration: 5ms, 250ms, 1.5s, 16m40s, 2h5m, 27,777h46m."""
    if seconds < 0.001:
        return f"{number(seconds * 1e6, 3)}µs" if seconds else "0s"
    if seconds < 1:
        return f"{number(seconds * 1000, 3)}ms"
    if seconds < 60:
        return f"{number(seconds, 3)}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{minutes}m{secs}s" if secs else f"{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{hours:,}h{minutes}m" if minutes else f"{hours:,}h"
