"""``keyqueue lab web``: the instrument, one page in the browser.

- ``app.create_app``: the aiohttp app (the page, its static files from
  ``static/``, and a small JSON API: the fluid model from ``lab model``'s
  ``run_model``, backoff from ``lab backoff``'s ``run_backoff``, and the live
  queue's trace as Server-Sent Events), built on ``keyqueue._web`` as
  ``keyqueue dashboard`` is (the guard, CSRF, JSON bodies, the headers, the
  shared ``base.css`` and ``format.js``);
- ``live.LiveLab``: the real ``AsyncWorkQueue`` the page watches, its workers
  and the trace built from ``queue.subscribe``;
- ``server.WebServer``: the app on a background thread, as a context manager;
- ``command.web``: the click command.

Needs aiohttp (the ``keyqueue[lab]`` extra); importing this package does not.
"""
