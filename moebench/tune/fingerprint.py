"""What a stored timing of `moebench tune` was measured on, so that a resume reuses only timings of
this machine and this code: the GPU's name, torch, Triton and a hash of moebench's own .py files on
the timed path (never reused by other code, committed or not; the CLI, the report and the traces
are left out: they run before or after a tune's timing, never inside one — a sweep's timing does
wrap its forwards in traces/nvtx.py's ranges, a tune's does not; test_fingerprint.py checks the
tune's timing modules import none of them), with the tuned files of
the layer being tuned where they change what is timed (the decisions' `current` option; a tile
trial names its tile itself). The decisions' timings carry DeepGEMM's version and torch's CUDA as
well (a `deepgemm` option runs DeepGEMM's kernels; the tile trials run Triton's only, and importing
DeepGEMM for them would cost each tune its start-up).

The tile trials (trials.py) and the decisions' timings (decision_trials.py) are keyed by it.
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

# moebench's subpackages that never run inside a tune's timing: a change to them keeps a tune's
# stored timings (a report or CLI fix between two calls of a long tune does not time it all again)
OFF_TIMED_PATH = ("cli", "report", "traces")


def _feed(h, i: int, root: Path, pattern: str, keep=lambda rel: True) -> None:
    for p in sorted(root.rglob(pattern)) if root.is_dir() else []:
        rel = p.relative_to(root)
        if keep(rel):
            h.update(f"{i}:{rel}".encode() + b"\0" + p.read_bytes() + b"\0")


def on_timed_path(rel: Path) -> bool:
    """Whether a .py file (its path within moebench/) can run inside a timing: all but OFF_TIMED_PATH's."""
    return rel.parts[0] not in OFF_TIMED_PATH


@functools.lru_cache(maxsize=1)
def _sources_hashed():
    """The hash fed with moebench's .py files on the timed path, once a process (~150 files: the
    trials' store, the decisions' and each GPU process asked for it again); copied before the tuned
    files go in."""
    import moebench

    h = hashlib.sha256()
    _feed(h, 0, Path(moebench.__file__).parent, "*.py", on_timed_path)
    return h


def layer_files(E: int, N: int):
    """keep() for the tuned files of one layer's tiles: vLLM's name begins E=..,N=.., and the
    provenance and decisions sidecars share the stem."""
    prefix = f"E={E},N={N},"
    return lambda rel: rel.name.startswith(prefix)


def source_sha(tuned_files: bool = True, layer: Optional[tuple[int, int]] = None) -> str:
    """sha256 of moebench's .py files on the timed path and (`tuned_files`) of the tuned files the
    layer looks up (kernels/configs/ and MOEBENCH_TRITON_CONFIG_DIR's: the tiles and sidecars the
    `current` option runs, read each call: an install changes them), by path within their folder
    and content; `layer` (E, N) keeps to that layer's files (installing another layer's leaves
    this one's stored timings valid)."""
    from moebench.kernels.triton import config as tconfig

    h = _sources_hashed().copy()
    if tuned_files:
        keep = layer_files(*layer) if layer is not None else (lambda rel: True)
        for i, root in enumerate([Path(tconfig.CONFIG_DIR), *tconfig.extra_config_dirs()], start=1):
            _feed(h, i, root, "*.json", keep)
    return h.hexdigest()


def device_name(device) -> str:
    """The GPU's name (torch's), or "cpu"."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclass(frozen=True)
class Fingerprint:
    """The device, torch, Triton and moebench's source (source_sha) a timing was measured under;
    `libs` the other libraries a timing ran (the decisions': DeepGEMM's version and torch's CUDA)."""

    device: str
    torch: str
    triton: str
    source: str
    libs: str = ""

    @property
    def key(self) -> str:
        """16 hex digits over all five: equal keys, interchangeable timings."""
        parts = {"device": self.device, "torch": self.torch, "triton": self.triton, "source": self.source}
        if self.libs:
            parts["libs"] = self.libs
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    def stamp(self) -> dict:
        """What a stored record carries: the key, and the parts that say cheaply what differs (the
        source's hash only inside the key)."""
        out = {"key": self.key, "device": self.device, "torch": self.torch, "triton": self.triton}
        if self.libs:
            out["libs"] = self.libs
        return out

    def matches(self, stamp: dict) -> bool:
        return bool(stamp) and stamp.get("key") == self.key

    def difference(self, stamp: dict) -> str:
        """How a record's stamp differs from this fingerprint, in words ('' where it matches)."""
        if self.matches(stamp):
            return ""
        if not stamp or not stamp.get("key"):
            return "predate fingerprints (no record of the GPU or code that timed them)"
        if stamp.get("device") != self.device:
            return f"were measured on another GPU ({stamp.get('device')}; this is {self.device})"
        versions = [
            f"{name} {stamp.get(name) or 'none'} (this is {mine or 'none'})"
            for name, mine in (("torch", self.torch), ("triton", self.triton), ("libs", self.libs))
            if (stamp.get(name) or "") != mine
        ]
        if versions:
            return "were measured under " + ", ".join(versions)
        return "were measured by other code (moebench's .py sources differ)"


def fingerprint(
    device, tuned_files: bool = True, layer: Optional[tuple[int, int]] = None, libs: str = ""
) -> Fingerprint:
    """This process's Fingerprint on `device` (a torch.device); `tuned_files` False leaves the
    installed tuned files out of the source hash (a tile trial runs the tile it names), `layer`
    (E, N) keeps to one layer's (source_sha); `libs` as Fingerprint's."""
    import torch
    import triton

    return Fingerprint(device_name(device), torch.__version__, triton.__version__, source_sha(tuned_files, layer), libs)


def other_libs() -> str:
    """DeepGEMM's version (or "absent") and torch's CUDA, as the decisions' fingerprint names them."""
    import torch

    from moebench.run.env import library_version

    return f"deep_gemm {library_version('deep_gemm') or 'absent'}; cuda {torch.version.cuda or 'none'}"


def env_key(device, layer: Optional[tuple[int, int]] = None) -> str:
    """The decisions' key (decision_trials.RecordKey.env): the fingerprint with the tuned files (of
    the layer (E, N) where given) and other_libs()."""
    return fingerprint(device, True, layer, other_libs()).key
