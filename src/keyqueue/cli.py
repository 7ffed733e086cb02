"""The ``keyqueue`` console script: a stub that loads the commands only when run.

``import keyqueue`` never imports this module's targets (click, rich, the
operator's tools, the lab). Without the extra a command needs, it says
exactly what to install, on stderr, and exits 1: ``keyqueue[ops]`` for the
operator's commands, ``keyqueue[lab]`` for ``keyqueue lab``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from ._cli import LAB_INSTALL, OPS_INSTALL

__all__ = ["LAB_INSTALL", "OPS_INSTALL", "main"]

_COMMAND_LINE_LIBRARIES = ("click", "rich")


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``keyqueue`` with ``argv`` (default: ``sys.argv[1:]``); exits when done."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _run(args)
    except KeyboardInterrupt:  # Ctrl-C before a command could take it (loading, parsing)
        print("keyqueue: interrupted", file=sys.stderr)
        sys.exit(130)


def _run(args: list[str]) -> None:
    try:
        from ._cli.commands import main as run  # noqa: PLC0415 (lazy: needs an extra)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in _COMMAND_LINE_LIBRARIES:
            raise
        extra, line = ("lab", LAB_INSTALL) if args[:1] == ["lab"] else ("ops", OPS_INSTALL)
        print(
            f"keyqueue: the command line needs the {extra} extra ({missing} is not installed):\n"
            f"    {line}",
            file=sys.stderr,
        )
        sys.exit(1)
    run(args)
