"""`moebench sweep` / `moebench run`: plan, skip what is stored, launch, write
rows as each combination ends, stop cleanly on Ctrl-C."""

from __future__ import annotations

import signal
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Optional

from moebench.config.limits import NOISY_SPREAD
from moebench.config.paths import default_runs_dir
from moebench.config.plugins import problems as plugin_problems
from moebench.config.spec import Combination
from moebench.results.finished import plan_work, run_meta, write_finished
from moebench.results.foreign import refuse_foreign
from moebench.results.lock import RunLock
from moebench.results.rank_result import Finished
from moebench.results.row import BAD_STATUSES, Status
from moebench.results.store import RunStore, invocation_rows
from moebench.results.writable import describe as environment_error
from moebench.results.writable import probe
from moebench.run import cpu_memory, other_requests
from moebench.run import env as envmod
from moebench.run.plan import plan, planned, reason_groups, refuse_impossible, run_name
from moebench.run.progress import Progress
from moebench.util.safe_write import safe_dir
from moebench.util.words import agree, counted


class SweepCounts(Counter):
    """Rows written by one invocation, by status; `interrupted` when Ctrl-C stopped it,
    `terminated` when SIGTERM did; `env_error` (the line saying what) when the machine refused
    a write mid-sweep."""

    interrupted: bool = False
    terminated: bool = False
    env_error: str = ""

    def exit_code(self) -> int:
        """0 every row ok or skipped with a reason; 1 failed / incorrect / timeout / oom rows,
        or an environment error stopped the sweep; 130 interrupted, 143 terminated
        (docs/design.md, "Exit status")."""
        if self.env_error:
            return 1
        if self.terminated:
            return 143
        if self.interrupted:
            return 130
        return 1 if any(self.get(s) for s in BAD_STATUSES) else 0


class Aborted(KeyboardInterrupt):
    """A second Ctrl-C: the sweep stops where it is. Unwinding kills the combination in flight
    with its ranks (no row) and cancels SLURM jobs; what finished is stored. The command line
    prints its message as one line and exits 130 (moebench/cli/main.py)."""

    def __init__(self):
        super().__init__(
            "aborted (Ctrl-C again): the combination in flight was cancelled, finished combinations "
            "are stored. Re-run the same command to resume."
        )


class _Stop:
    """First Ctrl-C: stop after the current combination. Second: abort now (Aborted; a third is
    ignored, so that nothing interrupts the unwinding that kills the ranks). SIGTERM (SLURM's
    pre-emption, `timeout`, `docker stop`, which give seconds before a SIGKILL): stop now --
    the combination in flight is cancelled with its ranks and gets no row, SLURM jobs are
    cancelled, what finished is stored; exit 143."""

    def __init__(self):
        self.requested = False
        self.terminated = False
        self._old: dict = {}

    def __enter__(self):
        self._old = {
            signal.SIGINT: signal.signal(signal.SIGINT, self._handler),
            signal.SIGTERM: signal.signal(signal.SIGTERM, self._term),
        }
        return self

    def _handler(self, signum, frame):
        if self.requested:
            signal.signal(signal.SIGINT, signal.SIG_IGN)
            raise Aborted
        self.requested = True
        print("\nmoebench: stopping after the current combination (Ctrl-C again to abort now)", file=sys.stderr)

    def _term(self, signum, frame):
        if not self.terminated:
            print("\nmoebench: SIGTERM: stopping now (the combination in flight is cancelled)", file=sys.stderr)
        self.requested = self.terminated = True

    def __exit__(self, *exc):
        for sig, old in self._old.items():
            signal.signal(sig, old)


