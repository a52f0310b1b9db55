"""What a new user meets first: argparse's refusals as one line (the project's rule for bad input),
and each command's --help stating its units and its exit statuses."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from moebench import cli
from moebench.cli import parser


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2, argv
    return capsys.readouterr().err


@pytest.mark.parametrize(
    "argv, cmd, says",
    [
        (["sweep", "--nope"], "sweep", "unrecognized arguments: --nope"),  # an unknown flag
        (["tune", "--budget"], "tune", "argument --budget: expected one argument"),  # a flag's missing value
        (["tune", "--budget", "abc"], "tune", "invalid float value: 'abc'"),
        (["compare"], "compare", "the following arguments are required: RUN"),  # a missing argument
        (["report", "r", "--format", "x"], "report", "argument --format: invalid choice: 'x'"),
        (["report", "r", "backend=local"], "report", "unrecognized arguments: backend=local"),  # parse_args' own
        (["report", "r", "--capacity", "--budget", "0.15"], "report", "argument --budget: 0.15 reads as 0 bytes"),
        (["env", "--x"], "env", "unrecognized arguments: --x"),
        (["list", "--sweep"], "list", "argument --sweep: expected one argument"),
    ],
)
def test_an_argparse_error_is_one_line_naming_the_command_and_its_help(argv, cmd, says, capsys):
    """Was argparse's usage block (every option of the command) before the error line."""
    err = _refused(argv, capsys)
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert re.fullmatch(rf"moebench {cmd}: error: .+ \(see moebench {cmd} --help\)\n", err), err
    assert says in err


@pytest.mark.parametrize(
    "argv, says",
    [
        (["sweep", "--dryrun"], "unrecognized arguments: --dryrun; did you mean --dry-run?"),
        (["list", "--swep=x"], "unrecognized arguments: --swep=x; did you mean --sweep?"),  # --x=value read as --x
        (["report", "r", "--basline", "b"], "unrecognized arguments: --basline b; did you mean --baseline?"),
        (
            ["sweep", "--dryrun", "--otu", "x", "--zzzz"],
            "did you mean --dry-run for --dryrun, --out for --otu?",  # each its own; --zzzz near none
        ),
        (["sweep", "--nope"], "unrecognized arguments: --nope (see"),  # near none: no suggestion
    ],
)
def test_an_unknown_option_is_followed_by_the_nearest_of_the_commands_own(argv, says, capsys):
    """Python 3.11's argparse has no suggest_on_error; config keys had a 'did you mean', options none."""
    err = _refused(argv, capsys)
    assert err.count("\n") == 1 and says in err, err


@pytest.mark.parametrize(
    "argv, says",
    [
        (
            ["sweep", "--dry-run", "reduction=experts", "reduction=finalize"],
            "reduction is given twice (reduction=experts reduction=finalize): the last would replace the first; "
            "give it once, reduction=experts,finalize for both",
        ),
        (  # after an option too; a comma list's values each once
            ["list", "quant=bf16,fp8_block", "--verbose", "quant=bf16"],
            "quant is given twice (quant=bf16,fp8_block quant=bf16): the last would replace the first; "
            "give it once, quant=bf16,fp8_block for both",
        ),
        (
            ["run", "workload.tokens_per_rank=[4]", "+workload.tokens_per_rank=[8]"],
            "give it once, workload.tokens_per_rank=[4],[8] for both",
        ),
    ],
)
def test_a_key_given_twice_is_refused_saying_how_to_give_both(argv, says, capsys):
    """`sweep reduction=experts reduction=finalize` ran finalize alone, where the user meant both."""
    err = _refused(argv, capsys)
    assert err.count("\n") == 1 and says in err, err


def test_a_key_given_twice_with_the_same_value_loses_nothing_and_runs():
    from moebench.cli.parser import repeated_key

    assert repeated_key(["model=tiny", "quant=bf16", "model=tiny"]) == ""
    assert repeated_key(["model=tiny", "model=tiny", "model=mixtral_8x7b"]).startswith("model is given twice")


