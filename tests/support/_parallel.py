"""How many pytest-xdist workers a run gets, and in which order they take the files.
pyproject.toml's addopts say `--numprocesses=auto --dist=loadfile --no-loadscope-reorder`, and
this plugin (loaded by tests/conftest.py) decides what `auto` means:

- 2 workers where the machine has 2 cores or more: the default tier on a 2-core machine took
  4m15s instead of 7m19s (docs/findings/harness.md, "Tests"). Most of a test's time is
  one process's work (the Triton interpreter, pandas, a rank's start-up), so a second worker
  fills the second core. `loadfile` keeps a file on one worker: its module fixtures run once
  and its progress line (tests/support/_progress.py) times the file alone.
- one process (no worker) where `-m` names `gpu` (GPU tests would share a device) or `slow`
  (the stress tests time `kill -9`s and hangs; a second worker beside them changes what they
  measure), under `--require` (its count of the tests that ran lives in the process that ran
  them: tests/support/_require.py), for a single test file or test (two workers' start-up would cost
  more than they save), and on one core;
- PYTEST_XDIST_AUTO_NUM_WORKERS (xdist's own variable), or `-n N` on the command line, decide
  instead; `-n 0` runs in one process.

The workers take the files in the order of `file_order`: those with `multiprocess` tests first,
most of them first, then the rest, most tests first (pyproject's `--no-loadscope-reorder` keeps
xdist from sorting them by their number of tests alone, which left the files of one or two long
end-to-end tests, `test_distributed.py`, `test_ab.py`, `test_kill9.py`, to run last, one worker
idle beside them).

Without pytest-xdist installed (an environment from before it joined the `test` extra), the
three options are accepted and ignored, and the header says so: the run takes one process.
Tested by tests/project/test_parallel.py.
"""

from __future__ import annotations

import os

import pytest
from _pytest.mark.expression import Expression  # what -m compiles to
from _tiers import TIER_MARKERS

WORKERS = 2


def pytest_addoption(parser, pluginmanager):
    if pluginmanager.has_plugin("xdist"):
        return
    group = parser.getgroup("xdist", "pytest-xdist is not installed: these options are ignored")
    group.addoption(
        "--numprocesses",
        dest="numprocesses",
        default=None,
        help="ignored: pytest-xdist is not installed (pip install -e '.[test]')",
    )
    group.addoption("--dist", dest="dist", default="no", help="ignored: pytest-xdist is not installed")
    group.addoption(
        "--no-loadscope-reorder",
        dest="loadscopereorder",
        action="store_false",
        help="ignored: pytest-xdist is not installed",
    )


def pytest_report_header(config):
    if config.getoption("numprocesses", None) not in (None, 0, "0") and not config.pluginmanager.has_plugin("xdist"):
        return "pytest-xdist is not installed: the tests run in one process (pip install -e '.[test]')"
    return None


def _one_file(args: list[str]) -> bool:
    return len(args) == 1 and args[0].split("::", 1)[0].endswith(".py")


def selects(markexpr: str, marker: str) -> bool:
    """Whether `-m markexpr` runs tests marked `marker` (a tier of tests/support/_tiers.py): only an
    expression that names it, and that a test with it (and any other mark) matches; the default
    `not gpu and not slow` runs neither."""
    if marker not in markexpr:
        return False  # tests/support/_tiers.py deselects them
    return Expression.compile(markexpr).evaluate(lambda name, **kw: name == marker or name not in TIER_MARKERS)


def auto_workers(markexpr: str, require: str, args: list[str], cpus: int) -> int:
    """`-n auto`'s number of workers (0: no worker, the tests run in pytest's process)."""
    if any(selects(markexpr, m) for m in TIER_MARKERS) or require.strip() or _one_file(args) or cpus < WORKERS:
        return 0
    return WORKERS


@pytest.hookimpl(optionalhook=True)  # a hook of xdist's: unknown without it
def pytest_xdist_auto_num_workers(config):
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # xdist's own hook reads it
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return auto_workers(config.option.markexpr or "", config.getoption("--require") or "", list(config.args), cpus)


def file_order(tests: list[tuple[str, bool]]) -> list[str]:
    """The test files of (nodeid, is multiprocess) in the order the workers take them: the most
    `multiprocess` tests first (end to end, seconds each), then the most tests."""
    count: dict[str, int] = {}
    mp: dict[str, int] = {}
    for nodeid, multiprocess in tests:
        f = nodeid.split("::", 1)[0]
        count[f] = count.get(f, 0) + 1
        mp[f] = mp.get(f, 0) + multiprocess
    return sorted(count, key=lambda f: (-mp[f], -count[f]))  # stable: collection order otherwise


@pytest.hookimpl(trylast=True)  # after the tiers' deselection (tests/support/_tiers.py)
def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):  # only in a worker: each collects, and sorts alike
        return
    rank = {
        f: i
        for i, f in enumerate(file_order([(i.nodeid, i.get_closest_marker("multiprocess") is not None) for i in items]))
    }
    items.sort(key=lambda i: rank[i.nodeid.split("::", 1)[0]])  # stable: a file's tests keep their order
