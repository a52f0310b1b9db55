"""Registries of backends (PrepareFinalize) and experts, keyed by Hydra option name.

Modules under kernels/prepare_finalize and kernels/experts are discovered by
scanning the packages, so adding one never edits a central list. Other projects
register theirs through the entry-point group ``moebench.kernels`` (each entry
point names a module to import; its decorators do the rest).
"""
from __future__ import annotations

import importlib
import importlib.metadata
import pkgutil
import warnings

BACKENDS: dict[str, type] = {}
EXPERTS: dict[str, type] = {}
_discovered = False


def _register(table: dict, kind: str, name: str):
    def deco(cls):
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} {name!r} registered twice: {table[name]} and {cls}")
        cls.registry_name = name
        table[name] = cls
        return cls

    return deco


def register_backend(name: str):
    """Class decorator: a PrepareFinalize under Hydra option `backend=<name>`."""
    return _register(BACKENDS, "backend", name)


def register_experts(name: str):
    """Class decorator: an Experts under Hydra option `experts=<name>`."""
    return _register(EXPERTS, "experts", name)


def discover() -> None:
    """Import every module of the two packages and the entry-point plugins."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for pkg_name in (f"{__package__}.prepare_finalize", f"{__package__}.experts"):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg_name}.{info.name}")
    for ep in importlib.metadata.entry_points(group="moebench.kernels"):
        try:
            ep.load()
        except Exception as e:  # a broken plugin must not break the harness
            warnings.warn(f"moebench.kernels plugin {ep.name!r} failed to load: {e}")


def get_backend(name: str) -> type:
    discover()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; registered: {sorted(BACKENDS)}")
    return BACKENDS[name]


def get_experts(name: str) -> type:
    discover()
    if name not in EXPERTS:
        raise ValueError(f"unknown experts {name!r}; registered: {sorted(EXPERTS)}")
    return EXPERTS[name]
