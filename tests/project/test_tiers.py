"""The tiers' selection (tests/support/_tiers.py, pyproject.toml's addopts) on a tiny test file run by
pytest's own `pytester`, with this project's addopts: the default runs neither gpu nor slow
tests, `-m slow` exactly the slow ones, and an `-m` that names neither deselects both."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]


@pytest.fixture
def selected(pytester):
    pytester.makeini("""
        [pytest]
        markers =
            gpu: g
            slow: s
            multiprocess: m
        addopts = -m 'not gpu and not slow'
    """)
    pytester.makepyfile(
        test_inner="""
        import pytest

        def test_unit(): pass

        @pytest.mark.multiprocess
        def test_mp(): pass

        @pytest.mark.slow
        @pytest.mark.multiprocess
        def test_mp_slow(): pass

        @pytest.mark.slow
        def test_slow(): pass

        @pytest.mark.gpu
        def test_gpu(): pass

        @pytest.mark.gpu
        @pytest.mark.slow
        def test_gpu_slow(): pass
    """
    )

    def _run(*args):
        res = pytester.runpytest_inprocess(
            "-p", "_tiers", "-p", "no:cacheprovider", "-p", "no:_progress", "--collect-only", "-q", *args
        )
        return sorted(s.split("::")[1] for s in res.outlines if "::" in s)

    return _run


@pytest.mark.parametrize(
    "args, want",
    [
        ((), ["test_mp", "test_unit"]),
        (("-m", "slow"), ["test_mp_slow", "test_slow"]),
        (("-m", "not multiprocess"), ["test_unit"]),
        (("-m", "multiprocess"), ["test_mp"]),
        (("-m", "gpu"), ["test_gpu"]),
        (("-m", "gpu or slow"), ["test_gpu", "test_gpu_slow", "test_mp_slow", "test_slow"]),
    ],
)
def test_each_tier_selects_its_tests(selected, args, want):
    assert selected(*args) == want
