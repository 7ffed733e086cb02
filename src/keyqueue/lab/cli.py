"""The ``keyqueue`` command: ``keyqueue lab slowmo | firehose | backoff | model``.

Each subcommand parses its options, calls its module's ``run_*`` function
(which returns a result object) and hands the result to ``render``. Errors in
the options (a number out of range, nan, inf) are one line on stderr and exit
status 2; any other error (a server that cannot be reached) is one line and
exit status 1. Every error line has one shape, ``keyqueue lab CMD: error:
MESSAGE``. Ctrl-C during a run prints the summary so far and exits 130; at any
other moment (starting up, printing) it prints ``keyqueue lab CMD:
interrupted`` and exits 130 too. When
the output pipe closes (``keyqueue lab slowmo | head -2``) the run stops at
its next write and exits 1, quietly: stdout is pointed at /dev/null so no
later flush complains.
"""

from __future__ import annotations

import contextlib
import os
import sys
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import click
from rich.console import Group
from rich.live import Live
from rich.status import Status

from keyqueue import __version__

from . import render
from ._format import Mode, Output
from ._options import (
    EXIT_INTERRUPTED,
    FiniteFloatRange,
    exit_interrupted,
    float_option,
    int_option,
    json_option,
    plain_option,
)
from .backoff import MAX_AUTO_ATTEMPTS, run_backoff
from .fairness_command import fairness_command
from .firehose import BACKENDS, FirehoseConfig, FirehoseTick, run_firehose
from .model import run_model
from .pipeline.command import pipeline_command
from .slowmo import SlowmoConfig, TraceLine, run_slowmo
from .web.command import web

# FiniteFloatRange lives in _options; listed here until pipeline/ imports it from there.
__all__ = ["FiniteFloatRange", "keyqueue", "main"]

EXIT_PIPE_CLOSED = 1

