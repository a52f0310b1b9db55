"""One failure policy for a combination's process group, whatever started its ranks.

An engine (the local launcher: run/launch.py; torchrun's ranks and SLURM's tasks:
run/dist_worker.py; SLURM jobs: run/slurm.py) only starts and watches processes; it says
what it saw as an `Observed` and `decide` gives the row's status and reason (a `Failure`).
A new engine (Ray, Kubernetes) gathers the same observations and calls the same function.

The policy (docs/design.md, "Isolation and resume"):
- a group that did not form by its start-up deadline, or a job that ended with nothing
  stored (time limit, node failure), is `lost:` (a plain resume runs it again);
- a rank that died without reporting (exit code, signal) is named first, then whatever its
  peers reported after it (a closed connection);
- a rank's own error is the row's: `oom` when an allocator's (is_oom), else `failed`;
  where the engine cannot see its ranks' exits (torchrun, SLURM) an error that says a peer
  went away (peer_lost) is `lost:`;
- nothing reported and nothing dead: `timeout` past the combination's runner.timeout_s, or
  past the start-up allowance when no rank began (a hang in imports or a plugin's import).
"""

from __future__ import annotations

import errno
import signal
import sys
from dataclasses import dataclass
from typing import Optional

from moebench.kernels.plugin import PLUGIN_TIMEOUT_VAR
from moebench.results.rank_result import Failure
from moebench.results.row import Status
from moebench.results.store import LOST

# what a rank's error says when a peer rank (or its node) went away under it: gloo's closed or
# reset connection, NCCL's remote error; its cause is the peer's loss, not this rank's code
PEER_LOST = (
    "connection closed by peer",
    "connection reset by peer",
    "broken pipe",
    "remote process exited",
    "communicator was aborted",
    "ncclremoteerror",
    "failed to recv, got 0 bytes",
)

# what allocators say when memory runs out: CUDA's caching allocator, the CPU allocator
# (c10's DefaultCPUAllocator: "can't allocate memory ... Error code 12 (Cannot allocate
# memory)"), std::bad_alloc and ENOMEM from the OS
OOM_TEXTS = ("out of memory", "can't allocate memory", "cannot allocate memory", "bad_alloc", "enomem")

REASON_LIMIT = 1000  # characters of a reason naming dead ranks and what followed


def peer_lost(reason: str) -> bool:
    """Whether an error's text says a peer rank or its node was lost (PEER_LOST)."""
    text = reason.lower()
    return any(t in text for t in PEER_LOST)


def is_oom(e: BaseException) -> bool:
    """Whether an exception says memory ran out (the row's status is then `oom`)."""
    torch = sys.modules.get("torch")  # an exception of torch's own type means torch is imported
    if isinstance(e, MemoryError) or (torch is not None and isinstance(e, torch.OutOfMemoryError)):
        return True
    if isinstance(e, OSError) and e.errno == errno.ENOMEM:
        return True
    text = str(e).lower()
    return any(t in text for t in OOM_TEXTS)


def raised_status(e: BaseException) -> Status:
    """The status of a row whose rank raised `e`: OOM for an allocator's error, else FAILED."""
    return Status.OOM if is_oom(e) else Status.FAILED


@dataclass(frozen=True)
class Death:
    """A rank that ended without reporting: its exit code (negative: the signal that ended it)."""

    rank: int
    code: int

    def text(self) -> str:
        sig = f" ({signal.Signals(-self.code).name})" if self.code < 0 else ""
        return f"rank {self.rank} died with exit code {self.code}{sig}"


@dataclass(frozen=True)
class Observed:
    """What an engine saw of a combination that did not finish (seconds)."""

    error: Optional[Failure] = None  # the first error a rank reported (its reason "rank r: ...")
    deaths: tuple[Death, ...] = ()  # ranks that ended without reporting and caused it, to name in order
    tokens: Optional[int] = None  # the token count in flight
    timeout_s: float = 0.0  # the combination's runner.timeout_s: the reason when nothing else went wrong
    startup_s: float = 0.0  # no rank had started the combination: the start-up allowance that passed
    group_end: str = "killed"  # what the engine did to the group at its timeout ("killed", "ended")
    sees_exits: bool = True  # the engine sees every rank's exit (else a peer's loss makes a `lost:` row)
    not_formed: str = ""  # the start-up deadline passed: why the group did not form (LOST's text)
    job_ended: str = ""  # a job ended with nothing stored: which, how, and the last line it wrote


def decide(seen: Observed) -> Failure:
    """The row of a combination that did not finish: its status, reason and token count."""
    if seen.not_formed:
        text = seen.not_formed
        return Failure(Status.FAILED, text if text.startswith(LOST) else f"{LOST}{text}", seen.tokens)
    if seen.job_ended:
        return Failure(Status.FAILED, f"{LOST}{seen.job_ended}", seen.tokens)
    err = seen.error
    if seen.deaths and (err is None or err.status == Status.FAILED):
        # a rank died: its peers' errors (a closed connection) are what followed
        died = "; ".join(d.text() for d in seen.deaths)
        after = f"; then {err.reason}" if err is not None else ""
        return Failure(Status.FAILED, f"{died}{after}"[:REASON_LIMIT], err.tokens if err is not None else seen.tokens)
    if err is not None:
        if err.status == Status.FAILED and not seen.sees_exits and peer_lost(err.reason):
            # a peer rank or its node went away: not the combination's doing (resume retries it)
            return Failure(Status.FAILED, f"{LOST}{err.reason}", err.tokens)
        return err
    if seen.startup_s:
        return Failure(
            Status.TIMEOUT,
            f"start-up: no rank started within {seen.startup_s:g} s (process start, imports, the plugins' "
            f"imports, each bounded by {PLUGIN_TIMEOUT_VAR}, process-group init): the process group was "
            f"{seen.group_end}",
            seen.tokens,
        )
    return Failure(
        Status.TIMEOUT, f"no result within {seen.timeout_s:g} s: the process group was {seen.group_end}", seen.tokens
    )
