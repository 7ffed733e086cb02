"""How every ``keyqueue`` command fails: one line, one exit status.

``Group`` is the click group class of ``keyqueue`` and of ``keyqueue lab``.
Errors in the options (a number out of range, nan, inf) are one line on
stderr and exit status 2; any other error (a server that cannot be reached)
is one line and exit status 1. Every error line has one shape, ``keyqueue
CMD: error: MESSAGE``. Ctrl-C in a command that does not print its own
summary prints ``keyqueue CMD: interrupted`` and exits 130. When the output
pipe closes (``keyqueue lab slowmo | head -2``) the run stops at its next
write and exits 1, quietly: stdout is pointed at /dev/null so no later flush
complains.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import click

from .options import EXIT_INTERRUPTED

__all__ = ["EXIT_PIPE_CLOSED", "Group", "OneLineError"]

EXIT_PIPE_CLOSED = 1


class OneLineError(click.ClickException):
    """Any other error, as ``<command path>: error: <message>`` on stderr, exit status 1."""

    def __init__(self, message: str, command_path: str) -> None:
        super().__init__(message)
        self.command_path = command_path

    def show(self, file: Any = None) -> None:
        click.echo(f"{self.command_path}: error: {self.format_message()}", err=True)


# An option a person may guess -> the one the commands call it: a guess that
# is not close in spelling (--seconds) is still suggested (--duration).
_GUESSES = {
    "--seconds": "--duration",
    "--secs": "--duration",
    "--time": "--duration",
    "--reconcile-seconds": "--reconcile-ms",
}


def _suggest(error: click.UsageError) -> click.UsageError:
    """An unknown option's error, pointing to the command's own name for a
    known guess (``--seconds``: ``--duration``) and never to a hidden option
    (an old name kept for scripts)."""
    if not isinstance(error, click.NoSuchOption) or error.ctx is None:
        return error
    params = error.ctx.command.params
    hidden = {name for param in params if getattr(param, "hidden", False) for name in param.opts}
    known = {name for param in params for name in param.opts} - hidden
    meant = _GUESSES.get(error.option_name)
    names = [meant] if meant in known else [n for n in error.possibilities or () if n in known]
    message = f"No such option {error.option_name!r}."
    if len(names) == 1:
        message += f" Did you mean {names[0]!r}?"
    elif names:
        message += f" (Did you mean one of: {', '.join(map(repr, names))}?)"
    return click.UsageError(message, error.ctx)


class _OneLineUsageError(OneLineError):
    """A usage error shown as one line (no usage block), exit status 2."""

    exit_code = 2

    def __init__(self, error: click.UsageError) -> None:
        error = _suggest(error)
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


class Group(click.Group):
    """A ``keyqueue`` group: every usage error below it becomes one line; a
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
        except KeyboardInterrupt:  # Ctrl-C while the command line is read: not "Aborted!"
            _interrupted_line(info_name or "keyqueue")
            raise click.exceptions.Exit(EXIT_INTERRUPTED) from None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            result = super().invoke(ctx)
            sys.stdout.flush()  # a pipe closed after the last write shows here, not at exit
            return result
        except click.exceptions.NoArgsIsHelpError:
            raise
        except click.UsageError as error:
            raise _OneLineUsageError(error) from None
        except OneLineError:
            raise
        except click.ClickException as error:
            raise OneLineError(error.format_message(), _running(ctx)) from None
        except BrokenPipeError:
            _stdout_to_devnull()
            ctx.exit(EXIT_PIPE_CLOSED)
        except KeyboardInterrupt:  # not in a run that prints its own summary
            _interrupted_line(_running(ctx))
            ctx.exit(EXIT_INTERRUPTED)


def _interrupted_line(command_path: str) -> None:
    with contextlib.suppress(OSError):  # stderr may be gone too
        click.echo(f"{command_path}: interrupted", err=True)
