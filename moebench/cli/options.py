"""What more than one command's grammar shares: the overrides' epilog, the sweep's exit statuses and
the clauses of a comparison's (each command's epilog states its own), the comparison's options, and
the two arguments the dispatcher reads by name (`overrides`, `--out`). Each command's module
declares its own arguments with these (its `register`, beside its body); parser.py assembles them."""

from __future__ import annotations

import argparse
import textwrap

EPILOG = """overrides are Hydra-style: group=option (backend=local), key=value
(workload.tokens_per_rank=[16,64]) and, in a sweep, comma lists (reduction=experts,finalize).
Groups: backend experts reduction overlap model quant workload runner trace."""


SWEEP_EXIT = """exit status: 0 every row ok or skipped with a reason; 1 failed / incorrect / timeout / oom
rows, or an environment error (a full disk) stopped the sweep mid-way (finished rows are stored:
re-run to resume); 2 bad input before any work (an unknown option or value, an impossible
combination, a world size this machine lacks, CPU weights beyond its memory, an unwritable --out,
an existing --out that is neither empty nor a run); 3 moebench or the machine failed (a defect,
memory: the traceback, then one line), not the measured kernels; 130 interrupted; 143 terminated."""


# what a comparison's statuses mean (report --baseline, compare, ab; docs/design.md "Exit status"):
# each command's epilog (exit_status) says its own around them
REGRESSION = (
    "a row slower beyond the threshold, a broken row (was ok, now failed/incorrect/timeout/oom) or no paired row ok "
    "on both sides (--fail-on tunes which)"
)
ENVIRONMENT = (
    "an environment error (a full disk, a read-only --out, an input that cannot be read, a link that loops or dangles)"
)
# a comparison whose shared rows are all host time (or CPU time, or GPU clocks apart): report/verdict.py
NO_VERDICT_0 = (
    '"No verdict" where the rows both runs share are all host time, CPU time (unless --cpu-verdict) or GPU clocks apart'
)

# moebench or the machine failed, not what was measured: every command exits this for a failure that
# is neither bad input, an environment error nor a stop (moebench/cli/main.py; docs/design.md, "Exit
# status"), the traceback kept on stderr; 1 stays the kernels' (failed rows) or the comparison's (slower)
NO_RESULT = 3

NO_VERDICT = "could not be produced (moebench or the machine failed: no verdict on the runs)"
# NO_RESULT in the epilog of every command but the comparing ones (NO_VERDICT)
FAILED = f"{NO_RESULT} moebench or the machine failed (a defect, memory: the traceback, then one line)"


def exit_status(*clauses: str) -> str:
    """An epilog 'exit status: 0 ...; 1 ...; ...' of a command's own statuses, one clause each,
    wrapped as the others are, a status never apart from the word after it."""
    text = textwrap.fill("exit status: " + "; ".join(c.replace(" ", "\0", 1) for c in clauses) + ".", width=100)
    return text.replace("\0", " ")


def command(sub, name: str, help: str, epilog: str | None = None) -> argparse.ArgumentParser:
    """A command's parser under the top level's subparsers `sub`; an epilog keeps its line breaks
    (the overrides' grammar, the exit statuses)."""
    if epilog is None:
        return sub.add_parser(name, help=help)
    return sub.add_parser(name, help=help, epilog=epilog, formatter_class=argparse.RawDescriptionHelpFormatter)


def overrides(p, help: str | None = None) -> None:
    """The positional overrides: parser.parse_args adds to them those that follow an option, and
    main.py names the one behind a config error from them."""
    p.add_argument("overrides", nargs="*", help=help)


def out(p, help: str) -> None:
    """--out, the folder a command writes: main.py names it in an environment error's line."""
    p.add_argument("--out", help=help)


def compare_options(p) -> None:
    """The comparison's threshold, exit policy and output format (report, compare, ab)."""
    p.add_argument(
        "--threshold",
        type=float,
        default=1.05,
        help="factor a latency (or workspace) ratio must pass to count (default %(default)s)",
    )
    p.add_argument(
        "--fail-on",
        default="slower,broken,empty",
        help="what exits 1, a comma list of slower, broken, memory (workspace larger), missing "
        "(a baseline row the candidate lacks), empty (no paired row ok on both sides), env (environments "
        "not comparable), or none (default: %(default)s)",
    )
    p.add_argument(
        "--cpu-verdict",
        action="store_true",
        help="give CPU rows faster / slower verdicts too (CPU figures are pipeline checks: by "
        "default two CPU runs compare without a verdict and exit 0)",
    )
    p.add_argument(
        "--format",
        default="md",
        choices=("md", "csv", "json"),
        help="what stdout gets: the verdict and table (md), the table (csv), everything (json); "
        "the report folder gets report.md and, for csv / json, the tables' files (default: md)",
    )


class Terminated(KeyboardInterrupt):
    """SIGTERM (`timeout`, `kill`, SLURM's pre-emption) in `tune`, raised where Ctrl-C is: its handlers
    say what is kept and what the step in flight loses, as on Ctrl-C, then exit 143, not 130."""


def stopped(e: BaseException) -> tuple[str, int]:
    """How a stop is worded and its exit status: SIGTERM's (Terminated) or Ctrl-C's."""
    return ("terminated (SIGTERM)", 143) if isinstance(e, Terminated) else ("interrupted", 130)
