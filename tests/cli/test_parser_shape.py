"""Each command owns its arguments (issue #47; asv's one module per command): its module declares
them beside its body (`register(sub)`), parser.py only assembles the modules, and what several
commands share lives in options.py. Checked on parser.py's syntax and on what each module registers;
the modules stay light at import, since the parser reads every one of them on every command."""

from __future__ import annotations

import argparse
import ast
import subprocess
import sys
from pathlib import Path

import pytest

from moebench import cli
from moebench.cli import options, parser
from moebench.cli.main import COMMANDS

ROOT = Path(__file__).resolve().parents[2]
PARSER = ROOT / "moebench" / "cli" / "parser.py"


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    return [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == name
    ]


def test_parser_declares_only_the_top_level():
    """No command's argument in parser.py: only the top level's --version, and no subparser added there."""
    tree = ast.parse(PARSER.read_text())
    declared = [ast.literal_eval(c.args[0]) for c in _calls(tree, "add_argument")]
    assert declared == ["--version"], f"parser.py declares {declared}: a command's arguments go in its module"
    assert not _calls(tree, "add_parser") and not _calls(tree, "add_argument_group"), (
        "parser.py adds a command's parser itself: its module's register(sub) does"
    )
    assert len(_calls(tree, "add_subparsers")) == 1


def _registered(module) -> dict[str, argparse.ArgumentParser]:
    sub = argparse.ArgumentParser(prog="moebench").add_subparsers(dest="cmd")
    module.register(sub)
    return dict(sub.choices)


def test_each_command_module_registers_the_commands_it_runs():
    """A module registers exactly the commands main.py's COMMANDS runs from it, with arguments of their own."""
    for module in parser.COMMAND_MODULES:
        name = module.__name__.rpartition(".")[2]
        runs = {cmd for cmd, (mod, _) in COMMANDS.items() if mod == name}
        got = _registered(module)
        assert set(got) == runs, f"{module.__name__} registers {sorted(got)} but runs {sorted(runs)}"
        for cmd, p in got.items():
            own = [a for a in p._actions if a.dest != "help"]
            assert own, f"`moebench {cmd}` declares no argument in {module.__name__}"


def test_the_assembled_parser_holds_every_command_once_in_order():
    _, commands = parser.build_parser()
    assert sorted(commands) == sorted(COMMANDS)
    by_module = [cmd for module in parser.COMMAND_MODULES for cmd in _registered(module)]
    assert list(commands) == by_module == ["sweep", "run", "list", "report", "compare", "ab", "trace", "tune", "env"]


def test_shared_options_are_declared_once():
    """report, compare and ab take the comparison's options from options.py, the same flags each."""
    _, commands = parser.build_parser()
    shared = argparse.ArgumentParser()
    options.compare_options(shared)
    flags = {s for a in shared._actions for s in a.option_strings} - {"-h", "--help"}
    for cmd in ("report", "compare", "ab"):
        assert flags <= set(commands[cmd]._option_string_actions), cmd
    # the two arguments main.py reads by name
    for cmd, p in commands.items():
        dests = {a.dest for a in p._actions}
        assert ("out" in dests) == (cmd not in ("list", "env")), cmd
        assert ("overrides" in dests) == (cmd in ("sweep", "run", "list", "ab", "tune")), cmd


def test_the_parser_imports_no_heavy_library():
    """Every command imports every command's module for its arguments: none imports pandas or torch
    at module level (report.py's bodies import moebench.report inside)."""
    code = (
        "import sys; import moebench.cli.parser as p; p.build_parser(); "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'triton', 'numpy', 'pandas', "
        "'pyarrow')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "[]"


def test_bare_moebench_prints_its_help_and_exits_2(capsys):
    """`moebench` alone: the help (what it does, its commands) on stderr, exit 2; was argparse's
    'the following arguments are required: cmd'."""
    with pytest.raises(SystemExit) as done:
        cli.main([])
    err = capsys.readouterr().err
    assert done.value.code == 2 and err.startswith("usage: moebench") and "Benchmark modular MoE layer kernels." in err
    assert "arguments are required" not in err
