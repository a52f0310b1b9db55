"""The repository's kernels/ is only ever moebench.kernels: with the repository root on sys.path
(pytest's rootdir, `python -m` from the root) `import kernels` gives the installed top-level
`kernels` distribution (Hugging Face's, which transformers imports), or fails as a missing
module would (kernels/_shadow.py); the tests put only tests/support/ on the path, never tests/
(whose kernels/ folder would shadow it too)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _python(code: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *flags, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT)


def test_import_kernels_from_the_root_gives_the_installed_distribution(tmp_path):
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHO = 'installed'\nfrom .layer import LAYER\n")
    (site / "kernels" / "layer.py").write_text("LAYER = 'installed layer'\n")
    p = _python(f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(site)!r}]\n"
                "import kernels, kernels.layer\n"
                "from kernels import WHO\n"
                "import moebench.kernels as mk\n"
                "print(WHO, kernels.layer.LAYER, kernels.__file__, mk.CONTRACT_VERSION, mk.__file__)")
    assert p.returncode == 0, p.stderr
    who, _, _, where, version, ours = p.stdout.split()
    assert who == "installed" and where == str(site / "kernels" / "__init__.py")
    assert ours == str(ROOT / "kernels" / "__init__.py") and int(version) >= 1


def test_import_kernels_from_the_root_without_a_distribution_is_a_missing_module():
    # -S: no site-packages, so no installed `kernels`; the root first on the path
    p = _python(f"import sys; sys.path[:0] = [{str(ROOT)!r}]\n"
                "try:\n    import kernels\n"
                "except ModuleNotFoundError as e:\n    print('missing', e.name); print(e)\n", "-S")
    assert p.returncode == 0, p.stderr
    first, message = p.stdout.splitlines()[:2]
    assert first == "missing kernels"
    assert "is moebench.kernels" in message and "kernels" in message


def test_this_process_sees_the_installed_kernels_not_a_repository_folder():
    """pytest put the root (its rootdir) on sys.path; conftest put tests/support/ there, not tests/."""
    tests = ROOT / "tests"
    assert str(tests) not in sys.path and str(tests / "support") in sys.path
    try:
        import kernels
    except ModuleNotFoundError:
        pytest.skip("no `kernels` distribution installed (transformers < 5 does not need it)")
    here = Path(kernels.__file__).resolve().parent
    assert here not in (ROOT / "kernels", tests / "kernels"), here
