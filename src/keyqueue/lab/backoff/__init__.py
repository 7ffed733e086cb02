"""``keyqueue lab backoff``: the per-key backoff table and a thundering herd, computed exactly.

``run`` asks the real limiters on a ``FakeClock``, ``render`` draws the
tables, ``command`` is the click command. ``keyqueue lab web`` shows the same
table, from ``run``.
"""
