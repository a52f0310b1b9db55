"""`moebench env`: this machine, its libraries and which entries are usable here."""
from __future__ import annotations


def env_args(args) -> int:
    from moebench.run.env import env_command

    return env_command(args.json)
