"""moebench sweep|run|list|report|compare|ab|trace|tune|env: the dispatcher. Each command's
arguments and body are a module of moebench.cli (COMMANDS; parser.py assembles the arguments);
this one maps errors to one line and an exit status (docs/design.md, "Exit status").

Bad input (unknown option, malformed results, a world size the machine lacks)
exits with code 2 and a message that says what to do, before any work starts; so does an
environment error (a full disk, a read-only folder, `--out` naming a file: one line naming
the path and the cause, moebench/results/writable.py). A sweep that meets one mid-run keeps its
rows and exits 1 saying so (moebench/run/sweep.py). A command that fails any other way (a defect,
memory, a library's refusal) exits NO_RESULT, never 1: a CI gate must not read a crash of moebench as
a kernel's failure (sweep, run), "slower" (compare, report, ab) or a regression (tune). A stdout or
stderr whose reader has gone (`moebench compare ... 2>&1 | head`) discards the rest of that output:
the command runs to its end and exits with its own status.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import traceback
from contextlib import contextmanager
from typing import Iterator, TextIO, cast

from moebench.cli.options import NO_RESULT
from moebench.cli.parser import parse_args

# command -> (module of moebench.cli, its function of the parsed arguments)
COMMANDS = {
    "sweep": ("sweep", "sweep_command"),
    "run": ("sweep", "run_command"),
    "list": ("listing", "list_command"),
    "report": ("report", "report_args"),
    "compare": ("report", "compare_args"),
    "ab": ("ab", "ab_command"),
    "trace": ("trace", "trace_args"),
    "tune": ("tune", "tune_command"),
    "env": ("env", "env_args"),
}


COMPARING = ("report", "compare", "ab")


class _Terminated(BaseException):
    """SIGTERM outside a sweep's running combinations (moebench/run/sweep.py handles it there)."""


def _on_sigterm(signum, frame):
    raise _Terminated


def _tune_sigterm(signum, frame):
    from moebench.cli.options import Terminated

    raise Terminated  # where Ctrl-C is caught: tune says what it keeps, then 143


class _Stdout:
    """sys.stdout for one command: once its reader has gone (`| head`: BrokenPipeError), what is
    written is discarded, so that the command runs to its end and returns its own status (compare's
    verdict too: a CI gate piping it into head reads 0 or 1, not a traceback's). Anything else it
    passes to the stream it wraps."""

    def __init__(self, stream: TextIO):
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                return self.stream.write(text)
            except BrokenPipeError:
                self._discard()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self.stream.flush()
            except BrokenPipeError:
                self._discard()

    def _discard(self) -> None:
        """docs.python.org, "Note on SIGPIPE": devnull in the closed pipe's place, so that the
        interpreter's last flush of what the stream still holds does not raise again at exit."""
        self.gone = True
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError):  # a stream of no file (a test's capture): nothing left to flush there
            return
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, fd)
        finally:
            os.close(devnull)

    def __getattr__(self, name: str):
        return getattr(self.stream, name)


@contextmanager
def _closed_output_discards() -> Iterator[None]:
    """The command's stdout and stderr each a _Stdout, flushed before the status is returned (a pipe's
    output is block-buffered: most of it is written here, or by the interpreter's exit, after main
    returns). stderr too: `moebench compare A B 2>&1 | head` closes it, and a warning or `_no_result`'s
    own line printed there must not turn the command's status into Python's 1 ("slower")."""
    given_out, given_err = sys.stdout, sys.stderr
    sys.stdout = cast(TextIO, _Stdout(given_out))
    sys.stderr = cast(TextIO, _Stdout(given_err))
    try:
        yield
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        finally:
            sys.stdout, sys.stderr = given_out, given_err


def main(argv=None) -> int:
    with _closed_output_discards():  # --help's text included
        args = parse_args(argv)
        if args.cmd not in ("sweep", "run", "tune"):
            return _main(args)
        # SLURM's pre-emption, `timeout`, `docker stop`: a message and exit 143, the lock released
        old = signal.signal(signal.SIGTERM, _tune_sigterm if args.cmd == "tune" else _on_sigterm)
        try:
            return _main(args)
        finally:
            signal.signal(signal.SIGTERM, old)


