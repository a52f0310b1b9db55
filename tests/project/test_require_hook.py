"""The --require gate (tests/support/_require.py) on tiny test files run by pytest's own `pytester`, with
empty stand-ins for the libraries so that they import: a skip of a test whose libraries were all
promised fails the run whatever its reason, a test that needs one more library may skip, and a
promised library none of whose tests ran fails the run."""

from __future__ import annotations

import pytest

pytest_plugins = ["pytester"]

SKIPS_FOR_GPUS = """
    import pytest

    @pytest.mark.needs("deep_ep")
    def test_two_ranks():
        pytest.skip("needs 2 GPUs, found 1")
"""


@pytest.fixture
def run(pytester, monkeypatch):
    """Run pytest in this process on pytester's folder with the gate loaded; returns its result."""
    monkeypatch.delenv("MOEBENCH_REQUIRE", raising=False)
    for lib in ("deep_ep", "deep_gemm", "pplx_kernels"):
        pytester.makepyfile(**{lib: '"""an empty stand-in: importable, nothing more"""'})
    pytester.syspathinsert()  # pytester restores sys.path and sys.modules afterwards

    def _run(*args):
        return pytester.runpytest_inprocess("-p", "_require", "-p", "no:cacheprovider", *args)

    return _run


def test_a_skip_for_too_few_gpus_fails_under_require(pytester, run):
    pytester.makepyfile(test_inner=SKIPS_FOR_GPUS)
    res = run("--require", "deep_ep")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.assert_outcomes(failed=1)
    res.stdout.fnmatch_lines(["*skipped although --require deep_ep: Skipped: needs 2 GPUs, found 1*"])
    # without the promise the same test skips and the run passes
    res = run()
    assert res.ret == pytest.ExitCode.OK
    res.assert_outcomes(skipped=1)


def test_skips_in_setup_fail_too(pytester, run):
    """A module's skipif mark, a fixture's skip (the wrong architecture): whatever the reason."""
    pytester.makepyfile(
        test_inner="""
        import pytest

        pytestmark = [pytest.mark.needs("deep_gemm"), pytest.mark.skipif(True, reason="needs a CUDA GPU")]

        def test_grouped_gemm():
            pass
    """
    )
    pytester.makepyfile(
        test_arch="""
        import pytest

        pytestmark = pytest.mark.needs("deep_gemm")

        @pytest.fixture(scope="module", autouse=True)
        def sm90():
            pytest.skip("DeepGEMM needs SM90 (H100 / H200); this GPU is SM80")

        def test_masked():
            pass
    """
    )
    res = run("--require", "deep_gemm")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.assert_outcomes(errors=2)  # a failed setup is reported as an error
    res.stdout.fnmatch_lines(["*skipped although --require deep_gemm: Skipped: needs a CUDA GPU*"])
    res.stdout.fnmatch_lines(["*skipped although --require deep_gemm: Skipped: DeepGEMM needs SM90*"])


def test_a_test_that_needs_an_unpromised_library_may_skip(pytester, run):
    """The one-GPU suite: --require deep_gemm runs the one-GPU DeepGEMM tests, and the 2-GPU tests
    of deep_ep with deep_gemm skip; --require deep_ep,deep_gemm promises them."""
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.needs("deep_gemm")
        def test_one_gpu():
            pass

        @pytest.mark.needs("deep_ep", "deep_gemm")
        def test_behind_deepep():
            pytest.skip("needs 2 GPUs")
    """
    )
    res = run("--require", "deep_gemm")
    assert res.ret == pytest.ExitCode.OK
    res.assert_outcomes(passed=1, skipped=1)
    res = run("--require", "deep_ep,deep_gemm")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.assert_outcomes(passed=1, failed=1)
    res = run("--require", "deep_ep")  # deep_ep's only test skipped: none of them ran
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.stdout.fnmatch_lines(["*--require deep_ep: no test marked needs('deep_ep') ran*"])


def test_an_unmarked_skip_that_names_a_required_library_fails(pytester, run):
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.needs("pplx_kernels")
        def test_marked():
            pass

        def test_unmarked():
            pytest.skip("pplx-kernels is not importable here")

        def test_unrelated():
            pytest.skip("needs 2 GPUs")
    """
    )
    res = run("--require", "pplx_kernels")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.assert_outcomes(passed=1, failed=1, skipped=1)


def test_an_expected_failure_counts_as_run(pytester, run):
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.needs("deep_ep")
        def test_probe():
            pytest.xfail("an HT and an LL buffer cannot share a process here")
    """
    )
    res = run("--require", "deep_ep")
    assert res.ret == pytest.ExitCode.OK
    res.assert_outcomes(xfailed=1)


def test_a_required_library_whose_tests_did_not_run_fails_the_run(pytester, run):
    """Deselected, or never collected: the promise was not kept."""
    pytester.makepyfile(
        test_inner="""
        import pytest

        @pytest.mark.needs("deep_ep")
        def test_ll():
            pass

        def test_other():
            pass
    """
    )
    res = run("--require", "deep_ep", "-k", "other")
    assert res.ret == pytest.ExitCode.TESTS_FAILED
    res.assert_outcomes(passed=1, deselected=1)
    res.stdout.fnmatch_lines(["*--require deep_ep: no test marked needs('deep_ep') ran*"])
    assert run("--require", "deep_ep").ret == pytest.ExitCode.OK


def test_modules_that_never_collect_cannot_pass(pytester, run):
    pytester.makepyfile(
        test_fine="""
        import pytest

        @pytest.mark.needs("deep_ep")
        def test_ht():
            pass
    """
    )
    pytester.makepyfile(
        test_broken="""
        import pytest
        import deep_ep_missing_symbol_here  # an import error: the module never collects

        pytestmark = pytest.mark.needs("deep_ep")

        def test_ll():
            pass
    """
    )
    res = run("--require", "deep_ep")
    assert res.ret != pytest.ExitCode.OK
    res.stdout.fnmatch_lines(["*ERROR collecting test_broken.py*"])
    (pytester.path / "test_broken.py").unlink()
    pytester.makepyfile(
        test_skipped_whole="""
        import pytest

        pytest.skip("DeepEP is not built for this GPU", allow_module_level=True)
    """
    )
    res = run("--require", "deep_ep")
    assert res.ret != pytest.ExitCode.OK
    res.stdout.fnmatch_lines(["*test_skipped_whole.py skipped whole although --require deep_ep*"])
    assert run().ret == pytest.ExitCode.OK  # without the promise a module may skip whole


def test_a_required_library_that_does_not_import_stops_the_run(pytester, run):
    pytester.makepyfile(test_inner=SKIPS_FOR_GPUS)
    res = run("--require", "deep_ep,no_such_library_anywhere")
    assert res.ret == pytest.ExitCode.USAGE_ERROR
    res.stderr.fnmatch_lines(["*required libraries are missing: no_such_library_anywhere (ModuleNotFoundError*"])
