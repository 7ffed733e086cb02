"""The Redis client (``keyqueue.redis``) on real valkey-servers."""
