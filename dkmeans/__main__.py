"""``python -m dkmeans``: the command line."""

import sys

from dkmeans.cli import run

if __name__ == "__main__":
    sys.exit(run())
