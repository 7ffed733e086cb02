"""The pipeline's other processes: the API server's and the load generator's.

Theory of operation
-------------------
``keyqueue lab pipeline`` is laid out as the seed's envtest run is: the
controller's process (``run``: the informer, the queue, the workers) starts
etcd and the API server as processes of their own, and the load generator (the
seed's k6 or curl) is a third. ``Child.start(role)`` runs
``python -m keyqueue.lab.pipeline.processes ROLE FD`` in a session of its own
(a terminal's Ctrl-C reaches the controller only, which then stops the
children in order) and dying with the controller (``PR_SET_PDEATHSIG``: even a
SIGKILL of the controller takes them with it). Each child talks to the
controller over one socketpair, in ``multiprocessing.connection`` messages
(tuples); the controller reads them on its event loop (``add_reader``).

The API server child (``serve_api``): ``("serve", etcd_url, port, traced)`` →
it answers ``("ready", url)`` or ``("error", kind, message)``, then sends
``("batch", writes, triggers, watches)``: the etcd writes
``(revision, started, finished)`` and ``/trigger`` records
``(name, action, rv, started, finished)`` since the last batch, at most
``FLUSH`` seconds late (a traced object's at once), and how many watches are
open. The load generator child (``generate_load``): ``("go", url, names,
concurrency)`` → ``("answered", [(name, rv, sent, answered)], failed)``
batches, then ``("done",)``. ``("stop",)``, or the controller's end of the
socket closing, stops either; it sends what it still has, then ``("done",)``.

Every time is ``time.monotonic()``: on Linux that is ``CLOCK_MONOTONIC``, one
clock for the whole machine, so a time taken in one process can be subtracted
from one taken in another (the write → watch event and trigger → reconciled
stages do so). Each child runs on uvloop when it is installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

from keyqueue.testing._processes import dying_with_parent

__all__ = ["FLUSH", "Child", "new_event_loop"]

FLUSH = 0.005
"""Seconds a child holds its samples before sending them (fewer, larger messages)."""
STOP_TIMEOUT = 5.0
"""Seconds a child gets to stop after ``("stop",)`` before SIGTERM, then SIGKILL."""


def new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when uvloop is installed (``keyqueue[lab]``), asyncio's otherwise."""
    try:
        import uvloop  # noqa: PLC0415 (optional)
    except ImportError:  # pragma: no cover - depends on the installed extras
        return asyncio.new_event_loop()
    loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
    return loop


class Child:
    """One child process and its end of the socketpair."""

    def __init__(self, role: str, process: subprocess.Popen[bytes], conn: Connection) -> None:
        self.role = role
        self.process = process
        self.conn = conn
        self.on_message: Callable[[Any], None] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def listen(self, loop: asyncio.AbstractEventLoop, on_message: Callable[[Any], None]) -> None:
        """``on_message(message)`` on ``loop`` for each of its messages (``("eof",)`` last)."""
        self.on_message, self._loop = on_message, loop
        read_messages(loop, self.conn, on_message)

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(cls, role: str) -> Child:
        ours, theirs = socket.socketpair()
        try:
            process = subprocess.Popen(
                dying_with_parent([sys.executable, "-m", __name__, role, str(theirs.fileno())]),
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                start_new_session=True,
            )
        finally:
            theirs.close()
        return cls(role, process, Connection(ours.detach()))

    def send(self, *message: Any) -> None:
        with contextlib.suppress(OSError):  # it is gone: its exit is seen on the socket
            self.conn.send(message)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """Ask it to stop, wait, SIGTERM, SIGKILL; then close the socket. Idempotent."""
        process = self.process
        if process.poll() is None:
            self.send("stop")
            for signum in (None, signal.SIGTERM, signal.SIGKILL):
                if signum is not None:
                    with contextlib.suppress(ProcessLookupError):
                        process.send_signal(signum)
                try:
                    process.wait(timeout)
                    break
                except subprocess.TimeoutExpired:
                    continue
                except KeyboardInterrupt:  # a second Ctrl-C: no more waiting
                    process.kill()
                    process.wait()
                    break
        if self.conn.closed:
            return
        if self._loop is not None and self.on_message is not None:
            # What it sent before it exited (its last samples, "done") still counts.
            with contextlib.suppress(EOFError, OSError):
                while self.conn.poll():
                    self.on_message(self.conn.recv())
            with contextlib.suppress(Exception):
                self._loop.remove_reader(self.conn.fileno())
        self.conn.close()


def read_messages(
    loop: asyncio.AbstractEventLoop, conn: Connection, on_message: Callable[[Any], None]
) -> None:
    """Call ``on_message(message)`` on ``loop`` for each message on ``conn``;
    ``("eof",)`` once when the other end is gone."""

    def readable() -> None:
        try:
            while conn.poll():
                on_message(conn.recv())
        except (EOFError, OSError):
            loop.remove_reader(conn.fileno())
            on_message(("eof",))

    loop.add_reader(conn.fileno(), readable)
    # uvloop's add_reader makes the socket non-blocking; a message is read (and
    # written) whole, so it stays blocking: readable means a message is coming.
    os.set_blocking(conn.fileno(), True)


# -- the children --------------------------------------------------------------------


class _Outbox:
    """Samples a child sends in batches, at most ``FLUSH`` seconds after the first."""

    def __init__(self, conn: Connection, loop: asyncio.AbstractEventLoop) -> None:
        self.conn = conn
        self.loop = loop
        self.armed = False

    def arm(self, now: bool = False) -> None:
        if now:
            self.loop.call_soon(self.flush)
        elif not self.armed:
            self.armed = True
            self.loop.call_later(FLUSH, self.flush)

    def flush(self) -> None:
        self.armed = False
        message = self.take()
        if message is not None:
            with contextlib.suppress(OSError):
                self.conn.send(message)

    def take(self) -> tuple[Any, ...] | None:  # pragma: no cover - overridden
        raise NotImplementedError


