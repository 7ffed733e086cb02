"""A few commands to a server over a plain socket: the launchers' own client.

The launchers ask servers for their role, their replication and their
cluster state while they start them and while a test breaks them, and
``keyqueue.testing`` must import with the standard library alone, so they
speak RESP2 here instead of through redis-py. One connection per call
(``call``), bounded by ``timeout`` seconds: a frozen or dead server is a
``ValkeyError`` within that bound, never a hang.
"""

from __future__ import annotations

import socket

__all__ = ["Reply", "ReplyError", "call"]

Reply = str | int | list["Reply"] | None
"""A parsed reply: simple and bulk strings as ``str``, integers, arrays, nil."""


class ReplyError(RuntimeError):
    """The server answered with an error (``-ERR ...``); the message is its text."""


class _Reader:
    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._buf = b""

    def _fill(self) -> None:
        chunk = self._sock.recv(65536)
        if not chunk:
            raise ConnectionError("the server closed the connection")
        self._buf += chunk

    def line(self) -> bytes:
        while b"\r\n" not in self._buf:
            self._fill()
        line, self._buf = self._buf.split(b"\r\n", 1)
        return line

    def exactly(self, n: int) -> bytes:
        while len(self._buf) < n + 2:
            self._fill()
        data, self._buf = self._buf[:n], self._buf[n + 2 :]
        return data

    def reply(self) -> Reply | ReplyError:
        line = self.line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest.decode(errors="replace")
        if kind == b"-":
            return ReplyError(rest.decode(errors="replace"))
        if kind == b":":
            return int(rest)
        if kind == b"$":
            n = int(rest)
            return None if n < 0 else self.exactly(n).decode(errors="replace")
        if kind == b"*":
            n = int(rest)
            if n < 0:
                return None
            items: list[Reply] = []
            for _ in range(n):
                item = self.reply()
                items.append(str(item) if isinstance(item, ReplyError) else item)
            return items
        raise ConnectionError(f"not a RESP2 reply: {line[:40]!r}")


def _encode(args: tuple[str | int, ...]) -> bytes:
    parts = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = str(arg).encode()
        parts.append(b"$%d\r\n%s\r\n" % (len(data), data))
    return b"".join(parts)


def call(
    port: int,
    *args: str | int,
    host: str = "127.0.0.1",
    timeout: float = 2.0,
    auth: tuple[str, str] | None = None,
) -> Reply:
    """Send one command to ``host:port`` and return its reply.

    ``auth`` (user, password) authenticates first. Raises ``ReplyError`` for
    an error reply, ``OSError`` (``ConnectionError``, ``TimeoutError``) when
    the server cannot be reached or does not answer within ``timeout``
    seconds.
    """
    with socket.create_connection((host, port), timeout=timeout) as sock:
        sock.settimeout(timeout)
        reader = _Reader(sock)
        if auth is not None:
            sock.sendall(_encode(("AUTH", *auth)))
            answer = reader.reply()
            if isinstance(answer, ReplyError):
                raise answer
        sock.sendall(_encode(args))
        reply = reader.reply()
    if isinstance(reply, ReplyError):
        raise reply
    return reply
