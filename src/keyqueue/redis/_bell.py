"""The doorbell wait of a Redis queue client's getters: on threads, on asyncio.

A get that finds no key waits for the queue's doorbell (``_getters`` says
who leads and when to look again). The leader waits in ``BLPOP`` on the bell
and on this client's wake-up list, in slices; the followers wait for it to
leave, on a condition of the client's lock (``Doorbell``) or on futures
(``AsyncDoorbell``), and the first to wake takes its place. A leader that
took the bell for a key it will not get (its client shut down or was
interrupted meanwhile, or its task was cancelled) rings it again: the key is
someone's. ``shutdown`` and ``interrupt`` reach the leader through the
wake-up list (``wake_leader``) and the followers directly
(``wake_followers``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import redis

from .._errors import Empty
from ._connection import WAKE_TTL_MS
from ._getters import Getters
from ._replies import text

__all__ = ["AsyncDoorbell", "Doorbell", "wait_until"]

logger = logging.getLogger("keyqueue")


def wait_until(condition: threading.Condition, deadline: float | None) -> bool:
    """Wait on ``condition`` (its lock held) until notified, or until
    ``deadline`` (monotonic; None: for ever); False if it had passed."""
    if deadline is None:
        condition.wait()
        return True
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        return False
    condition.wait(min(remaining, threading.TIMEOUT_MAX))
    return True


class _Bell:
    """What both doorbells know: the client, its getters, the two lists."""

    def __init__(self, client: Any, getters: Getters, bell: str, wake: str) -> None:
        self.client = client
        self.getters = getters
        self.bell = bell  # the queue's doorbell: one element per push
        self.wake = wake  # this client's wake-up list (shutdown, interrupt)

    def rang(self, popped: Any) -> bool:
        """A ``BLPOP`` took the doorbell (not a wake-up, nor nothing)."""
        return popped is not None and text(popped[0]) == self.bell


class Doorbell(_Bell):
    """The threading driver's doorbell wait."""

    def __init__(self, client: Any, getters: Getters, bell: str, wake: str) -> None:
        super().__init__(client, getters, bell, wake)
        # Notified (one) when the leader leaves BLPOP, (all) at shutdown and
        # interrupt; the getters that wait for the leader wait on it.
        self.followers = threading.Condition(getters.lock)

    def wait(self, seen: int, deadline: float | None) -> None:
        """Block until the doorbell rings or a look is due (then return: the
        caller runs the get script), ``deadline`` passes (``Empty``), this client
        shuts down (``ShutDown``) or is interrupted (``Empty``).

        One getter of the client (the leader) waits in ``BLPOP``; the others
        wait here until it leaves, and one of them takes its place.
        """
        getters = self.getters
        with getters.lock:
            getters.check_wait(seen)
            getters.blocked += 1
            try:
                while getters.leading:
                    if not wait_until(self.followers, deadline):
                        raise Empty
                    getters.check_wait(seen)
            except BaseException:
                getters.blocked -= 1
                raise
            getters.leading = True
        try:
            self._lead(seen, deadline)
        finally:
            with getters.lock:
                getters.blocked -= 1
                getters.leading = False
                self.followers.notify()

    def _lead(self, seen: int, deadline: float | None) -> None:
        """The leader's wait: ``BLPOP`` slices until a bell, a look or the end."""
        getters = self.getters
        while True:
            wait = getters.blpop_timeout(time.monotonic(), deadline)
            popped = self.client.blpop([self.bell, self.wake], timeout=wait)
            if getters.stopped(seen):
                if self.rang(popped):
                    self.client.rpush(self.bell, "1")  # the key it rang for is someone's
                with getters.lock:
                    getters.check_wait(seen)
            if popped is not None or time.monotonic() >= getters.look_at:
                return

    def wake_leader(self, getters: int) -> None:
        """Ring this client's wake-up list for ``getters`` getters in BLPOP."""
        if getters:
            pipe = self.client.pipeline()
            pipe.rpush(self.wake, *["1"] * getters)
            pipe.pexpire(self.wake, WAKE_TTL_MS)
            pipe.execute()

    def wake_followers(self) -> None:
        """Wake every follower (the lock held)."""
        self.followers.notify_all()


