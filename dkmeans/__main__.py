"""``python -m dkmeans``: the command line."""

import sys

from dkmeans.cli import main

if __name__ == "__main__":
    sys.exit(main())