def _main(args) -> int:
    try:
        # one module per command, light at import (the parser reads its arguments): its body imports
        # what the command needs when it runs (`list` and `report` need no torch)
        module, function = COMMANDS[args.cmd]
        return getattr(importlib.import_module(f"moebench.cli.{module}"), function)(args)
    except ValueError as e:
        print(f"moebench {args.cmd}: error: {_one_line(e, getattr(args, 'overrides', None) or [])}", file=sys.stderr)
        return 2
    except OSError as e:
        line = _environment_line(e, args)
        if line is None:
            return _no_result(args, e)
        print(f"moebench {args.cmd}: environment error: {line}", file=sys.stderr)
        return 2
    except Exception as e:  # noqa: BLE001 (any other failure is moebench's or the machine's: NO_RESULT, never 1)
        return _no_result(args, e)
    except KeyboardInterrupt as e:
        # a sweep's second Ctrl-C (moebench/run/sweep.py Aborted) says what became of the work; one line
        # for every command (a Ctrl-C while a plugin imports included)
        from moebench.cli.options import stopped

        word, code = stopped(e)  # tune's SIGTERM comes as Terminated, a KeyboardInterrupt (143)
        print(f"moebench {args.cmd}: {str(e) or word}", file=sys.stderr)
        return code
    except _Terminated:
        print(
            f"moebench {args.cmd}: terminated (SIGTERM); finished combinations are stored. Re-run the same "
            "command to resume.",
            file=sys.stderr,
        )
        return 143
    return 2


def _no_result(args, e: Exception) -> int:
    """A command that failed in a way no other status names: its traceback, one line saying that
    moebench or the machine failed (a comparison's command: that no comparison was made), NO_RESULT."""
    traceback.print_exception(e)
    first = (str(e).splitlines() or [""])[0]
    if args.cmd in COMPARING:
        what = "could not produce the comparison or report"
        meaning = "no verdict on the runs, a failure of moebench or of the machine"
    else:
        what = "could not finish"
        meaning = "a failure of moebench or of the machine, not of the measured kernels"
    print(
        f"moebench {args.cmd}: {what} ({type(e).__name__}: {first}); exit {NO_RESULT}: {meaning} (the traceback above)",
        file=sys.stderr,
    )
    return NO_RESULT


def _environment_line(e: OSError, args) -> str | None:
    """The one line of an environment error (moebench/results/writable.py decides which OSErrors are
    one), with what to do; None for any other OSError (a defect: its traceback stays). An input that
    cannot be read (store.Unreadable, naming it) says to make it readable, or, a link that loops or
    dangles, to remove the link (or restore its target): no --out helps there."""
    from moebench.results.store import READ_ADVICE, Unreadable
    from moebench.results.writable import DANGLING, GIVE_OUT, LINK_ADVICE, LOOPS, describe

    out = getattr(args, "out", None)
    line = describe(e, out)
    if line is None:
        return None
    sweeping = args.cmd in ("sweep", "run")
    if isinstance(e, Unreadable) and (line.endswith(LOOPS) or f": {DANGLING} (" in line):  # no file to make readable
        line = f"{line}; {LINK_ADVICE[e.errno or 0]}"
    elif isinstance(e, Unreadable):
        line = f"{line}; {'make it readable' if sweeping else READ_ADVICE}"  # a sweep's run is its --out
    elif args.cmd in ("report", "compare", "trace") and not out and not line.endswith(GIVE_OUT):
        return f"{line}; {GIVE_OUT}"  # what a folder not made says (writable.describe), for any other refusal
    return f"{line}; nothing was measured" if sweeping else line


def _one_line(e: ValueError, overrides: list[str]) -> str:
    """A config library's multi-line message (OmegaConf: the message, then full_key and
    object_type lines) as one line naming the override that caused it."""
    text = str(e)
    lines = text.splitlines()
    if len(lines) <= 1:
        return text
    key = getattr(e, "full_key", None) or next(
        (ln.split(":", 1)[1].strip() for ln in lines if ln.strip().startswith("full_key:")), None
    )
    given = next((o for o in overrides if key and o.split("=", 1)[0].lstrip("+~").endswith(str(key))), None)
    first = lines[0].strip()
    if "ListConfig" in first and given:
        name = given.split("=", 1)[0]
        first = "expects a list, e.g. " + (
            "workload.tokens_per_rank=[16,256]" if name.endswith("tokens_per_rank") else f"{name}=[a,b]"
        )
    return f"{given}: {first}" if given else " ".join(ln.strip() for ln in lines)


if __name__ == "__main__":
    sys.exit(main())
