"""Registries of backends (PrepareFinalize) and experts, keyed by Hydra option name.

moebench's own entries are known by their cards (kernels/entry.py): discovery imports every
module of kernels/cards/ (light: no torch, no Triton), whose `@card` classes name the module
that implements them, so adding an entry never edits a central list and planning imports no
implementation. The tables hold an entry's card until its implementation is imported
(get_backend / get_experts import it on demand; its `@register_backend` / `@register_experts`
class must subclass the card, and replaces it in the table). Other projects
register theirs as plugins (docs/plugins.md): an entry point of the group
``moebench.kernels`` names a module whose import runs the decorators, or
`MOEBENCH_PLUGIN_MODULES` (module names, separated by os.pathsep) names modules to import
the same way without an installed distribution (a plugin under development, the tests'
fault-injection experts).

A plugin's module imports in a daemon thread within MOEBENCH_PLUGIN_TIMEOUT_S (plugin.py
`import_within`): one still importing then is disabled and abandoned, and the command goes on.
Its entries are staged while its module imports and committed only when all of them are
sound: the module declares the contract version this build implements
(`MOEBENCH_CONTRACT`, kernels/__init__.py), imports without an error, and registers no
name or knob that clashes with another entry. Otherwise the whole plugin is disabled with
its reason (`PLUGINS`), its entries stay out of the tables, and everything else runs.
Built-ins are never replaced.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import inspect
import os
import pkgutil
import sys
import threading
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Optional, cast, overload

from .entry import BackendCard, EntryCard, ExpertsCard
from .plugin import PLUGIN_MODULES_VAR, Plugin, contract_problem, import_within, timed_out_earlier
from .plugin import timeout_s as plugin_timeout_s
from .split import Split, split

if TYPE_CHECKING:  # the implementations' bases import torch: planning imports none of them
    from .interfaces import Experts, PrepareFinalize

ENTRY_POINT_GROUP = "moebench.kernels"
BUILTIN_ORIGIN = "moebench"  # the provenance of moebench's own entries

BACKENDS: dict[str, type[BackendCard]] = {}  # name -> the card (moebench's, until implemented) or the class
EXPERTS: dict[str, type[ExpertsCard]] = {}
CARDS: dict[tuple[str, str], type[EntryCard]] = {}  # (kind, name) -> the card of one of moebench's own entries
PLUGINS: list["Plugin"] = []  # every plugin discover() found, loaded or disabled
DISABLED: dict[tuple[str, str], "Plugin"] = {}  # (kind, name) of a disabled plugin's entries
_OWNER: dict[tuple[str, str], "Plugin"] = {}  # (kind, name) -> the plugin that registered it
_stage = threading.local()  # .plugin: the plugin whose module this thread imports (its decorators stage)
_discovered = False
_plugins_off = 0  # inside without_plugins(): discover() reads moebench's own cards only
_cards_loaded = False
_generation = 0  # bumped whenever a table changes (what the harness caches from them: generation())


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
                    return (
                        f"{kind} {name!r} declares knob {knob.name!r}, which {other_kind} {other_name!r} "
                        "declares too: knob names are row columns"
                    )
                if (k.type, k.default) != (knob.type, knob.default):
                    return (
                        f"{kind} {name!r} declares knob {knob.name!r} = {knob.default!r}, {kind} "
                        f"{other_name!r} as {k.default!r}: one knob, one type and default"
                    )
    return None


def generation() -> tuple:
    """Changes whenever an entry is added, implemented or disabled (or a table replaced)."""
    return (_generation, id(BACKENDS), id(EXPERTS), id(DISABLED))


def _add(kind: str, name: str, cls, plugin: Optional[Plugin] = None) -> None:
    global _generation
    _generation += 1
    cls.registry_name = name
    _table(kind)[name] = cls
    if plugin is not None:
        _OWNER[(kind, name)] = plugin
        plugin.entries.append((kind, name))


def _register(kind: str, name: str):
    def deco(cls):
        loading = getattr(_stage, "plugin", None)
        if loading is not None and not cls.__module__.startswith(__package__ + "."):
            loading.staged.append((kind, name, cls))  # committed once the plugin's import ends
            return cls
        if is_builtin(cls) and not _is_card_module(cls.__module__):
            _implement(kind, name, cls)
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


def _is_card_module(module: str) -> bool:
    return module.startswith(f"{__package__}.cards.")


def _implement(kind: str, name: str, cls) -> None:
    """One of moebench's implementations: it subclasses its card and takes its place."""
    _load_cards()
    card = CARDS.get((kind, name))
    if card is None:
        raise ValueError(
            f"{kind} {name!r} ({cls.__module__}) has no card: declare one in kernels/cards/ "
            "(kernels/entry.py), or planning would import every implementation"
        )
    if not issubclass(cls, card) or cls.__module__ != f"{__package__}.{card.implementation}":
        raise ValueError(
            f"{kind} {name!r}: {cls.__module__}.{cls.__qualname__} must subclass its card "
            f"{card.__qualname__}, whose implementation is {card.implementation!r}"
        )
    table = _table(kind)
    if table.get(name) not in (card, cls):
        raise ValueError(f"{kind} {name!r} registered twice: {table[name]} and {cls}")
    _add(kind, name, cls)


def card(kind: str, name: str):
    """Class decorator of kernels/cards/: the card of moebench's own `kind=name`."""

    def deco(cls):
        CARDS[(kind, name)] = cls
        return _register(kind, name)(cls)

    return deco


