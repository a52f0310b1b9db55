"""argparse's refusals as the project's bad input, for every command line moebench has: the CLI's
commands (moebench/cli/parser.py), `python -m moebench.dist_worker` and the other `python -m`
entry points, and the scripts under benchmarks/ and scripts/."""

from __future__ import annotations

import argparse
import difflib
from pathlib import Path
from typing import NoReturn

UNRECOGNIZED = "unrecognized arguments: "  # argparse's words, and moebench/cli/parser.py's


class OneLineErrors(argparse.ArgumentParser):
    """argparse's refusals (an unknown option, a missing argument, a bad value, a script's own
    `error(...)`) as the project's bad input: one line naming the command and where its help is,
    exit 2, without the usage block argparse's own error() prints first; an unknown option is followed
    by the nearest of the parser's own ('; did you mean --dry-run?': Python 3.11's argparse has no
    suggest_on_error). The subcommands' parsers are of this class too (add_subparsers takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.splitlines())
        if line.startswith(UNRECOGNIZED):
            line += self.nearest_options(line[len(UNRECOGNIZED) :].split())
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")

    def nearest_options(self, given: list[str]) -> str:
        """'; did you mean --dry-run?' for the unknown options among `given` (`--x=value` read as
        `--x`) that are near one of this parser's, one suggestion each ('--a for --b, ...' for
        several), or ''."""
        known = [s for action in self._actions for s in action.option_strings]
        near = [
            (name, match[0])
            for name in (arg.split("=", 1)[0] for arg in given if arg.startswith("-"))
            if (match := difflib.get_close_matches(name, known, n=1, cutoff=0.6))
        ]
        if len(near) == 1:
            return f"; did you mean {near[0][1]}?"
        return "; did you mean " + ", ".join(f"{m} for {name}" for name, m in near) + "?" if near else ""


def script_prog(file) -> str:
    """The command that runs the script `file` from the checkout's root, as its help and its errors
    name it: `python benchmarks/NAME.py` (argparse's own default is the bare file name, or the test
    runner's when a test calls the script's main)."""
    path = Path(file)
    return f"python {path.parent.name}/{path.name}"
