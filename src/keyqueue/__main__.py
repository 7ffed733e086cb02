"""``python -m keyqueue``: the same as the ``keyqueue`` command."""

from keyqueue.cli import main

if __name__ == "__main__":
    main()
