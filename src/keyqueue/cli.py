"""The ``keyqueue`` console script: a stub that loads the lab only when run.

``import keyqueue`` never imports this module's targets (click, rich, the
lab). Without the ``keyqueue[lab]`` extra the command says exactly what to
install, on stderr, and exits 1.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["INSTALL_LINE", "main"]

INSTALL_LINE = "pip install 'keyqueue[lab]'"
_LAB_LIBRARIES = ("click", "rich")


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``keyqueue`` with ``argv`` (default: ``sys.argv[1:]``); exits when done."""
    try:
        from .lab.cli import main as lab_main  # noqa: PLC0415 (lazy: needs the lab extra)
    except KeyboardInterrupt:  # Ctrl-C while the lab loads: as at any other moment
        print("keyqueue: interrupted", file=sys.stderr)
        sys.exit(130)
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").partition(".")[0]
        if missing not in _LAB_LIBRARIES:
            raise
        print(
            f"keyqueue: the command line needs the lab extra ({missing} is not installed):\n"
            f"    {INSTALL_LINE}",
            file=sys.stderr,
        )
        sys.exit(1)
    lab_main(argv)
