"""Stored timings of `moebench tune --decisions` (decide.py): one JSON line per option timed at a
token count, appended as that count's interleaved timing finishes, so that a tune interrupted in
its decisions stage (Ctrl-C, a crash, a time limit) times again on the same command only what is
not stored, as its tile trials resume (trials.py, whose append this shares).

    <out>/decisions.jsonl   {"key": RecordKey, "timed": Timed} per line

A record's identity is RecordKey: the combination's key (as a tile trial's `layer`: model, quant,
simulate_ep, seed, ...), the token count, the option's whole spec (its experts, tile, Gluon
variant), the samples and the timing mode, and `env`: the GPU, torch, Triton, DeepGEMM, CUDA,
moebench's own source on the timed path (a hash of its .py files, so a record is never reused by
other code, committed or not) and this layer's tuned files (an --install of them meanwhile changes
what `current` runs): fingerprint.env_key, as the tile trials' fingerprint but for those.
A record of another identity is never reused; `--fresh` empties the file.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from moebench.tune.fingerprint import env_key
from moebench.tune.trials import append_line, json_num

FILE_NAME = "decisions.jsonl"
_FLOATS = ("us", "p20", "p80", "rel_err")
NAN = float("nan")


@dataclass
class Timed:
    """One option at one token count: µs are the interleaved medians of whole-layer forwards."""

    option: str
    us: float = NAN
    p20: float = NAN
    p80: float = NAN
    rel_err: float = NAN
    error: str = ""
    samples: list = field(default_factory=list)
    ran: str = ""  # what the layer reported running (its experts' last_layout / last_gemm)
    # why this timing is its count's second ('' the first): the host paced an option the first time
    # (decide._run), so the count's options were timed again together; kept with the record, so a
    # resumed tune still says so
    retimed: str = ""

    @property
    def ok(self) -> bool:
        return not self.error and math.isfinite(self.us)


@dataclass(frozen=True)
class RecordKey:
    """What a stored decision timing was timed as: equal keys, interchangeable timings."""

    layer: str  # plan.Combination.key
    tokens: int
    option: str  # decision_options.Option as sorted JSON (name, experts, options)
    reps: int
    timing: str  # graph | events | host
    env: str  # fingerprint.env_key(): GPU, torch, Triton, moebench's source and tuned files


def option_text(option) -> str:
    """A decision_options.Option as one canonical string (its tile and Gluon variant included)."""
    return json.dumps(dataclasses.asdict(option), sort_keys=True, default=str)


def timed_from_json(d: dict) -> Timed:
    """A Timed from its JSON (this file's, tune.json's): null figures are NaN, unknown keys dropped."""
    known = Timed.__dataclass_fields__
    fields: dict[str, Any] = {k: (NAN if k in _FLOATS and v is None else v) for k, v in d.items() if k in known}
    return Timed(**fields)


def timed_to_json(t: Timed, with_retimed: bool = False) -> dict:
    """A Timed as JSON (NaN as null, as json_num writes every tune figure): with `retimed` in this
    file, whose lines are read alone; without it in tune.json, whose count's record (decisions) or
    check (decisions_check) says once why it was timed twice."""
    return {k: json_num(v) for k, v in dataclasses.asdict(t).items() if with_retimed or k != "retimed"}


class DecisionStore:
    """The decision timings of one tune directory (FILE_NAME), for one layer on one machine."""

    def __init__(self, directory: Path, layer: str, env: str, resume: bool = True):
        self.path = Path(directory) / FILE_NAME
        self.layer, self.env = layer, env
        self._timed: dict[RecordKey, dict] = {}
        if not resume and self.path.is_file():
            self.path.unlink()
        elif self.path.is_file():
            self._read()

    def _read(self) -> None:
        with open(self.path) as f:
            for line in f:
                try:
                    d = json.loads(line)
                    key = RecordKey(**d["key"])
                    timed = dict(d["timed"])
                except (ValueError, TypeError, KeyError):
                    continue  # a line cut short by a kill (or of another format): that option runs again
                self._timed[key] = timed

    def key(self, tokens: int, option, reps: int, timing: str) -> RecordKey:
        return RecordKey(self.layer, int(tokens), option_text(option), int(reps), timing, self.env)

    def get(self, key: RecordKey):
        """The stored Timed of `key` (a new object each call), or None."""
        d = self._timed.get(key)
        return None if d is None else timed_from_json(d)

    def add(self, key: RecordKey, timed: Timed) -> None:
        d = timed_to_json(timed, with_retimed=True)
        append_line(self.path, json.dumps({"key": dataclasses.asdict(key), "timed": d}))
        self._timed[key] = d

    def __len__(self) -> int:
        return len(self._timed)


def open_store(directory: Optional[Path], c, device, resume: bool) -> Optional[DecisionStore]:
    """The store of a tune's --out (None without one: nothing is recorded)."""
    if directory is None:
        return None
    from moebench.tune.bench import dims_of

    dims = dims_of(c.combo)
    return DecisionStore(Path(directory), c.key, env_key(device, (dims.num_experts, dims.intermediate)), resume)