_PLAIN_HELP = (
    "No colour, no live redraw, one line per update (automatic when stdout is not a terminal)."
)


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
    """


@keyqueue.group(cls=_Group)
def lab() -> None:
    """Watch the queue work: a slow-motion trace, a firehose, backoff tables, a capacity model.

    Start with `keyqueue lab slowmo` (what happens to one key), then
    `keyqueue lab firehose` (what happens at 50,000 events a second).
    """


# -- slowmo ---------------------------------------------------------------------


@lab.command(short_help="Every transition of a few keys, one line each, in slow motion.")
@float_option(
    "--speed",
    min=0.01,
    max=10_000,
    default=1.0,
    help="Play this many times faster (2 = twice as fast; 0.5 = slower still).",
)
@int_option(
    "--workers",
    min=1,
    max=16,
    default=2,
    help="Worker threads.",
)
@float_option(
    "--hold",
    "hold_ms",
    min=0,
    max=60_000,
    default=300.0,
    help="Milliseconds a worker holds each key (at speed 1).",
)
@float_option(
    "--rate",
    min=0.01,
    max=1000,
    default=4.0,
    help="Events per second the generator fires (at speed 1).",
)
@json_option()
@plain_option(_PLAIN_HELP)
def slowmo(
    *, speed: float, workers: int, hold_ms: float, rate: float, as_json: bool, plain: bool
) -> None:
    """A slow-motion run: every transition of a few keys, one line each.

    A generator fires a few events a second at four keys; workers hold each key
    for --hold milliseconds; default/db fails twice. Watch for default/web:
    added while a worker holds it (REQUEUE-WHILE-PROCESSING), added again
    (COALESCED), then handed out exactly once more (REDELIVERY, Get). The
    summary points at those lines.

    Each of the queue's tags names the Stats counter it adds one to: ENQUEUE
    enqueued, COALESCED coalesced, REQUEUE-WHILE-PROCESSING
    marked_while_processing, REDELIVERY redeliveries, RATELIMIT rate_limited.
    Times are wall seconds since the start, --speed applied.
    """
    out = Output(Mode.choose(as_json, plain))
    config = SlowmoConfig(speed=speed, workers=workers, hold=hold_ms / 1000, rate=rate)
    on_line: Callable[[TraceLine], None] | None = None
    status: Status | None = None
    if not out.quiet:
        out.print(render.slowmo_header(config))

        def on_line(line: TraceLine) -> None:
            out.print(render.slowmo_line(line))

    on_step: Callable[[int, int], None] | None = None
    if out.rich:
        status = out.console.status("slowmo: starting", spinner="dots")
        status.start()

        def on_step(done: int, total: int) -> None:
            assert status is not None
            status.update(f"slowmo: script step {done:,}/{total:,}")

    try:
        result = run_slowmo(config, on_line=on_line, on_step=on_step)
    finally:
        if status is not None:
            status.stop()
    if out.quiet:
        out.json(result.to_json())
    else:
        out.print(*render.slowmo_summary(result))
    if result.interrupted:
        exit_interrupted()


# -- firehose -------------------------------------------------------------------


@lab.command(short_help="50,000 events a second onto 20 keys: coalescing at scale.")
@float_option(
    "--rate",
    min=0,
    max=10_000_000,
    min_open=True,
    default=50_000.0,
    help="Target events per second.",
)
@int_option(
    "--keys",
    min=1,
    max=10_000_000,
    default=20,
    help="Distinct keys the events land on.",
)
@float_option(
    "--duration",
    min=0,
    max=3600,
    min_open=True,
    default=10.0,
    help="Seconds to fire.",
)
@int_option(
    "--workers",
    min=1,
    max=256,
    default=4,
    help="Worker threads (run_workers).",
)
@float_option(
    "--reconcile",
    "reconcile_ms",
    min=0,
    max=60_000,
    default=4.0,
    help="Mean simulated reconcile time in milliseconds (each is 0.5x to 1.5x of it).",
)
@float_option(
    "--failure-rate",
    min=0,
    max=1,
    max_open=True,
    default=0.01,
    help="Fraction of reconciles that fail and are retried with backoff.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Random seed.")
@click.option(
    "--backend",
    type=click.Choice(BACKENDS),
    default="memory",
    show_default=True,
    help="Where the queue lives: one in-memory WorkQueue, or one RedisWorkQueue shared by "
    "--processes processes on a Valkey/Redis server.",
)
@click.option(
    "--redis-url",
    metavar="URL",
    default=None,
    callback=lambda ctx, param, value: _redis_url(value),
    help="The server for --backend redis (redis://host:port/db) [default: start a private "
    "valkey-server for the run].",
)
@int_option(
    "--processes",
    min=1,
    max=64,
    default=1,
    help="Processes the rate and the workers are spread over (--backend redis).",
)
@json_option()
@plain_option(_PLAIN_HELP)
def firehose(
    *,
    rate: float,
    keys: int,
    duration: float,
    workers: int,
    reconcile_ms: float,
    failure_rate: float,
    seed: int,
    backend: str,
    redis_url: str | None,
    processes: int,
    as_json: bool,
    plain: bool,
) -> None:
    """A firehose of events onto a few keys: coalescing at scale.

    A producer thread fires --rate events a second onto --keys keys for
    --duration seconds; --workers workers reconcile them (simulated time and
    failure rate). Every second: adds, coalesced, marked while processing,
    processed, rate-limited, depth, absorbed %, and queue-wait and reconcile
    percentiles. The run reports the event rate it actually achieved, and says
    so when the machine could not keep up.

    With --backend redis the same load runs in --processes processes sharing
    one queue on a Valkey/Redis server (--redis-url, or a private
    valkey-server started and stopped by the run): each fires its share of
    --rate, in batches (add_many), and runs its share of --workers. The
    counters are the server's, for the whole queue.
    """
    if backend == "memory" and (processes != 1 or redis_url is not None):
        option = "--processes" if processes != 1 else "--redis-url"
        raise click.BadParameter(
            "needs --backend redis (the in-memory queue lives in one process)",
            param_hint=f"'{option}'",
        )
    out = Output(Mode.choose(as_json, plain))
    config = FirehoseConfig(
        rate=rate,
        keys=keys,
        duration=duration,
        workers=workers,
        reconcile=reconcile_ms / 1000,
        failure_rate=failure_rate,
        seed=seed,
        backend=backend,
        processes=processes,
    )
    with _backend_errors(backend, redis_url):
        _firehose(config, out, redis_url)


_REDIS_SCHEMES = ("redis", "rediss", "unix")


def _redis_url(value: str | None) -> str | None:
    """--redis-url: a redis://, rediss:// or unix:// URL redis-py can open, or a usage error."""
    if value is None:
        return None
    scheme, sep, _ = value.partition("://")
    if not sep or scheme.lower() not in _REDIS_SCHEMES:
        raise click.BadParameter(
            f"{value!r} is not a redis://host:port/db, rediss:// or unix:// URL"
        )
    db = urllib.parse.urlsplit(value).path.strip("/")
    if scheme.lower() != "unix" and db and not db.isdigit():
        raise click.BadParameter(f"{value!r}: the database {db!r} is not a number")
    try:
        from redis import ConnectionPool  # noqa: PLC0415 (the redis backend only)
    except ModuleNotFoundError:  # pragma: no cover - _backend_errors names the install line
        return value
    try:
        ConnectionPool.from_url(value)  # parses only: no connection yet
    except ValueError as exc:
        raise click.BadParameter(f"{value!r}: {exc}") from None
    return value


