"""`python -m moebench.dist_worker` (torchrun, SLURM): the rank entry point, which lives in
moebench/run/dist_worker.py. Importing it first starts the parent watch, before anything heavy."""
import sys

from moebench.run.dist_worker import main

if __name__ == "__main__":
    sys.exit(main())
