"""The lab: the real queue under scripted load, made visible (``keyqueue lab ...``).

Needs the ``keyqueue[lab]`` extra (click, rich). Each subcommand's logic is a
function returning a result object, separate from its rendering:

- ``slowmo.run_slowmo``: every transition of a few keys, one line each;
- ``firehose.run_firehose``: tens of thousands of events a second onto a few keys;
- ``backoff.run_backoff``: the per-key backoff table and a thundering herd;
- ``model.run_model``: backlog, utilisation and M/M/1 estimates.

``render`` draws the results; ``cli`` is the click command.
"""
