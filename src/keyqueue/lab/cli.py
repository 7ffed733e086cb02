"""``keyqueue lab``: the click group of the lab's demonstrations.

This module only builds the group and registers each demonstration's command
(``slowmo``, ``firehose``, ``backoff``, ``model``, ``fairness``, ``pipeline``,
``web``, and ``valkey``, a server to try things on: each in
``keyqueue.lab.<name>``). The ``keyqueue`` group (``keyqueue.cli``) loads it
only when ``lab`` is asked for; errors read as every ``keyqueue`` command's
(``keyqueue._console.group``): ``keyqueue lab CMD: error: MESSAGE``, exit
status 2 for a usage error and 1 for any other, 130 after Ctrl-C, 1 quietly
when the output pipe closes.
"""

from __future__ import annotations

import click

from .._console.group import Group
from .backoff.command import backoff
from .fairness.command import fairness
from .firehose.command import firehose
from .model.command import model
from .pipeline.command import pipeline_command
from .slowmo.command import slowmo
from .valkey.command import valkey
from .web.command import web

__all__ = ["lab"]


@click.group(cls=Group)
def lab() -> None:
    """Watch the queue work: a slow-motion trace, a firehose, backoff tables, a capacity model.

    Start with `keyqueue lab slowmo` (what happens to one key), then
    `keyqueue lab firehose` (what happens at 50,000 events a second).
    """


for command in (slowmo, firehose, backoff, model, fairness, pipeline_command(), web, valkey):
    lab.add_command(command)
