"""`--require LIB[,LIB...]` (or MOEBENCH_REQUIRE): a GPU run's promise that it exercised LIB.

A pytest plugin (tests/conftest.py loads its hooks; tests/project/test_require_hook.py runs it on tiny
test files). The rule:

- A test states the optional libraries it exercises with `@pytest.mark.needs("deep_ep", ...)`
  (on the test, its parameter or its module; several marks add up).
- Under `--require`, a test is **owed a run** when every library it needs is required: the run
  promised all of them, so nothing this test needs may be missing. Such a test that skips, in
  setup (a `skipif` mark, a fixture) or in its body, fails instead, whatever the reason: no GPU,
  too few GPUs, the wrong architecture, a missing library. A test that needs a library the run
  did not promise may skip: `tests/gpu/test_ep_deepgemm.py` needs deep_ep (or pplx_kernels) and
  deep_gemm on 2 GPUs, so the one-GPU suite's `--require deep_gemm` lets it skip and
  `--require deep_ep,deep_gemm` does not. An expected failure (`xfail`) ran, so it counts as run.
- Fallback for unmarked tests and for modules skipped whole (never collected, so their marks are
  unseen): a skip whose reason names a required library (`deep_ep` or "DeepEP", ...) fails too.
- Each required library must have had at least one test that needs it run; else the session
  fails with a line saying so (its tests deselected, not collected, or unmarked).
- A required library that does not import stops the run before any test (a usage error).
- A module that fails to import is a collection error, which fails the run as always.

Skip inside tests or fixtures, not at module level: a module skipped whole hides its marks.
"""

from __future__ import annotations

import importlib
import os

import pytest

# names a skip reason may use for a library, beside its import name (matched case-insensitively)
ALIASES = {"deep_ep": ("DeepEP",), "deep_gemm": ("DeepGEMM",), "pplx_kernels": ("pplx",)}
_RAN = pytest.StashKey[dict]()


def pytest_addoption(parser):
    parser.addoption(
        "--require",
        default=os.environ.get("MOEBENCH_REQUIRE", ""),
        help="comma-separated libraries this run must exercise (e.g. deep_ep,deep_gemm): a test marked "
        "needs(...) with only required libraries fails instead of skipping, whatever the reason, and "
        "each required library needs at least one of its tests run (tests/support/_require.py)",
    )


def required(config) -> list[str]:
    return [x.strip() for x in (config.getoption("--require") or "").split(",") if x.strip()]


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "needs(*libs): the optional libraries a test exercises; under --require a test whose "
        "libraries are all required must run (tests/support/_require.py)",
    )
    config.stash[_RAN] = {lib: 0 for lib in required(config)}
    missing = []
    for lib in required(config):
        try:
            importlib.import_module(lib)
        except Exception as e:  # noqa: BLE001 - any import failure means the promise cannot hold
            missing.append(f"{lib} ({type(e).__name__}: {e})")
    if missing:
        raise pytest.UsageError("required libraries are missing: " + "; ".join(missing))


def needs(item) -> set[str]:
    """The libraries an item's `needs` marks name (its own, its parameter's, its module's)."""
    return {lib for m in item.iter_markers("needs") for lib in m.args}


def names(text: str, lib: str) -> bool:
    """Whether `text` (a skip reason) names `lib` by its import name or an alias."""
    low = text.lower()
    return any(n.lower() in low for n in (lib, *ALIASES.get(lib, ())))


def _reason(longrepr) -> str:
    # a skip's longrepr is (path, lineno, "Skipped: reason")
    return str(longrepr[2] if isinstance(longrepr, tuple) and len(longrepr) == 3 else longrepr)


def owed(libs: set[str], reason: str, req: list[str]) -> list[str]:
    """The required libraries that make a skip with `reason` of a test needing `libs` a failure."""
    if libs and libs <= set(req):
        return sorted(libs)
    return [lib for lib in req if names(reason, lib)]


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    req = required(item.config)
    if not req:
        return
    libs = needs(item)
    if hasattr(rep, "wasxfail") or (rep.when == "call" and not rep.skipped):
        for lib in libs & set(req):
            item.config.stash[_RAN][lib] += 1
        return
    if rep.skipped:
        reason = _reason(rep.longrepr)
        hit = owed(libs, reason, req)
        if hit:  # the run promised what this test needs: it must not pass by skipping
            rep.outcome = "failed"
            rep.longrepr = f"skipped although --require {','.join(hit)}: {reason}"


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector):
    outcome = yield
    rep = outcome.get_result()
    req = required(collector.config)
    if req and rep.skipped:
        reason = _reason(rep.longrepr)
        hit = [lib for lib in req if names(reason, lib)]
        if hit:
            rep.outcome = "failed"
            rep.longrepr = f"{collector.nodeid} skipped whole although --require {','.join(hit)}: {reason}"


def _unmet(config) -> list[str]:
    ran = config.stash.get(_RAN, {})
    return [
        f"--require {lib}: no test marked needs({lib!r}) ran (deselected, skipped, not collected or unmarked)"
        for lib, n in ran.items()
        if n == 0
    ]


def pytest_sessionfinish(session, exitstatus):
    if _unmet(session.config) and session.exitstatus in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    unmet = _unmet(config)
    if unmet:
        terminalreporter.section("--require", sep="=", red=True)
        for line in unmet:
            terminalreporter.write_line(line, red=True)
