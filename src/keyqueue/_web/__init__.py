"""What the lab's page (``keyqueue lab web``) and ``keyqueue dashboard`` are both built on.

Both are one page served by a small aiohttp app on loopback, for a person's
browser; they share every rule about who is answered and how:

- ``app``: the app every page is served by: one middleware that refuses
  other sites (``guard``) and cross-site state changes (CSRF: a JSON body, and
  the page's token where the app has one), turns bad input into
  ``{"error": ...}`` and sends the same security ``HEADERS`` on every answer;
  ``json_body`` for the request bodies; ``runner``, how both servers run it;
- ``guard``: which requests a local server answers (its own Host, Origin);
- ``static``: each page's files, and the two every page loads: ``base.css``
  (the colours, fonts and reset) and ``format.js`` (numbers and durations
  written as ``keyqueue top`` writes them, ``keyqueue._console.format``);
- ``sse``: a live picture as Server-Sent Events;
- ``listen``: the listening socket, ``--host``/``--port`` errors and the URL to open.

Needs aiohttp and click (both in the ``ops`` and the ``lab`` extras); imports
nothing from ``keyqueue.lab``.
"""
