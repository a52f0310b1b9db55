"""What travels between the launcher and its ranks (moebench/run/launch.py <-> worker.py),
as typed values: a rank receives `Task`s and puts `Started`, `Result`, `Done`, `Error`
and `Exited` messages on one queue. A `RankResult` is one rank's measurement of one
(combination, tokens per rank); moebench/results/rows.py aggregates them over ranks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from moebench.config.spec import Combo
from moebench.results.rank_result import RankResult
from moebench.results.row import Status


@dataclass(frozen=True)
class Task:
    """One combination for a process group: its index in the group's work, its spec and
    the token counts to run, in order."""

    idx: int
    combo: Combo
    tokens: tuple[int, ...]

    @property
    def key(self) -> str:
        return self.combo.key


@dataclass(frozen=True)
class Started:
    idx: int
    rank: int


@dataclass(frozen=True)
class Result:
    idx: int
    rank: int
    tokens: int
    result: RankResult


@dataclass(frozen=True)
class Done:
    idx: int
    rank: int


@dataclass(frozen=True)
class Exited:
    rank: int


@dataclass(frozen=True)
class Error:
    """A rank raised: what becomes the combination's failed / oom row."""

    idx: Optional[int]
    rank: int
    status: Status  # failed | oom
    reason: str
    tokens: Optional[int] = None  # the token count it was running, if any
    traceback: str = ""
