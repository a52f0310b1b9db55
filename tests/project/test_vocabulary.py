"""Statuses and verdicts are enum members (`moebench/results/row.py`'s `Status` and `Verdict`),
written as strings only where they enter or leave Parquet, JSON or Markdown, and that happens in
`moebench/results/` (issue #47): no string literal equal to a status or a verdict appears in
moebench/ outside it, but for the exceptions below, each with its reason.

A literal counts when it equals a value exactly (a log line that holds the word does not);
docstrings do not count."""

from __future__ import annotations

import ast
from pathlib import Path

from moebench.results.row import Status, Verdict

ROOT = Path(__file__).resolve().parents[2]
SCOPE = ("moebench",)
OWNER = "moebench/results"  # the one place the words are written

# Two verdicts are words of other vocabularies too: a row's timing mode (`host`), a device and a
# timing mode (`cpu`), and report/flags.py's figure basis (both), which the verdicts `host` and `cpu`
# are named after. Outside the modules that give or read verdicts they are those words, not verdicts.
SHARED_WORDS = {Verdict.HOST.value, Verdict.CPU.value}
VERDICT_MODULES = {
    "moebench/report/compare.py",
    "moebench/report/compare_tables.py",
    "moebench/report/verdict.py",
    "moebench/report/plots_compare.py",
    "moebench/report/axis.py",
}

# (file, value, where: the enclosing function or class by its qualified name, or "<module>") -> why it
# stays a string
EXCEPTIONS = {
    (
        "moebench/cli/sweep.py",
        "failed",
        "register",
    ): "`--redo failed`: a word of the command line (none | failed | all), checked by results/store.py",
    (
        "moebench/run/dist_worker.py",
        "failed",
        "_parser",
    ): "`--redo failed` of the torchrun entry, as the CLI's (its parser imports nothing of moebench)",
    (
        "moebench/config/plugins.py",
        "skipped",
        "combo_record",
    ): "`moebench list --json`'s `valid | skipped`: config stands below results and may not import it",
    (
        "moebench/report/compare.py",
        "~",
        "memory_verdict",
    ): "the workspace's verdict, its own vocabulary (larger | smaller | ~), no latency verdict",
    ("moebench/report/compare.py", "host", "<module>"): "the `host` column group of results/row.py",
    ("moebench/report/plots_compare.py", "cpu", "on_cpu"): "a row's `device` (cpu | cuda), no verdict",
    ("moebench/report/effects.py", "faster", "<module>"): "an effect's direction (faster | slower | no "
    "difference | inconclusive), effects.py's own vocabulary, no verdict of a compared pair",
    ("moebench/report/effects.py", "slower", "<module>"): "an effect's direction, as `faster`",
    ("moebench/tune/regression.py", "ok", "Check.table"): "the tune check's cell (REGRESSED | ok), no row status",
    ("moebench/kernels/triton/launch.py", "ok", "_Plan"): "an attribute's name in __slots__",
    ("moebench/kernels/triton/launch.py", "ok", "_Site"): "an attribute's name in __slots__",
}

VALUES = {s.value for s in Status} | {v.value for v in Verdict}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if (
            isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
            and body
            and isinstance(body[0], ast.Expr)
            and isinstance(body[0].value, ast.Constant)
        ):
            out.add(id(body[0].value))
    return out


def literals(path: Path, rel: str) -> list[tuple[str, str, str, int]]:
    """(file, value, where, line) of each string constant equal to a status or a verdict."""
    tree = ast.parse(path.read_text(), filename=rel)
    docs = _docstrings(tree)
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                visit(child, child.name if where == "<module>" else f"{where}.{child.name}")
                continue
            if (
                isinstance(child, ast.Constant)
                and isinstance(child.value, str)
                and child.value in VALUES
                and id(child) not in docs
                and (child.value not in SHARED_WORDS or rel in VERDICT_MODULES)
            ):
                found.append((rel, child.value, where, child.lineno))
            visit(child, where)

    visit(tree, "<module>")
    return found


def scan(root: Path = ROOT) -> list[tuple[str, str, str, int]]:
    out = []
    for top in SCOPE:
        for path in sorted((root / top).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            if not rel.startswith(OWNER + "/"):
                out += literals(path, rel)
    return out


def test_statuses_and_verdicts_are_members():
    found = scan()
    bad = [f"{f}:{line}: {v!r} in {where}" for f, v, where, line in found if (f, v, where) not in EXCEPTIONS]
    assert not bad, (
        "a status or verdict written as a string; use moebench.results.row's Status / Verdict member "
        "(or list it in EXCEPTIONS with why):\n" + "\n".join(bad)
    )


def test_exceptions_are_still_needed():
    """An exception whose literal is gone is dropped, so the list stays short and honest."""
    seen = {(f, v, where) for f, v, where, _ in scan()}
    assert not set(EXCEPTIONS) - seen, sorted(set(EXCEPTIONS) - seen)


def test_a_literal_is_caught(tmp_path):
    """The walk finds a status in a comparison, a verdict in a dict key, nested in a function and
    in an f-string's expression, and passes a docstring and a longer text."""
    pkg = tmp_path / "moebench" / "report"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        '"""ok"""\n'
        "def f(df, n):\n"
        '    """failed"""\n'
        '    log = "the sweep failed"\n'
        '    return df[df["status"] == "ok"], {"slower": 1}, f"{n[\'oom\']}"\n'
    )
    (tmp_path / "moebench" / "results").mkdir()
    (tmp_path / "moebench" / "results" / "y.py").write_text('S = "ok"\n')
    found = scan(tmp_path)
    assert [(v, where, line) for _, v, where, line in found] == [("ok", "f", 5), ("slower", "f", 5), ("oom", "f", 5)]


