"""`moebench sweep --slurm`: one SLURM job per combination family (the launcher's process-group
unit: moebench/run/plan.py `Combination.family`) through submitit, the `slurm` extra
(`pip install 'moebench[slurm]'`).

The sweep plans, takes the run folder's lock and writes what every invocation writes, then
submits the families' jobs at once (nodes x tasks per node = the family's world size, one
task per rank, one GPU per task) and waits. Each task is one rank of moebench/dist_worker.py;
rank 0 writes the rows into the run folder (a filesystem the nodes share) under the sweep's
lock, presenting its token (moebench/results/lock.py): a foreign sweep into the folder is refused,
and a job whose sweep no longer holds the folder writes nothing. A combination that fails
ends its job (its row written); the sweep then submits the family's rest as a new job, and
a job that ended with nothing new stored (time limit, node failure) gives its first
combination a `lost:` row saying so (run/outcome.py decides what a failure's row says; the
jobs' rows are read through the store, moebench/results/store.py). `--slurm-cluster local`
runs the jobs as local processes (submitit's LocalExecutor), as the tests do."""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generator, Iterator, Optional

from moebench.run.lifeline import watch_parent

if getattr(getattr(sys.modules.get("__main__"), "__spec__", None), "name", "") == "submitit.core._submit":
    # a job's task unpickling job_main (which imports this module before its arguments and
    # torch): watch the task's starter now, not after those imports (moebench/run/lifeline.py)
    watch_parent(init_means_gone=True)

POLL_S = 1.0
CANCEL_WAIT_S = 15.0  # after cancelling (Ctrl-C, SIGTERM): how long to wait for the jobs to end
CLUSTERS = ("slurm", "local", "debug")


@dataclass(frozen=True)
class SlurmOptions:
    partition: Optional[str] = None
    time_min: int = 60  # each job's time limit
    nodes: int = 1  # per job; its world size is split evenly over them
    cpus_per_task: Optional[int] = None
    cluster: str = "slurm"  # local: submitit's LocalExecutor (one machine, for tests)
    folder: Optional[str] = None  # submitit's logs and pickles (default <run>/slurm)

    def check(self, combos) -> None:
        """Bad input before any work: ValueError with what to do."""
        if self.cluster not in CLUSTERS:
            raise ValueError(f"--slurm-cluster {self.cluster!r}; valid: {', '.join(CLUSTERS)}")
        if self.time_min < 1 or self.nodes < 1:
            raise ValueError("--slurm-time and --slurm-nodes must be >= 1")
        if self.cluster != "slurm" and self.nodes != 1:
            raise ValueError(f"--slurm-cluster {self.cluster} runs on this machine: --slurm-nodes 1")
        try:
            import submitit  # noqa: F401 (whether it imports: the jobs are submitted below)
        except ImportError:
            raise ValueError("--slurm needs submitit: pip install 'moebench[slurm]'") from None
        for c in combos:
            if not c.reason and c.combo.world_size % self.nodes:
                raise ValueError(
                    f"{c.label}: world size {c.combo.world_size} does not split over --slurm-nodes {self.nodes}"
                )


def add_arguments(p) -> None:
    g = p.add_argument_group("SLURM (one job per combination family, through submitit)")
    g.add_argument("--slurm", action="store_true", help="run the work as SLURM jobs instead of here")
    g.add_argument("--slurm-partition", help="partition to submit to")
    g.add_argument("--slurm-time", type=int, default=60, metavar="MIN", help="time limit per job (default %(default)s)")
    g.add_argument("--slurm-nodes", type=int, default=1, help="nodes per job: a family's ranks split evenly over them")
    g.add_argument(
        "--slurm-cpus-per-task",
        type=int,
        default=None,
        metavar="N",
        help="CPU cores per task, one task a rank (submitit's cpus_per_task; default: the cluster's)",
    )
    g.add_argument(
        "--slurm-cluster",
        default="slurm",
        choices=CLUSTERS,
        help="slurm, or local: jobs as processes on this machine (submitit's LocalExecutor)",
    )
    g.add_argument("--slurm-folder", help="submitit's logs (default: <run>/slurm)")