def _server_name(redis_url: str | None) -> str:
    """Which server an error came from, without the URL's password."""
    if redis_url is None:
        return "the private valkey-server"
    parts = urllib.parse.urlsplit(redis_url)
    return "the Redis server " + parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()


@contextlib.contextmanager
def _backend_errors(backend: str, redis_url: str | None) -> Iterator[None]:
    """--backend redis: a missing library, or a server that cannot be reached or
    started, is one line on stderr and exit status 1. An error from the server
    names it (--redis-url, or the private one)."""
    if backend != "redis":
        yield
        return
    try:
        import redis  # noqa: PLC0415 (the redis backend only)

        from .firehose_redis import FirehoseError  # noqa: PLC0415
        from .valkey import ValkeyError  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        raise click.ClickException(
            f"--backend redis needs {exc.name}: pip install 'keyqueue[lab]'"
        ) from None
    try:
        yield
    except redis.exceptions.RedisError as exc:
        message = str(exc)
        if "the server at" not in message:  # the queue's own errors name it already
            message = f"{_server_name(redis_url)}: {message}"
        raise click.ClickException(message) from None
    except (ValkeyError, FirehoseError) as exc:
        raise click.ClickException(str(exc)) from None


def _firehose(config: FirehoseConfig, out: Output, redis_url: str | None) -> None:
    rate, duration = config.rate, config.duration
    if out.quiet:
        result = run_firehose(config, redis_url=redis_url)
        out.json(result.to_json())
    elif out.rich:
        latest: list[FirehoseTick | None] = [None]
        clock: list[Callable[[], float]] = [lambda: 0.0]

        class _Panel:
            def __rich__(self) -> Any:
                return render.firehose_panel(latest[0], clock[0](), duration, rate)

        def on_start(elapsed: Callable[[], float]) -> None:
            clock[0] = elapsed

        def on_tick(tick: FirehoseTick) -> None:
            latest[0] = tick

        with Live(_Panel(), console=out.console, refresh_per_second=4):
            result = run_firehose(config, on_tick=on_tick, on_start=on_start, redis_url=redis_url)
        out.print(Group(*render.firehose_summary(result)))
    else:
        out.print(render.firehose_header(config))
        result = run_firehose(
            config,
            on_tick=lambda tick: out.print(render.firehose_stats_line(tick)),
            redis_url=redis_url,
        )
        out.print(*render.firehose_summary(result))
    if result.interrupted:
        exit_interrupted()


# -- backoff --------------------------------------------------------------------


