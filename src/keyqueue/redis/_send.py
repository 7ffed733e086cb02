"""keyqueue's scripts on a redis-py client, each call sent once.

redis-py re-sends a command whose connection failed, as many times as the
client's ``Retry`` allows: by default (redis-py 8) ten for
``redis.Redis(host, port)``, ``RedisCluster`` and their asyncio twins, none
for ``Redis.from_url`` or a client on a ``ConnectionPool`` made without one.
A re-sent script whose first run's reply was lost runs twice: a get or a
claim takes keys no caller ever learns, a done answers ``lost`` for a key
its first run released. So none of keyqueue's scripts goes through that
retry, whatever the client: a ``Script`` sends ``EVALSHA`` once, on a
connection of the client's pool (a cluster client's node for the queue's
slot, with ``target_nodes``, which redis-py never retries), and a failure
raises into the operation (its connection closed unless every reply sent
for was read, ``_exchange``). The operation then knows its outcome is unknown,
and recovers by its own means when it is asked again (``_ops``: request
numbers, the get and claim records, done's "asked again"); the runners and
the renewal loop ask again after a backoff.

What the server answered without running the script is safe to send again
and is: ``NOSCRIPT`` (the script is then sent whole, with ``EVAL``), and a
cluster's ``MOVED``, ``ASK`` and ``TRYAGAIN`` (redis-py follows them; they
are not retries). Connecting (and its handshake) comes before anything is
sent: redis-py's connection retries it as it always does. Commands other
than the scripts keep the client's retry: ``INFO``, ``BLPOP`` of the
doorbell (a reply lost after it popped a bell costs that wake-up, not a key:
the key waits, and a getter looks again within a lease), ``RPUSH`` of a bell
or wake-up (an extra one wakes a getter that finds nothing), ``HGET`` and
``EXISTS`` (they read).

In the replicated mode (``_durability``) a script that writes is followed by
``WAIT n timeout`` on the same connection, both written at once and read in
order: one round trip, and ``WAIT`` counts the script's writes (those of its
own connection). That needs the connection in hand, also on a Cluster, where
``target_nodes`` gives none: ``ReplicatedScript`` takes a connection of the
slot's node itself, and a ``MOVED`` or ``ASK`` reply (the script did not run)
sends it to the node named, the map refreshed. A reply ``WAIT`` did not
confirm raises ``NotReplicated``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio
from redis.exceptions import AskError, MovedError, NoScriptError, ResponseError, TryAgainError

from ._durability import Replication

__all__ = ["AsyncReplicatedScript", "AsyncScript", "ReplicatedScript", "Script"]

REDIRECTS = 16
"""How many ``MOVED``, ``ASK`` or ``TRYAGAIN`` replies a replicated script on a
Cluster follows before it raises (redis-py's own ``RedisClusterRequestTTL``)."""
TRY_AGAIN_PAUSE = 0.05  # seconds before a script a Cluster answered TRYAGAIN is sent again

Command = tuple[Any, ...]


class Script:
    """One of keyqueue's Lua scripts on one client: ``script(keys, args)`` runs
    it once (``EVALSHA``, ``EVAL`` after ``NOSCRIPT``) and returns its reply,
    or raises what the call raised; never re-sent by redis-py's retry."""

    __slots__ = ("client", "sha", "source")

    def __init__(self, client: Any, source: str) -> None:
        self.client = client
        self.source = source
        self.sha = hashlib.sha1(source.encode()).hexdigest()

    def __call__(self, keys: list[str], args: list[str]) -> Any:
        try:
            return self._send(keys, "EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:  # answered without running it: send it whole
            return self._send(keys, "EVAL", self.source, len(keys), *keys, *args)

    def _send(self, keys: list[str], *command: Any) -> Any:
        client: Any = self.client
        if isinstance(self.client, redis.RedisCluster):
            # With target_nodes, RedisCluster makes one attempt (it follows
            # MOVED and ASK, and refreshes its map after a connection error).
            node = client.get_node_from_key(keys[0])
            return client.execute_command(*command, target_nodes=node)
        pool = client.connection_pool
        # A connection of its own from the pool (a single-connection client's
        # too): sent and read here, without the connection's retry.
        conn = pool.get_connection(*_command_name(pool))
        try:
            (reply,) = _exchange(client, conn, [command])
        finally:
            _release(pool, conn)
        return _reply(reply)


class AsyncScript(Script):
    """``Script`` on a ``redis.asyncio`` client: ``await script(keys, args)``.

    A cancelled call is a call whose outcome is unknown: its connection is
    closed (redis-py does that for a read it interrupts)."""

    __slots__ = ()

    async def __call__(self, keys: list[str], args: list[str]) -> Any:
        try:
            return await self._asend(keys, "EVALSHA", self.sha, len(keys), *keys, *args)
        except NoScriptError:
            return await self._asend(keys, "EVAL", self.source, len(keys), *keys, *args)

    async def _asend(self, keys: list[str], *command: Any) -> Any:
        try:
            return await self._asend_once(keys, *command)
        except TypeError as exc:
            # CPython 3.13.0's selector transport raises this TypeError when a
            # write meets a connection that just closed: a lost connection, so
            # the call's outcome is unknown, as for redis-py's ConnectionError.
            if not _closed_transport(exc):
                raise
            raise redis.exceptions.ConnectionError("the connection closed under a write") from exc

    async def _asend_once(self, keys: list[str], *command: Any) -> Any:
        client: Any = self.client
        if isinstance(self.client, redis.asyncio.RedisCluster):
            await client.initialize()  # a no-op once it knows the slots
            node = client.get_node_from_key(keys[0])
            return await client.execute_command(*command, target_nodes=node)
        pool = client.connection_pool
        conn = await pool.get_connection(*_command_name(pool))
        try:
            (reply,) = await _aexchange(client, conn, [command])
        finally:
            await _arelease(pool, conn)
        return _reply(reply)


class ReplicatedScript(Script):
    """``Script`` in the replicated mode: each call is the script and ``WAIT``,
    on one connection, in one round trip. Returns the script's reply once
    ``WAIT`` confirmed it; ``NotReplicated`` (the reply not acted on) if
    fewer replicas than ``replication.replicas`` acknowledged in time."""

    __slots__ = ("replication",)

    def __init__(self, client: Any, source: str, replication: Replication) -> None:
        super().__init__(client, source)
        self.replication = replication

    def _send(self, keys: list[str], *command: Any) -> Any:
        client: Any = self.client
        wait = ("WAIT", self.replication.replicas, self.replication.timeout_ms)
        if isinstance(client, redis.RedisCluster):
            replies = self._send_to_slot(keys[0], command, wait)
        else:
            pool = client.connection_pool
            conn = pool.get_connection(*_command_name(pool))
            try:
                replies = _exchange(client, conn, [command, wait])
            finally:
                _release(pool, conn)
        return _confirmed(self.replication, replies)

    def _send_to_slot(self, key: str, command: Command, wait: Command) -> list[Any]:
        """The script and ``WAIT`` on a connection of the node serving ``key``'s
        slot, following ``MOVED``, ``ASK`` and ``TRYAGAIN`` (the script did not
        run); after a connection error the slot map is reloaded and it raises."""
        client: Any = self.client
        node, asking = client.get_node_from_key(key), False
        replies: list[Any] = []
        for _ in range(REDIRECTS):
            commands = [("ASKING",), command, wait] if asking else [command, wait]
            redis_node = client.get_redis_connection(node)
            pool = redis_node.connection_pool
            conn = pool.get_connection(*_command_name(pool))
            try:
                replies = _exchange(redis_node, conn, commands)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                conn.disconnect()
                with contextlib.suppress(redis.exceptions.RedisError):
                    client.nodes_manager.initialize()  # the next call asks where the slot is
                raise
            finally:
                _release(pool, conn)
            redirect = replies[-2]
            if isinstance(redirect, MovedError):
                client.nodes_manager.initialize()
                node, asking = client.get_node_from_key(key), False
            elif isinstance(redirect, AskError):
                node, asking = client.get_node(host=redirect.host, port=redirect.port), True
                if node is None:
                    client.nodes_manager.initialize()
                    node, asking = client.get_node_from_key(key), False
            elif isinstance(redirect, TryAgainError):
                time.sleep(TRY_AGAIN_PAUSE)
            else:
                break
        return replies[-2:]


class AsyncReplicatedScript(AsyncScript):
    """``ReplicatedScript`` on a ``redis.asyncio`` client."""

    __slots__ = ("replication",)

    def __init__(self, client: Any, source: str, replication: Replication) -> None:
        super().__init__(client, source)
        self.replication = replication

    async def _asend_once(self, keys: list[str], *command: Any) -> Any:
        client: Any = self.client
        wait = ("WAIT", self.replication.replicas, self.replication.timeout_ms)
        if isinstance(client, redis.asyncio.RedisCluster):
            replies = await self._send_to_slot(keys[0], command, wait)
        else:
            pool = client.connection_pool
            conn = await pool.get_connection(*_command_name(pool))
            try:
                replies = await _aexchange(client, conn, [command, wait])
            finally:
                await _arelease(pool, conn)
        return _confirmed(self.replication, replies)

    async def _send_to_slot(self, key: str, command: Command, wait: Command) -> list[Any]:
        """``ReplicatedScript._send_to_slot`` on an asyncio Cluster client."""
        client: Any = self.client
        await client.initialize()  # a no-op once it knows the slots
        node, asking = client.get_node_from_key(key), False
        replies: list[Any] = []
        for _ in range(REDIRECTS):
            commands = [("ASKING",), command, wait] if asking else [command, wait]
            conn = node.acquire_connection()
            try:
                if _asked_to_reconnect(conn):
                    await conn.disconnect()
                replies = await _aexchange(node, conn, commands)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                await conn.disconnect()
                with contextlib.suppress(redis.exceptions.RedisError):
                    await client.nodes_manager.initialize()
                raise
            finally:
                node.release(conn)
            redirect = replies[-2]
            if isinstance(redirect, MovedError):
                await client.nodes_manager.initialize()
                node, asking = client.get_node_from_key(key), False
            elif isinstance(redirect, AskError):
                node, asking = client.get_node(host=redirect.host, port=redirect.port), True
                if node is None:
                    await client.nodes_manager.initialize()
                    node, asking = client.get_node_from_key(key), False
            elif isinstance(redirect, TryAgainError):
                await asyncio.sleep(TRY_AGAIN_PAUSE)
            else:
                break
        return replies[-2:]


def _exchange(client: Any, conn: Any, commands: Sequence[Command]) -> list[Any]:
    """Write ``commands`` at once on ``conn``, read their replies in order (an
    error reply in its place, as the exception; anything else raised raises).

    ``conn`` goes back to its pool only once every reply was read: whatever
    raised on the way, it is closed first, or the replies left unread would
    be read by its next user as its own (``WAIT``'s count as a script's
    reply, a script's reply as ``WAIT``'s count). redis-py closes a
    connection whose read failed, but not every one: a Sentinel's
    (``SentinelManagedConnection``) stays open after a socket timeout, and
    nothing closes one when a reply callback or an interrupt raises between
    two reads."""
    replies: list[Any] = []
    try:
        conn.send_packed_command(_pack(conn, commands))
        for command in commands:
            try:
                replies.append(client.parse_response(conn, command[0]))
            except ResponseError as exc:
                replies.append(exc)
    finally:
        if len(replies) < len(commands):
            conn.disconnect()
    return replies


async def _aexchange(client: Any, conn: Any, commands: Sequence[Command]) -> list[Any]:
    """``_exchange`` on an asyncio connection (cancelled: closed too)."""
    replies: list[Any] = []
    try:
        await conn.send_packed_command(_pack(conn, commands))
        for command in commands:
            try:
                replies.append(await client.parse_response(conn, command[0]))
            except ResponseError as exc:
                replies.append(exc)
    finally:
        if len(replies) < len(commands):
            await conn.disconnect(nowait=True)
    return replies


def _pack(conn: Any, commands: Sequence[Command]) -> list[bytes]:
    """``commands`` in the Redis protocol, as ``conn.pack_commands`` writes
    them, in one buffer (the send of one ``sendall``): a ``str`` encoded
    with ``conn``'s encoding, an ``int`` in decimal, anything else as
    ``conn``'s encoder does. A claim's hundreds of short arguments cost
    redis-py's packer a buffer copy each; this one joins them once."""
    encoder = conn.encoder
    encoding, errors = encoder.encoding, encoder.encoding_errors
    parts: list[bytes] = []
    add = parts.append
    for command in commands:
        add(b"*%d\r\n" % len(command))
        for arg in command:
            if type(arg) is str:
                data = arg.encode(encoding, errors)
            elif type(arg) is int:
                data = b"%d" % arg
            else:
                data = encoder.encode(arg)
            add(b"$%d\r\n%s\r\n" % (len(data), data))
    return [b"".join(parts)]


def _reply(reply: Any) -> Any:
    """A script's reply from ``_exchange``: raised if the server answered an error."""
    if isinstance(reply, ResponseError):
        raise reply
    return reply


def _confirmed(replication: Replication, replies: list[Any]) -> Any:
    """The script's reply of a ``[script, WAIT]`` exchange, if ``WAIT``
    confirmed it; raises the script's error reply (``NOSCRIPT``: not run) as
    is, ``NotReplicated`` if ``WAIT`` came short or was refused."""
    reply, acked = replies
    if isinstance(reply, Exception):
        raise reply
    if isinstance(acked, Exception):
        raise replication.refused(reply, 0) from acked
    if not replication.confirmed(int(acked)):
        raise replication.refused(reply, int(acked))
    return reply


def _release(pool: Any, conn: Any) -> None:
    """Give ``conn`` back to ``pool`` (closed first if it was asked to reconnect)."""
    try:
        if _asked_to_reconnect(conn):
            conn.disconnect()
    finally:
        pool.release(conn)


async def _arelease(pool: Any, conn: Any) -> None:
    """``_release`` on an asyncio pool."""
    try:
        if _asked_to_reconnect(conn):
            await conn.disconnect()
    finally:
        await pool.release(conn)


def _closed_transport(exc: TypeError) -> bool:
    """True for the ``TypeError`` asyncio's selector transport raises on a write
    to a connection that closed meanwhile (its write callback already None)."""
    tb = exc.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return (
        tb is not None
        and tb.tb_frame.f_code.co_filename.endswith("selector_events.py")
        and "'NoneType' object is not callable" in str(exc)
    )


def _asked_to_reconnect(conn: Any) -> bool:
    """Whether a maintenance notification asked this connection to reconnect
    (redis-py 7 and later; redis-py 5 and 6, which ``keyqueue[redis]`` allows,
    have no such notice and no ``should_reconnect``)."""
    should_reconnect = getattr(conn, "should_reconnect", None)
    return should_reconnect is not None and bool(should_reconnect())


_NAMED: dict[type, tuple[str, ...]] = {}


def _command_name(pool: Any) -> tuple[str, ...]:
    """What ``pool.get_connection`` must be given: the command's name on
    redis-py 5, which requires it; nothing on later versions, which deprecate
    it (a warning per call)."""
    kind = type(pool)
    named = _NAMED.get(kind)
    if named is None:
        parameter = inspect.signature(kind.get_connection).parameters.get("command_name")
        required = parameter is not None and parameter.default is inspect.Parameter.empty
        named = _NAMED[kind] = ("EVALSHA",) if required else ()
    return named
