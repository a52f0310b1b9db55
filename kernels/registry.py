"""Registries of backends (PrepareFinalize) and experts, keyed by Hydra option name.

Modules under kernels/prepare_finalize and kernels/experts are discovered by
scanning the packages, so adding one never edits a central list. Other projects
register theirs as plugins (docs/plugins.md): an entry point of the group
``moebench.kernels`` names a module whose import runs the decorators, or
`MOEBENCH_PLUGIN_MODULES` (module names, separated by os.pathsep) names modules to import
the same way without an installed distribution (a plugin under development, the tests'
fault-injection experts).

A plugin's entries are staged while its module imports and committed only when all of
them are sound: the module declares the contract version this build implements
(`MOEBENCH_CONTRACT`, kernels/__init__.py), imports without an error, and registers no
name or knob that clashes with another entry. Otherwise the whole plugin is disabled with
its reason (`PLUGINS`), its entries stay out of the tables, and everything else runs.
Built-ins are never replaced.
"""
from __future__ import annotations

import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from . import CONTRACT_VERSION

ENTRY_POINT_GROUP = "moebench.kernels"
PLUGIN_MODULES_VAR = "MOEBENCH_PLUGIN_MODULES"
BUILTIN_ORIGIN = "moebench"  # the provenance of moebench's own entries

BACKENDS: dict[str, type] = {}
EXPERTS: dict[str, type] = {}
PLUGINS: list["Plugin"] = []  # every plugin discover() found, loaded or disabled
DISABLED: dict[tuple[str, str], "Plugin"] = {}  # (kind, name) of a disabled plugin's entries
_OWNER: dict[tuple[str, str], "Plugin"] = {}  # (kind, name) -> the plugin that registered it
_loading: Optional["Plugin"] = None  # the plugin whose module is importing: its decorators stage
_discovered = False


@dataclass
class Plugin:
    """One plugin: an entry point of the `moebench.kernels` group (with the distribution that
    declares it) or a module named in MOEBENCH_PLUGIN_MODULES."""

    name: str  # the entry point's name, or the module's
    module: str
    dist: str = ""  # distribution name ("" for MOEBENCH_PLUGIN_MODULES)
    version: str = ""  # distribution version
    contract: Any = None  # what the module declares as MOEBENCH_CONTRACT
    status: str = "loading"  # loaded | disabled
    reason: str = ""  # why it is disabled
    entries: list = field(default_factory=list)  # (kind, name) it registers
    staged: list = field(default_factory=list, repr=False)  # (kind, name, cls) until committed

    @property
    def origin(self) -> str:
        """The provenance rows record for its entries: 'dist version', or 'module name'."""
        return f"{self.dist} {self.version}" if self.dist else f"module {self.module}"

    @property
    def who(self) -> str:
        if self.dist:
            return f"plugin {self.name!r} (distribution {self.dist} {self.version}, module {self.module})"
        return f"plugin module {self.module!r} ({PLUGIN_MODULES_VAR})"

    def as_dict(self) -> dict:
        return {"name": self.name, "module": self.module, "dist": self.dist, "version": self.version,
                "contract": self.contract, "status": self.status, "reason": self.reason,
                "entries": [f"{k}={n}" for k, n in self.entries]}


def _table(kind: str) -> dict:
    assert kind in ("backend", "experts"), kind
    return BACKENDS if kind == "backend" else EXPERTS


def _active() -> Iterator[tuple[str, str, type]]:
    for kind in ("backend", "experts"):
        for name, cls in _table(kind).items():
            yield kind, name, cls


def _owner_text(kind: str, name: str) -> str:
    p = _OWNER.get((kind, name))
    return p.who if p is not None else "moebench"


def _knob_conflict(kind: str, name: str, cls, others) -> Optional[str]:
    """A knob name is one row column: entries of one group may share a knob (same type and
    default), a backend knob and an experts knob may not share a name."""
    for knob in getattr(cls, "knobs", ()):
        for other_kind, other_name, other in others:
            if other is cls:
                continue
            for k in getattr(other, "knobs", ()):
                if k.name != knob.name:
                    continue
                if other_kind != kind:
                    return (f"{kind} {name!r} declares knob {knob.name!r}, which {other_kind} {other_name!r} "
                            "declares too: knob names are row columns")
                if (k.type, k.default) != (knob.type, knob.default):
                    return (f"{kind} {name!r} declares knob {knob.name!r} = {knob.default!r}, {kind} "
                            f"{other_name!r} as {k.default!r}: one knob, one type and default")
    return None


