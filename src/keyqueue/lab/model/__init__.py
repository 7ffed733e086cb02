"""``keyqueue lab model``: the fluid view of capacity, and M/M/1 when it applies.

``run`` steps the model, ``render`` draws its table, ``command`` is the click
command. ``keyqueue lab web`` shows the same model, from ``run``.
"""
