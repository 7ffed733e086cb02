"""What a Redis queue's snapshot does not carry, read beside it for the health verdict.

Two reads, in one round trip, on the queue's own keys (one hash tag, so one
cluster slot): the shared retry bucket (``HMGET bucket tokens last``: the
tokens left at its last take, negative when in debt) and the last delayed
key (``ZRANGE delayed -1 -1 WITHSCORES``: when the longest backoff ends).
Read-only, like the snapshot; not atomic with it, which a health reading
does not need. ``read`` takes a redis-py client, ``aread`` an asyncio one.
"""

from __future__ import annotations

from typing import Any

from .health import Probe

__all__ = ["aread", "keys", "parse", "read"]


def keys(name: str) -> tuple[str, str]:
    """The queue ``name``'s bucket and delayed keys on the server."""
    from keyqueue.redis._schema import KEY_NAMES, key_names  # noqa: PLC0415 (redis-py)

    names = key_names(name)
    return names[KEY_NAMES.index("bucket")], names[KEY_NAMES.index("delayed")]


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value.decode() if isinstance(value, bytes) else value)
    except ValueError:
        return None


def parse(bucket: Any, last: Any) -> Probe:
    """The ``Probe`` from the replies of ``HMGET bucket tokens last`` and
    ``ZRANGE delayed -1 -1 WITHSCORES``."""
    tokens, taken = (bucket or [None, None])[:2]
    last_due = _number(last[0][1]) if last else None
    return Probe(bucket_tokens=_number(tokens), bucket_last=_number(taken), last_due=last_due)


def read(client: Any, name: str) -> Probe:
    """Read the probe of the queue ``name`` with the blocking client ``client``."""
    bucket, delayed = keys(name)
    pipe = client.pipeline(transaction=False)
    pipe.hmget(bucket, ["tokens", "last"])
    pipe.zrange(delayed, -1, -1, withscores=True)
    return parse(*pipe.execute())


async def aread(client: Any, name: str) -> Probe:
    """Read the probe of the queue ``name`` with the asyncio client ``client``."""
    bucket, delayed = keys(name)
    pipe = client.pipeline(transaction=False)
    pipe.hmget(bucket, ["tokens", "last"])
    pipe.zrange(delayed, -1, -1, withscores=True)
    return parse(*(await pipe.execute()))