def options_from_args(args) -> Optional[SlurmOptions]:
    if not getattr(args, "slurm", False):
        return None
    return SlurmOptions(
        args.slurm_partition,
        args.slurm_time,
        args.slurm_nodes,
        args.slurm_cpus_per_task,
        args.slurm_cluster,
        args.slurm_folder,
    )


def job_main(work: list, run_dir: str, meta: dict, token: str, port: int, local: bool) -> int:
    """One task of a job: one rank of the family's process group (moebench/dist_worker.py)."""
    import submitit

    from moebench.run.dist_worker import RankEnv, run_ranks

    # this task already watches its starter (watch_parent at the top of this module): a task
    # outliving its job step would hold a GPU
    je = submitit.JobEnvironment()
    per_node = je.num_tasks // max(1, je.num_nodes)
    env = RankEnv(
        je.global_rank, je.num_tasks, je.local_rank, per_node, "127.0.0.1" if local else je.hostnames[0], port
    )
    rows = run_ranks(work, run_dir, meta, env, token=token, log=print)
    return len(rows)


def clip(text: str, limit: int, where: str) -> str:
    """`text` whole when it fits `limit` characters; else cut at the last sentence (or line)
    end inside it, saying how much more there is and where: '... (N more chars in FILE)'."""
    text = text.strip()
    if len(text) <= limit:
        return text
    more = lambda n: f" … ({n} more chars in {where})"
    head = text[: max(0, limit - len(more(len(text))))]
    cut = max(head.rfind(". "), head.rfind(".\n"), head.rfind("\n"))
    head = head[: cut + 1] if cut > len(head) // 3 else head
    return head.rstrip() + more(len(text) - len(head))


def _last_line(path: Path) -> str:
    try:
        tail = path.read_text(errors="replace")[-4000:].splitlines()
    except OSError:
        return ""
    return next((ln.strip() for ln in reversed(tail) if ln.strip() and not ln.startswith("-")), "")


def _job_failure(job) -> str:
    """Why a job ended without a result, for a row's reason: submitit's error where the task
    left one (it raised: the error's first and last lines), else the last line a task wrote
    to stderr (killed, a node lost; moebench's own line first, e.g. a group that did not
    form), cut at a sentence with the file that has the rest. Without a result file,
    submitit's own error would first wait 15 s for one to appear."""
    paths = job.paths
    if paths.result_pickle.exists():
        try:
            lines = [ln.strip() for ln in str(job.exception() or "").splitlines() if ln.strip()]
        except Exception as e:  # noqa: BLE001 - the reason is all that is wanted
            lines = [f"{type(e).__name__}: {e}"]
        last = next((ln for ln in reversed(lines) if not ln.startswith(("-", "File ", "^"))), "")
        text = " ".join(dict.fromkeys(x for x in (lines[0] if lines else "", last) if x))
    else:
        tasks = [(k, job.task(k).paths.stderr if job.num_tasks > 1 else paths.stderr) for k in range(job.num_tasks)]
        said = [(k, err, _last_line(err)) for k, err in tasks]
        k, err, last = next((s for s in said if s[2].startswith("moebench")), None) or next(
            (s for s in said if s[2]), (0, paths.stderr, "")
        )
        text = f"task {k} last wrote: {last}" if last else "no task wrote to stderr"
        return clip(text, 600, str(err))
    return clip(text or "no message", 600, str(paths.stderr))


def _executor(opts: SlurmOptions, run_dir: Path):
    import submitit

    return submitit.AutoExecutor(folder=opts.folder or str(run_dir / "slurm"), cluster=opts.cluster)