def test_an_unknown_axis_field_is_followed_by_the_nearest_field_or_knob(tmp_path, capsys):
    from moebench.results.synthetic import synthetic_run

    run = str(synthetic_run(tmp_path / "run"))
    for axis, near in (("quantt=bf16:fp8_block", "quant"), ("row_layot=a:b", "row_layout")):
        assert cli.main(["compare", run, "--axis", axis]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and err.endswith(f"; did you mean {near}?\n"), err
    assert not (tmp_path / "run" / "report").exists()


def test_an_unknown_command_is_one_line_pointing_at_the_top_level_help(capsys):
    err = _refused(["nope"], capsys)
    assert err.count("\n") == 1 and err.startswith("moebench: error: argument cmd: invalid choice: 'nope'")
    assert err.endswith("(see moebench --help)\n")


def test_every_command_parser_refuses_in_one_line():
    """Every subcommand's parser is built by the class whose error is one line (none added another way)."""
    top, commands = parser.build_parser()
    assert isinstance(top, parser.OneLineErrors)
    for cmd, p in commands.items():
        assert isinstance(p, parser.OneLineErrors), cmd


@pytest.mark.parametrize(
    "module, argv",
    [
        ("moebench.run.dist_worker", ["--out"]),  # the rank entry point (tests/run/test_distributed.py: its run)
        ("moebench.report.results_index", ["--nope"]),
        ("moebench.results.synthetic", []),  # --out is required
        ("moebench.results.row", ["--nope"]),
        ("moebench.run.treestate", ["nope"]),
    ],
)
def test_each_python_m_entry_point_refuses_in_one_line_naming_itself(module, argv, capsys):
    """`python -m moebench...`'s own parsers: the error line alone, naming the entry point as run,
    without argparse's usage block before it, as the commands'."""
    import importlib

    with pytest.raises(SystemExit) as done:
        importlib.import_module(module).main(argv)
    assert done.value.code == 2
    err = capsys.readouterr().err
    prog = "python -m moebench.dist_worker" if module.endswith("dist_worker") else f"python -m {module}"
    assert err.count("\n") == 1 and "usage:" not in err, err
    assert err.startswith(f"{prog}: error: ") and err.endswith(f" (see {prog} --help)\n"), err


def test_python_m_moebench_is_the_console_script():
    """`python -m moebench` runs what `moebench` runs (a checkout without the console script on PATH):
    an unknown command is the same one line and exit 2."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(
        [sys.executable, "-m", "moebench", "nope"], cwd=root, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "nope" in done.stderr, done.stderr


def test_no_command_line_builds_its_parser_another_way():
    """Every argparse parser in moebench/, benchmarks/ and scripts/ is a OneLineErrors (moebench/util/
    arg_errors.py), so that none prints argparse's usage block; kernels/ imports nothing of the harness,
    so the compile check (`python -m moebench.kernels.triton.compile_check`, a developer's tool) keeps
    argparse's own."""
    root = Path(__file__).resolve().parents[2]
    exempt = {Path("moebench/util/arg_errors.py"), Path("moebench/kernels/triton/compile_check.py")}
    files = [p for folder in ("moebench", "benchmarks", "scripts") for p in (root / folder).rglob("*.py")]
    plain = [
        str(p.relative_to(root))
        for p in files
        if p.relative_to(root) not in exempt and re.search(r"\bArgumentParser\(", p.read_text())
    ]
    assert not plain, f"parsers that print argparse's usage block: {plain}"


def _help(cmd: str) -> str:
    _, commands = parser.build_parser()
    return commands[cmd].format_help()


def _option_help(cmd: str, flag: str) -> str:
    """The option's lines of the command's --help, as printed (argparse fills %(default)s, wraps)."""
    text = _help(cmd)
    start = text.index(f"  {flag} ")
    end = re.search(r"\n  -", text[start + 1 :])
    return " ".join(text[start : start + 1 + end.start() if end else None].split())


# options for moebench's own tests, which no real use may pass: hidden from --help (argparse.SUPPRESS), a
# comment beside each saying what it does; `tune --allow-cpu-tiles` installs host-time tiles
HIDDEN = {("tune", "--allow-cpu-tiles")}


def _arguments():
    top, commands = parser.build_parser()
    return [(name, a) for name, p in [("moebench", top), *commands.items()] for a in p._actions]


def test_every_argument_has_a_help_text():
    """Options and positionals alike, of the top level and of every command (list --sweep, report's RUN,
    --baseline and --candidate, ab's revisions and overrides, env --json, sweep --slurm-cpus-per-task
    had none): --help says what each one is; the tests' own options (HIDDEN) are left out of it."""
    bare = [
        f"{name}: {'/'.join(a.option_strings) or a.metavar or a.dest}"
        for name, a in _arguments()
        if not (a.help or "").strip() or (a.help is argparse.SUPPRESS and (name, a.option_strings[0]) not in HIDDEN)
    ]
    assert not bare, f"arguments without a help text (or hidden, and not a test-only option of HIDDEN): {bare}"


def test_the_tests_own_options_are_out_of_help_and_of_its_suggestions(capsys):
    """`tune --help` listed --allow-cpu-tiles ('for moebench's own tests only'): noise for a user, and
    an invitation to install host-time tiles. It still works (the tests pass it), but neither --help
    nor a 'did you mean' names it."""
    hidden = {(name, a.option_strings[0]) for name, a in _arguments() if a.help is argparse.SUPPRESS}
    assert hidden == HIDDEN
    for cmd, flag in HIDDEN:
        assert flag not in _help(cmd)
        assert parser.build_parser()[1][cmd].parse_known_args([flag])[0].allow_cpu_tiles
    err = _refused(["tune", "--alow-cpu-tiles"], capsys)
    assert "did you mean" not in err, err


def test_each_budget_says_its_unit():
    """`tune --budget` is a fraction, `report --capacity --budget` bytes: each help says which, and
    that it is not the other."""
    tune = _option_help("tune", "--budget")
    assert tune.startswith("--budget FRACTION ") and "fraction of the pruned space" in tune, tune
    assert "not bytes" in tune and "(default: 0.15, i.e. 15 %)" in tune, tune
    report = _option_help("report", "--budget")
    assert report.startswith("--budget BYTES ") and "in bytes" in report and "16GiB" in report, report
    assert "not a fraction" in report, report


def _codes(text: str) -> set[int]:
    """The exit codes an epilog states: each opens the text after 'exit status:' or a clause after ';' / '.'."""
    epilog = text[text.index("exit status:") :]
    return {int(c) for c in re.findall(r"(?:exit status:|[;.])\s+(\d+) ", epilog)}


# what each command returns (main.py maps ValueError and an environment error to 2, Ctrl-C to 130,
# any other failure (moebench's or the machine's) to 3 and, in sweep, run and tune, SIGTERM to 143):
# trace 1 is --import's failed capture; tune 1 a regression, an untuned size or --check-vllm's not-ok
COMPARING = {0, 1, 2, 3, 130}
STATES = {
    "sweep": {0, 1, 2, 3, 130, 143},
    "run": {0, 1, 2, 3, 130, 143},
    "list": {0, 2, 3, 130},
    "report": COMPARING,
    "compare": COMPARING,
    "ab": COMPARING,
    "trace": {0, 1, 2, 3, 130},
    "tune": {0, 1, 2, 3, 130, 143},
    "env": {0, 2, 3, 130},
}


def test_every_command_has_its_statuses_here():
    _, commands = parser.build_parser()
    assert set(STATES) == set(commands)


@pytest.mark.parametrize("cmd", sorted(STATES))
def test_each_help_names_the_exit_codes_its_command_returns(cmd):
    """trace, tune, list and env had no exit status in their --help, where sweep, compare and report had;
    compare's and ab's was report's, naming sweep's 143 and a single run's report."""
    assert _codes(_help(cmd)) == STATES[cmd], _help(cmd)


@pytest.mark.parametrize("cmd", ["compare", "ab"])
def test_compare_and_ab_help_say_nothing_of_report_or_sweep(cmd):
    text = " ".join(_help(cmd).split())
    assert "A single run's report" not in text and "sweep and run" not in text and "SIGTERM" not in text, text


def test_every_command_help_has_an_exit_status():
    _, commands = parser.build_parser()
    for cmd in commands:
        text = _help(cmd)
        assert "exit status:" in text and {0, 2, 3, 130} <= _codes(text), cmd


@pytest.mark.parametrize("cmd", ["report", "compare"])
def test_report_and_compare_help_say_where_a_committed_runs_report_goes(cmd):
    """`compare --help` gave CAND/report/vs-BASE as the default --out, but a run committed under results/
    writes its reports to runs/reports/<path>/ (tune --help said so): the help says it too."""
    text = _option_help(cmd, "--out")
    assert "committed under results/" in text and "runs/reports/<its path under results/>/report" in text, text


def test_run_help_speaks_of_its_one_combination_and_prints_a_readable_table():
    """`run --help` spoke of "the sweep mid-way", and `run` printed a raw pandas frame (946.6485)."""
    import pandas as pd

    from moebench.cli.sweep import rows_table

    text = _help("run")
    assert "sweep" not in text[text.index("exit status:") :] and "more than one combination" in text
    df = pd.DataFrame(
        {
            "tokens_per_rank": [64, 4],
            "status": ["ok", "skipped"],
            "latency_us_median": [946.6485, float("nan")],
            "latency_us_p20": [940.04, float("nan")],
            "latency_us_p80": [1001.96, float("nan")],
            "rel_err": [0.0043871, float("nan")],
            "reason": ["", "backend.max_tokens_per_rank=2 caps the buffers"],
        }
    )
    assert rows_table(df).splitlines() == [
        "tokens  status   median µs  p20 µs  p80 µs  rel err",
        "     4  skipped          -       -       -        -",
        "    64  ok           946.6   940.0  1002.0  4.4e-03",
        "reasons:",
        "  T=4: backend.max_tokens_per_rank=2 caps the buffers",
    ]
