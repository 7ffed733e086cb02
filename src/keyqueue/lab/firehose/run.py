"""``run_firehose``: the firehose's one entry point, on the backend its config names.

The in-memory run (``memory``) needs nothing but keyqueue; the Redis one
(``redis``) is imported only when asked for, as it needs the redis library.
"""

from __future__ import annotations

from collections.abc import Callable

from .common import FirehoseConfig, FirehoseResult, FirehoseTick
from .memory import run_memory_firehose

__all__ = ["run_firehose"]


def run_firehose(
    config: FirehoseConfig | None = None,
    on_tick: Callable[[FirehoseTick], None] | None = None,
    on_start: Callable[[Callable[[], float]], None] | None = None,
    redis_url: str | None = None,
) -> FirehoseResult:
    """Fire ``config.rate`` events a second onto ``config.keys`` keys for
    ``config.duration`` seconds, with ``config.workers`` workers; then drain.

    ``on_tick(tick)`` gets a status sample every ``config.tick`` seconds, once
    at the end of firing, and every ``config.tick`` seconds while the queue
    drains (``tick.draining``). ``on_start(elapsed)`` is called once the
    producer started, with a function returning seconds since then (for
    progress bars). Ctrl-C (KeyboardInterrupt in the calling thread) stops the
    run; the result then covers what happened so far and has
    ``interrupted=True``. Any other exception (from ``on_tick``, say, when the
    output pipe closed) stops the threads and is raised.

    ``config.backend == "redis"`` runs the same load in ``config.processes``
    processes sharing one queue on the server at ``redis_url`` (default: a
    private valkey-server started and stopped here): ``firehose.redis``.
    """
    config = config or FirehoseConfig()
    if config.backend == "redis":
        from .redis import run_redis_firehose  # noqa: PLC0415 (lazy: needs the redis library)

        return run_redis_firehose(config, on_tick, on_start, redis_url)
    return run_memory_firehose(config, on_tick, on_start)
