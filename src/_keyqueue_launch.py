"""The ``keyqueue`` console script's entry point, outside the ``keyqueue`` package.

The script pip writes runs ``from <module> import main`` before anything of
ours can take Ctrl-C, and importing ``keyqueue.cli`` runs the package's
``__init__`` first (the queues, the compiled core: tens of milliseconds). This
module imports nothing at all, so a Ctrl-C while ``keyqueue`` loads is
``keyqueue: interrupted`` and exit status 130 here, not a traceback;
``keyqueue.cli.main`` takes it from there on.
"""

import sys

__all__ = ["main"]


_interrupted: list[bool] = []


def _note_interrupt(unraisable: "sys.UnraisableHookArgs") -> None:
    """Note a Ctrl-C that landed where Python cannot raise it (a weakref's
    callback as a module loads: "Exception ignored in"); ``main`` acts on it
    once the import is over. Raising it here, even by ``interrupt_main``, would
    only be "Exception ignored in sys.unraisablehook"."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        _interrupted.append(True)
    else:
        sys.__unraisablehook__(unraisable)


def _interrupted_exit() -> None:
    sys.stderr.write("keyqueue: interrupted\n")
    sys.exit(130)


def main() -> None:
    """Load ``keyqueue.cli`` and run the command line; Ctrl-C meanwhile is exit 130."""
    sys.unraisablehook = _note_interrupt
    try:
        from keyqueue.cli import main as run  # noqa: PLC0415 (after the try: the point)
    except (KeyboardInterrupt, RuntimeError) as exc:
        # Python 3.11 wraps what a ``__set_name__`` raises (a dataclass field's,
        # as a class is made) in a RuntimeError: a Ctrl-C there is its cause.
        if isinstance(exc, RuntimeError) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        _interrupted_exit()
    finally:
        sys.unraisablehook = sys.__unraisablehook__
    if _interrupted:
        _interrupted_exit()
    run()
