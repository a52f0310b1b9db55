"""What `--numprocesses=auto` (pyproject.toml's addopts) means here (tests/support/_parallel.py): two
pytest-xdist workers for the CPU tiers on 2 cores or more, none for the GPU tests, the slow tier,
`--require`, a single file, one core; without pytest-xdist the options are ignored and said so."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from _parallel import auto_workers, file_order, selects

pytest_plugins = ["pytester"]

DEFAULT = "not gpu and not slow"  # pyproject.toml's addopts


def test_the_readme_command_takes_two_workers_a_file_on_each():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    addopts = pyproject["tool"]["pytest"]["ini_options"]["addopts"]
    assert f"-m '{DEFAULT}'" in addopts and "--numprocesses=auto" in addopts and "--dist=loadfile" in addopts
    assert "--no-loadscope-reorder" in addopts  # the files in file_order's order
    assert auto_workers(DEFAULT, "", ["tests"], cpus=2) == 2
    assert auto_workers(DEFAULT, "", ["tests"], cpus=16) == 2
    assert any(d.startswith("pytest-xdist") for d in pyproject["project"]["optional-dependencies"]["test"])


@pytest.mark.parametrize(
    "markexpr, workers",
    [
        (DEFAULT, 2),
        ("not multiprocess", 2),  # the quick tier
        ("multiprocess", 2),
        ("not slow", 2),
        ("slow", 0),
        ("slow and multiprocess", 0),
        ("gpu", 0),
        ("gpu or slow", 0),
    ],
)
def test_gpu_tests_and_the_slow_tier_run_in_one_process(markexpr, workers):
    assert auto_workers(markexpr, "", ["tests"], cpus=2) == workers


def test_require_one_file_and_one_core_take_no_worker():
    assert auto_workers(DEFAULT, "deep_gemm", ["tests"], cpus=2) == 0
    assert auto_workers(DEFAULT, "", ["tests/run/test_plan.py"], cpus=2) == 0
    assert auto_workers(DEFAULT, "", ["tests/run/test_plan.py::test_x"], cpus=2) == 0
    assert auto_workers(DEFAULT, "", ["tests/run/test_plan.py", "tests/run/test_kill9.py"], cpus=2) == 2
    assert auto_workers(DEFAULT, "", ["tests/run"], cpus=2) == 2
    assert auto_workers(DEFAULT, "", ["tests"], cpus=1) == 0


def test_selects_mirrors_the_tiers_rule():
    assert not selects(DEFAULT, "gpu") and not selects(DEFAULT, "slow")
    assert not selects("not multiprocess", "slow")  # tests/support/_tiers.py deselects what -m does not name
    assert selects("slow or multiprocess", "slow") and not selects("slow or multiprocess", "gpu")


def test_files_with_the_most_end_to_end_tests_go_first_then_the_most_tests():
    tests = [
        ("a.py::u1", False),
        ("a.py::u2", False),
        ("a.py::u3", False),
        ("b.py::e1", True),
        ("c.py::u1", False),
        ("c.py::e1", True),
        ("c.py::e2", True),
        ("d.py::u1", False),
        ("d.py::u2", False),
        ("d.py::u3", False),
        ("d.py::u4", False),
        ("e.py::e1[x]", True),
        ("e.py::e1[y]", True),
    ]
    # xdist's own order (most tests first) would take b.py, a file of one long test, last
    assert file_order(tests) == ["c.py", "e.py", "b.py", "d.py", "a.py"]


def test_without_xdist_the_options_are_ignored_and_the_header_says_so(pytester):
    pytester.makepyfile(test_one="def test_one():\n    pass\n")
    res = pytester.runpytest_inprocess(
        "-p",
        "no:xdist",
        "-p",
        "_parallel",
        "-p",
        "no:cacheprovider",
        "--numprocesses=auto",
        "--dist=loadfile",
        "--no-loadscope-reorder",
    )
    res.assert_outcomes(passed=1)
    assert any("pytest-xdist is not installed: the tests run in one process" in s for s in res.outlines), res.outlines
