"""Token epochs: fencing tokens that no failover hands out twice.

Theory of operation
-------------------
A token is ``epoch * 2**32 + n``: one integer below 2**53, so a store keeps
comparing integers. The epoch comes from the layer that decides failovers,
never from the data set, so a failover that loses the last writes (or a
cascade of them) cannot lose it: under Sentinel, the service's
``config-epoch`` (``SENTINEL MASTER``: raised by every failover, granted by
a majority vote, kept in the sentinels' config files); in a Cluster, the
``cluster_my_epoch`` of the primary that serves the queue's slot (a replica
that takes over gets one above every other, by vote). A plain server's
client (a ``redis.Redis`` no Sentinel manages) has none: epoch 0, nothing
read, nothing sent, its tokens as they always were.

The client keeps a view: the replication id of the node it verified was
the primary, and that epoch. It reads ``INFO replication`` (``role:master``
and ``master_replid``) on a connection of its pool and then the epoch; a
Sentinel view is trusted only if, of the records the sentinels answer
``SENTINEL MASTER`` with, the one of the highest ``config-epoch`` names the
address of that same connection. Each hand-out (the get and claim scripts)
carries the view; the script reads ``INFO replication`` itself and hands
out nothing unless the node is a primary with that replication id (else
``STALEEPOCH``), then raises the queue's counter to ``epoch * 2**32`` before
counting on (``lua/lib/handout.lua``).

Why it holds. A promotion gives the promoted node a new replication id, so
every hand-out on it carries a view read after the promotion, whose epoch
is the promotion's or a later one (``INFO`` is read first, the epoch after
it). A failover away from a primary raises the epoch strictly (a new
Sentinel config-epoch; a Cluster epoch above every other). The old primary,
frozen, cut off from the sentinels or still reachable by its pooled
clients, keeps its replication id, so its clients keep their older epoch:
every token it hands out is below ``(old epoch + 1) * 2**32``, below every
token of the new primary. A demoted node reports its primary's replication
id as a replica (``role:slave``): refused. No epoch is refused for being
below one the queue saw: the counter travels with the data, and
``max(seq, epoch * 2**32)`` never goes down, so a queue whose slot moves to
a Cluster node of a lower epoch keeps counting up.

What it trades, and what is open. An epoch's band holds 2**32 hand-outs
(at 50,000 keys a second, a day without a failover): past it the tokens
still increase on that primary but enter the next epoch's band, and the
promise across a failover rests on replication again. A view is as fresh
as the freshest sentinel the client reaches: a node promoted again at a
later epoch (primary, replaced, primary again) read while every sentinel
the client reaches still holds the older record naming it gets that older
epoch until they learn the new one (their hello messages, every 2 s); the
same address is required, so only that flip-flop. The sentinels are asked
at once, and once one answered the others have ``SENTINEL_GRACE``: one
that is frozen or slower counts as one not reached (a view read would
otherwise wait out its timeout and redis-py's retries, every hand-out of
the client with it). A lone primary restarted
empty without a failover (a new replication id, the same epoch) starts its
counter from the epoch's base again: persistence closes that.

After ``STALEEPOCH``, or a view not trusted yet (the sentinels name another
node), the client drops its view, sends its pool back to whoever names the
primary (``_ride.reroute``), reads the view again and asks again, up to
``VIEW_ATTEMPTS`` times with a pause of 0.05 s doubling; then it raises
``StaleEpoch``, a connection error that the runners ask again after their
backoff. Nothing was handed out by a call that answered ``STALEEPOCH``.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from .._outcome import jitter
from ._connection import StaleEpoch, sentinels_of
from ._ride import areroute, reroute
from ._send import _command_name

__all__ = [
    "EPOCH_SHIFT",
    "VIEW_ATTEMPTS",
    "Epochs",
    "Retries",
    "View",
    "arun_viewed",
    "epochs_for",
    "hands_out",
    "run_viewed",
]

logger = logging.getLogger("keyqueue")

EPOCH_SHIFT = 32
"""A token is ``epoch << EPOCH_SHIFT`` plus the queue's count."""
MAX_EPOCH = 1 << (53 - EPOCH_SHIFT)
"""Epochs must stay below this for tokens to stay below 2**53."""
VIEW_ATTEMPTS = 5
"""Hand-outs tried, each on a view read afresh, before ``StaleEpoch`` is raised."""
FIRST_PAUSE = 0.05  # seconds before the third attempt (the second follows at once)
SENTINEL_GRACE = 0.25
"""Seconds the other sentinels have to answer a view's question once one has:
a frozen or unreachable sentinel costs a view read that, not its timeout (nor
redis-py's retries of it)."""
STALE = "STALEEPOCH"


