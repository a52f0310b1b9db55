"""One progress line per test file, as the file's last test finishes:

    [ 12/118  4m31s] tests/run/test_kill9.py  7 passed  1m46s

(files done / files selected, time since the session started; the file, its outcomes and its
own time, its module fixtures' teardown included). `-q`'s dots say nothing for minutes while a
file of end-to-end tests runs; these lines say where the run is and what took the time.

A pytest plugin, loaded by tests/conftest.py (`pytest_plugins`); `-p no:_progress` turns it off,
and so does `-qq`. A run stopped early (`-x`, Ctrl-C) gets the line of the file in flight, marked
`stopped`, before pytest's summary. Under pytest-xdist it runs in the controller, which learns
the selected tests from the workers' collections; a file's line comes when all its tests have
finished, in whatever order the workers ran them (with `--dist loadfile` a file runs on one
worker, so its time is its own). Tested by tests/project/test_progress.py.
"""

from __future__ import annotations

import time
from collections import Counter

import pytest

# pytest's own order in its summary line
_ORDER = ("failed", "error", "passed", "skipped", "xfailed", "xpassed")


def _file(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def fmt_s(seconds: float) -> str:
    """4m31s, 52s."""
    m, s = divmod(int(round(seconds)), 60)
    return f"{m}m{s:02d}s" if m else f"{s}s"


class Progress:
    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.t0 = time.monotonic()
        self.todo: dict[str, set[str]] = {}  # file -> its selected tests not finished yet
        self.started: dict[str, float] = {}  # file -> when its first test started
        self.counts: dict[str, Counter] = {}
        self.printed: set[str] = set()
        self.finished: set[str] = set()

    def _selected(self, nodeids) -> None:
        self.todo = {}
        for nodeid in nodeids:
            self.todo.setdefault(_file(nodeid), set()).add(nodeid)

    @pytest.hookimpl(trylast=True)  # after the deselection hooks (conftest's gpu rule, -m, -k)
    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.items or not self.todo:  # xdist's controller collects nothing itself
            self._selected(item.nodeid for item in session.items)

    @pytest.hookimpl(optionalhook=True)
    def pytest_xdist_node_collection_finished(self, node, ids) -> None:
        # every worker collects (and deselects) the same tests; xdist checks that they agree
        if not self.todo:
            self._selected(ids)

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        f = _file(nodeid)
        self.started.setdefault(f, time.monotonic())
        self.counts.setdefault(f, Counter())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        category = self.config.hook.pytest_report_teststatus(report=report, config=self.config)[0]
        if category:  # "" for a passing setup or teardown
            self.counts.setdefault(_file(report.nodeid), Counter())[category] += 1

    @pytest.hookimpl(trylast=True)  # after the terminal reporter's dot and its [ nn%]
    def pytest_runtest_logfinish(self, nodeid: str) -> None:
        f = _file(nodeid)
        todo = self.todo.get(f)
        if todo and nodeid in todo:
            todo.discard(nodeid)
            if not todo:
                self.finished.add(f)
                if any(self.todo.values()):  # the last file's line comes after pytest's final [100%]
                    self._line(f)

    def pytest_sessionfinish(self) -> None:
        # inside the terminal reporter's wrapper: before its summary
        for f in self.started:
            if f not in self.printed:
                self._line(f, "" if f in self.finished else "  stopped")

    def _line(self, f: str, note: str = "") -> None:
        self.printed.add(f)
        tr = self.config.pluginmanager.get_plugin("terminalreporter")
        if tr is None:
            return
        now = time.monotonic()
        counts = self.counts.get(f, Counter())
        what = ", ".join(f"{counts[k]} {k}" for k in (*_ORDER, *sorted(set(counts) - set(_ORDER))) if counts[k])
        n = len(self.todo)
        width = len(str(n))
        if tr._tw.width_of_current_line:  # -q's dots (ensure_newline() knows of -v's lines only)
            tr._tw.line()
        tr.write_line(
            f"[{len(self.printed):>{width}}/{n} {fmt_s(now - self.t0):>6}] {f}  {what or 'nothing ran'}"
            f"  {fmt_s(now - self.started.get(f, now))}{note}"
        )


def pytest_configure(config: pytest.Config) -> None:
    if config.get_verbosity() >= -1 and not hasattr(config, "workerinput"):  # in xdist's controller, not a worker
        config.pluginmanager.register(Progress(config), "moebench-progress")
