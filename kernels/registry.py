"""Registries of backends (PrepareFinalize) and experts, keyed by Hydra option name.

Modules under kernels/prepare_finalize and kernels/experts are discovered by
scanning the packages, so adding one never edits a central list. Other projects
register theirs through the entry-point group ``moebench.kernels`` (each entry
point names a module to import; its decorators do the rest). `MOEBENCH_PLUGIN_MODULES`
(module names, separated by os.pathsep) imports modules the same way without an installed
distribution: a plugin under development, or the tests' fault-injection experts.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import os
import pkgutil
import warnings

BACKENDS: dict[str, type] = {}
EXPERTS: dict[str, type] = {}
_discovered = False


def _register(table: dict, kind: str, name: str):
    def deco(cls):
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} {name!r} registered twice: {table[name]} and {cls}")
        _check_knobs(kind, name, cls)
        cls.registry_name = name
        table[name] = cls
        return cls

    return deco


def _check_knobs(kind: str, name: str, cls) -> None:
    """A knob name is one row column: entries of one group may share a knob (same type and
    default), a backend knob and an experts knob may not share a name."""
    for knob in getattr(cls, "knobs", ()):
        for other_kind, table in (("backend", BACKENDS), ("experts", EXPERTS)):
            for other_name, other in table.items():
                for k in getattr(other, "knobs", ()):
                    if k.name != knob.name or other is cls:
                        continue
                    if other_kind != kind:
                        raise ValueError(f"{kind} {name!r} declares knob {knob.name!r}, which {other_kind} "
                                         f"{other_name!r} declares too: knob names are row columns")
                    if (k.type, k.default) != (knob.type, knob.default):
                        raise ValueError(f"{kind} {name!r} declares knob {knob.name!r} = {knob.default!r}, "
                                         f"{kind} {other_name!r} as {k.default!r}: one knob, one type and default")


def is_builtin(cls) -> bool:
    """Whether an entry is one of moebench's own (not registered from outside)."""
    return cls.__module__.startswith(__package__ + ".")


def knobs(kind: str, builtin_only: bool = False) -> dict:
    """Every knob the registered entries of `kind` ("backend" | "experts") declare, by name."""
    discover()
    out: dict = {}
    for cls in (BACKENDS if kind == "backend" else EXPERTS).values():
        if builtin_only and not is_builtin(cls):
            continue
        for k in getattr(cls, "knobs", ()):
            out.setdefault(k.name, k)
    return out


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
    for name in filter(None, os.environ.get("MOEBENCH_PLUGIN_MODULES", "").split(os.pathsep)):
        try:
            importlib.import_module(name)
        except Exception as e:
            warnings.warn(f"MOEBENCH_PLUGIN_MODULES: {name!r} failed to import: {e}")


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