def hands_out(script: str, args: Sequence[str]) -> bool:
    """Whether the call hands out keys, so carries the view: a get that
    takes (ARGV[9] is not '1': ``lua/get.lua``), a claim of n > 0
    (ARGV[5]: ``lua/claim.lua``)."""
    if script == "get":
        return args[8] != "1"
    return script == "claim" and args[4] != "0"


@dataclass(frozen=True, slots=True)
class View:
    """What a client verified: the primary at ``address`` had replication id
    ``replid`` at ``epoch`` (or later)."""

    replid: str
    epoch: int
    address: str
    args: tuple[str, str] = field(init=False)
    """What a hand-out script is sent: the token base and the replication id."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", (str(self.epoch << EPOCH_SHIFT), self.replid))


def _fields(reply: Any) -> dict[str, str]:
    """``INFO``'s or ``CLUSTER INFO``'s fields, from the raw text or redis-py's dict."""
    if isinstance(reply, Mapping):
        return {str(k): str(v) for k, v in reply.items()}
    text = reply.decode() if isinstance(reply, bytes) else str(reply)
    pairs = (line.partition(":") for line in text.splitlines())
    return {name: value.strip() for name, sep, value in pairs if sep and not name.startswith("#")}


def _primary(info: Mapping[str, str], where: str) -> str:
    """The replication id of a node that says it is a primary; ``StaleEpoch`` otherwise."""
    if info.get("role") != "master" or not info.get("master_replid"):
        raise StaleEpoch(f"{where} is not a primary (role {info.get('role')!r})")
    return info["master_replid"]


def _checked(epoch: int, where: str) -> int:
    if not 0 <= epoch < MAX_EPOCH:
        raise RuntimeError(f"{where}: epoch {epoch} leaves no room for tokens below 2**53")
    return epoch


def sentinel_view(
    info: Mapping[str, str], address: tuple[str, int], records: Sequence[Mapping[str, Any]]
) -> View:
    """The view from a node's ``INFO replication``, the address of the
    connection that read it, and the sentinels' ``SENTINEL MASTER`` records:
    trusted only if the record of the highest ``config-epoch`` names that
    address (``StaleEpoch`` otherwise)."""
    where = f"{address[0]}:{address[1]}"
    replid = _primary(info, where)
    best: tuple[int, str] | None = None
    for record in records:
        try:
            epoch = int(record["config-epoch"])
            named = f"{record['ip']}:{int(record['port'])}"
        except (KeyError, TypeError, ValueError):
            continue
        if best is None or epoch > best[0]:
            best = (epoch, named)
    if best is None:
        raise StaleEpoch(f"no sentinel answered for the primary (this connection is to {where})")
    if best[1] != where:
        raise StaleEpoch(
            f"the sentinels name {best[1]} (config-epoch {best[0]}), not {where}, as the primary"
        )
    return View(replid, _checked(best[0], where), where)


def cluster_view(info: Mapping[str, str], cluster: Mapping[str, str], where: str) -> View:
    """The view from the ``INFO replication`` and ``CLUSTER INFO`` of the node
    serving the queue's slot (``StaleEpoch`` if it is not a primary)."""
    replid = _primary(info, where)
    return View(replid, _checked(int(cluster["cluster_my_epoch"]), where), where)


