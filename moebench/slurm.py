"""`moebench sweep --slurm`: placeholder (filled in below)."""
from __future__ import annotations


def add_arguments(p) -> None:
    p.add_argument("--slurm", action="store_true", help="submit the work as SLURM jobs (submitit)")


def options_from_args(args):
    return None