def test_skipped_is_two_members():
    assert Status.SKIPPED is not Verdict.SKIPPED
    assert Status.SKIPPED.value == Verdict.SKIPPED.value == "skipped"


def test_members_print_as_their_value():
    """Markdown, CSV and JSON get the old words: str(), format() and f-strings give the value."""
    import json

    for m in [*Status, *Verdict]:
        assert str(m) == f"{m}" == format(m) == "{}".format(m) == m.value
        assert f"{m:>12}" == f"{m.value:>12}"
        assert json.dumps({m: m}) == json.dumps({m.value: m.value})


# -- column names: the report asks the declarations ------------------------------------------
# A column is declared once (moebench/results/row.py's MEASURED, the spec's fields in
# moebench/config/spec.py), with its roles; the report derives its lists from them
# (moebench/report/columns.py). No list, tuple or set literal of three or more string constants,
# all of them declared column names, appears in moebench/report/ but for these, each with why.
REPORT = "moebench/report"
# (file, where: the module-level name assigned or the enclosing function) -> why it stays a literal
COLUMN_LIST_EXCEPTIONS = {
    ("moebench/report/plotgrid.py", "SPLIT_ORDER"): "the order in which a figure splits its rows into panels when "
    "it has too many series: a preference of the plots, not a set of columns sharing a role",
    ("moebench/report/flags.py", "PACED"): "(count column, its denominator column, the family's name): the "
    "name shown to people, `trace`, happens to equal the trace field's",
    ("moebench/report/effects.py", "INTERACTION_ORDER"): "the order in which an effect whose pairs disagree "
    "is split by another axis: a preference of effects.py, not a set of columns sharing a role",
}


def column_names() -> set[str]:
    from moebench.config.spec import knob_meta
    from moebench.results import row

    return {c.name for c in row.columns()} | set(knob_meta())


def column_lists(path: Path, rel: str, names: set[str]) -> list[tuple[str, str, int, list[str]]]:
    """(file, where, line, the names) of each literal of three or more string constants that
    are all column names (other elements, a starred query, do not count)."""
    tree = ast.parse(path.read_text(), filename=rel)
    found = []

    def visit(node: ast.AST, where: str) -> None:
        for child in ast.iter_child_nodes(node):
            here = where
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                here = child.name if where == "<module>" else f"{where}.{child.name}"
            elif where == "<module>" and isinstance(child, (ast.Assign, ast.AnnAssign)):
                target = child.targets[0] if isinstance(child, ast.Assign) else child.target
                here = target.id if isinstance(target, ast.Name) else where
            if isinstance(child, (ast.List, ast.Tuple, ast.Set)):
                strings = [e.value for e in child.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
                if len(strings) >= 3 and all(s in names for s in strings):
                    found.append((rel, here, child.lineno, strings))
            visit(child, here)

    visit(tree, "<module>")
    return found


def scan_column_lists(root: Path = ROOT) -> list[tuple[str, str, int, list[str]]]:
    names = column_names()
    out = []
    for path in sorted((root / REPORT).rglob("*.py")):
        out += column_lists(path, path.relative_to(root).as_posix(), names)
    return out


def test_the_report_types_no_column_list():
    bad = [
        f"{f}:{line}: {names} in {where}"
        for f, where, line, names in scan_column_lists()
        if (f, where) not in COLUMN_LIST_EXCEPTIONS
    ]
    assert not bad, (
        "a list of column names typed in the report; ask the declarations (moebench/report/columns.py, "
        "moebench.results.row.having(role)), give the columns a role there, or list it in "
        "COLUMN_LIST_EXCEPTIONS with why:\n" + "\n".join(bad)
    )


def test_column_list_exceptions_are_still_needed():
    seen = {(f, where) for f, where, _, _ in scan_column_lists()}
    assert not set(COLUMN_LIST_EXCEPTIONS) - seen, sorted(set(COLUMN_LIST_EXCEPTIONS) - seen)


def test_a_column_list_is_caught(tmp_path):
    """The walk finds a list, a tuple and a set of column names, beside a starred query and in a
    function, and passes two names, a list with a word that is no column, and other folders."""
    pkg = tmp_path / "moebench" / "report"
    pkg.mkdir(parents=True)
    (pkg / "x.py").write_text(
        'MEM = ["workspace_bytes_peak", "device_bytes_peak", "workspace_bytes_analytic"]\n'
        'TWO = ("status", "reason")\n'
        'WORDS = ["status", "reason", "not a column"]\n'
        "def f(df, q):\n"
        '    return df[[*q, "backend", "experts", "model"]], {"quant", "seed", "fill"}\n'
    )
    (tmp_path / "moebench" / "results").mkdir()
    (tmp_path / "moebench" / "results" / "y.py").write_text('X = ["status", "reason", "rel_err"]\n')
    found = [(where, line, names) for _, where, line, names in scan_column_lists(tmp_path)]
    assert found == [
        ("MEM", 1, ["workspace_bytes_peak", "device_bytes_peak", "workspace_bytes_analytic"]),
        ("f", 5, ["backend", "experts", "model"]),
        ("f", 5, ["quant", "seed", "fill"]),
    ]
