"""What the harness says about plugins (docs/plugins.md): the disabled ones and why (sweep,
list, env), each entry's origin, `list --json` records and `list --knobs`. The loading
itself, the contract check and the clash rules live in kernels/registry.py."""

from __future__ import annotations

from typing import Optional

from moebench.config.spec import COLUMN_FIELDS, Combination
from moebench.kernels import registry


def problems() -> list[str]:
    """One line per disabled plugin: who it is and why it is disabled."""
    return [f"{p.who} is disabled: {p.reason}" for p in registry.plugins() if p.status == "disabled"]


def summary() -> list[str]:
    """One line per plugin: loaded with its entries, or disabled with its reason."""
    out = []
    for p in registry.plugins():
        if p.status == "loaded":
            out.append(f"{p.who}, contract {p.contract}: " + " ".join(f"{k}={n}" for k, n in p.entries))
        else:
            out.append(f"{p.who} is disabled: {p.reason}")
    return out


def origin_tag(c) -> str:
    """'  [from mydist 0.1.0]' for a combination with a plugin's entries, else ''."""
    found = {
        kind: registry.origin(kind, getattr(c.combo, kind))
        for kind in ("backend", "experts")
        if registry.plugin_of(kind, getattr(c.combo, kind)) is not None
    }
    if len(set(found.values())) == 1:
        return f"  [from {next(iter(found.values()))}]"
    return "  [" + ", ".join(f"{kind} from {o}" for kind, o in found.items()) + "]" if found else ""


def _skip_kind(rule: bool) -> str:
    """A skip's kind in `list --json`: 'rule' (a rule of the plan, which no machine lifts) or
    'machine' (what this machine lacks; docs/design.md, "Validity")."""
    return "rule" if rule else "machine"


def combo_record(c) -> dict:
    """`list --json`: a planned combination with each field of its Combo (the axes, the model's
    sizes, world size, ...), its knobs and its entries' origins as fields of their own, each
    skip reason with its kind (_skip_kind), and whether no machine runs any of it (`ruled_out`:
    a rule of the plan skips the combination or each of its token counts, told even where this
    machine skips it whole and its token counts' reasons are not listed)."""
    combo = c.combo
    return {
        "key": c.key,
        "label": c.label,
        **{f.name: getattr(combo, f.name) for f in COLUMN_FIELDS},
        "knobs": dict(combo.knobs),
        **{f"{kind}_origin": registry.origin(kind, getattr(combo, kind)) for kind in ("backend", "experts")},
        "overrides": list(c.overrides),
        "status": "skipped" if c.reason else "valid",
        "reason": c.reason,
        "reason_kind": _skip_kind(c.rule) if c.reason else None,
        "tokens": list(c.tokens),
        "skipped_tokens": {str(k): v for k, v in c.token_reasons.items()},
        "skipped_token_kinds": {str(k): _skip_kind(c.token_skips[k].rule) for k in c.token_reasons},
        "ruled_out": c.ruled_out,
    }


def knob_lines() -> list[str]:
    """`list --knobs`: every knob of the registered entries, with its type, default and takers."""
    registry.discover()
    out = []
    for kind in ("backend", "experts"):
        table = registry.BACKENDS if kind == "backend" else registry.EXPERTS
        takers: dict[str, list[str]] = {}
        for name, cls in sorted(table.items()):
            for k in getattr(cls, "knobs", ()):
                takers.setdefault(k.name, []).append(name)
        for name, knob in sorted(registry.knobs(kind).items()):
            allowed = f" in {{{', '.join(map(str, knob.choices))}}}" if knob.choices else ""
            low = f" >= {knob.minimum:g}" if knob.minimum is not None else ""
            out.append(
                f"{kind}.{name:<22} {knob.type.__name__:<5} default {knob.default!r}{allowed}{low}  "
                f"[{', '.join(takers.get(name, []))}]  {knob.help}"
            )
    return out


def provenance(c: Combination) -> dict:
    """Where the combination's backend and experts come from: 'moebench', or a plugin's
    'distribution version' ('module name' for MOEBENCH_PLUGIN_MODULES); docs/plugins.md."""
    return {f"{kind}_origin": registry.origin(kind, getattr(c.combo, kind)) for kind in ("backend", "experts")}


def entry_knobs(kind: str, name: str) -> set[str]:
    """The knobs an entry declares (an empty set for one not registered here)."""
    try:
        return {k.name for k in getattr(registry.entry(kind, name), "knobs", ())}
    except (KeyError, ValueError):  # not registered here (a plugin not installed): unknown
        return set()


def single_rank(backend: str) -> Optional[bool]:
    """Whether a backend runs on one rank (local, local_batched); None for one not registered here."""
    try:
        return bool(registry.entry("backend", str(backend)).single_rank)
    except ValueError:
        return None
