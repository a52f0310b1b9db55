"""The progress line per test file (tests/support/_progress.py) on tiny test files run by pytest's own
`pytester`: one line per file as its last test finishes, in order, with its outcomes; pytest's
summary still comes last; `-x` gets the stopped file's line; deselected files are not counted."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

LINE = re.compile(r"^\[ ?(\d+)/(\d+) +(\d+m\d\ds|\d+s)\] (\S+)  (.+)  (\d+m\d\ds|\d+s)( +stopped)?$")


@pytest.fixture
def run(pytester):
    pytester.makepyfile(
        test_a="""
            def test_one():
                pass

            def test_two():
                pass
        """,
        test_b="""
            import pytest

            @pytest.fixture(scope="module")
            def broken_teardown():
                yield
                raise RuntimeError("teardown")

            def test_ok(broken_teardown):
                pass

            def test_fails():
                assert False

            def test_skips():
                pytest.skip("no reason")
        """,
        test_c="""
            def test_last():
                pass
        """,
    )

    def _run(*args):
        res = pytester.runpytest_inprocess("-p", "_progress", "-p", "no:cacheprovider", *args)
        lines = [m.groups() for m in map(LINE.match, res.outlines) if m]
        return res, lines

    return _run


def test_a_line_per_file_in_order_with_its_outcomes_and_the_summary_after(run):
    res, lines = run("-q")
    assert [(done, total, f, what, stopped) for done, total, _, f, what, _, stopped in lines] == [
        ("1", "3", "test_a.py", "2 passed", None),
        # the module fixture's teardown ran within the file: its error is the file's
        ("2", "3", "test_b.py", "1 failed, 1 error, 1 passed, 1 skipped", None),
        ("3", "3", "test_c.py", "1 passed", None),
    ], res.outlines
    res.assert_outcomes(passed=4, failed=1, skipped=1, errors=1)
    last = [i for i, s in enumerate(res.outlines) if LINE.match(s)][-1]
    assert any("1 failed, 4 passed, 1 skipped, 1 error" in s for s in res.outlines[last + 1 :]), res.outlines


def test_x_stops_with_the_line_of_the_file_in_flight(run):
    res, lines = run("-q", "-x")
    assert [(f, what, stopped) for *_, f, what, _, stopped in lines] == [
        ("test_a.py", "2 passed", None),
        ("test_b.py", "1 failed, 1 error, 1 passed", "  stopped"),
    ], res.outlines
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    assert any("stopping after 2 failures" in s for s in res.outlines), res.outlines


def test_deselected_files_are_not_counted_and_verbose_runs_get_the_lines_too(run):
    res, lines = run("-v", "-k", "one or last")
    assert [(done, total, f, what) for done, total, _, f, what, _, _ in lines] == [
        ("1", "2", "test_a.py", "1 passed"),
        ("2", "2", "test_c.py", "1 passed"),
    ], res.outlines
    res.assert_outcomes(passed=2, deselected=4)


def test_qq_and_no_progress_print_no_line(run):
    for args in (("-qq",), ("-q", "-p", "no:_progress")):
        res, lines = run(*args)
        assert lines == [] and res.ret == pytest.ExitCode.TESTS_FAILED, (args, res.outlines)


@pytest.mark.multiprocess
def test_under_xdist_each_file_gets_its_line_once_all_its_tests_ran_on_the_workers(run, pytester):
    # the controller has no items of its own: it counts what the workers collected, and a file
    # is done when all its tests are, in whichever order the two workers ran them
    pytest.importorskip("xdist")
    # as in this repository: a conftest loads the plugin (a worker restores the sys.path the
    # controller had before any conftest, so `-p _progress` would not import there)
    pytester.makeconftest(f"""
        import sys
        sys.path.insert(0, {str(Path(__file__).parents[1] / "support")!r})
        pytest_plugins = ["_progress"]
    """)
    for dist in ("loadfile", "load"):
        res = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-q", "-n", "2", "--dist", dist)
        lines = [m.groups() for m in map(LINE.match, res.outlines) if m]
        assert sorted((total, f, what, stopped) for _, total, _, f, what, _, stopped in lines) == [
            ("3", "test_a.py", "2 passed", None),
            ("3", "test_b.py", "1 failed, 1 error, 1 passed, 1 skipped", None),
            ("3", "test_c.py", "1 passed", None),
        ], (dist, res.outlines)
        assert sorted(done for done, *_ in lines) == ["1", "2", "3"], res.outlines
        res.assert_outcomes(passed=4, failed=1, skipped=1, errors=1)
        last = [i for i, s in enumerate(res.outlines) if LINE.match(s)][-1]
        assert any("1 failed, 4 passed, 1 skipped, 1 error" in s for s in res.outlines[last + 1 :]), res.outlines
