"""The operator's commands on a live Redis queue: ``keyqueue inspect``, ``top``,
``add``, ``forget`` and ``delete``.

``connect`` opens a queue for a command (short socket timeouts, one-line
errors for a server that cannot be reached or a queue that does not exist);
``render`` writes a ``Snapshot`` for a person (tables, the live ``top`` frame,
its one-line plain form) and the rates ``top`` takes from counter deltas;
``command`` holds the click commands, which use the public API
(``RedisWorkQueue``: ``snapshot``, ``exists``, ``add``, ``forget``,
``delete``) and read a sharded queue's map from the server (``shards``: one
queue, each shard's sizes beside it; no ``--shards`` option). They need the
``keyqueue[ops]`` extra only (click, rich, redis-py: redis-py imported only
when a command runs) and import nothing from ``keyqueue.lab``. ``reshard``
and ``place`` change a sharded queue's layout online: its shard count
(``RedisWorkQueue.reshard``), and on a Cluster which primary serves each
shard (``placement.place_shards``: the shards' slots moved with their keys).
"""
