"""The command line's grammar, assembled: the top level's options, then each command's parser as
its own module declares it (`register(sub)`, beside the command's body; what several commands share
is in options.py), and the parsing that lets overrides come before, between and after options."""

from __future__ import annotations

import argparse
import itertools
import sys

from moebench import __version__
from moebench.cli import ab, env, listing, report, sweep, trace, tune
from moebench.cli.options import EPILOG
from moebench.util.arg_errors import UNRECOGNIZED, OneLineErrors  # the commands' parsers, one line per refusal

# in `moebench --help`'s order; a module may declare two commands (sweep.py: sweep and run; report.py:
# report and compare), the module main.py's COMMANDS runs them from
COMMAND_MODULES = (sweep, listing, report, ab, trace, tune, env)


def build_parser() -> tuple[OneLineErrors, dict[str, argparse.ArgumentParser]]:
    """The parser and its subcommands' parsers by name."""
    p = OneLineErrors(
        prog="moebench",
        description="Benchmark modular MoE layer kernels.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--version", action="version", version=f"moebench {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True, help="the command (moebench CMD --help: its arguments)")
    for module in COMMAND_MODULES:
        module.register(sub)
    return p, dict(sub.choices)


def parse_args(argv):
    """argparse stops filling `overrides` at the first option, so `sweep a=1 --sweep x b=2`
    would refuse b=2: overrides may come before, between and after options."""
    parser, commands = build_parser()
    given = list(sys.argv[1:] if argv is None else argv)
    if not given:  # bare `moebench`: what it does and its commands
        parser.print_help(sys.stderr)
        raise SystemExit(2)
    # an unknown option before the command is the top level's (`moebench --verison`): argparse said only
    # that the command was missing, or named it in the command's line (the top level's take no value)
    if stray := parser.unknown_options(list(itertools.takewhile(lambda a: a.startswith("-"), given))):
        parser.error(UNRECOGNIZED + " ".join(stray))
    args, rest = parser.parse_known_args(given)
    if rest and hasattr(args, "overrides"):
        stray = [a for a in rest if a.startswith("-") or "=" not in a]
        if not stray:
            args.overrides = list(args.overrides or []) + rest
            rest = []
    if twice := repeated_key(getattr(args, "overrides", None) or []):
        commands[args.cmd].error(twice)
    if rest:
        # the subcommand's own usage (its options), not the top level's list of subcommands
        (commands.get(getattr(args, "cmd", None)) or parser).error(UNRECOGNIZED + " ".join(rest))
    return args


def repeated_key(overrides: list[str]) -> str:
    """'' unless one key is given twice (`reduction=experts reduction=finalize`): Hydra keeps the
    last and the first is dropped unsaid, where the user meant both; then the line saying what to
    give instead. The values' comma list, each once ('experts,finalize'); a bracketed or quoted
    value is kept whole."""
    seen: dict[str, list[str]] = {}
    for raw in overrides:
        if "=" not in raw:
            continue
        key, value = raw.split("=", 1)
        key = key.lstrip("+~")
        if key not in seen:
            seen[key] = [raw]
            continue
        if value == seen[key][0].split("=", 1)[1]:
            continue  # the same value again: nothing is lost
        values = [r.split("=", 1)[1] for r in (*seen[key], raw)]
        whole = any(c in v for v in values for c in "[]()'\"{}")
        both = ",".join(values if whole else dict.fromkeys(p for v in values for p in v.split(",")))
        return (
            f"{key} is given twice ({seen[key][0]} {raw}): the last would replace the first; "
            f"give it once, {key}={both} for both"
        )
    return ""
