"""A TCP relay that can cut connections by where they come from: a partition on loopback.

``Relay(listen, upstream)`` accepts on ``listen`` and copies bytes both ways
between each accepted connection and a new one to ``upstream``, made from
the peer's own address (so the server sees where a connection came from;
any loopback address can be bound without privileges), a thread per
direction. ``cut(sources)`` closes the links whose peer address is one
of ``sources`` (IP strings) and refuses new ones from them; ``cut_all()``
does that for every peer; ``heal()`` undoes both. Linux routes all of
127.0.0.0/8 to the loopback device, so processes bound to distinct loopback
addresses are told apart by their source address: ``ValkeyCluster`` puts
each node on its own and routes the cluster bus through one relay per node,
so that cutting a node's relay and its address at every other relay cuts it
off from the other nodes and from nothing else.
"""

from __future__ import annotations

import contextlib
import socket
import threading

__all__ = ["Relay"]


class Relay:
    """See the module's docstring. ``start()`` returns it; ``stop()`` closes everything."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.listen = listen
        self.upstream = upstream
        self._lock = threading.Lock()
        self._cut: set[str] = set()  # peer addresses refused and cut
        self._cut_all = False
        self._links: list[tuple[str, socket.socket, socket.socket]] = []  # peer, in, out
        self._server: socket.socket | None = None
        self._stopped = False

    def start(self) -> Relay:
        """Listen (``OSError`` if the address is taken) and start accepting."""
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            server.bind(self.listen)
            server.listen(64)
        except OSError:
            server.close()
            raise
        self._server = server
        threading.Thread(target=self._accept, name=f"relay-{self.listen}", daemon=True).start()
        return self

    def _refused(self, peer: str) -> bool:
        return self._cut_all or peer in self._cut

    def _accept(self) -> None:
        assert self._server is not None
        while not self._stopped:
            try:
                inbound, (peer, _) = self._server.accept()
            except OSError:
                return
            with self._lock:
                refused = self._refused(peer)
            if refused:
                inbound.close()
                continue
            try:
                outbound = socket.create_connection(
                    self.upstream, timeout=2.0, source_address=(peer, 0)
                )
                outbound.settimeout(None)
            except OSError:
                inbound.close()
                continue
            with self._lock:
                self._links.append((peer, inbound, outbound))
            for source, sink in ((inbound, outbound), (outbound, inbound)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pump(source: socket.socket, sink: socket.socket) -> None:
        try:
            while chunk := source.recv(65536):
                sink.sendall(chunk)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def _close_links(self, doomed: list[tuple[str, socket.socket, socket.socket]]) -> None:
        for _, inbound, outbound in doomed:
            for sock in (inbound, outbound):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def cut(self, sources: set[str]) -> None:
        """Close the links from ``sources`` and refuse new ones from them."""
        with self._lock:
            self._cut |= sources
            doomed = [link for link in self._links if link[0] in sources]
            self._links = [link for link in self._links if link[0] not in sources]
        self._close_links(doomed)

    def cut_all(self) -> None:
        """Close every link and refuse new ones."""
        with self._lock:
            self._cut_all = True
            doomed, self._links = self._links, []
        self._close_links(doomed)

    def heal(self) -> None:
        """Accept from everyone again."""
        with self._lock:
            self._cut.clear()
            self._cut_all = False

    def stop(self) -> None:
        """Stop accepting and close every link."""
        self._stopped = True
        if self._server is not None:
            with contextlib.suppress(OSError):
                self._server.close()
        self.cut_all()
