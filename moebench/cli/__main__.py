"""`python -m moebench.cli`: the console script `moebench`."""

import sys

from moebench.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