def dry_run_listing(work: list, combos: list, already: int) -> str:
    """What `sweep --dry-run` prints: each combination to run with its token counts, then
    the skipped ones counted by reason."""
    if work:
        lines = [f"would run {counted(len(work), 'combination')}, {counted(sum(len(t) for _, t in work), 'row')}:"]
        lines += [f"  {c.label}  tokens {', '.join(map(str, tokens))}" for c, tokens in work]
    elif already:
        lines = [f"would run nothing: {_all_stored(already)}"]
        already = 0  # said
    else:
        lines = ["would run nothing: no combination can run here"]
    reasons = [c.reason for c in combos if c.reason]
    reasons += [why for c in combos if not c.reason for why in c.token_reasons.values()]
    if reasons:
        lines.append(f"would skip {len(reasons)} (combination or token count), by reason:")
        lines += [f"  {n:4d}  {text}" for n, text in reason_groups(reasons)]
    if already:
        lines.append(f"{counted(already, 'row')} already stored (--redo failed|all to re-run them)")
    return "\n".join(lines)


def _all_stored(already: int) -> str:
    rows = "the 1 row that can run is" if already == 1 else f"all {already} rows that can run are"
    return f"{rows} already stored (--redo failed|all to re-run them)"


def summary_line(counts: "SweepCounts", already: int, nothing_to_do: bool, where: Path) -> str:
    """The sweep's last count, in words: what this invocation wrote by status, what was stored
    before it, or that there was nothing to do (every row that can run stored) or nothing written."""
    if nothing_to_do and already:
        return f"moebench: nothing to do: {_all_stored(already)}; results in {where}"
    parts = [f"{n} {getattr(status, 'value', status)}" for status, n in sorted(counts.items()) if n]
    wrote = (
        f"this invocation wrote {counted(sum(counts.values()), 'row')} ({', '.join(parts)})"
        if parts
        else "this invocation wrote no row"
    )
    stored = f"; {counted(already, 'row')} {agree(already, 'was', 'were')} stored before it" if already else ""
    return f"moebench: {wrote}{stored}; results in {where}"


def _trace_folders(combos: list[Combination]) -> set[Path]:
    """The run folder's subfolders the ranks will write traces into (trace=torch|nsys: the
    combination's trace_dir; profiler timing and nsys: traces/)."""
    out = set()
    for c in combos:
        if c.reason:
            continue
        if c.combo.trace in ("torch", "nsys"):
            out.add(Path(c.combo.trace_dir))
        if c.combo.trace == "nsys" or c.combo.timing == "profiler":
            out.add(Path("traces"))
    return out


