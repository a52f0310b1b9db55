"""argparse's refusals as the project's bad input, for every command line moebench has: the CLI's
commands (moebench/cli/parser.py), `python -m moebench.dist_worker` and the other `python -m`
entry points, and the scripts under benchmarks/ and scripts/."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import NoReturn


class OneLineErrors(argparse.ArgumentParser):
    """argparse's refusals (an unknown option, a missing argument, a bad value, a script's own
    `error(...)`) as the project's bad input: one line naming the command and where its help is,
    exit 2, without the usage block argparse's own error() prints first. The subcommands' parsers
    are of this class too (add_subparsers takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.splitlines())
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")


def script_prog(file) -> str:
    """The command that runs the script `file` from the checkout's root, as its help and its errors
    name it: `python benchmarks/NAME.py` (argparse's own default is the bare file name, or the test
    runner's when a test calls the script's main)."""
    path = Path(file)
    return f"python {path.parent.name}/{path.name}"
