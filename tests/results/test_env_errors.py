"""Environment errors (issue 31, item 7; docs/design.md, "Environment errors and torn files"):
a full disk, a read-only folder, `--out` naming a file or a `.lock` that is a folder are one
line naming the path and the cause; before any work the command exits 2, and a sweep that
meets one mid-run keeps its rows, says how to resume and exits 1.

How each condition is made, so that the tests run in CI without root:
- a full disk mid-sweep: the parent's parquet write raises OSError(ENOSPC) as pyarrow does on a
  full disk (errno set, no file name), injected in-process (the rows are written by the
  sweeping process, moebench/run/sweep.py `write_finished`); a real full filesystem before any
  work: a 64 KiB tmpfs filled up, mounted in a user namespace (`unshare -rm`), skipped where
  the kernel allows none.
- a read-only folder: chmod 0o555; where that does not bind (root), the immutable flag
  (chattr +i, EPERM even for root); skipped where neither binds (root without
  CAP_LINUX_IMMUTABLE).
- a file of a run that cannot be read (a row file or env.json): chmod 0o000; where that does not
  bind (root), its readers (pyarrow's parquet reads, Path.read_text) raise what pyarrow raises for
  it (PermissionError, errno set, no file name).
"""

from __future__ import annotations

import errno
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow.parquet as pq
import pytest

from moebench import cli
from moebench.results import writable
from moebench.results.store import READ_ADVICE, RunStore, Unreadable
from moebench.results.synthetic import synthetic_run
from tests.run.test_sweep_cpu import children

QUICK = ["runner.reps=3", "runner.warmup=0", "runner.phase_reps=1", "runner.memory=false"]
LOCAL = [
    "backend=local",
    "experts=torch",
    "overlap=none",
    "quant=bf16",
    "model=tiny",
    "workload.tokens_per_rank=[4]",
    *QUICK,
]
ONE = [*LOCAL, "reduction=experts"]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    return lines[0]


@pytest.fixture
def read_only():
    """make(path): `path` (a folder) read-only for this process, undone at teardown."""
    made: list[tuple[Path, bool]] = []

    def make(path: Path) -> Path:
        path.mkdir(parents=True, exist_ok=True)
        os.chmod(path, 0o555)
        immutable = False
        if os.access(path, os.W_OK):  # root: permissions do not bind; the immutable flag does
            immutable = (
                subprocess.run(["chattr", "+i", str(path)], capture_output=True).returncode == 0
                if shutil.which("chattr")
                else False
            )
        made.append((path, immutable))
        try:
            (path / "probe").touch()
        except OSError:
            return path
        (path / "probe").unlink()
        pytest.skip("nothing makes a folder read-only for this process (root without CAP_LINUX_IMMUTABLE)")

    yield make
    for path, immutable in made:
        if immutable:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        os.chmod(path, 0o755)