def execute(
    cli_overrides: list[str],
    sweep: Optional[str],
    out: Optional[str],
    redo: str = "none",
    dry_run: bool = False,
    quiet: bool = False,
    oversubscribe: bool = False,
    wait: bool = False,
    slurm=None,
) -> tuple[Path, "SweepCounts"]:
    """Plan and run; returns the run directory and the status counts of this invocation.
    Bad input, or a run directory another sweep holds (unless `wait`), raise ValueError
    before any work. `slurm`: a moebench.run.slurm.SlurmOptions to run the work as jobs."""
    # SLURM jobs run on other machines: this one's cores and GPUs decide nothing
    combos, sweep_data = plan(
        cli_overrides, sweep, oversubscribe=oversubscribe, this_machine=slurm is None or slurm.cluster != "slurm"
    )
    refuse_impossible(combos)  # every combination breaks a rule: one line, exit 2, nothing written
    if slurm is None or slurm.cluster != "slurm":  # this machine's ranks: their weights must fit its memory
        combos = cpu_memory.check(combos, cli_overrides)
    if slurm is not None:
        slurm.check(combos)
    run_dir = Path(out) if out else default_runs_dir() / run_name(sweep_data["name"], cli_overrides)
    store = RunStore(run_dir)
    refuse_foreign(store)  # a checkout's root, a home folder: one line, exit 2, nothing written
    log = (lambda *a: None) if quiet else (lambda *a: print(*a, file=sys.stderr))
    if dry_run:
        info, eid, run_id = {}, "", "dry-run"
        lock = None
        for torn in store.torn_files() if store.rows_dir.is_dir() else ():
            log(f"moebench: {torn}: a sweep moves it to rows/.corrupt/ and measures its rows again")
    else:
        probe(run_dir)  # a full disk, a read-only folder or a file in the way: exit 2 before any work
        for folder in _trace_folders(combos):  # a link there: one line, exit 2, before any work
            safe_dir(run_dir, *folder.parts)
        lock = RunLock.acquire(run_dir, wait=wait, log=log)
    try:
        if lock is not None:
            store.clean_temp()  # a writer killed between write and rename left these
            for torn, moved in store.set_aside_torn():
                log(f"moebench: {torn}: moved to {moved}; its rows are measured again")
            info = envmod.fingerprint()
            eid = envmod.env_id(info)
            run_id = uuid.uuid4().hex[:10]
        meta = run_meta(run_id, sweep_data["name"], info, eid)
        skipped, work, already = plan_work(combos, store, redo, meta)
        counts = SweepCounts({Status.SKIPPED: len(skipped)})
        log(f"moebench: {planned(combos, work, len(skipped), already)} -> {run_dir}")
        mixed = other_requests.notice(store, combos, sweep_data["name"], cli_overrides, dry_run)
        if mixed:  # extending a run is allowed, but said: its report and comparisons change
            log(mixed)
        for note in sweep_data.get("notes", ()):  # e.g. a device section's model share left out
            log(f"moebench: {note}")
        for line in plugin_problems():  # docs/plugins.md: the rest of the sweep runs
            log(f"moebench: {line}")
        if any(c.combo.trace == "nsys" and not c.reason for c in combos):
            from moebench.traces.nsys import NSYS_MISSING, nsys_available

            if not nsys_available():
                log(f"moebench: {NSYS_MISSING}")
        if lock is None:  # --dry-run
            if not quiet:
                print(dry_run_listing(work, combos, already))
            return run_dir, counts
        store.write_env({**info, "env_id": eid}, run_id)
        store.write_json(
            f"sweep-{run_id}.json",
            {"sweep": sweep_data, "cli_overrides": cli_overrides, "run_id": run_id, "slurm": bool(slurm)},
        )
        store.write_skipped(skipped)
        _run(work, store, meta, lock, counts, log, quiet, slurm, already)
        if not work and not already:
            log(nothing_ran(combos))
        return run_dir, counts
    finally:
        if lock is not None:
            lock.release()


def _report(label: str, rows: list[dict], progress: Progress, quiet: bool) -> None:
    """Bad rows printed through the bar; wide-spread rows counted for the summary."""
    for r in rows:
        if r["status"] in BAD_STATUSES:
            if not quiet:
                progress.write(f"  {r['status']}: {label} T={r['tokens_per_rank']}: {r['reason']}")
        elif r["status"] == Status.OK and r["latency_us_p80"] > NOISY_SPREAD * r["latency_us_p20"]:
            progress.wide.append((r["latency_us_p80"] / r["latency_us_p20"], f"{label} T={r['tokens_per_rank']}"))


def _skip_of(c: Combination) -> tuple[bool, str]:
    """(whether no machine runs it, why) of a combination none of whose token counts runs: its own
    reason, or its token counts' (each distinct one once)."""
    if c.reason and (c.rule or not c.ruled_out):
        return c.rule, c.reason
    by_token = c.token_rules if c.ruled_out else c.token_reasons
    return c.ruled_out, "; ".join(dict.fromkeys(by_token.values()))


