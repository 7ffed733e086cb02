"""The lab's valkey-server (``--backend redis`` without ``--redis-url``): ``keyqueue.testing``'s.

The launcher is the public one (``keyqueue.testing.local_valkey``: free
loopback port, temporary directory, stopped on every exit, dies with its
owner); this module only names it for the lab's modules that import it from
here.
"""

from __future__ import annotations

from keyqueue.testing import ValkeyError, ValkeyServer, local_valkey

__all__ = ["ValkeyError", "ValkeyServer", "local_valkey"]
