"""What a Redis queue's snapshot does not carry, read beside it for the health verdict.

Two reads, in one round trip, on the queue's own keys (one hash tag, so one
cluster slot): the shared retry bucket (``HMGET bucket tokens last``: the
tokens left at its last take, negative when in debt) and the last delayed
key (``ZRANGE delayed -1 -1 WITHSCORES``: when the longest backoff ends).
Read-only, like the snapshot; not atomic with it, which a health reading
does not need. ``read`` takes a redis-py client, ``aread`` an asyncio one.

A sharded queue has a bucket and a delayed set per shard: ``read`` and
``aread`` take each shard's queue name (``names``), read each shard in its
own round trip (its own slot, perhaps its own primary; ``aread`` sends
them together) and ``merge`` them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from .health import Probe

__all__ = ["aread", "keys", "merge", "parse", "read"]


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


def merge(probes: Sequence[Probe]) -> Probe:
    """A sharded queue's probe from its shards': in debt if any shard's bucket
    is, by the sum of their debts (the latest take among them); the last
    delayed key the latest of the shards'. One probe is itself."""
    if len(probes) == 1:
        return probes[0]
    read = [(t, p.bucket_last) for p in probes if (t := p.bucket_tokens) is not None]
    owing = [(t, last) for t, last in read if t < 0]
    tokens = sum(t for t, _ in owing) if owing else min((t for t, _ in read), default=None)
    lasts = [last for _, last in owing or read if last is not None]
    dues = [p.last_due for p in probes if p.last_due is not None]
    return Probe(
        bucket_tokens=tokens,
        bucket_last=max(lasts, default=None),
        last_due=max(dues, default=None),
        buckets=len(probes),
    )


def _pipeline(client: Any, name: str) -> Any:
    bucket, delayed = keys(name)
    pipe = client.pipeline(transaction=False)
    pipe.hmget(bucket, ["tokens", "last"])
    pipe.zrange(delayed, -1, -1, withscores=True)
    return pipe


def read(client: Any, names: Sequence[str]) -> Probe:
    """Read the probe of the queue whose shards are ``names`` (one name: an
    unsharded queue) with the blocking client ``client``."""
    return merge([parse(*_pipeline(client, name).execute()) for name in names])


async def aread(client: Any, names: Sequence[str]) -> Probe:
    """As ``read``, with the asyncio client ``client``."""
    replies = await asyncio.gather(*(_pipeline(client, name).execute() for name in names))
    return merge([parse(*reply) for reply in replies])