@lab.command(short_help="Per-key backoff table and a thundering herd, computed exactly.")
@float_option(
    "--base",
    "base_ms",
    min=0,
    max=1e12,
    min_open=True,
    default=5.0,
    help="Per-key base delay in milliseconds (client-go's default: 5).",
)
@float_option(
    "--cap",
    min=0,
    max=1e9,
    min_open=True,
    default=1000.0,
    help="Per-key maximum delay in seconds (client-go's default: 1000).",
)
@int_option(
    "--attempts",
    min=1,
    max=1000,
    default=None,
    help=f"Rows in the table [default: two past the cap, at most {MAX_AUTO_ATTEMPTS}].",
)
@int_option(
    "--herd",
    min=1,
    max=100_000,
    default=500,
    help="Distinct keys failing at once in the thundering-herd run.",
)
@json_option()
@plain_option(_PLAIN_HELP)
def backoff(
    *, base_ms: float, cap: float, attempts: int | None, herd: int, as_json: bool, plain: bool
) -> None:
    """Backoff, exactly: the per-key exponential table and a thundering herd.

    The table asks a real ItemExponentialFailureRateLimiter(base, cap) for each
    attempt's delay. The herd makes --herd distinct keys fail at once on a
    WorkQueue with the default controller limiter (per-key 5 ms doubling, and a
    10/s token bucket with burst 100), and counts the re-adds per second. Both
    run on a FakeClock: instant and exact.
    """
    base = base_ms / 1000
    if cap < base:
        raise click.BadParameter(
            f"the cap ({cap:g} s) must be at least the base ({base_ms:g} ms)",
            param_hint="'--cap'",
        )
    out = Output(Mode.choose(as_json, plain))
    result = run_backoff(base, cap, attempts, herd)
    if out.quiet:
        out.json(result.to_json())
    else:
        render.render_backoff(result, out)


# -- model ----------------------------------------------------------------------


@lab.command(short_help="Backlog, utilisation and M/M/1 estimates for λ and μ.")
@float_option(
    "--arrival",
    "--lambda",
    "arrival",
    min=0,
    max=1e12,
    default=4.0,
    help="λ: keys becoming ready per step (per second, say).",
)
@float_option(
    "--service",
    "--mu",
    "service",
    min=0,
    max=1e12,
    min_open=True,
    default=3.0,
    help="μ: keys all the workers together can finish per step.",
)
@float_option(
    "--backlog",
    min=0,
    max=1e12,
    default=4.0,
    help="Keys waiting at t=0.",
)
@int_option(
    "--steps",
    min=1,
    max=1000,
    default=None,
    help="Steps to show [default: until the backlog clears, plus two; else 12].",
)
@json_option()
@plain_option(_PLAIN_HELP)
def model(
    *, arrival: float, service: float, backlog: float, steps: int | None, as_json: bool, plain: bool
) -> None:
    """The fluid view of capacity: backlog per step, utilisation, M/M/1.

    With λ keys arriving and μ served per step the backlog changes by λ-μ per
    step: λ=4, μ=3 from a backlog of 4 grows as 4+t; λ=2, μ=3 clears it at t=4.
    When λ < μ it adds M/M/1 estimates (mean keys in the system, mean time in
    it), which rest on Poisson assumptions.
    """
    out = Output(Mode.choose(as_json, plain))
    result = run_model(arrival, service, backlog, steps)
    if out.quiet:
        out.json(result.to_json())
    else:
        render.render_model(result, out)


lab.add_command(web)  # keyqueue lab web: the instrument (web/command.py)

lab.add_command(pipeline_command())  # keyqueue lab pipeline (pipeline/command.py)

lab.add_command(fairness_command())  # keyqueue lab fairness (fairness_command.py)


def main(argv: Sequence[str] | None = None) -> None:
    """Run the ``keyqueue`` command with ``argv`` (default: ``sys.argv[1:]``)."""
    keyqueue.main(args=list(argv) if argv is not None else None, prog_name="keyqueue")
