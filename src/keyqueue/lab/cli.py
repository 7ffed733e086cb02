"""The ``keyqueue`` command: the click group ``keyqueue lab`` and its subcommands.

This module only builds the group and registers each demonstration's command
(``slowmo``, ``firehose``, ``backoff``, ``model``, ``fairness``, ``pipeline``,
``web``: each in ``keyqueue.lab.<demo>``), and gives them all one way to fail.
Errors in the options (a number out of range, nan, inf) are one line on
stderr and exit status 2; any other error (a server that cannot be reached) is
one line and exit status 1. Every error line has one shape, ``keyqueue lab
CMD: error: MESSAGE``. Ctrl-C during a run prints the summary so far and
exits 130; at any other moment (starting up, printing) it prints ``keyqueue
lab CMD: interrupted`` and exits 130 too. When the output pipe closes
(``keyqueue lab slowmo | head -2``) the run stops at its next write and exits
1, quietly: stdout is pointed at /dev/null so no later flush complains.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Sequence
from typing import Any

import click

from keyqueue import __version__
from keyqueue.dashboard.command import dashboard

from ..ops.command import COMMANDS as OPERATOR_COMMANDS
from ._options import EXIT_INTERRUPTED
from .backoff.command import backoff
from .fairness.command import fairness
from .firehose.command import firehose
from .model.command import model
from .pipeline.command import pipeline_command
from .slowmo.command import slowmo
from .web.command import web

__all__ = ["keyqueue", "main"]

EXIT_PIPE_CLOSED = 1


class _OneLineError(click.ClickException):
    """Any other error, as ``<command path>: error: <message>`` on stderr, exit status 1."""

    def __init__(self, message: str, command_path: str) -> None:
        super().__init__(message)
        self.command_path = command_path

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.command_path}: error: {self.format_message()}", err=True)


class _OneLineUsageError(_OneLineError):
    """A usage error shown as one line (no usage block), exit status 2."""

    exit_code = 2

    def __init__(self, error: click.UsageError) -> None:
        ctx = error.ctx
        super().__init__(
            error.format_message(), ctx.command_path if ctx is not None else "keyqueue"
        )

    def show(self, file: Any = None) -> None:
        click.echo(
            f"{self.command_path}: error: {self.format_message()} "
            f"(see '{self.command_path} --help')",
            err=True,
        )


def _running(ctx: click.Context) -> str:
    """The command path of the subcommand ``ctx`` (a group's context) is running."""
    sub = ctx.invoked_subcommand
    return f"{ctx.command_path} {sub}" if sub else ctx.command_path


def _stdout_to_devnull() -> None:
    """After a closed pipe: what is still buffered, and any later write, goes nowhere."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)


class _Group(click.Group):
    """The top-level group: every usage error below it becomes one line; a
    closed output pipe ends the command quietly."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: click.Context | None = None,
        **extra: Any,
    ) -> click.Context:
        try:
            return super().make_context(info_name, args, parent, **extra)
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            raise _OneLineUsageError(error) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a pipe closed after the last write shows here, not at exit
            return result
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            raise _OneLineUsageError(error) from None
        except _OneLineError:
            raise
        except click.ClickException as error:
            raise _OneLineError(error.format_message(), _running(ctx)) from None
        except BrokenPipeError:
            _stdout_to_devnull()
            ctx.exit(EXIT_PIPE_CLOSED)
        except KeyboardInterrupt:  # not in a run that prints its own summary
            _interrupted_line(_running(ctx))
            ctx.exit(EXIT_INTERRUPTED)


def _interrupted_line(command_path: str) -> None:
    with contextlib.suppress(OSError):  # stderr may be gone too
        click.echo(f"{command_path}: interrupted", err=True)


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="keyqueue")
def keyqueue() -> None:
    """keyqueue: Kubernetes client-go's work queue for Python.

    The lab runs the real queue under scripted load and shows what happens to
    each key. Start with `keyqueue lab slowmo`, then `keyqueue lab firehose`.

    The operator's commands look inside a live queue on Valkey/Redis and act
    on it: `keyqueue inspect`, `top`, `add`, `forget` and `delete`.
    """


@keyqueue.group(cls=_Group)
def lab() -> None:
    """Watch the queue work: a slow-motion trace, a firehose, backoff tables, a capacity model.

    Start with `keyqueue lab slowmo` (what happens to one key), then
    `keyqueue lab firehose` (what happens at 50,000 events a second).
    """


for command in (slowmo, firehose, backoff, model, fairness, pipeline_command(), web):
    lab.add_command(command)
keyqueue.add_command(dashboard)

for command in OPERATOR_COMMANDS:  # keyqueue.ops: on a live Redis queue
    keyqueue.add_command(command)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``keyqueue`` command with ``argv`` (default: ``sys.argv[1:]``)."""
    keyqueue.main(args=list(argv) if argv is not None else None, prog_name="keyqueue")
