"""One version: moebench/__init__.py's __version__, which pyproject.toml's must equal, printed by
`moebench --version` and `moebench env` (and recorded in env.json: tests/run/test_env_record.py)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from moebench import __version__, cli

ROOT = Path(__file__).resolve().parents[2]


def test_pyproject_and_the_package_name_one_version():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    if "version" in pyproject["project"].get("dynamic", []):  # setuptools reads the package's: one by construction
        assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "moebench.__version__"}
    else:
        assert pyproject["project"]["version"] == __version__


def test_version_flag_prints_the_version(capsys):
    with pytest.raises(SystemExit) as done:
        cli.main(["--version"])
    assert done.value.code == 0 and capsys.readouterr().out == f"moebench {__version__}\n"


def test_env_shows_the_version(capsys):
    assert cli.main(["env"]) == 0
    assert f"moebench  {__version__}\n" in capsys.readouterr().out


def test_env_on_a_machine_without_gpu_or_nsys_says_so_plainly(capsys, monkeypatch):
    """No 'cpu x0' for the GPU line, and no word on what Nsight Systems 2024.2 records where there is
    no nsys at all."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("PATH", "/nonexistent")  # no nsys on it
    assert cli.main(["env"]) == 0
    out = capsys.readouterr().out
    assert "gpu       none (CPU ranks over gloo)" in out and " x0" not in out
    nvtx = next(line for line in out.splitlines() if line.startswith("  nvtx ranges"))
    assert "Nsight Systems 2024.2" not in nvtx, nvtx