def _add(kind: str, name: str, cls, plugin: Optional[Plugin] = None) -> None:
    cls.registry_name = name
    _table(kind)[name] = cls
    if plugin is not None:
        _OWNER[(kind, name)] = plugin
        plugin.entries.append((kind, name))


def _register(kind: str, name: str):
    def deco(cls):
        if _loading is not None and not cls.__module__.startswith(__package__ + "."):
            _loading.staged.append((kind, name, cls))  # committed once the plugin's import ends
            return cls
        table = _table(kind)
        if name in table and table[name] is not cls:
            raise ValueError(f"{kind} {name!r} registered twice: {table[name]} and {cls}")
        why = _knob_conflict(kind, name, cls, _active())
        if why:
            raise ValueError(why)
        _add(kind, name, cls)
        return cls

    return deco


def register_backend(name: str):
    """Class decorator: a PrepareFinalize under Hydra option `backend=<name>`."""
    return _register("backend", name)


def register_experts(name: str):
    """Class decorator: an Experts under Hydra option `experts=<name>`."""
    return _register("experts", name)


# ---------------------------------------------------------------------------
# plugins


def contract_problem(declared) -> Optional[str]:
    """Why a module declaring MOEBENCH_CONTRACT = `declared` (an int, or a tuple of the ints it
    supports) cannot load here, or None."""
    if declared is None:
        return (f"it declares no MOEBENCH_CONTRACT; this moebench implements plugin contract "
                f"{CONTRACT_VERSION}: set MOEBENCH_CONTRACT = {CONTRACT_VERSION} in the module its entry "
                "point names once it follows that contract (docs/plugins.md)")
    accepted = tuple(declared) if isinstance(declared, (tuple, list, set, frozenset)) else (declared,)
    if CONTRACT_VERSION not in accepted:
        return (f"it was written against plugin contract {declared}, this moebench implements contract "
                f"{CONTRACT_VERSION}: use a version of the plugin written for contract {CONTRACT_VERSION}, or "
                f"a moebench that implements contract {declared}")
    return None


def _commit(p: Plugin) -> None:
    """Add the staged entries of `p`, or disable it if any of them is unsound."""
    from .interfaces import Experts, PrepareFinalize

    base = {"backend": PrepareFinalize, "experts": Experts}
    staged, problems = list(p.staged), []
    for i, (kind, name, cls) in enumerate(staged):
        if any((k, n) == (kind, name) for k, n, _ in staged[:i]):
            problems.append(f"it registers {kind} {name!r} twice")
            continue
        if not (isinstance(cls, type) and issubclass(cls, base[kind])):
            problems.append(f"{kind} {name!r} is not a subclass of moebench.kernels.interfaces."
                            f"{base[kind].__name__}")
        elif inspect.isabstract(cls):
            problems.append(f"{kind} {name!r} leaves {', '.join(sorted(cls.__abstractmethods__))} unimplemented")
        if name in _table(kind):
            problems.append(f"it registers {kind} {name!r}, a name {_owner_text(kind, name)} registers "
                            "already: rename it")
        why = _knob_conflict(kind, name, cls, [*_active(), *staged[:i]])
        if why:
            problems.append(why)
    if problems:
        _disable(p, "; ".join(problems))
        return
    p.staged = []
    for kind, name, cls in staged:
        _add(kind, name, cls, p)
    p.status = "loaded"


def _disable(p: Plugin, reason: str) -> None:
    names = list(dict.fromkeys([*p.entries, *((k, n) for k, n, _ in p.staged)]))
    for kind, name in p.entries:  # committed entries leave the tables
        _table(kind).pop(name, None)
        _OWNER.pop((kind, name), None)
    p.entries, p.staged = names, []
    p.status, p.reason = "disabled", reason
    for key in names:
        DISABLED.setdefault(key, p)


def disable(p: Plugin, reason: str) -> None:
    """Disable a loaded plugin (the harness's own checks: knob names it reserves)."""
    if p.status != "disabled":
        _disable(p, reason)


def _load(p: Plugin, load: Callable[[], Any]) -> None:
    global _loading
    PLUGINS.append(p)
    before = set(sys.modules)
    _loading = p
    try:
        load()
    except (Exception, SystemExit) as e:  # a broken plugin must not break the harness
        _disable(p, f"import failed: {type(e).__name__}: {e}")
        return
    finally:
        _loading = None
    if not p.staged and p.module in before:  # imported before discover(): adopt its entries
        for kind, name, cls in list(_active()):
            mod = cls.__module__
            mine = mod == p.module or mod.startswith(p.module + ".")
            if mine and (kind, name) not in _OWNER and not is_builtin(cls):
                _table(kind).pop(name)
                p.staged.append((kind, name, cls))
    p.contract = getattr(sys.modules.get(p.module), "MOEBENCH_CONTRACT", None)
    why = contract_problem(p.contract)
    if why:
        _disable(p, why)
    else:
        _commit(p)


