"""'Did you mean' at the top level and for a choice: `moebench --verison` said only "the following
arguments are required: cmd" (never naming the option), `moebench --verison sweep` blamed sweep's own
options, and a mistyped command (`moebench sweeep`) or choice (`--redo faild`) got no suggestion
(moebench/util/arg_errors.py OneLineErrors, moebench/cli/parser.py)."""

from __future__ import annotations

import pytest

from moebench import cli
from moebench.util.arg_errors import OneLineErrors


def _refused(argv, capsys) -> str:
    with pytest.raises(SystemExit) as done:
        cli.main(argv)
    assert done.value.code == 2, argv
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "usage:" not in err and "Traceback" not in err, err
    return err


@pytest.mark.parametrize(
    "argv",
    [["--verison"], ["--verison", "sweep", "model=tiny"], ["--verison=1"], ["--verison", "--help"]],
)
def test_an_unknown_option_before_the_command_is_the_top_levels(argv, capsys):
    err = _refused(argv, capsys)
    assert err.startswith(f"moebench: error: unrecognized arguments: {argv[0]}; did you mean --version?"), err
    assert err.endswith("(see moebench --help)\n") and "required" not in err, err


def test_an_option_before_the_command_near_none_is_named_without_a_suggestion(capsys):
    err = _refused(["--zzzz", "list"], capsys)
    assert err == "moebench: error: unrecognized arguments: --zzzz (see moebench --help)\n", err


def test_the_top_levels_own_options_and_their_abbreviations_still_work(capsys):
    for argv in (["--version"], ["--vers"]):
        with pytest.raises(SystemExit) as done:
            cli.main(argv)
        assert done.value.code == 0 and capsys.readouterr().out.startswith("moebench ")


@pytest.mark.parametrize(
    "argv, prog, near",
    [
        (["sweeep"], "moebench", "sweep"),
        (["comapre", "a", "b"], "moebench", "compare"),
        (["tracee", "x"], "moebench", "trace"),
        (["sweep", "--redo", "faild"], "moebench sweep", "failed"),
        (["report", "r", "--format", "jsn"], "moebench report", "json"),
    ],
)
def test_a_mistyped_command_or_choice_is_followed_by_the_nearest(argv, prog, near, capsys):
    err = _refused(argv, capsys)
    assert err.startswith(f"{prog}: error: argument "), err
    assert f"invalid choice: '{argv[-1] if prog != 'moebench' else argv[0]}'" in err, err
    assert err.endswith(f"; did you mean {near}? (see {prog} --help)\n"), err


def test_a_choice_near_none_gets_no_suggestion(capsys):
    err = _refused(["nope"], capsys)
    assert "did you mean" not in err and err.endswith("'env') (see moebench --help)\n"), err


def test_a_scripts_choices_are_suggested_however_its_values_are_quoted(capsys):
    p = OneLineErrors(prog="x")
    p.add_argument("--mode", choices=["it's", 'say "hi"', "plain"])
    p.add_argument("--n", type=int, choices=[1, 2])
    for given, near in (("its", "it's"), ('say "ho"', 'say "hi"'), ("plian", "plain")):
        with pytest.raises(SystemExit):
            p.parse_args(["--mode", given])
        assert capsys.readouterr().err.endswith(f"; did you mean {near}? (see x --help)\n")
    with pytest.raises(SystemExit):
        p.parse_args(["--n", "3"])  # a number's choices: none is near another by its spelling
    assert "did you mean" not in capsys.readouterr().err
