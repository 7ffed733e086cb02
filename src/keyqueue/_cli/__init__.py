"""What the ``keyqueue`` commands share, the operator's and the lab's alike.

The operator's tools (``keyqueue.ops``, ``keyqueue.dashboard``) need only the
``keyqueue[ops]`` extra, so they import nothing from ``keyqueue.lab``; what
they share with the lab lives here:

- ``commands``: the ``keyqueue`` group (the operator's commands, and
  ``keyqueue lab`` loaded only when asked for, or the line that installs it);
- ``group``: how every command fails (one line, one exit status);
- ``options``: the option types and the options every command takes;
- ``format``: the output modes, and numbers and durations for a person;
- ``guard``: which requests a local web server answers (its own Host, Origin);
- ``sse``: a live picture as Server-Sent Events;
- ``listen``: ``--host``/``--port`` errors and the URL to open.

``keyqueue.cli`` is the console script's stub, which imports none of this
until the command runs.
"""

__all__ = ["LAB_INSTALL", "OPS_INSTALL"]

OPS_INSTALL = "pip install 'keyqueue[ops]'"
"""The line that installs the operator's commands (``inspect`` ... ``dashboard``)."""
LAB_INSTALL = "pip install 'keyqueue[lab]'"
"""The line that installs ``keyqueue lab``."""