def test_out_naming_a_file_is_one_line_and_exit_2_before_any_work(tmp_path, capsys):
    f = tmp_path / "afile"
    f.write_text("keep")
    assert cli.main(["sweep", *ONE, "--out", str(f)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith("moebench sweep: environment error: ") and f"{f}: not a directory" in line
    assert cli.main(["sweep", *ONE, "--out", str(f / "sub")]) == 2  # a file in the folder's path
    assert f"{f / 'sub'}: not a directory" in _one_line(capsys.readouterr().err)
    assert f.read_text() == "keep"
    # a report's and a comparison's --out naming a file: the same, before any reading
    run = tmp_path / "missing-is-not-reached"
    run.mkdir()
    assert cli.main(["report", str(run), "--out", str(f)]) == 2
    assert "moebench report: environment error:" in _one_line(capsys.readouterr().err)
    other = tmp_path / "another-run"  # two runs: one run on both sides is refused before --out is looked at
    other.mkdir()
    assert cli.main(["compare", str(run), str(other), "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "moebench compare: environment error:" in err and f"{f}: not a directory" in err
    assert f.read_text() == "keep"


def test_an_out_folder_the_file_system_will_not_make_is_one_line_and_exit_2(capsys):
    """mkdir under /proc answers ENOENT (not EACCES): the sweep still says so in one line, exit 2."""
    out = f"/proc/moebench-{os.getpid()}/run"
    assert cli.main(["sweep", *ONE, "--out", out]) == 2
    line = _one_line(capsys.readouterr().err)
    first = f"/proc/moebench-{os.getpid()}"
    assert line == (
        f"moebench sweep: environment error: {out}: {writable.NOT_CREATABLE} ({first} could not be made); "
        f"{writable.GIVE_OUT}; nothing was measured"
    )
    assert children() == []


def test_a_lock_that_is_a_folder_is_one_line_and_exit_2(tmp_path, capsys):
    run = tmp_path / "run"
    (run / ".lock").mkdir(parents=True)
    assert cli.main(["sweep", *ONE, "--out", str(run)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert ".lock" in line and "Traceback" not in line
    assert not (run / "rows").exists()


def test_a_read_only_run_folder_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, read_only):
    run = read_only(tmp_path / "run")
    assert cli.main(["sweep", *ONE, "--out", str(run)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"moebench sweep: environment error: {run}: ")
    assert ("permission denied" in line or "operation not permitted" in line) and "nothing was measured" in line
    assert children() == []


def test_report_and_compare_into_a_read_only_folder_exit_2_not_1(tmp_path, capsys, read_only):
    from moebench.results.synthetic import synthetic_run

    base, cand = synthetic_run(tmp_path / "base"), synthetic_run(tmp_path / "cand", scale=3.0)  # 3x slower
    ro = read_only(tmp_path / "ro")
    # 1 would read as "slower" to CI: a folder that cannot be written is 2, whatever the rows say
    assert cli.main(["compare", str(base), str(cand), "--out", str(ro / "cmp")]) == 2
    line = _one_line(capsys.readouterr().err)
    assert line.startswith(f"moebench compare: environment error: {ro / 'cmp'}: ")
    assert cli.main(["report", str(base), "--out", str(ro)]) == 2
    assert f"moebench report: environment error: {ro}: " in _one_line(capsys.readouterr().err)
    # without --out the report goes inside the run: a read-only run says where else to write
    read_only(Path(base))
    assert cli.main(["report", str(base)]) == 2
    line = _one_line(capsys.readouterr().err)
    assert f"{base / 'report'}: " in line and line.endswith(f"; {writable.GIVE_OUT}")
    assert not list(ro.iterdir())


@pytest.mark.multiprocess
def test_a_full_disk_mid_sweep_keeps_the_rows_says_how_to_resume_and_a_resume_completes(tmp_path, capsys, monkeypatch):
    run = tmp_path / "run"
    two = [*LOCAL, "reduction=experts,finalize"]
    writes = []
    real = pd.DataFrame.to_parquet

    def disk_full_after_one(self, path, *a, **kw):
        writes.append(path)  # this sweep has no skipped rows: every write is a row file's
        if len(writes) > 1:  # pyarrow's ENOSPC: errno set, no file name
            raise OSError(errno.ENOSPC, "Error writing bytes to file. Detail: [errno 28] No space left on device")
        return real(self, path, *a, **kw)

    monkeypatch.setattr(pd.DataFrame, "to_parquet", disk_full_after_one)
    assert cli.main(["sweep", *two, "--out", str(run)]) == 1
    monkeypatch.setattr(pd.DataFrame, "to_parquet", real)
    err = capsys.readouterr().err
    line = next(ln for ln in err.splitlines() if "environment error" in ln)
    assert line.startswith(f"moebench: environment error: {run / 'rows'}/") and ".parquet: no space left" in line
    assert "keeping the 1 measured row it stored" in line and "re-run the same command to resume" in line
    assert "Traceback" not in err
    kept = RunStore(run).load()
    assert len(kept) == 1 and set(kept["status"]) == {"ok"}  # the row written before the full disk
    assert not list((run / "rows").glob(".tmp-*"))  # the refused write left nothing behind
    assert children() == []  # the ranks went with the sweep
    # the same command resumes: only the combination the disk refused runs, and the lock is free
    assert cli.main(["sweep", *two, "--out", str(run)]) == 0
    assert "this invocation wrote 1 row (1 ok); 1 row was stored before it" in capsys.readouterr().err
    df = RunStore(run).load()
    assert len(df) == 2 and set(df["status"]) == {"ok"} and set(df["reduction"]) == {"experts", "finalize"}


def _userns_mount_works() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"], capture_output=True)
    return probe.returncode == 0


@pytest.mark.multiprocess
@pytest.mark.skipif(not _userns_mount_works(), reason="no user namespace to mount a small filesystem in")
def test_a_really_full_filesystem_before_any_work_is_exit_2(tmp_path):
    """A 64 KiB tmpfs, filled, in a mount namespace of its own (gone with the process)."""
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    script = (
        f"mount -t tmpfs -o size=64k tmpfs {mnt} && (dd if=/dev/zero of={mnt}/filler bs=4k 2>/dev/null; true) "
        f"&& exec {sys.executable} -m moebench.cli sweep {' '.join(map(shlex.quote, ONE))} --out {mnt}/run"
    )
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert done.returncode == 2, done.stderr
    line = _one_line(done.stderr)
    assert line == f"moebench sweep: environment error: {mnt}/run: no space left on the device; nothing was measured"


def test_a_folder_not_made_rebuilt_from_its_errno_and_path_is_still_described():
    """with_path(replace=True) and safe_write's _named rebuild an OSError as type(e)(errno, msg, path):
    a NotMade so rebuilt has no first folder of its own, and reads as the folder asked for."""
    from moebench.util.safe_write import NotCreatable, NotMade

    for cls, cause in ((NotMade, writable.CAUSES[errno.EACCES]), (NotCreatable, writable.NOT_CREATABLE)):
        code = errno.ENOENT if cls is NotCreatable else errno.EACCES
        e = writable.with_path(cls(code, os.strerror(code), "/old"), "/new", replace=True)
        assert type(e) is cls and writable.describe(e) == f"/new: {cause}; {writable.GIVE_OUT}"


@pytest.mark.parametrize("asker", ["check_dir", "probe_in"])
def test_a_probe_file_a_kill_leaves_in_a_run_folder_is_removed_by_clean_temp(asker, tmp_path, monkeypatch):
    """check_dir asks an existing folder with a probe file (report's check of `--out RUN`), and the
    sweep's probe (writable.probe_in) with one of its own, each made and removed at once; a kill
    between the two leaves it. check_dir's was `.moebench-probe-<hex>`, a name the store's clean_temp
    did not know: both are one probe now (moebench/util/probe.py open_probe), named like the store's
    temp files, so the next sweep's clean_temp removes the leftover, and no reader sees it meanwhile."""
    from moebench.results.synthetic import synthetic_run
    from moebench.util.safe_write import check_dir

    run = synthetic_run(tmp_path / "run")
    before, rows = sorted(p.name for p in run.iterdir()), len(RunStore(run).load())
    real = os.unlink

    def killed(path, *args, **kwargs):  # as a kill between the probe's open and its unlink
        if Path(path).parent == run:
            raise KeyboardInterrupt
        return real(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", killed)
    with pytest.raises(KeyboardInterrupt):
        (check_dir if asker == "check_dir" else writable.probe_in)(run)
    monkeypatch.setattr(os, "unlink", real)
    (left,) = [p for p in run.iterdir() if p.name not in before]
    assert left.is_file() and len(RunStore(run).load()) == rows  # the rows read as before
    assert RunStore(run).clean_temp() == [left]
    assert sorted(p.name for p in run.iterdir()) == before


@pytest.fixture
def unreadable(monkeypatch):
    """make(path): the file `path` unreadable to this process, as chmod 0o000 makes it for a user."""
    refused: set[Path] = set()
    real_file, real_table, real_frame, real_text = pq.ParquetFile, pq.read_table, pd.read_parquet, Path.read_text

    def refuse(path) -> None:
        if isinstance(path, (str, os.PathLike)) and Path(path) in refused:  # as pyarrow words it: no file name
            detail = f"Detail: [errno 13] {os.strerror(errno.EACCES)}"
            raise PermissionError(errno.EACCES, f"Failed to open local file '{path}'. {detail}")

    def make(path: Path) -> Path:
        os.chmod(path, 0o000)
        if os.access(path, os.R_OK):  # root: permissions do not bind; its readers refuse it instead
            refused.add(path)
            monkeypatch.setattr(pq, "ParquetFile", lambda p, *a, **k: refuse(p) or real_file(p, *a, **k))
            monkeypatch.setattr(pq, "read_table", lambda p, *a, **k: refuse(p) or real_table(p, *a, **k))
            monkeypatch.setattr(pd, "read_parquet", lambda p, *a, **k: refuse(p) or real_frame(p, *a, **k))
            monkeypatch.setattr(Path, "read_text", lambda p, *a, **k: refuse(p) or real_text(p, *a, **k))
        return path

    yield make
    for path in refused:
        os.chmod(path, 0o644)


def test_trace_import_rewrites_no_row_file_of_a_run_where_one_cannot_be_read(tmp_path, capsys, unreadable):
    """Rows naming nsys captures, the second row file unreadable: the store rewrote the first and passed
    over the second unsaid (a half-imported run, exit 0). Now the store reads every file before it rewrites
    one (update_rows), and `trace --import` checks the run's files before it exports anything: exit 2,
    the line naming the file, no row file changed."""
    from moebench.run.nsys_import import resolve_nsys_rows
    from moebench.traces.nsys import record_capture

    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    for n, key in enumerate(("a", "b"), 1):
        row = {"combo_key": key, "tokens_per_rank": 4, "status": "ok", "trace_path": "", "latency_us_median": 1.0}
        pd.DataFrame([row]).to_parquet(run / "rows" / f"{key}-T4.parquet", index=False)
        record_capture(run, 11, n, key, 4, 0, "torch.cuda.nvtx")
    (run / "traces" / "nsys" / "ranks_11.1.sqlite").write_bytes(b"SQLite format 3\0")
    (run / "traces" / "nsys" / "ranks_11.2.qdstrm").write_bytes(b"")  # a capture to export
    before = {f: f.read_bytes() for f in sorted((run / "rows").glob("*.parquet"))}
    bad = unreadable(run / "rows" / "b-T4.parquet")
    with pytest.raises(Unreadable) as e:
        resolve_nsys_rows(run)
    assert e.value.filename == str(bad)
    assert cli.main(["trace", "--import", str(run)]) == 2  # before it looks for the host tools, or exports
    line = _one_line(capsys.readouterr().err)
    assert line == f"moebench trace: environment error: {bad}: permission denied; {READ_ADVICE}"
    assert {f: f.read_bytes() for f in before} == before
    assert not (run / "traces" / "nsys" / "ranks_11.2.nsys-rep").exists()


@pytest.mark.parametrize(
    "cmd", ["report", "report_file", "compare", "tune", "env_json", "sweep", "trace", "trace_import"]
)
def test_an_unreadable_file_of_a_run_is_named_and_not_answered_with_out(cmd, tmp_path, capsys, unreadable):
    """A row file (or env.json) the user may not read: one line naming it and saying to make it
    readable, exit 2, before any work; it said 'permission denied; give --out a folder you can write'
    (pyarrow's error names no file; the CLI advised --out for every report's refusal), which no --out helps.
    `trace` read the run's labels, and `trace --import` rewrote its rows, passing over such a file
    unsaid (its rows unlabelled, or left naming no export) as if it were torn."""
    run = synthetic_run(tmp_path / "run")
    if cmd == "trace":  # a trace to name by the run's labels
        (run / "traces" / "k").mkdir(parents=True)
        shutil.copy(
            ROOT / "tests" / "fixtures" / "traces" / "h200_deepep_ht_combine_rank0_T4096.json.gz", run / "traces" / "k"
        )
    bad = unreadable(run / "env.json" if cmd == "env_json" else sorted((run / "rows").glob("*.parquet"))[-1])
    argv = {
        "report": ["report", run],
        "report_file": ["report", bad],
        "compare": ["compare", synthetic_run(tmp_path / "base"), run],
        "tune": ["tune", "--results", run],
        "env_json": ["report", run],
        "sweep": ["sweep", *ONE, "--out", run],
        "trace": ["trace", run],
        "trace_import": ["trace", "--import", run],
    }[cmd]
    name = argv[0]
    assert cli.main([str(a) for a in argv]) == 2
    line = _one_line(capsys.readouterr().err)
    advice = "make it readable; nothing was measured" if name == "sweep" else READ_ADVICE
    assert line == f"moebench {name}: environment error: {bad}: permission denied; {advice}"
    assert "--out" not in line
    assert not (run / "report").exists()
