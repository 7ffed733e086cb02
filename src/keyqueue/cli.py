"""The ``keyqueue`` command: the operator's commands, the dashboard and the lab, side by side.

``keyqueue.cli.keyqueue`` is the click group, built when first used:

- ``inspect``, ``top``, ``add``, ``forget``, ``dead``, ``replay``, ``delete``
  (``keyqueue.ops``) and
  ``dashboard`` (``keyqueue.dashboard``), which need the ``keyqueue[ops]``
  extra;
- ``lab`` (``keyqueue.lab``), which needs the ``keyqueue[lab]`` extra: loaded
  only when asked for (its help listed, or a lab command run), or, without
  the extra, the line that installs it.

``import keyqueue.cli`` imports none of them, nor click or rich: ``main`` is a
stub that, without the extra a command needs, says exactly what to install,
on stderr, and exits 1 (``keyqueue[ops]`` for the operator's commands,
``keyqueue[lab]`` for ``keyqueue lab``).
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

from ._console import LAB_INSTALL, OPS_INSTALL

if TYPE_CHECKING:
    import click

__all__ = ["LAB_INSTALL", "OPS_INSTALL", "main"]

_COMMAND_LINE_LIBRARIES = ("click", "rich")


def main(argv: Sequence[str] | None = None) -> None:
    """Run ``keyqueue`` with ``argv`` (default: ``sys.argv[1:]``); exits when done."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        _run(args)
    except (KeyboardInterrupt, RuntimeError) as exc:  # Ctrl-C before a command could take it
        # (loading, parsing). Python 3.11 wraps what a ``__set_name__`` raises (a
        # dataclass field's, as a class is made) in a RuntimeError: Ctrl-C is its cause.
        if isinstance(exc, RuntimeError) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        print("keyqueue: interrupted", file=sys.stderr)
        sys.exit(130)


def _run(args: list[str]) -> None:
    try:
        group = _group()
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
    group.main(args=args, prog_name="keyqueue")


def _lab() -> click.Command:
    from .lab.cli import lab  # noqa: PLC0415 (the lab extra, only when asked for)

    return lab


@functools.cache
def _group() -> click.Group:
    """The ``keyqueue`` group with every command registered (imports click and the commands)."""
    from ._console.commands import lab_or_install_line, new_group  # noqa: PLC0415 (an extra)
    from .dashboard.command import dashboard  # noqa: PLC0415
    from .ops.command import COMMANDS as OPERATOR_COMMANDS  # noqa: PLC0415
    from .ops.place import place  # noqa: PLC0415
    from .ops.reshard import reshard  # noqa: PLC0415

    group = new_group()
    for command in OPERATOR_COMMANDS:  # inspect, top, add, forget, dead, replay, delete
        group.add_command(command)
    group.add_command(reshard)
    group.add_command(place)
    group.add_command(dashboard)
    group.add_lazy("lab", lambda: lab_or_install_line(_lab))
    return group


def __getattr__(name: str) -> click.Group:
    """``keyqueue.cli.keyqueue``: the group, built on first use (imports click and the commands)."""
    if name == "keyqueue":
        return _group()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
