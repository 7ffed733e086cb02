"""``keyqueue dashboard``: a live page of Redis queues for their operator.

- ``monitor.Monitor``: every queue's ``q.snapshot()`` once a second, its rates, its last
  10 minutes and the reading of whether it keeps up; the two actions;
- ``app.create_app``: the aiohttp app (the page from ``static/``, the state
  as JSON and Server-Sent Events, the actions behind the guard and a token);
- ``server.serve``: the app on this thread's loop until Ctrl-C;
- ``command.dashboard``: the click command.

Needs the ``keyqueue[ops]`` extra (aiohttp, redis-py, click, rich); importing
this package does not. It imports nothing from ``keyqueue.lab``.
"""
