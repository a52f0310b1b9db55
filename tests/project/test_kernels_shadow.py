"""Nothing of the repository stands in for Hugging Face's `kernels` (which transformers imports):
the layer under test is moebench/kernels/, and the tests put only tests/support/ on the path,
never tests/ (whose kernels/ folder would shadow it)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def test_import_kernels_from_the_root_gives_the_installed_distribution(tmp_path):
    site = tmp_path / "site"
    (site / "kernels").mkdir(parents=True)
    (site / "kernels" / "__init__.py").write_text("WHO = 'installed'\n")
    p = subprocess.run(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path[:0] = [{str(ROOT)!r}, {str(site)!r}]\n"
            "import kernels, moebench.kernels as mk\n"
            "print(kernels.WHO, kernels.__file__, mk.CONTRACT_VERSION, mk.__file__)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    who, where, version, ours = p.stdout.split()
    assert who == "installed" and where == str(site / "kernels" / "__init__.py")
    assert ours == str(ROOT / "moebench" / "kernels" / "__init__.py") and int(version) >= 1


def test_the_root_holds_no_top_level_kernels_package():
    assert not (ROOT / "kernels").exists(), "a top-level kernels/ shadows Hugging Face's `kernels` from the root"


def test_this_process_sees_the_installed_kernels_not_a_repository_folder():
    """pytest put the root (its rootdir) on sys.path; conftest put tests/support/ there, not tests/."""
    tests = ROOT / "tests"
    assert str(tests) not in sys.path and str(tests / "support") in sys.path
    try:
        import kernels
    except ModuleNotFoundError:
        pytest.skip("no `kernels` distribution installed (transformers < 5 does not need it)")
    # an installed distribution, wherever its environment lives (a `.venv` inside the checkout too)
    here = Path(kernels.__file__).resolve().parent
    assert here not in (ROOT / "kernels", tests / "kernels", ROOT / "moebench" / "kernels"), here
