"""scripts/lint_baseline.py, the lint gate of .ci/run: a new violation fails, a shrink passes,
`--update` refuses a count that grew, a `# noqa` without its reason is reported (and none in
moebench/ or kernels/ lacks one). The comparison runs on made-up findings; ruff and mypy run
for real on a tiny repository where they are installed (.ci/run installs them: the lint extra)."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("lint_baseline", ROOT / "scripts" / "lint_baseline.py")
lb = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(lb)


def V(file: str, rule: str, line: int = 1) -> "lb.Violation":
    return lb.Violation(file, line, 1, rule, f"what {rule} says")


def test_a_new_or_grown_count_fails_a_shrink_passes():
    base = {"moebench/a.py": {"ruff:E501": 2, "mypy:arg-type": 1}}
    same = [V("moebench/a.py", "ruff:E501", 1), V("moebench/a.py", "ruff:E501", 2), V("moebench/a.py", "mypy:arg-type")]
    assert lb.grown(base, same) == []
    assert lb.grown(base, same + [V("moebench/a.py", "ruff:E501", 3)]) == [("moebench/a.py", "ruff:E501", 2, 3)]
    assert lb.grown(base, same + [V("kernels/b.py", "ruff:F401")]) == [("kernels/b.py", "ruff:F401", 0, 1)]
    # the same count of another rule in the file is still new
    assert lb.grown(base, same[1:] + [V("moebench/a.py", "ruff:B905")]) == [("moebench/a.py", "ruff:B905", 0, 1)]
    assert lb.grown(base, same[:1]) == [] and lb.shrunk(base, same[:1]) == 2
    # a suppression without its reason fails whatever a baseline says
    noqa = [V("moebench/a.py", lb.NOQA_REASON)]
    assert lb.grown({"moebench/a.py": {lb.NOQA_REASON: 3}}, noqa) == [("moebench/a.py", lb.NOQA_REASON, 0, 1)]
    assert lb.count(same + noqa) == {"moebench/a.py": {"mypy:arg-type": 1, "ruff:E501": 2}}


@pytest.fixture
def fake_tools(tmp_path, monkeypatch):
    """A repository whose ruff and mypy findings the test sets (the noqa scan reads its files)."""
    found: dict[str, list] = {"ruff": [], "mypy": []}
    monkeypatch.setattr(lb, "ruff_violations", lambda root: list(found["ruff"]))
    monkeypatch.setattr(lb, "mypy_violations", lambda root: list(found["mypy"]))
    (tmp_path / "moebench").mkdir()
    (tmp_path / "moebench" / "__init__.py").write_text("")
    return tmp_path, found


def test_main_fails_on_growth_and_update_refuses_it(fake_tools, capsys):
    root, found = fake_tools
    base = root / ".ci" / "lint-baseline.json"
    run = lambda *a: lb.main(["--root", str(root), *a])
    assert run() == 2 and "no baseline" in capsys.readouterr().err

    found["ruff"] = [V("moebench/a.py", "ruff:E501", 4)]
    assert run("--update") == 1 and not base.exists()  # from nothing, every count grows
    assert run("--update", "--allow-growth") == 0
    assert json.loads(base.read_text())["counts"] == {"moebench/a.py": {"ruff:E501": 1}}
    assert run() == 0
    capsys.readouterr()

    found["mypy"] = [V("moebench/a.py", "mypy:arg-type", 7)]
    written = base.read_text()
    assert run() == 1
    err = capsys.readouterr().err
    assert "moebench/a.py mypy:arg-type: 0 -> 1" in err and "moebench/a.py:7:1: what mypy:arg-type says" in err
    assert "ruff:E501" not in err  # not above its baseline
    assert run("--update") == 1 and base.read_text() == written
    assert "not updated" in capsys.readouterr().err

    found["ruff"], found["mypy"] = [], []
    assert run() == 0 and "1 count(s) fell below the baseline" in capsys.readouterr().out
    assert run("--update") == 0 and json.loads(base.read_text())["counts"] == {}
    # with the count down, the old violation back is new
    found["ruff"] = [V("moebench/a.py", "ruff:E501", 4)]
    assert run() == 1


def test_update_refuses_a_noqa_without_reason_even_with_allow_growth(fake_tools, capsys):
    root, _ = fake_tools
    (root / "moebench" / "m.py").write_text("import os  # noqa: F401\n")
    assert lb.main(["--root", str(root), "--update", "--allow-growth"]) == 1
    assert "moebench/m.py:1:12: a `# noqa` without a reason" in capsys.readouterr().err
    assert not (root / ".ci" / "lint-baseline.json").exists()


def test_a_noqa_or_type_ignore_without_reason_is_reported(tmp_path):
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "m.py").write_text(
        "import os  # noqa: F401\n"                                   # 1: codes, no reason
        "import sys  # noqa\n"                                        # 2: blanket
        "import re  # noqa: F401 (re-exported for callers)\n"
        "import json  # noqa: E402,F401 - kept for callers\n"
        "x = '# noqa: F401'  # a string is no comment\n"
        "y: int = ''  # type: ignore[assignment]\n"                   # 6: code, no reason
        "z: int = ''  # type: ignore[assignment]  # a stub's mistake\n"
        "w = 1  # ruff: noqa: E501\n"                                 # 8
    )
    found = lb.noqa_violations(tmp_path)
    assert [(v.file, v.line, v.rule) for v in found] == [("kernels/m.py", n, lb.NOQA_REASON) for n in (1, 2, 6, 8)]
    assert "names no codes" in found[1].message


def test_every_noqa_here_gives_its_reason():
    assert [f"{v.file}:{v.line}: {v.message}" for v in lb.noqa_violations(ROOT)] == []


def test_paths_in_the_tree_of_links_map_back(tmp_path):
    tree = f"{lb.TREE.as_posix()}/moebench"
    assert lb._from_tree(tmp_path, f"{tree}/kernels/experts/triton.py") == "kernels/experts/triton.py"
    assert lb._from_tree(tmp_path, f"{tree}/report/compare.py") == "moebench/report/compare.py"
    assert lb._from_tree(tmp_path, f"{tree}/__init__.py") == "moebench/__init__.py"


def _tiny_repo(tmp_path: Path) -> Path:
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")  # the real settings
    for d in ("moebench", "kernels"):
        (tmp_path / d).mkdir()
        (tmp_path / d / "__init__.py").write_text('"""A package."""\n')
    (tmp_path / "kernels" / "k.py").write_text('def width() -> int:\n    """Bytes."""\n    return 4\n')
    (tmp_path / ".ci").mkdir()
    (tmp_path / ".ci" / "lint-baseline.json").write_text(json.dumps({"counts": {}}))
    return tmp_path


@pytest.mark.skipif(importlib.util.find_spec("ruff") is None, reason="ruff not installed (pip install -e '.[lint]')")
def test_ruff_finds_a_new_violation(tmp_path, capsys):
    root = _tiny_repo(tmp_path)
    run = lambda: lb.main(["--root", str(root), "--tools", "ruff,noqa"])
    assert run() == 0
    (root / "moebench" / "a.py").write_text('"""A module."""\nimport os\n')
    assert run() == 1
    assert "moebench/a.py ruff:F401: 0 -> 1" in capsys.readouterr().err


@pytest.mark.skipif(importlib.util.find_spec("mypy") is None, reason="mypy not installed (pip install -e '.[lint]')")
def test_mypy_sees_kernels_as_moebench_kernels(tmp_path, capsys):
    root = _tiny_repo(tmp_path)
    # only a checker that resolves moebench.kernels to kernels/ knows width() returns an int
    (root / "moebench" / "a.py").write_text('"""A module."""\nfrom moebench.kernels.k import width\n\n'
                                            'NAME: str = width()\n')
    (root / "kernels" / "b.py").write_text('"""A module."""\nCOUNT: int = "one"\n')
    assert lb.main(["--root", str(root), "--tools", "mypy"]) == 1
    err = capsys.readouterr().err
    assert "moebench/a.py mypy:assignment: 0 -> 1" in err and "kernels/b.py mypy:assignment: 0 -> 1" in err
