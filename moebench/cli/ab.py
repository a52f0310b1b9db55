"""`moebench ab BASE_REV CAND_REV OVERRIDES...`: baseline and candidate measured together.

The two git revisions are checked out as detached worktrees (``OUT/src/base``,
``OUT/src/cand``); each plans the overrides with its own code (`moebench list --json`),
and every combination of either plan is run by each worktree's own `moebench sweep`
(its code, its config groups, its kernels), one combination at a time, A then B, so
that drift of the machine (clocks, temperature, a neighbour) hits both sides alike.
Both runs land in ``OUT/base`` and ``OUT/cand`` and end with `moebench compare`
(``OUT/report``), whose exit status this returns. Re-running the same command resumes:
stored rows are skipped by each sweep.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

from moebench.cli import options
from moebench.config.paths import default_runs_dir
from moebench.run.treestate import git_env
from moebench.util.words import counted

# variables that would point a worktree's moebench at this checkout's files
LEAKED_ENV = ("MOEBENCH_CONF_DIR", "MOEBENCH_SWEEPS_DIR", "MOEBENCH_GIT_SHA", "MOEBENCH_RUNS")

# the comparison's statuses (a revision's sweep with failed rows is no 1 of its own: its broken rows are)
EXIT_STATUS = options.exit_status(
    "0 the two runs compared (moebench compare) with no regression",
    f"1 {options.REGRESSION}, or no row of the two revisions pairs (their combinations differ)",
    "2 bad input (a revision git does not know, overrides either revision's moebench refuses, no valid "
    f"combination in either revision's plan, an unknown option) or {options.ENVIRONMENT}",
    f"3 the comparison {options.NO_VERDICT}, either revision's sweep or list exiting 3 included",
    "130 interrupted (the measured combinations are stored: the same command resumes)",
)


def register(sub) -> None:
    """`ab` under the top level's subparsers."""
    ab = options.command(
        sub,
        "ab",
        "measure two git revisions alternately, one combination at a time, then compare",
        options.EPILOG + "\n\n" + EXIT_STATUS,
    )
    ab.add_argument("base_rev", metavar="BASE_REV", help="the baseline's git revision: a branch, tag or sha")
    ab.add_argument("cand_rev", metavar="CAND_REV", help="the candidate's git revision")
    options.overrides(
        ab, "group=option, key=value or comma lists, as `moebench sweep` takes them (below), planned by each revision"
    )
    ab.add_argument("--sweep", default="default", help="named sweep in the revisions' sweeps/ (default: %(default)s)")
    options.out(
        ab,
        "directory for the worktrees, both runs and the comparison "
        "(default: runs/ab-<base>-<cand>-<hash of the overrides>)",
    )
    ab.add_argument("--keep-worktrees", action="store_true", help="leave the two checkouts in place")
    ab.add_argument("--repo", help="the git repository the revisions are in (default: the working directory's)")
    options.compare_options(ab)