def register_backend(name: str):
    """Class decorator: a PrepareFinalize under Hydra option `backend=<name>`."""
    return _register("backend", name)


def register_experts(name: str):
    """Class decorator: an Experts under Hydra option `experts=<name>`."""
    return _register("experts", name)


# ---------------------------------------------------------------------------
# plugins


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
            problems.append(f"{kind} {name!r} is not a subclass of moebench.kernels.interfaces.{base[kind].__name__}")
        elif inspect.isabstract(cls):
            problems.append(f"{kind} {name!r} leaves {', '.join(sorted(cls.__abstractmethods__))} unimplemented")
        if name in _table(kind):
            problems.append(
                f"it registers {kind} {name!r}, a name {_owner_text(kind, name)} registers already: rename it"
            )
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
    global _generation
    _generation += 1
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


def _load(p: Plugin, load: Callable[[], Any], seconds: Optional[float] = None) -> None:
    seconds = plugin_timeout_s() if seconds is None else seconds
    PLUGINS.append(p)
    before = set(sys.modules)
    # a broken or hung plugin must not break the harness; one the starting process gave up on is not waited for again
    why = timed_out_earlier(p.module, seconds) or import_within(p, load, seconds, _stage)
    if why:
        _disable(p, why)
        return
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


def _load_cards() -> None:
    """Import every module of kernels/cards/ (each card registers itself)."""
    global _cards_loaded
    if _cards_loaded:
        return
    _cards_loaded = True
    pkg = importlib.import_module(f"{__package__}.cards")
    for info in pkgutil.iter_modules(pkg.__path__):
        importlib.import_module(f"{pkg.__name__}.{info.name}")


def discover() -> None:
    """moebench's own cards (kernels/cards/, no implementation), then the plugins (entry points
    first)."""
    global _discovered
    if _discovered:
        return
    _load_cards()
    if _plugins_off:
        return
    seconds = plugin_timeout_s()
    _discovered = True
    for ep in _entry_points():
        dist = getattr(ep, "dist", None)
        p = Plugin(
            name=ep.name,
            module=ep.module,
            dist=getattr(dist, "name", "") or "",
            version=getattr(dist, "version", "") or "",
        )
        _load(p, ep.load, seconds)
    for name in filter(None, os.environ.get(PLUGIN_MODULES_VAR, "").split(os.pathsep)):
        _load(Plugin(name=name, module=name), functools.partial(importlib.import_module, name), seconds)


@contextmanager
def without_plugins() -> Iterator[None]:
    """Inside it, discover() reads moebench's own cards and imports no plugin: for commands that need
    none (report, compare), whose rows already name their entries, so a broken plugin cannot stop them."""
    global _plugins_off
    _plugins_off += 1
    try:
        yield
    finally:
        _plugins_off -= 1


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
    cls = entry(kind, name)
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


@overload
def entry(kind: Literal["backend"], name: str) -> type[BackendCard]: ...
@overload
def entry(kind: Literal["experts"], name: str) -> type[ExpertsCard]: ...
@overload
def entry(kind: str, name: str) -> type[EntryCard]: ...
def entry(kind: str, name: str) -> type[EntryCard]:
    """What answers for `kind=name` in planning (its metadata and rules) without importing an
    implementation: moebench's card (or its implementation, once imported), a plugin's class."""
    discover()
    table = _table(kind)
    if name not in table:
        # a plugin disabled before it registered anything (its import failed or timed out) may be the one
        why = [unavailable(kind, name)] if (kind, name) in DISABLED else []
        why = why or [f"{p.who} is disabled: {p.reason}" for p in PLUGINS if p.status == "disabled" and not p.entries]
        raise ValueError(
            f"unknown {kind} {name!r}; registered: {sorted(table)}" + (f" ({'; '.join(why)})" if why else "")
        )
    return table[name]


def ep_split(combo) -> Split:
    """The split that `combo` (a Combo, or any mapping with its fields: backend, world_size,
    simulate_ep, simulate_tp; those missing or None read 1) really uses: split.py's rule over its
    backend's card; a backend not registered here splits as an EP backend."""
    discover()
    card = BACKENDS.get(str(combo.get("backend", "")), BackendCard)
    return split(
        int(combo.get("world_size") or 1),
        int(combo.get("simulate_ep") or 1),
        int(combo.get("simulate_tp") or 1),
        tensor_parallel=card.tensor_parallel,
        single_rank=card.single_rank,
    )


def _implementation(kind: str, name: str) -> type[EntryCard]:
    cls, card = entry(kind, name), CARDS.get((kind, name))
    if card is not None and cls is card:  # moebench's own, not imported yet: its decorator replaces the card
        module = card.implementation
        importlib.import_module(f"{__package__}.{module}")
        if _table(kind).get(name) is cls:
            raise ValueError(f"{kind} {name!r}: {module} registers no implementation of its card")
    return _table(kind)[name]


def get_backend(name: str) -> type[PrepareFinalize]:
    """The backend's implementation (PrepareFinalize), imported on first use."""
    # an implementation replaces its card only if it subclasses it (_implement); a plugin's
    # class enters only as a PrepareFinalize (_commit)
    return cast("type[PrepareFinalize]", _implementation("backend", name))


def get_experts(name: str) -> type[Experts]:
    """The experts' implementation (Experts), imported on first use."""
    return cast("type[Experts]", _implementation("experts", name))  # as get_backend's
