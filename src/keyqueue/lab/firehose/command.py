"""``keyqueue lab firehose``: the click command, for both backends.

Options, then ``run_firehose``: in rich mode under a live panel redrawn four
times a second, in plain mode one [STATS] line a second, with ``--json`` the
result only. ``--redis-url`` is checked as it is parsed (a usage error); with
``--backend redis`` a missing library, or a server that cannot be reached or
started, is one error line naming the server.
"""

from __future__ import annotations

import contextlib
import urllib.parse
from collections.abc import Callable, Iterator
from typing import Any

import click
from rich.console import Group
from rich.live import Live

from keyqueue.testing import ValkeyError

from ..._console.format import Mode, Output
from ..._console.options import (
    FiniteFloatRange,
    durability_option,
    exit_interrupted,
    float_option,
    int_option,
    output_options,
    redis_url,
)
from . import render
from .common import BACKENDS, FirehoseConfig, FirehoseTick
from .run import run_firehose

__all__ = ["firehose"]


@click.command(short_help="50,000 events a second onto 20 keys: coalescing at scale.")
@float_option(
    "--rate",
    above=0,
    max=10_000_000,
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
    above=0,
    max=3600,
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
    "--reconcile-ms",
    min=0,
    max=60_000,
    default=4.0,
    help="Mean simulated reconcile time in milliseconds (each is 0.5x to 1.5x of it).",
)
@click.option(  # the old name of --reconcile-ms (lab pipeline's name is the one kept)
    "--reconcile",
    "reconcile_old",
    type=FiniteFloatRange(min=0, max=60_000),
    default=None,
    hidden=True,
)
@float_option(
    "--failure-rate",
    min=0,
    below=1,
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
    callback=redis_url,
    help="The server for --backend redis (redis://host:port/db) [default: start a private "
    "valkey-server for the run].",
)
@durability_option
@int_option(
    "--processes",
    min=1,
    max=64,
    default=1,
    help="Processes the rate and the workers are spread over (--backend redis).",
)
@output_options
def firehose(
    *,
    rate: float,
    keys: int,
    duration: float,
    workers: int,
    reconcile_ms: float,
    reconcile_old: float | None,
    failure_rate: float,
    seed: int,
    backend: str,
    redis_url: str | None,
    durability: str,
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
    if backend == "memory" and (processes != 1 or redis_url is not None or durability != "primary"):
        option = (
            "--processes"
            if processes != 1
            else "--redis-url"
            if redis_url is not None
            else "--durability"
        )
        raise click.BadParameter(
            "needs --backend redis (the in-memory queue lives in one process)",
            param_hint=f"'{option}'",
        )
    if reconcile_old is not None:
        reconcile_ms = reconcile_old
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
        durability=durability,
    )
    with _backend_errors(backend, redis_url):
        _firehose(config, out, redis_url)


def _server_name(redis_url: str | None) -> str:
    """Which server an error came from, without the URL's password."""
    if redis_url is None:
        return "the private valkey-server"
    parts = urllib.parse.urlsplit(redis_url)
    return (
        "the Redis server "
        + parts._replace(netloc=parts.netloc.rpartition("@")[2], query="").geturl()
    )


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

        from .redis import FirehoseError  # noqa: PLC0415
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
