"""``python -m keyqueue.lab``: the same as ``keyqueue lab``."""

import sys

from keyqueue.cli import main

if __name__ == "__main__":
    main(["lab", *sys.argv[1:]])
