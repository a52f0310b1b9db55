"""Stored trials of a tune: one JSON line per timed config, appended as it finishes,
so an interrupted tune (a killed process, a lease that ran out) resumes where it
stopped: the search is deterministic given its measurements (strategy.py), and a
re-run with the same arguments reads the stored ones instead of timing them again.

A trial's identity is (layer, tokens, config, phase, reps, timing): `layer` is the
combination's key (plan.Combination.key: model, quant, simulate_ep, seed, ...), so a
store may hold several layers and token grids; a trial of another identity is never
reused. Each trial carries the fingerprint it was measured under (`env`: fingerprint.py's
GPU, torch, Triton and moebench's source), and only those of this process's are reused: a
tune resumed on another GPU or by other code times again. The others (and those stored
before fingerprints) stay in the file, for reading, and `foreign_lines` says why they were
passed over. Several processes (one per GPU) append to one file under an advisory lock.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Optional

from moebench.tune.fingerprint import Fingerprint, fingerprint
from moebench.tune.space import config_key

FILE_NAME = "trials.jsonl"
HOST_PACED_ERROR = "host-paced"  # the kind (error's first word) of a trial the host paced


def retime_host_paced(
    time: Callable[[], list], names: list[str], where: str, log: Callable[[str], None], first: Optional[list] = None
) -> tuple[list, str]:
    """`time()`, and once more when the host paced any of its results (their error HOST_PACED_ERROR:
    host time, no figure; a moment's host stall outlasting the timing loop's holds): every one of them
    again, together, so that the figures that decide were taken side by side and one busy moment
    decides nothing. The second timing stands, host-paced or not. `time` returns timed results (each
    with an `.error`) in the order of `names`, theirs in words. Returns (the timing that stands, why it
    was taken twice: '<the paced names>: <the first paced error>', e.g. 'current: host-paced: 1 of 5
    samples: host time, not ranked'; '' when once); `log` gets the retime, prefixed by `where`.
    `first`: the first timing where it was taken already (a resumed decisions tune's stored results),
    so only the retime, if any, is timed. Used by decide._run (the decisions), decide.check and
    regression.measure (--max-regression)."""
    got = time() if first is None else first
    paced = [(n, t.error) for n, t in zip(names, got, strict=True) if t.error.startswith(HOST_PACED_ERROR)]
    if not paced:
        return got, ""
    why = f"{', '.join(n for n, _ in paced)}: {paced[0][1]}"
    log(f"{where}: {why}; timing all {len(names)} once more, together")
    return time(), why


@dataclass
class Trial:
    """One config timed at one token count (µs); `error` set when it did not run or
    was incorrect (then `us` is NaN)."""

    config: dict
    us: float = float("nan")  # median
    p20: float = float("nan")
    p80: float = float("nan")
    rel_err: float = float("nan")
    error: str = ""
    samples: list = field(default_factory=list)
    # identity
    layer: str = ""
    tokens: int = 0
    phase: str = "screen"  # screen | final (interleaved with the other finalists) | baseline
    reps: int = 0
    timing: str = ""  # graph | events | host
    group: str = ""  # final: the finalists' keys, so another final set is not reused
    seconds: float = float("nan")  # wall time of this trial (check + time)
    # samples the GPU started before the host had enqueued them after the timing loop's retakes
    # (timing.Samples.host_paced; NaN off a GPU and in trials stored before the count): any makes
    # the trial's figure host time, so it carries an error (HOST_PACED_ERROR) and never wins
    host_paced: float = float("nan")
    env: dict = field(default_factory=dict)  # Fingerprint.stamp() of what measured it ({}: stored before)

    @property
    def ok(self) -> bool:
        return not self.error and math.isfinite(self.us)

    def key(self) -> tuple:
        return (
            self.layer,
            int(self.tokens),
            config_key(self.config),
            self.phase,
            int(self.reps),
            self.timing,
            self.group,
        )


def trial_env(device) -> Fingerprint:
    """The tile trials' fingerprint on `device` (a torch.device): the installed tuned files left out,
    as a trial runs the tile it names (an --install changes only which tile `current` is: another
    trial), so that a rerun after an --install reuses the search."""
    return fingerprint(device, tuned_files=False)


def json_num(v):
    """v, or None for a float that is NaN or infinite (JSON has neither): the one spelling of that
    for what a tune writes (tune.json, the sidecars, trials.jsonl, decisions.jsonl); not recursive."""
    return None if isinstance(v, float) and not math.isfinite(v) else v


def trial_from_json(d: dict) -> Trial:
    nan = float("nan")
    for k in ("us", "p20", "p80", "rel_err", "seconds", "host_paced"):
        d[k] = nan if d.get(k) is None else float(d[k])
    if not isinstance(d.get("env", {}), dict):
        d["env"] = {}  # no fingerprint to match
    known = Trial.__dataclass_fields__
    return Trial(**{k: v for k, v in d.items() if k in known})


def append_line(path: Path, line: str) -> None:
    """One JSON line appended to a store file whole: one write under an advisory lock (several
    GPU processes append to one file); a line cut short by a kill is skipped when read back, and
    ended first, so that the line appended after it is not lost with it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    # O_NOFOLLOW: a link planted at the store file is refused, never appended through
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666)
    with os.fdopen(fd, "r+b") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            end = os.fstat(fd).st_size
            cut = end > 0 and os.pread(fd, 1, end - 1) != b"\n"
            f.write((("\n" if cut else "") + line + "\n").encode("utf-8"))
            f.flush()
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


class TrialStore:
    """The trials of one tune directory (FILE_NAME) measured under `env`, read once, appended to as
    they run (stamped with `env`). Trials of another fingerprint are read into `foreign`, never
    reused."""

    def __init__(self, directory: Path, env: Fingerprint, resume: bool = True):
        self.path = Path(directory) / FILE_NAME
        self.env = env
        self._trials: dict[tuple, Trial] = {}
        self.foreign: list[Trial] = []  # stored under another fingerprint (or none): kept, not reused
        if resume and self.path.is_file():
            self.reload()

    def reload(self) -> None:
        self._trials, self.foreign = {}, []
        with open(self.path) as f:
            for line in f:
                line = line.strip()
                if not line:
                    continue
                try:
                    t = trial_from_json(json.loads(line))
                except (ValueError, TypeError):
                    continue  # a line cut short by a kill: that trial runs again
                if self.env.matches(t.env):
                    self._trials[t.key()] = t
                else:
                    self.foreign.append(t)

    def get(self, key: tuple) -> Optional[Trial]:
        return self._trials.get(key)

    def add(self, t: Trial) -> None:
        t.env = self.env.stamp()
        append_line(self.path, json.dumps({k: json_num(v) for k, v in asdict(t).items()}))
        self._trials[t.key()] = t

    def __len__(self) -> int:
        return len(self._trials)

    def select(self, layer: str, tokens: Optional[int] = None) -> Iterable[Trial]:
        return (t for t in self._trials.values() if t.layer == layer and (tokens is None or t.tokens == tokens))

    def foreign_lines(self, layer: str) -> list[str]:
        """One progress line per reason that stored trials of `layer` are not reused (another GPU,
        torch or Triton, other moebench code, no fingerprint), with their count; [] where none."""
        why: dict[str, list[Trial]] = {}
        for t in self.foreign:
            if t.layer == layer:
                why.setdefault(self.env.difference(t.env), []).append(t)
        lines = []
        for reason, trials in why.items():
            keys = sorted({str(t.env.get("key")) for t in trials if t.env.get("key")})
            fp = f" (fingerprint {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''})" if keys else ""
            lines.append(
                f"tune: {len(trials)} stored trials {reason}{fp}; timing again (they stay in {self.path.name})"
            )
        return lines


def open_store(directory: Path, device, resume: bool, layer: str, log: Callable[[str], None]) -> TrialStore:
    """A tune's store of trials measured on `device` (a torch.device); without `resume` (--fresh)
    emptied; `log` says which stored trials of `layer` it passes over, and why."""
    store = TrialStore(directory, trial_env(device), resume)
    if not resume and store.path.exists():
        store.path.unlink()
    for line in store.foreign_lines(layer):
        log(line)
    return store