def _git(repo: Path, *args: str) -> str:
    try:
        # no optional locks (treestate.git_env): a `git commit` in the repository meanwhile must not fail
        done = subprocess.run(
            ["git", "--no-optional-locks", "-C", str(repo), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=git_env(),
        )
    except FileNotFoundError:
        raise ValueError("moebench ab needs git on PATH") from None
    if done.returncode:
        raise ValueError(f"git {' '.join(args)} in {repo}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout.strip()


def resolve(repo: Path, rev: str) -> str:
    """The full commit sha of a revision (ValueError naming it when git knows none)."""
    try:
        return _git(repo, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except ValueError:
        raise ValueError(
            f"{rev!r} names no commit in {repo}: give a branch, tag or sha (`git log --oneline` lists them)"
        ) from None


def checkout(repo: Path, sha: str, where: Path) -> Path:
    """A detached worktree of `sha` at `where` (reused when it is already there at that commit)."""
    if (where / ".git").exists():
        if _git(where, "rev-parse", "HEAD") == sha:
            return where
        raise ValueError(f"{where} holds another checkout: remove it (git worktree remove {where}) or pick --out")
    where.parent.mkdir(parents=True, exist_ok=True)
    _git(repo, "worktree", "add", "--detach", str(where), sha)
    return where


def remove(repo: Path, where: Path) -> None:
    if (where / ".git").exists():
        _git(repo, "worktree", "remove", "--force", str(where))


def tree_env(tree: Path, sha: str) -> dict:
    """The environment a worktree's moebench runs in: its own files first on the path, the
    commit it is named (env.json's git_sha), none of this checkout's overrides."""
    env = {k: v for k, v in os.environ.items() if k not in LEAKED_ENV}
    env["PYTHONPATH"] = os.pathsep.join([str(tree)] + [p for p in [os.environ.get("PYTHONPATH")] if p])
    env["MOEBENCH_GIT_SHA"] = sha
    return env


def _moebench(tree: Path, sha: str, args: list[str], capture: bool = False) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "moebench.cli", *args]
    done = subprocess.run(
        cmd,
        cwd=tree,
        env=tree_env(tree, sha),
        text=True,
        stdout=subprocess.PIPE if capture else None,
        stderr=subprocess.PIPE if capture else None,
    )
    if done.returncode == 130:
        raise KeyboardInterrupt
    err = (done.stderr or "").strip().splitlines()
    if done.returncode == 2:
        raise ValueError(
            f"{tree.name} ({sha[:10]}): moebench {args[0]} refused the input"
            + (f": {err[-1]}" if err else " (its message is above)")
        )
    if done.returncode == options.NO_RESULT:  # that revision's moebench or the machine failed: comparing
        # what it left (rows missing, or no plan) would give a verdict on a crash, "broken" or "empty"
        raise RuntimeError(
            f"{tree.name} ({sha[:10]}): moebench {args[0]} failed (exit {options.NO_RESULT}, moebench or the machine)"
            + (f": {err[-1]}" if err else "; its traceback is above")
        )
    return done


def planned(tree: Path, sha: str, sweep: str, overrides: list[str]) -> list[dict]:
    """The combinations a worktree's code plans for the overrides (`moebench list --json`)."""
    done = _moebench(tree, sha, ["list", "--json", "--sweep", sweep, *overrides], capture=True)
    if done.returncode:
        raise ValueError(f"{tree.name} ({sha[:10]}): moebench list failed: {done.stderr.strip()[-500:]}")
    try:
        return json.loads(done.stdout)
    except json.JSONDecodeError:
        raise ValueError(
            f"{tree.name} ({sha[:10]}): `moebench list --json` printed no JSON (too old a revision for moebench ab?)"
        ) from None


def schedule(base: list[dict], cand: list[dict]) -> list[list[str]]:
    """The override lists to run, each once: the base plan's valid combinations in its
    order, then those only the candidate's plan holds (a new option, say)."""
    out: list[list[str]] = []
    for entry in base + cand:
        ovs = list(entry["overrides"])
        if entry["status"] == "valid" and ovs not in out:
            out.append(ovs)
    return out


def default_out(base_sha: str, cand_sha: str, overrides: list[str]) -> Path:
    h = hashlib.sha1("\0".join(sorted(overrides)).encode()).hexdigest()[:8]
    return default_runs_dir() / f"ab-{base_sha[:8]}-{cand_sha[:8]}-{h}"


def ab_command(args) -> int:
    """CLI body (module doc); returns the comparison's exit status."""

    repo = Path(getattr(args, "repo", None) or _git(Path.cwd(), "rev-parse", "--show-toplevel"))
    shas = {"base": resolve(repo, args.base_rev), "cand": resolve(repo, args.cand_rev)}
    out = Path(args.out) if args.out else default_out(shas["base"], shas["cand"], list(args.overrides))
    out = out.resolve()
    trees = {side: out / "src" / side for side in shas}
    log = lambda text: print(f"moebench ab: {text}", file=sys.stderr)
    try:
        for side, sha in shas.items():
            checkout(repo, sha, trees[side])
        plans = {side: planned(trees[side], shas[side], args.sweep, list(args.overrides)) for side in shas}
        todo = schedule(plans["base"], plans["cand"])
        if not todo:
            raise ValueError("no valid combination in either revision's plan: `moebench list` says why")
        log(
            f"{counted(len(todo), 'combination')}, each run by {args.base_rev} ({shas['base'][:10]}) then "
            f"{args.cand_rev} ({shas['cand'][:10]}) -> {out}"
        )
        for i, ovs in enumerate(todo, 1):
            for side in ("base", "cand"):
                log(f"[{i}/{len(todo)}] {side}: {' '.join(ovs)}")
                _moebench(trees[side], shas[side], ["sweep", "--sweep", args.sweep, "--out", str(out / side), *ovs])
    finally:
        if not args.keep_worktrees:
            for tree in trees.values():
                try:
                    remove(repo, tree)
                except ValueError as e:  # leave it, say so
                    log(f"could not remove {tree}: {e}")
    return _compared(args, out)


def _compared(args, out: Path) -> int:
    """compare_command on the two revisions' runs; 1 where their rows never pair (the measuring is done:
    a broken comparison, not bad input), with the line saying why."""
    from moebench.cli.report import compare_command
    from moebench.report.overlap import NoPairs

    try:
        return compare_command(
            [str(out / "base"), str(out / "cand")],
            None,
            str(out / "report"),
            args.threshold,
            args.format,
            args.fail_on,
            names=(args.base_rev, args.cand_rev),
            cpu_verdict=args.cpu_verdict,
        )
    except NoPairs as e:
        print(f"moebench ab: no row of {args.cand_rev} pairs with one of {args.base_rev}: {e}", file=sys.stderr)
        return 1
