"""``keyqueue lab firehose``: tens of thousands of events a second onto a few keys.

- ``common``: what both backends share: the config, the producer and its
  pacing, the simulated reconcile and its workers, the samples, the tick and
  the result;
- ``memory``: the run on one in-memory ``WorkQueue`` (the default);
- ``redis``: the run in several processes on one ``RedisWorkQueue``
  (``--backend redis``; needs the redis library, imported only then);
- ``run``: ``run_firehose``, which runs the one the config names;
- ``render``: the live panel, the plain lines and the summary;
- ``command``: the click command.
"""
