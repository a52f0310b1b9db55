"""argparse's refusals as the project's bad input, for every command line moebench has: the CLI's
commands (moebench/cli/parser.py), `python -m moebench.dist_worker` and the other `python -m`
entry points, and the scripts under benchmarks/ and scripts/."""

from __future__ import annotations

import argparse
import ast
import difflib
import re
from pathlib import Path
from typing import NoReturn

UNRECOGNIZED = "unrecognized arguments: "  # argparse's words, and moebench/cli/parser.py's
# argparse's words for a value not among an argument's choices (a command's name: `moebench sweeep`)
QUOTED = r"'(?:[^'\\]|\\.)*'" + "|" + r'"(?:[^"\\]|\\.)*"'  # a value as repr() quotes it
INVALID_CHOICE = re.compile(rf"argument (?P<name>.+?): invalid choice: (?P<value>{QUOTED})")


class OneLineErrors(argparse.ArgumentParser):
    """argparse's refusals (an unknown option, a missing argument, a bad value, a script's own
    `error(...)`) as the project's bad input: one line naming the command and where its help is,
    exit 2, without the usage block argparse's own error() prints first; an unknown option is followed
    by the nearest of the parser's own ('; did you mean --dry-run?': Python 3.11's argparse has no
    suggest_on_error), and a value not among an argument's choices by the nearest choice (a command's
    name: `moebench sweeep`, '; did you mean sweep?'). The subcommands' parsers are of this class too
    (add_subparsers takes the parent's)."""

    def error(self, message: str) -> NoReturn:
        line = " ".join(message.splitlines())
        if line.startswith(UNRECOGNIZED):
            line += self.nearest_options(line[len(UNRECOGNIZED) :].split())
        elif found := INVALID_CHOICE.match(line):
            line += self.nearest_choice(found["name"], found["value"])
        self.exit(2, f"{self.prog}: error: {line} (see {self.prog} --help)\n")

    def unknown_options(self, given: list[str]) -> list[str]:
        """The options among `given` that this parser does not take: neither one of its own (`--x=value`
        read as `--x`) nor the start of a long one, which argparse takes for it (allow_abbrev)."""
        known = [s for action in self._actions for s in action.option_strings]

        def takes(arg: str) -> bool:
            name = arg.split("=", 1)[0]
            prefix = self.allow_abbrev and name.startswith("--") and any(k.startswith(name) for k in known)
            return arg in ("-", "--") or name in known or prefix

        return [arg for arg in given if arg.startswith("-") and not takes(arg)]

    def nearest_choice(self, name: str, shown: str) -> str:
        """'; did you mean sweep?' for the value `shown` (as argparse's message quotes it) of the argument
        `name` (as the message names it) that is near one of its choices, or ''."""
        try:
            value = ast.literal_eval(shown)
        except (ValueError, SyntaxError):
            return ""
        choices = next((a.choices for a in self._actions if a.choices is not None and _name(a) == name), None)
        match = difflib.get_close_matches(str(value), [str(c) for c in choices or ()], n=1, cutoff=0.6)
        return f"; did you mean {match[0]}?" if match else ""

    def nearest_options(self, given: list[str]) -> str:
        """'; did you mean --dry-run?' for the unknown options among `given` (`--x=value` read as
        `--x`) that are near one of this parser's shown in --help (none hidden from it), one suggestion
        each ('--a for --b, ...' for several), or ''."""
        known = [s for action in self._actions if action.help is not argparse.SUPPRESS for s in action.option_strings]
        near = [
            (name, match[0])
            for name in (arg.split("=", 1)[0] for arg in given if arg.startswith("-"))
            if (match := difflib.get_close_matches(name, known, n=1, cutoff=0.6))
        ]
        if len(near) == 1:
            return f"; did you mean {near[0][1]}?"
        return "; did you mean " + ", ".join(f"{m} for {name}" for name, m in near) + "?" if near else ""


def _name(action: argparse.Action) -> str | None:
    """An argument's name as argparse's messages give it (argparse._get_action_name, private)."""
    if action.option_strings:
        return "/".join(action.option_strings)
    name = next((n for n in (action.metavar, action.dest) if n not in (None, argparse.SUPPRESS)), None)
    return name if isinstance(name, str) else None


def script_prog(file) -> str:
    """The command that runs the script `file` from the checkout's root, as its help and its errors
    name it: `python benchmarks/NAME.py` (argparse's own default is the bare file name, or the test
    runner's when a test calls the script's main)."""
    path = Path(file)
    return f"python {path.parent.name}/{path.name}"
