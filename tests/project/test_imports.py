"""Every module of moebench/ and kernels/ imports, and every third-party package it
imports is a declared dependency (pyproject.toml), so that a fresh install from
pyproject alone has what the code needs. The optional kernel libraries are imported
only inside their own modules."""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OPTIONAL = {  # import name -> the only modules allowed to import it
    "deep_ep": {"moebench/kernels/prepare_finalize/_deepep.py"},
    "deep_gemm": {"moebench/kernels/experts/_deep_gemm.py"},
    "pplx_kernels": {"moebench/kernels/prepare_finalize/_pplx.py"},
    "pynvml": {"moebench/measure/nvml.py"},  # nvidia-ml-py, the [nvml] extra (on the GPU image)
}
# imported by name only where the tool needs it, declared as extras (not core deps)
EXTRAS_ONLY: dict[str, str] = {"submitit": "slurm", "transformers": "test"}  # transformers: routing/hf.py


def _sources() -> list[Path]:
    return sorted(p for p in (ROOT / "moebench").rglob("*.py"))


def _imports(path: Path) -> set[str]:
    """Top-level names of absolute imports anywhere in the file (functions included)."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            out.add(node.module.split(".")[0])
    return out


def _declared() -> set[str]:
    """Normalised distribution names of pyproject's core dependencies."""
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    return {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in deps}


def _extras() -> dict[str, set[str]]:
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"].get("optional-dependencies", {})
    return {
        k: {re.split(r"[<>=!~\[ ;]", d, maxsplit=1)[0].lower().replace("_", "-") for d in v} for k, v in extras.items()
    }


def test_every_module_imports():
    # module names from the files (moebench.__path__ also holds the repository root in
    # a source checkout, which pkgutil.walk_packages would recurse into)
    names = []
    for folder, pkg in (("moebench", "moebench"),):
        for path in sorted((ROOT / folder).rglob("*.py")):
            parts = list(path.relative_to(ROOT / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            names.append(".".join([pkg, *parts]))
    assert len(names) > 40, names
    failed = {}
    for name in names:
        try:
            importlib.import_module(name)
        except Exception as e:  # noqa: BLE001 - report every module that fails
            failed[name] = f"{type(e).__name__}: {e}"
    assert not failed, failed


def test_third_party_imports_are_declared():
    stdlib = set(sys.stdlib_module_names)
    dists = importlib.metadata.packages_distributions()
    declared, extras = _declared(), _extras()
    missing = {}
    for path in _sources():
        rel = path.relative_to(ROOT).as_posix()
        for name in _imports(path):
            if name in stdlib or name in ("moebench", "kernels", "__future__"):
                continue
            if name in OPTIONAL:
                assert rel in OPTIONAL[name], f"{rel} imports optional {name}: only {OPTIONAL[name]} may"
                continue
            if name in EXTRAS_ONLY:
                extra = EXTRAS_ONLY[name]
                assert name in extras.get(extra, set()), f"{name} must be in the [{extra}] extra"
                continue
            owners = {d.lower().replace("_", "-") for d in dists.get(name, [name])}
            if not owners & declared:
                missing.setdefault(name, []).append(rel)
    assert not missing, f"imported but not declared in pyproject's dependencies: {missing}"


def test_every_readme_section_a_message_names_exists():
    """Skip reasons and install hints say "see README '<section>'": that heading must exist."""
    headings = {
        line.lstrip("#").strip() for line in (ROOT / "README.md").read_text().splitlines() if line.startswith("#")
    }
    named = {}
    for path in list((ROOT / "moebench").rglob("*.py")):
        for m in re.finditer(r"README:? '([^']+)'", path.read_text()):
            named.setdefault(m.group(1), path.relative_to(ROOT).as_posix())
    assert named, "no message names a README section: the pattern has drifted"
    missing = {sec: where for sec, where in named.items() if sec not in headings}
    assert not missing, f"messages name README sections that do not exist: {missing}"


def test_every_package_is_installed():
    """pyproject's explicit `packages` list names every package of the tree: a subpackage left
    out (kernels/cards/ once was) works in an editable install and is missing from a wheel."""
    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = set()
    for base, name in ((ROOT / "moebench", "moebench"),):
        for init in base.rglob("__init__.py"):
            found.add(".".join((name, *init.parent.relative_to(base).parts)))
    assert found == listed, f"not listed: {sorted(found - listed)}; listed, not a package: {sorted(listed - found)}"
