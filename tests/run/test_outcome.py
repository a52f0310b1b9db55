"""The one failure policy every engine calls (moebench/run/outcome.py): what a row says for
what the launcher, torchrun's ranks or a SLURM job saw. Unit tests; the engines' own fault
tests (test_faults.py, test_lost_ranks.py, test_abort.py) run the processes."""

from __future__ import annotations

import errno
import signal

from moebench.results.rank_result import Failure
from moebench.results.row import Status
from moebench.results.store import LOST
from moebench.run.outcome import Death, Observed, decide, is_oom, peer_lost, raised_status

CLOSED = "rank 0: RuntimeError: [gloo] Connection closed by peer [127.0.0.1]:1234"


def test_nothing_reported_and_nothing_dead_is_a_timeout_worded_by_the_engine():
    assert decide(Observed(timeout_s=2.5, tokens=8)) == Failure(
        Status.TIMEOUT, "no result within 2.5 s: the process group was killed", 8
    )
    assert (
        decide(Observed(timeout_s=60, group_end="ended")).reason == "no result within 60 s: the process group was ended"
    )


def test_a_dead_rank_is_named_before_what_its_peers_said():
    deaths = (Death(1, -signal.SIGKILL), Death(0, -signal.SIGABRT))
    got = decide(Observed(error=Failure(Status.FAILED, CLOSED, 4), deaths=deaths, tokens=8))
    assert got == Failure(
        Status.FAILED,
        f"rank 1 died with exit code -9 (SIGKILL); rank 0 died with exit code -6 (SIGABRT); then {CLOSED}",
        4,
    )
    assert decide(Observed(deaths=(Death(2, 3),), tokens=8)) == Failure(
        Status.FAILED, "rank 2 died with exit code 3", 8
    )
    # an allocator's error is the cause, whatever died after it
    oom = Failure(Status.OOM, "rank 0: OutOfMemoryError: CUDA out of memory", 8)
    assert decide(Observed(error=oom, deaths=deaths)) is oom


def test_a_lost_peer_is_lost_only_where_the_engine_cannot_see_exits():
    err = Failure(Status.FAILED, CLOSED, 4)
    assert decide(Observed(error=err)) is err  # the launcher: it names the dead rank when it sees one
    assert decide(Observed(error=err, sees_exits=False)) == Failure(Status.FAILED, f"{LOST}{CLOSED}", 4)
    own = Failure(Status.FAILED, "rank 1: RuntimeError: injected failure on rank 1", 4)
    assert decide(Observed(error=own, sees_exits=False)) is own
    assert peer_lost("NCCLRemoteError") and not peer_lost(own.reason)


def test_a_group_that_never_formed_and_a_job_that_ended_are_lost():
    text = f"{LOST}the process group of 2 ranks did not form within 5 s (runner.startup_timeout_s)"
    assert decide(Observed(not_formed=text)) == Failure(Status.FAILED, text)
    got = decide(Observed(job_ended="SLURM job 7 ended (TIMEOUT) without a result: no task wrote to stderr"))
    assert got.status == Status.FAILED and got.reason.startswith(f"{LOST}SLURM job 7 ended (TIMEOUT)")


def test_an_allocators_error_is_oom():
    assert is_oom(MemoryError()) and is_oom(OSError(errno.ENOMEM, "no"))
    assert is_oom(RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 bytes"))
    assert raised_status(MemoryError()) is Status.OOM and raised_status(ValueError("x")) is Status.FAILED
