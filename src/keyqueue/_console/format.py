"""How the ``keyqueue`` commands write for a person: output modes, numbers in digits and words.

Every subcommand writes through an ``Output``: rich (colour, boxes, live
panels), plain (``--plain``, or stdout not a terminal: the same words without
colour, boxes or redraw, one line per update, to pipe and grep), or JSON
(``--json``: only ``result.to_json()``).

Every number a command prints for a person goes through one of the helpers
here: thousands separators, never an exponent (``count``, ``number``,
``duration``), the noun that agrees with it (``counted``, ``numbered``), or
words (``roughly``). ``--json`` keeps plain numbers for scripts. The one
exception is the seed, an identifier to copy back into ``--seed``.
"""

from __future__ import annotations

import enum
import json
import math
import shutil
import sys
from collections.abc import Callable
from decimal import Decimal
from typing import Any

from rich import box
from rich.console import Console, RenderableType
from rich.table import Column, Table

__all__ = [
    "DASH",
    "RHO",
    "Mode",
    "Output",
    "count",
    "counted",
    "due",
    "duration",
    "left",
    "number",
    "numbered",
    "percent",
    "roughly",
]


class Mode(enum.Enum):
    RICH = "rich"
    PLAIN = "plain"
    JSON = "json"

    @classmethod
    def choose(cls, as_json: bool, plain: bool) -> Mode:
        if as_json:
            return cls.JSON
        if plain or not sys.stdout.isatty():
            return cls.PLAIN
        return cls.RICH


class Output:
    """Where a subcommand writes: a rich console (colour or not), or JSON only."""

    def __init__(self, mode: Mode) -> None:
        self.mode = mode
        if mode is Mode.RICH:
            self.console = Console(highlight=False, markup=False, emoji=False)
        else:
            width = shutil.get_terminal_size((120, 24)).columns if sys.stdout.isatty() else 120
            self.console = Console(
                color_system=None,
                force_terminal=False,
                force_jupyter=False,
                highlight=False,
                markup=False,
                emoji=False,
                width=width,
                soft_wrap=True,
            )

    @property
    def rich(self) -> bool:
        return self.mode is Mode.RICH

    @property
    def quiet(self) -> bool:
        """--json: nothing but the JSON document on stdout."""
        return self.mode is Mode.JSON

    def print(self, *renderables: RenderableType) -> None:
        """Print each renderable on its own line(s); nothing with --json."""
        if not self.quiet:
            for renderable in renderables:
                self.console.print(renderable)

    def json(self, data: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(data, indent=2, ensure_ascii=False) + "\n")
        sys.stdout.flush()

    def box(self) -> Any:
        """Table box: lines in rich mode, none in plain mode."""
        return box.SIMPLE_HEAD if self.rich else None

    def table(self, *columns: str | Column, title: str | None = None) -> Table:
        """A table in the lab's style: its title on the left, a rule under the
        header in rich mode, none in plain mode. A column given as a ``str`` is
        numbers, justified right; ``left(header)`` makes one of words."""
        return Table(
            *(Column(c, justify="right") if isinstance(c, str) else c for c in columns),
            title=title,
            box=self.box(),
            title_justify="left",
        )

    def show(self, result: Any, render: Callable[[Any, Output], None]) -> None:
        """A computed result: with ``--json`` its ``to_json()`` document, else
        ``render(result, self)``."""
        if self.quiet:
            self.json(result.to_json())
        else:
            render(result, self)


def left(header: str) -> Column:
    """A table column of words, justified left (``Output.table``)."""
    return Column(header, justify="left")


RHO = "\u03c1"  # spelled out: ruff flags a literal rho as confusable with p
DASH = "\u2013"  # en dash, for ranges


# -- numbers ----------------------------------------------------------------


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
    """A short human duration: 5ms, 250ms, 1.5s, 16m40s, 2h5m, 27,777h46m (-1.5s before 0).

    Every duration the commands and the dashboard's page show is written here
    (or by ``due``), so one state reads the same wherever it is shown."""
    if seconds < 0:
        return "-" + duration(-seconds)
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


def due(seconds: float | None) -> str:
    """A time ahead, as ``duration`` writes it: ``in 4.5s``; past, ``overdue 4m18s``;
    ``-`` for None (nothing ahead)."""
    if seconds is None:
        return "-"
    if seconds < 0:
        return f"overdue {duration(-seconds)}"
    return f"in {duration(seconds)}"


# -- words --------------------------------------------------------------------

_ONES = ["", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"]
_TEENS = [
    "ten",
    "eleven",
    "twelve",
    "thirteen",
    "fourteen",
    "fifteen",
    "sixteen",
    "seventeen",
    "eighteen",
    "nineteen",
]
_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]


def _spoken_small(n: int, scaled: bool) -> str:
    """Words for 1 <= n <= 999: 'a hundred and fifty', 'twelve', 'forty-two'.

    ``scaled``: a thousand/million follows, so a lone 1 is 'a'.
    """
    hundreds, rest = divmod(n, 100)
    parts = []
    if hundreds:
        parts.append(("a" if hundreds == 1 else _ONES[hundreds]) + " hundred")
    if rest >= 20:
        parts.append(_TENS[rest // 10] + ("-" + _ONES[rest % 10] if rest % 10 else ""))
    elif rest >= 10:
        parts.append(_TEENS[rest - 10])
    elif rest:
        parts.append("a" if rest == 1 and scaled and not hundreds else _ONES[rest])
    return " and ".join(parts)


def _spoken(value: int) -> str:
    """Words for a positive integer with at most two significant digits."""
    for size, name in ((10**9, "billion"), (10**6, "million")):
        if value >= size:
            n = value / size
            return (_spoken_small(int(n), True) if n.is_integer() else f"{n:g}") + f" {name}"
    if value >= 1000 and value % 1000 == 0:
        return _spoken_small(value // 1000, True) + " thousand"
    if value >= 1000:
        return _spoken_small(value // 100, False) + " hundred"  # 1,100: 'eleven hundred'
    return _spoken_small(value, False)


def roughly(x: float) -> str:
    """A number as a person would say it: 'half a million', 'about a thousand'.

    One significant figure, two when the first digit is 1 (150,000 is 'a
    hundred and fifty thousand', not 'a hundred thousand'); 'about' when the
    rounding changed the number by more than 0.5%.
    """
    if x < 0.5:
        return "none" if x == 0 else "less than one"
    exponent = max(0, math.floor(math.log10(x)))
    digits = 2 if x / 10**exponent < 1.95 and exponent >= 1 else 1
    step = 10 ** (exponent - digits + 1)
    value = round(x / step) * step
    about = abs(value - x) > 0.005 * x
    if value in (500_000, 500_000_000):
        words = "half a million" if value == 500_000 else "half a billion"
    else:
        words = _spoken(value)
    return f"about {words}" if about else words


def percent(x: float) -> str:
    """A percentage rounded down, so 99.96 absorbed never reads as 100%."""
    return f"{math.floor(x * 10) / 10:.1f}%"
