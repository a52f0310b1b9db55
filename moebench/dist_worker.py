"""`python -m moebench.dist_worker` (torchrun, SLURM): the rank entry point, which lives in
moebench/run/dist_worker.py. A rank watches its starter from its first line, before torch's
seconds of imports (moebench/run/lifeline.py): here, since run/dist_worker.py is imported, not
run as __main__, under this name."""

import sys

if __name__ == "__main__":
    from moebench.run.lifeline import watch_parent

    watch_parent()

from moebench.run.dist_worker import main  # after the parent watch: these imports take seconds

if __name__ == "__main__":
    sys.exit(main())