class Epochs:
    """One client's view of the primary, shared by its threads (or tasks).

    ``view`` is None until read, and again after a hand-out on it answered
    ``STALEEPOCH`` (``failed``); it is read by one thread (``lock``) or task
    (``alock``) at a time, the others waiting for that reading."""

    __slots__ = (
        "alock",
        "key",
        "kind",
        "last",
        "lock",
        "name",
        "reads",
        "refused",
        "service",
        "stale",
        "view",
    )

    def __init__(self, name: str, kind: str, key: str, service: str = "") -> None:
        self.name = name
        self.kind = kind  # "sentinel" or "cluster"
        self.key = key  # a key of the queue: its slot's node serves a Cluster's view
        self.service = service  # the Sentinel service
        self.view: View | None = None
        self.last: View | None = None  # the last view adopted (kept when view is dropped)
        self.lock = threading.Lock()  # the threading driver's: one reader at a time
        self.alock: asyncio.Lock | None = None  # the asyncio driver's, made on its loop
        self.reads = 0  # views read and trusted
        self.refused = 0  # views read and not trusted (the sentinels named another node)
        self.stale = 0  # hand-outs answered STALEEPOCH (nothing handed out)

    def adopt(self, view: View) -> View:
        """``view`` read and trusted: the next hand-outs carry it."""
        self.reads += 1
        previous, self.last = self.last, view
        if previous is not None and previous.replid != view.replid:
            logger.info(
                "keyqueue %r: the primary is now %s (replication id %s, epoch %d): tokens from %d",
                self.name,
                view.address,
                view.replid[:8],
                view.epoch,
                view.epoch << EPOCH_SHIFT,
            )
        self.view = view
        return view

    def failed(self, view: View | None, exc: BaseException) -> StaleEpoch | None:
        """A hand-out on ``view`` (None: its reading) raised ``exc``: the
        ``StaleEpoch`` to ride (the view dropped), or None for any other error."""
        if isinstance(exc, StaleEpoch):
            self.refused += 1
        elif isinstance(exc, redis.exceptions.ResponseError) and str(exc).startswith(STALE):
            self.stale += 1
            exc = StaleEpoch(str(exc).removeprefix(STALE).strip())
        else:
            return None
        if self.view is view or view is None:
            self.view = None
        return exc


class Retries:
    """A hand-out's attempts after ``STALEEPOCH``: the second at once (a view
    read afresh is the remedy), then pauses of 0.05 s doubling;
    ``VIEW_ATTEMPTS`` in all."""

    __slots__ = ("_made", "_pause")

    def __init__(self) -> None:
        self._made = 1
        self._pause = 0.0

    def pause(self) -> float | None:
        """Seconds to pause before the next attempt, or None: raise."""
        if self._made >= VIEW_ATTEMPTS:
            return None
        self._made += 1
        if self._made == 2:
            return 0.0
        self._pause = FIRST_PAUSE if not self._pause else self._pause * 2
        return jitter(self._pause)


def epochs_for(client: Any, name: str, key: str) -> Epochs | None:
    """The view of a Sentinel or Cluster client; None for a plain server's."""
    if getattr(client, "nodes_manager", None) is not None:
        return Epochs(name, "cluster", key)
    if sentinels_of(client):
        return Epochs(name, "sentinel", key, client.connection_pool.service_name)
    return None


def run_viewed(epochs: Epochs, client: Any, script: Any, keys: list[str], args: list[str]) -> Any:
    """``script(keys, args)``, a hand-out, carrying the client's view of the
    primary, read first if there is none; after ``STALEEPOCH`` or a view not
    trusted, read again and asked again (``Retries``), then ``StaleEpoch``."""
    retries = Retries()
    while True:
        view = epochs.view
        try:
            if view is None:
                with epochs.lock:
                    view = epochs.view or epochs.adopt(read_view(epochs, client))
            return script(keys, [*args, *view.args])
        except Exception as exc:
            stale = epochs.failed(view, exc)
            if stale is None:
                raise
            reroute(client)
            pause = retries.pause()
            if pause is None:
                raise stale from exc
            time.sleep(pause)


async def arun_viewed(
    epochs: Epochs, client: Any, script: Any, keys: list[str], args: list[str]
) -> Any:
    """``run_viewed`` for an asyncio client."""
    if epochs.alock is None:
        epochs.alock = asyncio.Lock()
    retries = Retries()
    while True:
        view = epochs.view
        try:
            if view is None:
                async with epochs.alock:
                    view = epochs.view or epochs.adopt(await aread_view(epochs, client))
            return await script(keys, [*args, *view.args])
        except Exception as exc:
            stale = epochs.failed(view, exc)
            if stale is None:
                raise
            await areroute(client)
            pause = retries.pause()
            if pause is None:
                raise stale from exc
            await asyncio.sleep(pause)


