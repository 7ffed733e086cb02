"""``keyqueue lab valkey``: a private valkey-server on 127.0.0.1 to try ``keyqueue.redis`` on.

``command`` is the click command; the server is ``keyqueue.testing``'s
``local_valkey``, the one the lab's other commands and keyqueue's tests use.
"""
