"""What the ``keyqueue`` commands share, the operator's and the lab's alike.

The operator's tools (``keyqueue.ops``, ``keyqueue.dashboard``) need only the
``keyqueue[ops]`` extra, so they import nothing from ``keyqueue.lab``; what
they share with the lab's commands lives here (and what the two web pages
share, in ``keyqueue._web``):

- ``commands``: the ``keyqueue`` group's class (commands loaded only when asked
  for), its help, and the lab's extra (the line that installs it);
- ``group``: how every command fails (one line, one exit status);
- ``options``: the option types and the options every command takes;
- ``format``: the output modes, and numbers and durations for a person.

``keyqueue.cli`` is the console script's stub, which registers the commands
and imports none of this until the command runs. This module itself imports
nothing: the stub reads its install lines.
"""

__all__ = ["LAB_INSTALL", "OPS_INSTALL"]

OPS_INSTALL = "pip install 'keyqueue[ops]'"
"""The line that installs the operator's commands (``inspect`` ... ``dashboard``)."""
LAB_INSTALL = "pip install 'keyqueue[lab]'"
"""The line that installs ``keyqueue lab``."""