def read_view(epochs: Epochs, client: Any) -> View:
    """Read a threading client's view (``StaleEpoch`` if not trusted)."""
    if epochs.kind == "cluster":
        node = client.get_node_from_key(epochs.key)
        info = client.execute_command("INFO", "replication", target_nodes=node)
        cluster = client.execute_command("CLUSTER INFO", target_nodes=node)
        return cluster_view(_fields(info), _fields(cluster), f"{node.host}:{node.port}")
    pool = client.connection_pool
    conn = pool.get_connection(*_command_name(pool))
    try:
        conn.send_command("INFO", "replication")
        info = conn.read_response()
        address = (str(conn.host), int(conn.port))
    except BaseException:
        conn.disconnect()
        raise
    finally:
        pool.release(conn)
    return sentinel_view(_fields(info), address, _records(client, epochs.service))


async def aread_view(epochs: Epochs, client: Any) -> View:
    """``read_view`` for an asyncio client."""
    if epochs.kind == "cluster":
        await client.initialize()
        node = client.get_node_from_key(epochs.key)
        info = await client.execute_command("INFO", "replication", target_nodes=node)
        cluster = await client.execute_command("CLUSTER INFO", target_nodes=node)
        return cluster_view(_fields(info), _fields(cluster), f"{node.host}:{node.port}")
    pool = client.connection_pool
    conn = await pool.get_connection(*_command_name(pool))
    try:
        await conn.send_command("INFO", "replication")
        info = await conn.read_response()
        address = (str(conn.host), int(conn.port))
    except BaseException:
        await conn.disconnect()
        raise
    finally:
        await pool.release(conn)
    return sentinel_view(_fields(info), address, await _arecords(client, epochs.service))


def _answers(done: set[Any]) -> list[Mapping[str, Any]]:
    """The records of the questions in ``done`` that were answered (a
    sentinel that failed or refused is skipped, as one that did not answer)."""
    records = []
    for future in done:
        if future.cancelled():
            continue
        exc = future.exception()
        if exc is None:
            records.append(future.result())
        elif not isinstance(exc, (redis.exceptions.RedisError, OSError)):
            raise exc
    return records


def _records(client: Any, service: str) -> list[Mapping[str, Any]]:
    """Every sentinel's ``SENTINEL MASTER`` record of ``service``, asked at
    once (a daemon thread each); once one answered, the others have
    ``SENTINEL_GRACE``. A question still unanswered is left to end by its
    sentinel's socket timeout, unwaited for (at exit too)."""
    pending: set[concurrent.futures.Future[Any]] = set()
    for sentinel in sentinels_of(client):
        future: concurrent.futures.Future[Any] = concurrent.futures.Future()
        ask = threading.Thread(
            target=_ask, args=(sentinel, service, future), name="keyqueue-sentinel", daemon=True
        )
        ask.start()
        pending.add(future)
    records: list[Mapping[str, Any]] = []
    while pending and not records:
        done, pending = concurrent.futures.wait(
            pending, return_when=concurrent.futures.FIRST_COMPLETED
        )
        records += _answers(done)
    if pending:
        done, _ = concurrent.futures.wait(pending, timeout=SENTINEL_GRACE)
        records += _answers(done)
    return records


def _ask(sentinel: Any, service: str, future: concurrent.futures.Future[Any]) -> None:
    """``future`` gets ``sentinel``'s record of ``service``, or what asking raised."""
    try:
        future.set_result(sentinel.sentinel_master(service))
    except BaseException as exc:  # handed to the reader, which skips or raises it
        future.set_exception(exc)


async def _arecords(client: Any, service: str) -> list[Mapping[str, Any]]:
    """``_records`` for an asyncio client (a task each; the unanswered cancelled)."""
    pending = {asyncio.ensure_future(s.sentinel_master(service)) for s in sentinels_of(client)}
    records: list[Mapping[str, Any]] = []
    try:
        while pending and not records:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            records += _answers(done)
        if pending:
            done, pending = await asyncio.wait(pending, timeout=SENTINEL_GRACE)
            records += _answers(done)
        return records
    finally:
        for task in pending:
            task.cancel()
