"""The house's rules (docs/design.md, "The map"), checked on the code's own imports: which room
may import which, no import cycle (imports inside functions and under TYPE_CHECKING count: an
import moved into a function to break a cycle is still a cycle), kernels import nothing of the
harness, no module over 300 statements, no private name imported from another module."""

from __future__ import annotations

import ast
import io
import tokenize
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# statements (logical lines), not physical lines: ruff's formatter lays a call out over as many
# lines as it has arguments, so a line count would measure the layout. 300 statements is about
# the 400 dense lines this rule allowed before the formatter (the largest module had 291)
MAX_STATEMENTS = 300

# A -> the rooms A may import (besides itself). A room is moebench's first subpackage, or the
# top-level package itself ("moebench": __init__ and the entry-point shims dist_worker.py, __main__.py).
RULES = {
    "kernels": set(),
    "util": set(),
    "routing": {"util"},
    "config": {"kernels", "routing", "util"},
    "traces": {"kernels", "util"},
    "results": {"config", "traces", "util"},
    "measure": {"kernels", "config", "routing", "traces", "util"},
    "run": {"measure", "results", "config", "routing", "traces", "kernels", "util"},
    "report": {"results", "config", "traces", "util"},
    "tune": {"run", "measure", "results", "config", "routing", "traces", "kernels", "report", "util"},
    "cli": {"run", "measure", "results", "config", "routing", "traces", "kernels", "report", "tune", "util"},
    "moebench": {"run", "cli"},  # the shims `python -m moebench.dist_worker` and `python -m moebench`
}


def modules() -> dict[str, Path]:
    out = {}
    for base, pkg in ((ROOT / "moebench", "moebench"),):
        for p in base.rglob("*.py"):
            rel = p.relative_to(base).with_suffix("").parts
            name = ".".join((pkg, *rel))
            out[name.removesuffix(".__init__")] = p
    return out


MODULES = modules()


def room(mod: str) -> str:
    parts = mod.split(".")
    if len(parts) == 1 or (
        len(parts) == 2
        and f"{parts[0]}.{parts[1]}" in MODULES
        and MODULES[f"{parts[0]}.{parts[1]}"].name != "__init__.py"
    ):
        return "moebench"
    return parts[1]


def _resolve(mod: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = mod.split(".") if MODULES[mod].name == "__init__.py" else mod.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports(mod: str) -> list[tuple[str, int, list[str]]]:
    """(imported moebench module, line, names) of every import in `mod`, wherever it stands."""
    tree = ast.parse(MODULES[mod].read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(a.name, node.lineno, []) for a in node.names if a.name.split(".")[0] == "moebench"]
        elif isinstance(node, ast.ImportFrom):
            target = _resolve(mod, node)
            if target.split(".")[0] != "moebench":
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((sub, node.lineno, []) if sub in MODULES else (target, node.lineno, [a.name]))
    return [(t if t in MODULES else _owner(t), line, names) for t, line, names in out]


def _owner(name: str) -> str:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def graph() -> dict[str, set[str]]:
    g = defaultdict(set)
    for mod in MODULES:
        for target, _, _ in imports(mod):
            if target and target != mod:
                g[mod].add(target)
    return g


def test_rooms_import_only_what_the_rules_allow():
    bad = []
    for mod in MODULES:
        a = room(mod)
        for target, line, _ in imports(mod):
            b = room(target)
            if target and b != a and b not in RULES[a] and not (target == "moebench"):
                bad.append(f"{MODULES[mod].relative_to(ROOT)}:{line} {a} -> {b} ({target})")
    assert not bad, "imports against docs/design.md's rules:\n" + "\n".join(sorted(bad))


def test_kernels_import_nothing_of_the_harness():
    bad = [
        f"{MODULES[m].relative_to(ROOT)}: {t}"
        for m in MODULES
        if room(m) == "kernels"
        for t, _, _ in imports(m)
        if room(t) != "kernels"
    ]
    assert not bad, bad


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), and self-loops."""
    index, low, stack, on, out, n = {}, {}, [], set(), [], [0]

    def visit(v):
        index[v] = low[v] = n[0]
        n[0] += 1
        stack.append(v)
        on.add(v)
        for w in g.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    import sys

    sys.setrecursionlimit(10_000)
    for v in sorted(set(g) | {w for ws in g.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def test_no_import_cycle():
    found = cycles(graph())
    assert not found, "import cycles (imports inside functions count):\n" + "\n".join(" ⇄ ".join(c) for c in found)


def test_the_cycle_check_can_fail():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def statements(text: str) -> int:
    """The logical lines of a module's source (tokenize's NEWLINE tokens)."""
    return sum(1 for tok in tokenize.generate_tokens(io.StringIO(text).readline) if tok.type == tokenize.NEWLINE)


def test_no_module_over_the_limit():
    long = {str(p.relative_to(ROOT)): n for p in MODULES.values() if (n := statements(p.read_text())) > MAX_STATEMENTS}
    assert not long, f"modules over {MAX_STATEMENTS} statements: {long}"


def test_statements_count_logical_lines_not_the_layout():
    assert statements("x = f(\n    1,\n    2,\n)\ny = 3  # a comment\n\n# another\n") == 2


def test_no_private_name_is_imported_from_another_module():
    bad = [
        f"{MODULES[m].relative_to(ROOT)}:{line} {t}.{n}"
        for m in MODULES
        for t, line, names in imports(m)
        for n in names
        if n.startswith("_") and not n.startswith("__") and t != m
    ]
    assert not bad, "private names imported across modules:\n" + "\n".join(bad)


@pytest.mark.parametrize("mod", ["moebench.cli", "moebench.dist_worker", "moebench.report.results_index"])
def test_documented_entry_points_exist(mod):
    assert mod in MODULES


def test_reports_and_the_store_read_results_without_torch():
    """`moebench report` / `compare` on a laptop without a GPU stack: the report, the store
    and the row schema import no torch (report/flags.py used to import timing and so torch)."""
    import subprocess
    import sys

    code = (
        "import sys, moebench.report.document, moebench.report.compare, moebench.report.flags, "
        "moebench.results.store, moebench.results.row; print('torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip() == "False"