class AsyncDoorbell(_Bell):
    """The asyncio driver's doorbell wait: the followers are futures, and a
    cancelled wait passes on the doorbell it may have taken, and the lead."""

    def __init__(
        self,
        client: Any,
        getters: Getters,
        bell: str,
        wake: str,
        *,
        name: str,
        ready: Callable[[], Awaitable[None]],
        spawn: Callable[[Coroutine[Any, Any, None]], None],
    ) -> None:
        super().__init__(client, getters, bell, wake)
        self.name = name
        self.ready = ready  # the driver's: its server checked (the first call's check)
        self.spawn = spawn  # the driver's: run a call of its own in the background
        # Getters waiting for the leader to leave BLPOP: one is woken when it
        # does, all at shutdown and interrupt.
        self.followers: deque[asyncio.Future[None]] = deque()

    async def wait(self, seen: int, deadline: float | None) -> None:
        """As ``Doorbell.wait``, on the loop."""
        getters = self.getters
        loop = asyncio.get_running_loop()
        with getters.lock:
            getters.check_wait(seen)
            getters.blocked += 1
        try:
            while getters.leading:
                follower = loop.create_future()
                self.followers.append(follower)
                try:
                    if deadline is None:
                        await follower
                    else:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            raise Empty
                        async with asyncio.timeout(remaining):
                            await follower
                except TimeoutError:
                    raise Empty from None
                finally:
                    if not follower.done():
                        follower.cancel()
                        with contextlib.suppress(ValueError):
                            self.followers.remove(follower)
                with getters.lock:
                    getters.check_wait(seen)
        except BaseException:
            with getters.lock:
                getters.blocked -= 1
            if not getters.leading:
                self._wake_one()  # a wake-up meant for us may have come
            raise
        getters.leading = True
        try:
            await self._lead(seen, deadline)
        finally:
            with getters.lock:
                getters.blocked -= 1
            getters.leading = False
            self._wake_one()

    def _wake_one(self) -> None:
        while self.followers:
            follower = self.followers.popleft()
            if not follower.done():
                follower.set_result(None)
                return

    def wake_followers(self) -> None:
        """Wake every follower."""
        followers, self.followers = self.followers, deque()
        for follower in followers:
            if not follower.done():
                follower.set_result(None)

    async def _lead(self, seen: int, deadline: float | None) -> None:
        """The leader's wait: ``BLPOP`` slices until a bell, a look or the end."""
        getters = self.getters
        while True:
            wait = getters.blpop_timeout(time.monotonic(), deadline)
            try:
                popped = await self.client.blpop([self.bell, self.wake], timeout=wait)
                # Python 3.11's asyncio.wait_for, which redis.asyncio sends each
                # command through, can swallow a cancellation that races its
                # inner task's end: honour it here, or this get waits on.
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError
            except asyncio.CancelledError:
                # The bell we may have taken was for a waiting key: pass it on.
                self.spawn(self._ring())
                raise
            if getters.stopped(seen):
                if self.rang(popped):
                    self.spawn(self._ring())  # the key it rang for is someone's
                with getters.lock:
                    getters.check_wait(seen)
            if popped is not None or time.monotonic() >= getters.look_at:
                return

    async def wake_leader(self, getters: int) -> None:
        """Ring this client's wake-up list for ``getters`` getters in BLPOP."""
        if getters:
            await self.ready()
            async with self.client.pipeline() as pipe:
                pipe.rpush(self.wake, *["1"] * getters)
                pipe.pexpire(self.wake, WAKE_TTL_MS)
                await pipe.execute()

    async def _ring(self) -> None:
        try:
            await self.client.rpush(self.bell, "1")
        except redis.exceptions.RedisError:
            logger.debug("keyqueue %r: passing on a doorbell failed", self.name, exc_info=True)
