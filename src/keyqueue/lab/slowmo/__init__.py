"""``keyqueue lab slowmo``: every transition of a few keys, one line each, in slow motion.

``run`` plays the script on a real ``WorkQueue`` and returns the trace,
``render`` draws it, ``command`` is the click command.
"""
