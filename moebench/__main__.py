"""`python -m moebench`: the console script `moebench` (as `python -m moebench.cli`)."""

import sys

from moebench.cli.main import main

if __name__ == "__main__":
    sys.exit(main())
