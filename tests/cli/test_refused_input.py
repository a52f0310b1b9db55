"""Bad input and an unwritable --out, for the commands that read runs (report, compare, trace,
tune --results): one line, exit 2, and nothing left behind (moebench/cli/main.py; the report
folder is checked before the runs are read and made only once there is a report to write,
moebench/report/document.py ReportDir).

- an --out the file system will not make (as /proc, where mkdir answers ENOENT; a read-only file
  system; a folder not ours; one below a folder the user may not search, as /root) is the
  environment's one line, not a traceback and exit 3 (or 1): the same line for every command,
  sweep's included, and for root and a user (tests/support/refusing_fs.py); an existing --out that
  takes no file says the same, to give another;
- a command refused for its input (a file given as a run, an axis value no row has, a folder of
  foreign parquet) leaves no empty report folder in the run or in an unrelated folder;
- a plain file given as a run is 'a file, not a run folder', not a torn row file;
- a run folder or its rows/ that may not be listed says it cannot be read, not to give --out;
- a trace file that cannot be read (below a folder the user may not search, or of mode 000) says to
  pass a trace file, not a run, one can read;
- input refused is its one line alone: a report's note (a committed run's) comes once the runs are
  read, and one folder on both sides of a comparison is itself one line (tests/cli/test_same_run.py)."""

from __future__ import annotations

import builtins
import errno
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from refusing_fs import REFUSALS, refusing

from moebench import cli
from moebench.results.synthetic import synthetic_run
from moebench.results.writable import GIVE_OUT, NO_FILES

CPU_TRACE = Path(__file__).parents[1] / "fixtures" / "traces" / "cpu_phases.json.gz"


