"""A run folder given to a sweep of another request: resuming or extending a run is a feature, but a
sweep that quietly adds other combinations changes what the run's report and comparisons hold, so it
says so in one line before any work (docs/design.md, "The store")."""

from __future__ import annotations

from typing import Optional

from moebench.config.spec import Combination
from moebench.results.store import RunStore
from moebench.util.words import counted


def _request(record: dict) -> Optional[tuple[str, tuple[str, ...]]]:
    """(sweep name, overrides) of one sweep-<run_id>.json, None where it is not one."""
    sweep, ovs = record.get("sweep"), record.get("cli_overrides")
    if not isinstance(sweep, dict) or not isinstance(ovs, list):
        return None
    return str(sweep.get("name", "")), tuple(str(o) for o in ovs)


def _said(name: str, ovs: tuple[str, ...], this_name: str) -> str:
    """A request as a command line's tail: its sweep named where it is not this one's."""
    words = ([f"--sweep {name}"] if name != this_name else []) + list(ovs)
    return "`" + (" ".join(words) or "no overrides") + "`"


def notice(store: RunStore, combos: list[Combination], sweep_name: str, cli_overrides: list[str], dry_run: bool) -> str:
    """'' unless `store` holds rows of another request (its earlier sweep-*.json) and this one adds
    combinations it has no row of; else the line saying so, and how to keep them apart."""
    if not store.rows_dir.is_dir():
        return ""
    this = (sweep_name, tuple(cli_overrides))
    try:
        records = store.sweep_records()
    except (OSError, ValueError):  # an unreadable record: the sweep's own checks name it, not this notice
        return ""
    earlier = [r for r in map(_request, (x for x in records if isinstance(x, dict))) if r is not None]
    other = list(dict.fromkeys(r for r in earlier if (r[0], sorted(r[1])) != (this[0], sorted(this[1]))))
    if not other:
        return ""
    held = set(store.stored()) | store.skipped_keys()
    if not held:
        return ""
    new = sum(1 for c in combos if c.key not in held)
    if not new:
        return ""
    said = "; ".join(_said(name, ovs, sweep_name) for name, ovs in other)
    verb = "would add" if dry_run else "adds"
    return (
        f"moebench: this sweep {verb} {counted(new, 'combination')} to {store.dir}, a run that holds rows of "
        f"{said} (its report and comparisons will hold both); a separate --out keeps them apart"
    )
