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


def _interrupt_again(unraisable: "sys.UnraisableHookArgs") -> None:
    """A Ctrl-C that landed where Python cannot raise it (a weakref's callback
    as a module loads: "Exception ignored in") is raised again in the main
    thread, so it interrupts the command as any other Ctrl-C does."""
    if isinstance(unraisable.exc_value, KeyboardInterrupt):
        import _thread  # noqa: PLC0415 (only when it happens)

        _thread.interrupt_main()
    else:
        sys.__unraisablehook__(unraisable)


def main() -> None:
    """Load ``keyqueue.cli`` and run the command line; Ctrl-C meanwhile is exit 130."""
    sys.unraisablehook = _interrupt_again
    try:
        from keyqueue.cli import main as run  # noqa: PLC0415 (after the try: the point)
    except (KeyboardInterrupt, RuntimeError) as exc:
        # Python 3.11 wraps what a ``__set_name__`` raises (a dataclass field's,
        # as a class is made) in a RuntimeError: a Ctrl-C there is its cause.
        if isinstance(exc, RuntimeError) and not isinstance(exc.__cause__, KeyboardInterrupt):
            raise
        sys.stderr.write("keyqueue: interrupted\n")
        sys.exit(130)
    run()
