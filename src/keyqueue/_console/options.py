"""What the ``keyqueue`` commands share on the command line: option types, options, exits.

Every float option is a ``FiniteFloatRange`` (nan and ±inf are usage errors,
as a number out of range is), written with ``float_option`` (bounds ``min``
and ``max``, or ``above`` and ``below`` to exclude them); whole numbers with
``int_option``. Every command takes ``--json`` and ``--plain``: together as
``output_options`` where plain mode is what ``PLAIN_HELP`` says, else each
with its own help (``json_option``, ``plain_option``). A run that Ctrl-C
interrupted exits ``EXIT_INTERRUPTED`` after its summary (``exit_interrupted``);
a command that serves until Ctrl-C takes SIGINT even if it started ignored
(``ctrl_c_taken``). Every ``--redis-url`` is read by one parser,
``redis_url``: one server, a Sentinel service or a Cluster, as
``keyqueue.redis.client_from_url`` reads them (a usage error for a URL it
cannot read, or one redis-py would misread, say a database that is not a
number, which it would quietly take as 0); every command that builds a queue
from it takes ``--durability`` beside it (``durability_option``), passed to
the queue as ``durability=``.
"""

from __future__ import annotations

import contextlib
import math
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any, NoReturn, TypeVar

import click

__all__ = [
    "EXIT_INTERRUPTED",
    "JSON_HELP",
    "PLAIN_HELP",
    "FiniteFloatRange",
    "ctrl_c_taken",
    "durability_option",
    "exit_interrupted",
    "float_option",
    "int_option",
    "json_option",
    "output_options",
    "plain_option",
    "redis_url",
]

F = TypeVar("F", bound=Callable[..., Any])

EXIT_INTERRUPTED = 130
"""Exit status after Ctrl-C (128 + SIGINT), as a shell reports it."""

JSON_HELP = "Write the result as one JSON document (for scripts) and nothing else."
PLAIN_HELP = (
    "No colour, no live redraw, one line per update (automatic when stdout is not a terminal)."
)


class FiniteFloatRange(click.FloatRange):
    """A ``click.FloatRange`` that also rejects nan and ±inf (a usage error)."""

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = click.FLOAT.convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return super().convert(number, param, ctx)


def float_option(
    *names: str,
    min: float | None = None,
    above: float | None = None,
    max: float | None = None,
    below: float | None = None,
    default: float,
    help: str,
) -> Callable[[F], F]:
    """A float option from ``min`` (or ``above``: excluded) to ``max`` (or
    ``below``: excluded), its default shown."""
    kind = FiniteFloatRange(
        min=above if above is not None else min,
        min_open=above is not None,
        max=below if below is not None else max,
        max_open=below is not None,
    )
    return click.option(*names, type=kind, default=default, show_default=True, help=help)


def int_option(
    *names: str,
    min: int,
    max: int,
    default: int | None,
    help: str,
) -> Callable[[F], F]:
    """A whole-number option in ``[min, max]``; its default shown unless it is None
    (the help then says what the default is)."""
    shown: dict[str, Any] = {"show_default": True} if default is not None else {}
    return click.option(*names, type=click.IntRange(min, max), default=default, help=help, **shown)


def plain_option(help: str = PLAIN_HELP) -> Callable[[F], F]:
    """``--plain``: no colour (and whatever else the command's ``help`` says)."""
    return click.option("--plain", is_flag=True, help=help)


def json_option(help: str = JSON_HELP) -> Callable[[F], F]:
    """``--json`` (the parameter ``as_json``): one JSON document on stdout, nothing else."""
    return click.option("--json", "as_json", is_flag=True, help=help)


def output_options(f: F) -> F:
    """``--json`` then ``--plain`` with ``PLAIN_HELP``: the output flags of a
    command whose plain mode is one line per update."""
    return json_option()(plain_option()(f))


def exit_interrupted() -> NoReturn:
    """End a run that Ctrl-C stopped, after its summary: exit status 130."""
    sys.exit(EXIT_INTERRUPTED)


@contextlib.contextmanager
def ctrl_c_taken() -> Iterator[None]:
    """Python's Ctrl-C handler in the block, also when the process started with SIGINT ignored.

    A shell without job control starts a background job (``keyqueue lab
    pipeline --no-load &`` in a script, a test suite run in the background)
    with SIGINT ignored; Python then installs no handler and neither does
    ``asyncio.run``, so SIGINT would never end a command that serves until
    Ctrl-C. The block takes SIGINT as SIGTERM is taken (as Go's
    ``signal.Notify`` does), and leaves it ignored again afterwards.
    """
    if (
        threading.current_thread() is not threading.main_thread()
        or signal.getsignal(signal.SIGINT) is not signal.SIG_IGN
    ):
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.SIG_IGN)


DURABILITY_HELP = (
    "When a write counts as made: 'primary' once the primary answered; 'replicated' once "
    "every replica of it acknowledged it too (WAIT after each write: a failover loses "
    "nothing acknowledged; writes stop while a replica is behind)."
)


def durability_option(f: F) -> F:
    """``--durability primary|replicated`` (the parameter ``durability``): the
    queue's ``durability=``, default ``primary``."""
    return click.option(
        "--durability",
        type=click.Choice(["primary", "replicated"]),
        default="primary",
        show_default=True,
        help=DURABILITY_HELP,
    )(f)


def redis_url(ctx: click.Context | None, param: click.Parameter | None, value: Any) -> Any:
    """``--redis-url``'s callback in every command: ``value`` (None passes) if
    ``keyqueue.redis.client_from_url`` reads it (one server, a Sentinel
    service, a Cluster; a database that is a number), else a usage error
    naming what is wrong. redis-py itself would take ``redis://host:6379/abc``
    as database 0. Connects to nothing."""
    if value is None:
        return None
    try:
        from keyqueue.redis._connection import check_url  # noqa: PLC0415 (the redis extra)
    except ImportError:  # the command says what to install when it needs redis-py
        return value
    try:
        check_url(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc), ctx, param) from None
    return value
