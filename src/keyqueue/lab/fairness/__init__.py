"""``keyqueue lab fairness``: priorities, aging and per-endpoint buckets, simulated exactly.

``run`` simulates one worker on a ``FakeClock``, ``render`` draws the tables,
``command`` is the click command.
"""