class _Inbox:
    """The controller's messages to a child: the first one starts it (``start``
    gets its arguments), ``stop`` or a closed socket sets ``stopped`` (and makes
    ``start`` raise ``SystemExit`` if it came first)."""

    def __init__(self, conn: Connection) -> None:
        loop = asyncio.get_running_loop()
        self.start: asyncio.Future[tuple[Any, ...]] = loop.create_future()
        self.stopped = asyncio.Event()
        read_messages(loop, conn, self.on_message)

    def on_message(self, message: tuple[Any, ...]) -> None:
        if message[0] in ("stop", "eof"):
            self.stopped.set()
            if not self.start.done():
                self.start.set_exception(SystemExit(0))
        elif not self.start.done():
            self.start.set_result(message[1:])


async def serve_api(conn: Connection) -> None:
    """The API server's process: the lab's ``ApiServer`` on the controller's etcd."""
    import aiohttp  # noqa: PLC0415

    from .apiserver import ApiServer, TriggerRecord  # noqa: PLC0415
    from .etcd import Etcd  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    writes: list[tuple[int, float, float]] = []
    triggers: list[tuple[str, str, int, float, float]] = []
    traced: set[str] = set()
    trace_all = False
    server: ApiServer | None = None
    last_watches = 0

    class Outbox(_Outbox):
        def take(self) -> tuple[Any, ...] | None:
            nonlocal last_watches
            watches = server.watches if server is not None else 0
            if not writes and not triggers and watches == last_watches:
                return None
            last_watches = watches
            message = ("batch", writes[:], triggers[:], watches)
            writes.clear()
            triggers.clear()
            return message

    outbox = Outbox(conn, loop)

    def on_write(revision: int, started: float, finished: float) -> None:
        writes.append((revision, started, finished))
        outbox.arm()

    def on_trigger(record: TriggerRecord) -> None:
        triggers.append((record.name, record.action, record.rv, record.started, record.finished))
        outbox.arm(now=trace_all or record.name in traced)

    inbox = _Inbox(conn)
    etcd_url, port, names, everything = await inbox.start
    traced, trace_all = set(names), everything
    etcd = Etcd(etcd_url)
    try:
        server = ApiServer(etcd, on_write=on_write, on_trigger=on_trigger)
        try:
            url = await server.start(port=port)
        except OSError as exc:
            conn.send(("error", "listen", exc.strerror or str(exc)))
            return
        conn.send(("ready", url))

        async def report_watches() -> None:  # the informer's watch, as soon as it opens
            await server.watch_opened.wait()
            outbox.arm(now=True)

        reporter = loop.create_task(report_watches())
        await inbox.stopped.wait()
        reporter.cancel()
        await server.close()
    except (aiohttp.ClientError, OSError) as exc:  # pragma: no cover - etcd went away
        with contextlib.suppress(OSError):
            conn.send(("error", "etcd", str(exc)))
    finally:
        await etcd.close()
        outbox.flush()
        with contextlib.suppress(OSError):
            conn.send(("done",))


async def generate_load(conn: Connection) -> None:
    """The load generator's process: ``concurrency`` keep-alive connections, each
    POSTing ``/trigger/NAME`` for the next name until none is left."""
    from .loadgen import Client  # noqa: PLC0415

    loop = asyncio.get_running_loop()
    answered: list[tuple[str, int, float, float]] = []
    failed = 0

    class Outbox(_Outbox):
        def take(self) -> tuple[Any, ...] | None:
            nonlocal failed
            if not answered and not failed:
                return None
            message = ("answered", answered[:], failed)
            answered.clear()
            failed = 0
            return message

    outbox = Outbox(conn, loop)
    inbox = _Inbox(conn)
    url, names, concurrency = await inbox.start
    names = list(reversed(names))  # popped from the end: in drawing order

    async def client() -> None:
        nonlocal failed
        async with Client(url) as http:
            while names:
                name = names.pop()
                sent = time.monotonic()
                try:
                    revision = await http.trigger(name)
                except (OSError, ValueError, TimeoutError):
                    revision = None
                if revision is None:
                    failed += 1
                else:
                    answered.append((name, revision, sent, time.monotonic()))
                outbox.arm()

    load: asyncio.Future[Any] = asyncio.gather(*(client() for _ in range(concurrency)))
    stop: asyncio.Future[Any] = loop.create_task(inbox.stopped.wait())
    await asyncio.wait([load, stop], return_when=asyncio.FIRST_COMPLETED)
    names.clear()
    for task in (load, stop):
        task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await load
    outbox.flush()
    with contextlib.suppress(OSError):
        conn.send(("done",))


_ROLES = {"apiserver": serve_api, "load": generate_load}


def main(argv: list[str]) -> None:
    """``python -m keyqueue.lab.pipeline.processes ROLE FD``."""
    role, fd = argv
    # The controller stops this process (a message, then SIGTERM): Ctrl-C is its.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    conn = Connection(int(fd))
    loop = new_event_loop()
    task = loop.create_task(_ROLES[role](conn))
    loop.add_signal_handler(signal.SIGTERM, task.cancel)
    try:
        loop.run_until_complete(task)
    except (asyncio.CancelledError, SystemExit):
        pass
    finally:
        loop.close()
        conn.close()
    os._exit(0)  # nothing left to flush; skip the interpreter's slow teardown


if __name__ == "__main__":
    main(sys.argv[1:])
