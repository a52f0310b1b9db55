"""What a stored timing of `moebench tune` was measured on, so that a resume reuses only timings of
this machine and this code: the GPU's name, torch, Triton and a hash of moebench's own .py files
(never reused by other code, committed or not), with the tuned files the layer looks up where they
change what is timed (the decisions' `current` option; a tile trial names its tile itself).

The tile trials (trials.py) and the decisions' timings (decision_trials.py) are keyed by it.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path


def _feed(h, i: int, root: Path, pattern: str) -> None:
    for p in sorted(root.rglob(pattern)) if root.is_dir() else []:
        h.update(f"{i}:{p.relative_to(root)}".encode() + b"\0" + p.read_bytes() + b"\0")


@functools.lru_cache(maxsize=1)
def _sources_hashed():
    """The hash fed with moebench's .py files, once a process (~190 files: the trials' store, the
    decisions' and each GPU process asked for it again); copied before the tuned files go in."""
    import moebench

    h = hashlib.sha256()
    _feed(h, 0, Path(moebench.__file__).parent, "*.py")
    return h


def source_sha(tuned_files: bool = True) -> str:
    """sha256 of moebench's .py files and (`tuned_files`) of the tuned files the layer looks up
    (kernels/configs/ and MOEBENCH_TRITON_CONFIG_DIR's: the tiles and sidecars the `current` option
    runs, read each call: an install changes them), by path within their folder and content."""
    from moebench.kernels.triton import config as tconfig

    h = _sources_hashed().copy()
    if tuned_files:
        folders = [Path(tconfig.CONFIG_DIR)]
        if os.environ.get(tconfig.CONFIG_DIR_ENV):
            folders.append(Path(os.environ[tconfig.CONFIG_DIR_ENV]))
        for i, root in enumerate(folders, start=1):
            _feed(h, i, root, "*.json")
    return h.hexdigest()


def device_name(device) -> str:
    """The GPU's name (torch's), or "cpu"."""
    import torch

    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"


@dataclass(frozen=True)
class Fingerprint:
    """The device, torch, Triton and moebench's source (source_sha) a timing was measured under."""

    device: str
    torch: str
    triton: str
    source: str

    @property
    def key(self) -> str:
        """16 hex digits over all four: equal keys, interchangeable timings."""
        parts = {"device": self.device, "torch": self.torch, "triton": self.triton, "source": self.source}
        return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]

    def stamp(self) -> dict:
        """What a stored record carries: the key, and the parts that say cheaply what differs (the
        source's hash only inside the key)."""
        return {"key": self.key, "device": self.device, "torch": self.torch, "triton": self.triton}

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
            f"{name} {stamp.get(name)} (this is {mine})"
            for name, mine in (("torch", self.torch), ("triton", self.triton))
            if stamp.get(name) != mine
        ]
        if versions:
            return "were measured under " + ", ".join(versions)
        return "were measured by other code (moebench's .py sources differ)"


def fingerprint(device, tuned_files: bool = True) -> Fingerprint:
    """This process's Fingerprint on `device` (a torch.device); `tuned_files` False leaves the
    installed tuned files out of the source hash (a tile trial runs the tile it names)."""
    import torch
    import triton

    return Fingerprint(device_name(device), torch.__version__, triton.__version__, source_sha(tuned_files))


def env_key(device) -> str:
    """The decisions' key (decision_trials.RecordKey.env): the fingerprint with the tuned files."""
    return fingerprint(device).key