def nothing_ran(combos: list[Combination]) -> str:
    """What a sweep that ran nothing ends with: every combination skipped, on this machine (a
    library, GPUs, CUDA) and, named apart, by a rule of the plan that no machine lifts (where every
    one is, the sweep was refused: refuse_impossible); the combinations counted by reason, then
    what to do."""
    skips = [_skip_of(c) for c in combos]
    machine = [why for rule, why in skips if not rule]
    rules = [why for rule, why in skips if rule]
    where = " on this machine"
    if rules:
        where = f": {len(machine)} on this machine, {len(rules)} by a rule of the plan that no machine lifts"
    lines = [f"moebench: nothing ran: every combination was skipped{where}; combinations by reason:"]
    lines += [f"  {n:4d}  {why}" for n, why in reason_groups(machine)]
    lines += [f"  {n:4d}  [rule] {why}" for n, why in reason_groups(rules)]
    todo = "run them on a machine that has what the reasons above ask for (`moebench env` shows what this one has)"
    if rules:
        todo += "; no machine runs the [rule] ones: change or drop those options"
    lines.append(f"moebench: to measure them, {todo}; `moebench list -v` with the same options lists each combination")
    return "\n".join(lines)


def _run(
    work, store: RunStore, meta: dict, lock: RunLock, counts: SweepCounts, log, quiet: bool, slurm, already: int = 0
) -> None:
    """Run the work here (one process group per family) or as SLURM jobs; count the rows."""
    from moebench.run.harness_time import HarnessTally

    progress = Progress(0 if quiet else len(work))
    tally = HarnessTally()

    def on_finished(fin: Finished) -> None:
        rows = write_finished(store, fin, meta, lock)
        tally.add(rows)
        counts.update(r["status"] for r in rows)
        _report(fin.combo.label, rows, progress, quiet)
        progress.update(fin.combo.label, counts, 0 if fin.rest_follows else 1)

    with _Stop() as stop:
        try:
            if slurm is not None:
                from moebench.run.slurm import run_jobs

                jobs = run_jobs(work, store, meta, lock, slurm, should_stop=lambda: stop.requested)
                try:
                    for label, rows in jobs:
                        tally.add(rows)
                        counts.update(r["status"] for r in rows)
                        _report(label, rows, progress, quiet)
                        progress.update(label, counts)
                finally:
                    jobs.close()  # an abort between two rows: the jobs cancelled before the lock goes
            else:
                from moebench.run.launch import Launcher  # torch: only where ranks start, not for --dry-run

                Launcher(
                    str(store.dir),
                    on_finished,
                    should_stop=lambda: stop.requested,
                    should_abort=lambda: stop.terminated,
                ).run(work)
        except OSError as e:
            # a full disk or a folder turned read-only: the rows written so far stay (each file
            # is whole or absent); measuring on would only lose more, so the sweep stops here
            counts.env_error = environment_error(e, store.dir) or ""
            if not counts.env_error:
                raise
        except Aborted:
            progress.close(keep=False)
            raise
        finally:
            progress.close()
    if progress.summary():
        log(progress.summary())
    line = tally.line()
    if line:
        log(line)
    log(summary_line(counts, already, not work, store.dir))
    if counts[Status.OK] and not counts.env_error and not counts.interrupted and not counts.terminated:
        log(f"moebench: next: moebench report {store.dir}  (or moebench compare {store.dir} OTHER_RUN)")
    if counts.env_error:
        # what is on disk, not what was counted: a write can fail after its file is in place
        # (the folder's fsync after the rename), and its rows are stored all the same
        try:
            written = sum(len(df) for df in invocation_rows(store.rows_dir, meta["run_id"]).values())
        except OSError:  # the disk refuses reads too: what was counted
            written = sum(n for status, n in counts.items() if status != Status.SKIPPED)
        print(
            f"moebench: environment error: {counts.env_error}; the sweep stopped, keeping the "
            f"{counted(written, 'measured row')} it stored: fix that, then re-run the same command to resume",
            file=sys.stderr,
        )
    elif stop.terminated:
        counts.terminated = True
        log(
            f"moebench: terminated (SIGTERM): the work in flight was cancelled"
            f"{' (its SLURM jobs too)' if slurm else ''};"
            " finished combinations are stored. Re-run the same command to resume."
        )
    elif stop.requested:
        counts.interrupted = True
        log("moebench: interrupted; finished combinations are stored. Re-run the same command to resume.")
