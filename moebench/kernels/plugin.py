"""A plugin as the registry (registry.py) sees it, the contract check (docs/plugins.md) and the
import's deadline (MOEBENCH_PLUGIN_TIMEOUT_S)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from . import CONTRACT_VERSION

PLUGIN_MODULES_VAR = "MOEBENCH_PLUGIN_MODULES"
PLUGIN_TIMEOUT_VAR = "MOEBENCH_PLUGIN_TIMEOUT_S"
DEFAULT_TIMEOUT_S = 20.0
# modules whose import a parent process gave up on (set by import_within, read by the ranks it starts)
TIMED_OUT_VAR = "MOEBENCH_PLUGINS_TIMED_OUT"


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


def timeout_s() -> float:
    """How long a plugin's import may take (MOEBENCH_PLUGIN_TIMEOUT_S, seconds; default 20)."""
    text = os.environ.get(PLUGIN_TIMEOUT_VAR, "").strip()
    try:
        value = float(text) if text else DEFAULT_TIMEOUT_S
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{PLUGIN_TIMEOUT_VAR}={text!r}: give the seconds a plugin's import may take, e.g. 20")
    return value


def timed_out_earlier(module: str, seconds: float) -> Optional[str]:
    """Why `module` is not imported here when a process that started this one (the sweep, for its
    ranks) gave up on its import; else None."""
    if module not in os.environ.get(TIMED_OUT_VAR, "").split(os.pathsep):
        return None
    return f"its import did not finish within {seconds:g} s ({PLUGIN_TIMEOUT_VAR}) in the process that started this one"


def import_within(p: Plugin, load: Callable[[], Any], seconds: float, stage: Any) -> Optional[str]:
    """Run `load` (the plugin's import) in a daemon thread and wait at most `seconds`: None once it
    imported, else why not ('import failed: ...', or that it did not finish in time).

    A thread, not a child process that probes the import first (docs/design.md, "Plugins"): the
    plugin imports once, in the process that uses it (a probe would import torch and the plugin's
    libraries a second time, in every rank of every process group), and a hang that waits (sleep,
    a lock, I/O, a subprocess) leaves the GIL, so the wait ends whatever the plugin does with
    signals. A thread that does not finish is abandoned (a daemon: the process still exits); its
    plugin is disabled, so what it registers later is never committed. `stage` is the thread-local
    the registry's decorators read to stage the plugin's entries."""
    outcome: list[Optional[str]] = []

    def run() -> None:
        stage.plugin = p
        try:
            load()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 (a broken plugin must not break the harness: disabled, with why)
            outcome.append(f"import failed: {type(e).__name__}: {e}")

    thread = threading.Thread(target=run, name=f"moebench plugin {p.name}", daemon=True)
    thread.start()
    # waited for in short slices: the main thread runs Python between them, so a Ctrl-C that the
    # kernel delivered to another thread (torch's, NVML's) is seen at once, not at the deadline
    end = time.monotonic() + seconds
    while thread.is_alive() and time.monotonic() < end:
        thread.join(min(0.1, max(0.0, end - time.monotonic())))
    if thread.is_alive():
        # the processes this one starts (ranks) skip it rather than wait again
        os.environ[TIMED_OUT_VAR] = os.pathsep.join(filter(None, [os.environ.get(TIMED_OUT_VAR, ""), p.module]))
        return f"its import did not finish within {seconds:g} s ({PLUGIN_TIMEOUT_VAR}); the command goes on without it"
    return outcome[0] if outcome else "import failed"
