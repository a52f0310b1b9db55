"""A plugin as the registry (registry.py) sees it, and the contract check (docs/plugins.md)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from . import CONTRACT_VERSION

PLUGIN_MODULES_VAR = "MOEBENCH_PLUGIN_MODULES"


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
        return {
            "name": self.name,
            "module": self.module,
            "dist": self.dist,
            "version": self.version,
            "contract": self.contract,
            "status": self.status,
            "reason": self.reason,
            "entries": [f"{k}={n}" for k, n in self.entries],
        }


def contract_problem(declared) -> Optional[str]:
    """Why a module declaring MOEBENCH_CONTRACT = `declared` (an int, or a tuple of the ints it
    supports) cannot load here, or None."""
    if declared is None:
        return (
            f"it declares no MOEBENCH_CONTRACT; this moebench implements plugin contract "
            f"{CONTRACT_VERSION}: set MOEBENCH_CONTRACT = {CONTRACT_VERSION} in the module its entry "
            "point names once it follows that contract (docs/plugins.md)"
        )
    accepted = tuple(declared) if isinstance(declared, (tuple, list, set, frozenset)) else (declared,)
    if CONTRACT_VERSION not in accepted:
        return (
            f"it was written against plugin contract {declared}, this moebench implements contract "
            f"{CONTRACT_VERSION}: use a version of the plugin written for contract {CONTRACT_VERSION}, or "
            f"a moebench that implements contract {declared}"
        )
    return None
