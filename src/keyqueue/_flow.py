"""Rules as generators, and their two drivers (httpx's auth-flow manner), no I/O.

A flow is a generator that yields a call to make (a function of no
arguments) and is sent back its value, or thrown the exception it raised; it
returns its result. The same flow runs in a thread (``drive``: each call made
here and now) and on an event loop (``adrive``: a call that returns an
awaitable is awaited), so a rule written once serves a blocking queue and an
asyncio one. The outcome rules (``_outcome``), the worker sources
(``_source``) and the batched claims (``redis._claim_rules``) are flows.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from typing import TypeVar

__all__ = ["Call", "Flow", "Pause", "adrive", "begin", "drive"]

T = TypeVar("T")

Call = Callable[[], object]
"""A call a flow asks its driver to make (a queue call, or the driver's pause)."""
Flow = Generator[Call, object, T]
"""Rules as a generator: yields calls, is sent their values or thrown their errors."""
Pause = Callable[[float], object]
"""The runner's wait: ``pause(seconds)`` answers True if the workers go on."""


def drive(flow: Flow[T]) -> T:
    """Run ``flow`` to its end here: make each call it yields, send back the
    value or throw in the exception; returns what the flow returns."""
    try:
        call = next(flow)
        while True:
            try:
                reply = call()
            except Exception as exc:
                call = flow.throw(exc)
            else:
                call = flow.send(reply)
    except StopIteration as end:
        return end.value  # type: ignore[no-any-return]
    finally:
        flow.close()


def begin(flow: Flow[T]) -> tuple[Call | None, T | None]:
    """Run ``flow`` up to its first call: ``(call, None)``, to go on with
    ``adrive(flow, call)``; or ``(None, result)`` if it ended without one (a
    rule that had nothing to send costs its runner no coroutine)."""
    try:
        return next(flow), None
    except StopIteration as end:
        return None, end.value
    except BaseException:
        flow.close()
        raise


async def adrive(flow: Flow[T], call: Call | None = None) -> T:
    """``drive`` on the loop: a call that returns an awaitable is awaited.
    ``call``: the flow's first call, already taken (``begin``)."""
    try:
        if call is None:
            try:
                call = next(flow)
            except StopIteration as end:
                return end.value  # type: ignore[no-any-return]
        while True:
            try:
                reply = call()
                if reply is not None and inspect.isawaitable(reply):
                    reply = await reply
            except Exception as exc:
                try:
                    call = flow.throw(exc)
                except StopIteration as end:
                    return end.value  # type: ignore[no-any-return]
            else:
                try:
                    call = flow.send(reply)
                except StopIteration as end:
                    return end.value  # type: ignore[no-any-return]
    finally:
        flow.close()