def _submit(ex, opts: SlurmOptions, work: list, run_dir: Path, meta: dict, token: str):
    from moebench.run.launch import free_port

    c0 = work[0][0].combo
    per_node = c0.world_size // opts.nodes
    params = {
        "nodes": opts.nodes,
        "tasks_per_node": per_node,
        "timeout_min": opts.time_min,
        "gpus_per_node": per_node if c0.device == "cuda" else 0,
        "name": f"moebench-{meta['run_id']}",
    }
    if opts.cpus_per_task:
        params["cpus_per_task"] = opts.cpus_per_task
    if opts.partition:
        params["slurm_partition"] = opts.partition
    ex.update_parameters(**params)
    return ex.submit(job_main, work, str(run_dir), meta, token, free_port(), opts.cluster != "slurm")


def run_jobs(
    work: list, store, meta: dict, lock, opts: SlurmOptions, should_stop: Callable[[], bool] = lambda: False
) -> Generator[tuple[str, list[dict]], None, None]:
    """Submit one job per family, wait, resubmit a family's rest after a failure; yield
    (label, rows) for each combination as its rows land in the store."""
    from moebench.results.finished import write_finished
    from moebench.results.rank_result import Finished
    from moebench.results.store import invocation_files, invocation_rows
    from moebench.run.outcome import Observed, decide

    families: dict = {}
    for c, toks in work:
        families.setdefault(c.family, []).append((c, toks))
    ex = _executor(opts, store.dir)
    seen: set = set()  # row files of this invocation already reported
    done: set = set()  # combination keys with rows from this invocation

    def submit(w: list):
        job = _submit(ex, opts, w, store.dir, meta, lock.token)
        lock.add_job(job.job_id)  # its tasks may borrow the lock (moebench/results/lock.py)
        return job

    jobs = {fam: submit(w) for fam, w in families.items()}
    keys = {fam: {c.key for c, _ in w} for fam, w in families.items()}
    progress = {fam: 0 for fam in families}  # the family's combinations stored when its job started

    def collect() -> Iterator[tuple[str, list[dict]]]:
        for name, df in invocation_rows(store.rows_dir, meta["run_id"], skip=seen).items():
            seen.add(name)
            rows = df.to_dict("records")
            done.add(rows[0]["combo_key"])
            yield rows[0]["label"], rows

    try:
        while jobs:
            if should_stop():
                for job in jobs.values():
                    job.cancel(check=False)
                deadline = time.monotonic() + CANCEL_WAIT_S  # their tasks gone before the lock is
                while time.monotonic() < deadline and not all(job.done() for job in jobs.values()):
                    time.sleep(0.2)
                return
            yield from collect()
            for fam, job in list(jobs.items()):
                if not job.done():
                    continue
                yield from collect()
                rest = [(c, t) for c, t in families[fam] if c.key not in done]
                if rest and len(done & keys[fam]) == progress[fam]:  # nothing new stored: the job itself failed
                    c, toks = rest[0]
                    # lost (a node, the time limit, a group that never formed): a plain resume retries it
                    ended = f"SLURM job {job.job_id} ended ({job.state}) without a result: {_job_failure(job)}"
                    rows = write_finished(
                        store, Finished(c, list(toks), {}, decide(Observed(job_ended=ended))), meta, lock
                    )
                    seen.update(f.name for f in invocation_files(store.rows_dir, meta["run_id"], c.key))
                    done.add(c.key)
                    yield c.label, rows  # counted here, once: collect() skips the file
                    rest = rest[1:]
                families[fam] = rest
                progress[fam] = len(done & keys[fam])
                if rest:
                    jobs[fam] = submit(rest)
                else:
                    del jobs[fam]
            time.sleep(POLL_S)
    except (KeyboardInterrupt, GeneratorExit):  # a second Ctrl-C (run/sweep.py Aborted): no job outlives the sweep
        for job in jobs.values():
            job.cancel(check=False)
        raise
    yield from collect()
