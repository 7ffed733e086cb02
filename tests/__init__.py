"""keyqueue's tests, one folder per concept.

- ``core/``: the pure state machine, its transitions table, the waiting
  orders, the rate limiters, snapshots, validators, and a Hypothesis model;
  no front, no thread, no redis-py.
- ``fronts/``: what only one front does: ``WorkQueue`` (threading),
  ``AsyncWorkQueue`` (asyncio) and the two runners.
- ``conformance/``: one behaviour suite run on every queue, in memory and on
  Redis (the ``front`` fixture, conftest.py).
- ``redis/``: the Redis client: many clients and processes, claims, leases,
  lost replies, stalls, cluster, faults, and the Lua against the core.
- ``informer/``: ``keyqueue.informer`` against the lab's API server on etcd.
- ``lab/``: ``keyqueue lab`` and its pipeline, web page and API server.
- ``ops/``: the operator's commands, ``top``'s health verdict, the dashboard.
- ``meta/``: the project as a whole: the public surface, import layout, docs,
  builds, packaging, wheels, ``keyqueue.testing``'s launchers.
- ``support/``: what tests share: servers (Valkey, etcd), processes, a cutting
  proxy, a browser, the fronts; imported as ``tests.support.<module>``.

The core tests, the fronts' and the in-memory half of conformance run without
redis-py installed (meta/test_without_redis.py proves it).
"""
