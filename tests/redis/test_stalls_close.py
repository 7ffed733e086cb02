"""What the calls an asyncio client makes on its own cost its close.

``AsyncRedisWorkQueue`` runs some calls in tasks of its own (a doorbell
passed on by a cancelled get, a reap, a put-back of a cancelled get's key);
``aclose`` waits for them so none reaches the server after it, for
``_ends.CLOSE_WAIT`` seconds at most, then cancels those left (``end_calls``).
A synchronous client's ``close`` waits for no call of its own (its renewal
thread and reap timer are daemons told to stop), so it has no such wait.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from pathlib import Path

import pytest
import redis.asyncio

from keyqueue.redis import AsyncRedisWorkQueue
from keyqueue.testing import ValkeyServer
from tests.support import valkey_server

WAIT = 10.0  # generous bound, wall seconds

name = valkey_server.name


def test_aclose_returns_when_a_call_of_its_own_ended_on_the_turn_before_it(
    valkey_url: str, name: str
) -> None:
    """A call the client made on its own ended on the loop's turn just before
    aclose's, so its task is done but still in the client's set (its done
    callback runs on the next turn): aclose returns at once. Awaiting done
    tasks does not yield to the loop (``asyncio.gather`` on Python 3.12+), so
    a close that waited on the set as it stood spun for ever, the loop
    blocked. Run in a thread, so such a spin fails the test instead of
    hanging it."""
    elapsed: list[float] = []

    async def main() -> None:
        aq = AsyncRedisWorkQueue(name, url=valkey_url)
        await aq.stats()

        async def ended() -> None:
            pass

        aq._spawn(ended())
        await asyncio.sleep(0)  # it runs and ends first; its done callback after this turn
        assert [task.done() for task in aq._background] == [True]
        start = time.monotonic()
        await aq.aclose()
        elapsed.append(time.monotonic() - start)

    closing = threading.Thread(target=asyncio.run, args=(main(),), daemon=True)
    closing.start()
    closing.join(WAIT)
    assert not closing.is_alive(), "aclose never returned: its loop spun on a done task"
    assert len(elapsed) == 1
    assert elapsed[0] < 1.0


async def test_aclose_cancels_a_call_of_its_own_the_server_never_answers_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A cancelled get passes the doorbell on in a task of the client's own;
    the server is paused (``CLIENT PAUSE``), the client has no socket timeout,
    so that call never ends: aclose cancels it after ``_close_wait`` seconds,
    with one WARNING naming it, and returns."""
    caplog.set_level(logging.WARNING, logger="keyqueue")
    with ValkeyServer(tmp_path) as server:
        admin = redis.asyncio.Redis.from_url(server.url)
        aq = AsyncRedisWorkQueue("q", url=server.url)
        aq._close_wait = 0.5
        try:
            getter = asyncio.create_task(aq.get())
            async with asyncio.timeout(WAIT):
                while not aq._waiting.leading:  # in BLPOP
                    await asyncio.sleep(0.01)
            await admin.execute_command("CLIENT", "PAUSE", int(WAIT * 1000), "ALL")
            getter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await getter
            assert [task.done() for task in aq._background] == [False]  # its bell, paused
            start = time.monotonic()
            await aq.aclose()
            elapsed = time.monotonic() - start
        finally:
            await admin.aclose()
    assert 0.5 <= elapsed < 0.5 + 2.0
    warnings = [r.getMessage() for r in caplog.records if "into its close" in r.getMessage()]
    assert len(warnings) == 1
    assert "1 call(s)" in warnings[0]
    assert "(AsyncDoorbell._ring;" in warnings[0]
    assert "cancelled" in warnings[0]
