"""Ranks started by someone else: `torchrun` (one or many nodes) or the tasks of a SLURM job
(moebench/run/slurm.py). Each process is one rank of one process group; the ranks run the same
`run_combination` as the local launcher's (moebench/run/worker.py) and rank 0 writes the rows.

    torchrun --nnodes=2 --nproc-per-node=8 --node-rank=$NODE --master-addr=$HEAD \\
        --master-port=29500 --max-restarts=8 -m moebench.dist_worker --out runs/ep16 \\
        backend=naive experts=torch model=deepseek_v3 ...

torchrun gives RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT;
the combinations whose world size is WORLD_SIZE run, in this one group. Rank 0 takes the run
folder's lock (moebench/results/lock.py; or works under its holder's with MOEBENCH_LOCK_TOKEN, when that
holder started it), plans against the store and tells the other ranks what to run. Each rank
watches its starter from its first line (moebench/run/lifeline.py), and the group must form within
runner.startup_timeout_s or this rank exits 1 (under a SLURM job, rank 0 first writes the
first combination's rows saying so).

A rank blocked in a collective cannot take part in another, so faults travel through the
process group's key-value store: a rank that raises posts its error; rank 0's watchdog
thread writes the combination's `failed`/`oom` row (or `timeout` past runner.timeout_s),
posts an abort, and every rank exits 1 (run/dist_faults.py; run/outcome.py decides the row).
An error that says a peer went away (a closed or reset connection: outcome.peer_lost) makes a
`lost:` row, which a plain resume runs again; each token
count's results reach rank 0 as it ends, so the counts measured before a loss keep their
rows. The group is then spent: torchrun's --max-restarts
(or the SLURM parent's next job) starts a fresh one, which resumes past the stored rows.
Exit status: 0 every planned row ok or skipped, 1 otherwise (a fault, or failed rows; with
torchrun's --max-restarts a group that ran everything exits 0, since torchrun would restart
it), 2 bad input before any work."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import os
import sys
import threading
import uuid
from dataclasses import dataclass
from typing import Callable, Optional

if __name__ == "__main__":
    # a rank of torchrun's: watch its agent now, before torch's seconds of imports, not
    # after them, when a dead agent reads as pid 1 (moebench/run/lifeline.py); the imports above
    # are the standard library's, milliseconds
    from moebench.run.lifeline import watch_parent

    watch_parent()

from moebench.run.dist_faults import Channel, LeadRows, exit_now, follow, not_formed, raised  # stdlib only
from moebench.util.arg_errors import OneLineErrors


@dataclass(frozen=True)
class RankEnv:
    """Where this process sits in its group (torchrun's variables, or a SLURM task's)."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    attempt: int = 0  # torchrun's restart count: keys of an earlier attempt's store stay

    @classmethod
    def from_environ(cls, env=os.environ) -> "RankEnv":
        missing = [k for k in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT") if k not in env]
        if missing:
            raise ValueError(
                f"{', '.join(missing)} not set: start moebench.dist_worker with torchrun "
                "(or use `moebench sweep`, which starts its own ranks)"
            )
        ws = int(env["WORLD_SIZE"])
        return cls(
            int(env["RANK"]),
            ws,
            int(env.get("LOCAL_RANK", 0)),
            int(env.get("LOCAL_WORLD_SIZE", ws)),
            env["MASTER_ADDR"],
            int(env["MASTER_PORT"]),
            int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
        )


def _setup(env: RankEnv, device_kind: str, startup_s: float = 30.0):
    """This rank's device and process group, formed within `startup_s` (worker.form_group:
    GroupNotFormed otherwise)."""
    import torch.distributed as dist

    from moebench.run.worker import form_group, rank_device

    device = rank_device(device_kind, env.local_rank)
    if env.world_size > 1 and not dist.is_initialized():
        os.environ.setdefault("MASTER_ADDR", env.master_addr)
        os.environ.setdefault("MASTER_PORT", str(env.master_port))
        form_group(device, env.rank, env.world_size, "env://", startup_s)
    return device, (dist.group.WORLD if env.world_size > 1 else None)


def run_ranks(
    work: list,
    run_dir: str,
    meta: dict,
    env: RankEnv,
    token: Optional[str] = None,
    log: Callable[[str], None] = lambda s: None,
) -> list[dict]:
    """Run `work` [(Combination, tokens)] as this rank of `env`'s group; rank 0 writes each
    combination's rows to the run under the lock `token` names (or the lock it holds) and
    returns them. A fault ends the process (module docstring)."""
    import torch.distributed as dist

    from moebench.kernels import registry
    from moebench.measure import memory
    from moebench.results.lock import LockHeld, RunLock
    from moebench.results.store import RunStore
    from moebench.run.messages import Task
    from moebench.run.worker import GroupNotFormed, process_age_s, run_combination

    store = RunStore(run_dir)
    try:
        startup_s = max((c.combo.startup_timeout_s for c, _ in work), default=30.0)
        device, group = _setup(env, work[0][0].combo.device if work else "cpu", startup_s)
    except GroupNotFormed as e:
        not_formed(e, env.rank, work, store, meta, run_dir, token)
    chan = Channel(f"moebench/{meta['run_id']}/{env.attempt}")
    lock = None
    if env.rank == 0 and token:
        try:
            lock = RunLock.acquire(run_dir, token=token)
        except LockHeld as e:  # the sweep this job works for is gone: write nothing
            print(f"moebench worker: {e}", file=sys.stderr)
            chan.abort()
            exit_now(2)
    rows = LeadRows(work, store, meta, lock, chan, log) if env.rank == 0 else None
    watch = rows.watch if rows is not None else (lambda: follow(chan))
    threading.Thread(target=watch, name="moebench-watchdog", daemon=True).start()
    baseline = memory.device_used_bytes(device)
    start_s = process_age_s()  # this rank's start and group formation: the first combination's rows
    for i, (c, toks) in enumerate(work):
        if rows is not None:
            rows.begin(i)
        mine: dict = rows.mine if rows is not None else {}
        tokens = None
        try:
            for tokens, res in run_combination(
                Task(i, c.combo, tuple(toks)),
                env.rank,
                env.world_size,
                group,
                device,
                run_dir,
                baseline,
                start_s if i == 0 else 0.0,
            ):
                if res is None:
                    continue
                mine[tokens] = res
                # every token count's results reach rank 0 as it ends (every rank yields each
                # one): a group lost at the next count keeps this one's row measured
                gathered: Optional[list] = [None] * env.world_size if env.rank == 0 else None
                if group is not None:
                    dist.gather_object(res, gathered, dst=0)
                else:
                    gathered = [res]
                if rows is not None:
                    assert gathered is not None
                    rows.gathered(tokens, gathered)
            tokens = None
        except KeyboardInterrupt:  # Ctrl-C, or a cancelled SLURM job: the work is cancelled, not failed
            print(f"moebench worker: rank {env.rank} interrupted; nothing written for {c.label}", file=sys.stderr)
            exit_now(130)
        except BaseException as e:  # noqa: BLE001 - everything becomes a row
            raised(e, env.rank, i, tokens, chan, rows)
        if rows is not None:
            rows.end()
    if group is not None:
        for name in sorted({c.combo.backend for c, _ in work}):  # collective: every rank alike
            registry.get_backend(name).release_group(group)
    return rows.written if rows is not None else []


def _parser() -> argparse.ArgumentParser:
    p = OneLineErrors(prog="python -m moebench.dist_worker", description=__doc__.split("\n\n")[0])
    p.add_argument("overrides", nargs="*")
    p.add_argument("--sweep", default=None, help="named sweep in sweeps/ (or a path); default: the overrides only")
    p.add_argument("--out", required=True, help="run directory (on a filesystem rank 0 can write)")
    p.add_argument("--redo", default="none", choices=("none", "failed", "all"))
    p.add_argument("--wait", action="store_true", help="if another sweep is writing --out, wait for it")
    return p


def _plan(args, env: RankEnv, log):
    """Rank 0: lock, clean, plan against the store, write what an invocation writes.
    Returns (lock, work, meta) or raises ValueError (bad input, a folder another sweep holds)."""
    from moebench.results.finished import plan_work, run_meta
    from moebench.results.foreign import refuse_foreign
    from moebench.results.lock import RunLock
    from moebench.results.store import RunStore
    from moebench.run import env as envmod
    from moebench.run.plan import plan, planned

    combos, sweep_data = plan(list(args.overrides), args.sweep, this_machine=False)
    for note in sweep_data.get("notes", ()):  # e.g. a sweep file's model share left out
        log(f"moebench: {note}")
    other = [c for c in combos if not c.reason and c.combo.world_size != env.world_size]
    for c in other:
        log(f"moebench: left out (runs {c.combo.world_size} ranks, this group has {env.world_size}): {c.label}")
    combos = [c for c in combos if c not in other]
    store = RunStore(args.out)
    refuse_foreign(store)  # as moebench sweep: not among a checkout's files (before the lock writes .lock)
    lock = RunLock.acquire(args.out, wait=args.wait, log=log)
    if lock.fd is not None:
        store.clean_temp()
    else:  # working under a holder's lock: its temp files may be in flight
        store.refuse_links()
    info = envmod.fingerprint()
    eid, run_id = envmod.env_id(info), uuid.uuid4().hex[:10]
    meta = run_meta(run_id, sweep_data["name"], info, eid)
    skipped, work, already = plan_work(combos, store, args.redo, meta)
    log(f"moebench: {planned(combos, work, len(skipped), already, f' on {env.world_size} ranks')} -> {args.out}")
    store.write_env({**info, "env_id": eid}, run_id)
    store.write_json(
        f"sweep-{run_id}.json",
        {
            "sweep": sweep_data,
            "cli_overrides": list(args.overrides),
            "run_id": run_id,
            "torchrun": dataclasses.asdict(env),
        },
    )
    store.write_skipped(skipped)
    return lock, work, meta, [c.key for c in combos]


def main(argv=None) -> int:
    import torch.distributed as dist

    from moebench.results.row import BAD_STATUSES
    from moebench.results.store import RunStore
    from moebench.util.words import counted

    args = _parser().parse_args(argv)
    log = lambda s: print(s, file=sys.stderr, flush=True)
    try:
        env = RankEnv.from_environ()
    except ValueError as e:
        print(f"moebench worker: error: {e}", file=sys.stderr)
        return 2
    lead = env.rank == 0
    device = "cpu"
    try:  # every rank plans (bad input fails alike everywhere, before the group exists)
        from moebench.run.plan import plan, refuse_impossible

        combos, _ = plan(list(args.overrides), args.sweep, this_machine=False)
        refuse_impossible(combos)
        mine = [c.combo for c in combos if c.combo.world_size == env.world_size]
        device = mine[0].device if mine else "cpu"
    except ValueError as e:
        if lead:
            print(f"moebench worker: error: {e}", file=sys.stderr)
        return 2
    from moebench.run.worker import GroupNotFormed

    try:
        _setup(env, device, max((c.startup_timeout_s for c in mine), default=30.0))
    except GroupNotFormed as e:  # nothing planned or locked yet: the next attempt starts afresh
        print(f"moebench worker: {e}", file=sys.stderr)
        return 1
    lock = keys = None
    shared: list = [None]  # rank 0 tells the others (work, meta), or why there is none
    if lead:
        try:
            lock, work, meta, keys = _plan(args, env, log)
            shared = [(work, meta)]
        except ValueError as e:
            print(f"moebench worker: error: {e}", file=sys.stderr)
            shared = [str(e)]
    if env.world_size > 1:
        dist.broadcast_object_list(shared, src=0)
    if isinstance(shared[0], str):
        return 2
    work, meta = shared[0]
    run_ranks(work, args.out, meta, env, token=lock.token if lock else None, log=log if lead else (lambda s: None))
    if env.world_size > 1:
        dist.barrier()
        dist.destroy_process_group()
    if not lead:
        return 0
    assert lock is not None and keys is not None  # the lead planned: a failed plan returned 2 above
    df = RunStore(args.out).load()
    bad = df[df["combo_key"].isin(set(keys)) & df["status"].isin(BAD_STATUSES)] if len(df) else df
    lock.release()
    done = dt.datetime.now().isoformat(timespec="seconds")
    log(f"moebench: done at {done}; {counted(len(bad), 'row')} not ok in {args.out}")
    # torchrun restarts a group that exits non-zero: with restarts, a group that ran everything
    # exits 0 (its last line says how many rows are not ok), else as `moebench sweep` does
    restarts = int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0") or 0)
    return 1 if len(bad) and not restarts else 0


if __name__ == "__main__":
    sys.exit(main())