def _entry_points() -> list:
    return list(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP))


def discover() -> None:
    """Import every module of the two packages, then the plugins (entry points first)."""
    global _discovered
    if _discovered:
        return
    _discovered = True
    for pkg_name in (f"{__package__}.prepare_finalize", f"{__package__}.experts"):
        pkg = importlib.import_module(pkg_name)
        for info in pkgutil.iter_modules(pkg.__path__):
            importlib.import_module(f"{pkg_name}.{info.name}")
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        p = Plugin(name=ep.name, module=ep.module, dist=getattr(dist, "name", "") or "",
                   version=getattr(dist, "version", "") or "")
        _load(p, ep.load)
    for name in filter(None, os.environ.get(PLUGIN_MODULES_VAR, "").split(os.pathsep)):
        _load(Plugin(name=name, module=name), lambda name=name: importlib.import_module(name))


def plugins() -> list[Plugin]:
    discover()
    return list(PLUGINS)


def plugin_of(kind: str, name: str) -> Optional[Plugin]:
    """The plugin an entry (active or disabled) comes from; None for moebench's own."""
    discover()
    return _OWNER.get((kind, name)) or (DISABLED.get((kind, name)) if name not in _table(kind) else None)


def origin(kind: str, name: str) -> str:
    """A row's provenance of an entry: 'moebench', 'dist version', 'module name', or '' (unknown)."""
    discover()
    p = plugin_of(kind, name)
    if p is not None:
        return p.origin
    return BUILTIN_ORIGIN if name in _table(kind) else ""


def unavailable(kind: str, name: str) -> str:
    """Why `kind=name` is not registered (a disabled plugin's reason, or none at all)."""
    discover()
    p = DISABLED.get((kind, name))
    if p is not None and name not in _table(kind):
        return f"{kind}={name} is from {p.who}, which is disabled: {p.reason}"
    return f"{kind}={name} has no implementation registered in this build"


def ask(kind: str, name: str, method: str, *args):
    """`cls.<method>(*args)` of an entry (supports, token_limit: a reason or None). A plugin's
    exception becomes a reason naming the plugin; a built-in's propagates (a bug of ours)."""
    cls = get_backend(name) if kind == "backend" else get_experts(name)
    try:
        return getattr(cls, method)(*args)
    except Exception as e:  # the plugin's code, reported in the row
        p = _OWNER.get((kind, name))
        if p is None:
            raise
        return f"{kind}={name} from {p.who}: {method}() raised {type(e).__name__}: {e}"


def refuse_knob_names(names, what: str) -> None:
    """Disable each plugin with an entry declaring a knob in `names` (the harness's own fields);
    a built-in that does is a bug: ValueError."""
    discover()
    for kind, name, cls in list(_active()):
        bad = sorted({k.name for k in getattr(cls, "knobs", ())} & set(names))
        if not bad:
            continue
        p = _OWNER.get((kind, name))
        if p is None:
            raise ValueError(f"knob names {bad} of {kind} {name!r} clash with {what}: rename them in their entry")
        disable(p, f"{kind} {name!r} declares knob {bad[0]!r}, a name of {what}: rename it")


def is_builtin(cls) -> bool:
    """Whether an entry is one of moebench's own (not registered from outside)."""
    return cls.__module__.startswith(__package__ + ".")


def knobs(kind: str, builtin_only: bool = False) -> dict:
    """Every knob the registered entries of `kind` ("backend" | "experts") declare, by name."""
    discover()
    out: dict = {}
    for name, cls in _table(kind).items():
        if builtin_only and ((kind, name) in _OWNER or not is_builtin(cls)):
            continue
        for k in getattr(cls, "knobs", ()):
            out.setdefault(k.name, k)
    return out


def get_backend(name: str) -> type:
    discover()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; registered: {sorted(BACKENDS)}"
                         + (f" ({unavailable('backend', name)})" if ("backend", name) in DISABLED else ""))
    return BACKENDS[name]


def get_experts(name: str) -> type:
    discover()
    if name not in EXPERTS:
        raise ValueError(f"unknown experts {name!r}; registered: {sorted(EXPERTS)}"
                         + (f" ({unavailable('experts', name)})" if ("experts", name) in DISABLED else ""))
    return EXPERTS[name]