def _main(argv, capsys) -> tuple[int, str]:
    rc = cli.main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def _one_line(err: str) -> str:
    lines = [ln for ln in err.strip().splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


@pytest.fixture
def run(tmp_path) -> Path:
    """A synthetic run whose rows have reduction = finalize and experts, and a trace in traces/."""
    run = synthetic_run(tmp_path / "run")
    (run / "traces" / "abc").mkdir(parents=True)
    shutil.copy(CPU_TRACE, run / "traces" / "abc" / CPU_TRACE.name)
    return run


SWEEP = ["sweep", "backend=local", "experts=torch", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny"]


def _writer_argv(cmd: str, run, tmp_path) -> list:
    """The command line of each command that writes below --out (given after it)."""
    return {
        "report": ["report", run],
        "compare": ["compare", synthetic_run(tmp_path / "base"), run],
        "trace": ["trace", "--plot", run],
        "tune": ["tune", "--results", run],
        "sweep": SWEEP,
    }[cmd]


@pytest.mark.parametrize("kind", REFUSALS)
@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune", "sweep"])
@pytest.mark.parametrize("deeper", [False, True])
def test_an_out_the_file_system_will_not_make_is_one_line_and_exit_2(
    cmd, kind, deeper, run, tmp_path, capsys, monkeypatch
):
    """--out in a folder that makes no folder (as /proc), a read-only one, one not ours, or one not
    searchable (as /root to a user): one wording for every command (report, compare and trace check
    the folder before they read, sweep and tune meet mkdir's answer; /proc was 'permission denied' in
    the first three to a user, 'cannot be created here' in the others, and below /root their line
    was Path.exists()'s bare 'permission denied'), for root and a user (tests/support/refusing_fs.py);
    it names the folder asked for and, when it lies deeper, the first one that could not be made."""
    fs = refusing(monkeypatch, tmp_path / "fs", kind)
    out = fs / cmd / "deeper" if deeper else fs / cmd
    argv = _writer_argv(cmd, run, tmp_path)
    asked = out / "abc" if cmd == "trace" else out  # trace: the PNGs' folder below --out, as the run's traces/abc
    before = _tree(tmp_path)
    rc, err = _main([*argv, "--out", out], capsys)
    assert rc == 2
    made = f" ({fs / cmd} could not be made)" if asked != fs / cmd else ""
    tail = "; nothing was measured" if cmd == "sweep" else ""
    cause = REFUSALS[kind][1]
    assert _one_line(err) == f"moebench {cmd}: environment error: {asked}: {cause}{made}; {GIVE_OUT}{tail}"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("kind", list(REFUSALS))
@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune", "sweep"])
def test_an_existing_out_that_takes_no_file_says_to_give_another(cmd, kind, run, tmp_path, capsys, monkeypatch):
    """An --out that exists but takes no file (read-only, not ours; /root itself to a user; /proc,
    where no file is made, to root as to a user): the same line as a folder that cannot be made
    there, advice included (report and compare said only 'permission denied', sweep and tune
    likewise, where --out new below it said to give another; /proc itself ended in a traceback)."""
    fs = refusing(monkeypatch, tmp_path / "fs", kind)
    argv = _writer_argv(cmd, run, tmp_path)
    asked = fs / "abc" if cmd == "trace" else fs  # trace: the PNGs' folder below --out
    before = _tree(tmp_path)
    rc, err = _main([*argv, "--out", fs], capsys)
    assert rc == 2
    tail = "; nothing was measured" if cmd == "sweep" else ""
    # /proc: no file is made in --out itself; trace makes a folder below it, and no folder is made either
    cause = NO_FILES if kind.startswith("not_creatable") and cmd != "trace" else REFUSALS[kind][1]
    assert _one_line(err) == f"moebench {cmd}: environment error: {asked}: {cause}; {GIVE_OUT}{tail}"
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune"])
def test_a_run_below_a_folder_the_user_may_not_search_says_it_cannot_be_read(cmd, run, tmp_path, capsys, monkeypatch):
    """A run below a folder the user may not search (/root to a user: Path.exists() raises EACCES)
    is one line saying it cannot be read, exit 2; it said 'permission denied; give --out a folder you
    can write', which no --out helps."""
    fs = refusing(monkeypatch, tmp_path / "fs", "not_searchable")
    os.rename(run, fs / "run")
    hidden = fs / "run"
    argv = {
        "report": ["report", hidden],
        "compare": ["compare", hidden, hidden],
        "trace": ["trace", "--plot", hidden],
        "tune": ["tune", "--results", hidden],
    }[cmd]
    rc, err = _main(argv, capsys)
    assert rc == 2
    line = f"moebench {cmd}: error: {hidden}: cannot be read (Permission denied): pass a run you can read"
    assert _one_line(err) == line


@pytest.mark.parametrize("folder", ["run", "rows"])
@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune"])
def test_a_run_folder_that_may_not_be_listed_says_it_cannot_be_read(cmd, folder, run, capsys, monkeypatch):
    """A run folder, or its rows/, the user may not list (mode 000, another user's 700): one line
    saying it cannot be read, exit 2; it said 'RUN/rows/skipped.parquet: permission denied; give --out
    a folder you can write' (or RUN/report, RUN/traces), which no --out helps."""
    shut = run / "rows" if folder == "rows" else run
    access = os.access
    # what chmod 0o000 does to a user (root lists any folder): os.access says no
    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == shut else access(p, mode, **k))
    argv = {
        "report": ["report", run],
        "compare": ["compare", run, run],
        "trace": ["trace", run],
        "tune": ["tune", "--results", run],
    }[cmd]
    rc, err = _main(argv, capsys)
    assert rc == 2
    line = f"moebench {cmd}: error: {shut}: cannot be read (Permission denied): pass a run you can read"
    assert _one_line(err) == line


@pytest.mark.parametrize("name", [CPU_TRACE.name, "synthetic_nsys.sqlite"])
@pytest.mark.parametrize("where", ["below_unsearchable", "mode_000"])
def test_a_trace_file_that_cannot_be_read_speaks_of_a_trace_file(where, name, tmp_path, capsys, monkeypatch):
    """`trace FILE` for a trace file one may not read says to pass a trace file one can read: below a
    folder the user may not search it said 'pass a run you can read', of mode 000 'not a readable JSON
    trace ([Errno 13] ...)' ('not a readable SQLite file (unable to open database file)')."""
    given = tmp_path / name
    shutil.copy(CPU_TRACE.parent / name, given)
    if where == "below_unsearchable":
        fs = refusing(monkeypatch, tmp_path / "fs", "not_searchable")
        os.rename(given, fs / name)
        given, tail = fs / name, "pass a trace file you can read"
    else:
        os.chmod(given, 0o000)
        tail = "make it readable or pass a trace file you can read"
        if os.access(given, os.R_OK):  # root: permissions do not bind; opening it is refused instead
            real = open

            def refused(path, *args, **kwargs):
                if isinstance(path, (str, os.PathLike)) and Path(path) == given:
                    raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
                return real(path, *args, **kwargs)

            monkeypatch.setattr(builtins, "open", refused)
    rc, err = _main(["trace", given], capsys)
    assert rc == 2
    assert _one_line(err) == f"moebench trace: error: {given}: cannot be read (Permission denied): {tail}"


def _foreign(folder: Path) -> Path:
    """A folder whose only parquet file holds no moebench rows."""
    folder.mkdir()
    pd.DataFrame({"a": [1, 2]}).to_parquet(folder / "x.parquet")
    return folder


@pytest.mark.parametrize("case", ["file_as_base", "bogus_axis_value", "foreign_parquet", "file_and_unrelated_folder"])
def test_a_refused_command_leaves_no_report_folder_behind(case, run, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# not a run\n")
    somedir = tmp_path / "somedir"
    somedir.mkdir()
    argv = {
        "file_as_base": ["compare", readme, run],
        "bogus_axis_value": ["compare", run, "--axis", "reduction=finalize:bogus"],
        "foreign_parquet": ["report", _foreign(tmp_path / "fake")],
        "file_and_unrelated_folder": ["compare", readme, somedir],
    }[case]
    before = _tree(tmp_path)
    rc, err = _main(argv, capsys)
    assert rc == 2
    assert _one_line(err).startswith(f"moebench {argv[0]}: error: ")
    assert _tree(tmp_path) == before  # no report/, report/vs-…, report/axis-… anywhere


def test_the_report_folder_is_made_once_there_is_a_report(run, capsys):
    """The other side of the rule: a command that succeeds still makes its folders."""
    rc, _ = _main(["compare", run, "--axis", "reduction=finalize:experts"], capsys)
    assert rc in (0, 1)
    assert (run / "report" / "axis-reduction-finalize-experts" / "report.md").is_file()


@pytest.mark.parametrize("cmd", ["report", "compare", "trace", "tune"])
def test_a_plain_file_given_as_a_run_is_one_line_saying_so(cmd, run, tmp_path, capsys):
    readme = tmp_path / "README.md"
    readme.write_text("# not a run\n")
    argv = {
        "report": ["report", readme],
        "compare": ["compare", readme, run],
        "trace": ["trace", readme],
        "tune": ["tune", "--results", readme],
    }[cmd]
    before = _tree(tmp_path)
    rc, err = _main(argv, capsys)
    assert rc == 2
    line = _one_line(err)
    assert line.startswith(f"moebench {cmd}: error: {readme}: a file, not a run folder (pass the folder ")
    assert "torn" not in line and "no rows" not in line
    assert _tree(tmp_path) == before


@pytest.mark.parametrize("case", ["committed_folder", "same_empty_folder", "same_file", "same_missing"])
def test_input_refused_before_a_note_is_its_one_line(case, tmp_path, monkeypatch, capsys):
    """The note a report may open with (a committed run's 'is committed: writing to ...') comes once the
    runs are read: input refused is one line alone (the same folder on both sides is such input)."""
    monkeypatch.setenv("MOEBENCH_RUNS", str(tmp_path / "runs"))
    (tmp_path / "empty").mkdir()
    (tmp_path / "README.md").write_text("# not a run\n")
    argv = {
        "committed_folder": ["report", Path(__file__).parents[2] / "results"],  # the repository's: no run
        "same_empty_folder": ["compare", tmp_path / "empty", tmp_path / "empty"],
        "same_file": ["compare", tmp_path / "README.md", tmp_path / "README.md"],
        "same_missing": ["compare", tmp_path / "nowhere", tmp_path / "nowhere"],
    }[case]
    before = _tree(tmp_path)
    rc, err = _main(argv, capsys)
    assert rc == 2
    assert _one_line(err).startswith(f"moebench {argv[0]}: error: ")
    assert _tree(tmp_path) == before


def test_a_report_folder_is_made_once(run, monkeypatch):
    """ReportDir.make makes the folder and probes it with a file, without making it again."""
    from moebench.report.document import report_dir

    made, mkdir = [], os.mkdir
    monkeypatch.setattr(os, "mkdir", lambda path, *a, **k: made.append(Path(path)) or mkdir(path, *a, **k))
    out = report_dir(run, None, "vs-x").make()
    assert out == run / "report" / "vs-x" and out.is_dir() and not list(out.iterdir())
    assert made.count(out) == 1, made


@pytest.mark.parametrize("target", ["file", "run"])
def test_a_trace_that_fails_to_read_leaves_no_plot_folder_behind(target, run, tmp_path, capsys):
    """trace --plot --out checks its folders before reading and makes one only for a PNG drawn."""
    bad = run / "traces" / "abc" / "rank0_T16.json.gz"
    bad.write_bytes(b"not gzip")
    if target == "run":  # every trace of the run unreadable: each skipped, then the error
        (run / "traces" / "abc" / CPU_TRACE.name).unlink()
    out = tmp_path / "plots" / "here"
    before = _tree(tmp_path)
    rc, err = _main(["trace", "--plot", bad if target == "file" else run, "--out", out], capsys)
    assert rc == 2
    last = err.strip().splitlines()[-1]
    if target == "file":
        assert _one_line(err) == last
    assert last.startswith("moebench trace: error: ") and str(bad) in last and "Traceback" not in err
    assert _tree(tmp_path) == before  # neither plots/ nor plots/here/abc


def test_a_trace_drawn_under_out_makes_its_folder(run, tmp_path, capsys):
    """The other side: a readable trace's PNG goes under --out, its folder made then."""
    out = tmp_path / "plots"
    rc, _ = _main(["trace", "--plot", run, "--out", out], capsys)
    assert rc == 0
    assert [p.relative_to(out).as_posix() for p in out.rglob("*.png")] == [f"abc/{CPU_TRACE.name}.timeline.png"]
