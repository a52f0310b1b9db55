"""Writes never follow a link out of a run folder (issue #31, item 2): a symbolic link planted
at `RUN/report/`, `RUN/report/report.md`, `RUN/traces/`, an --out folder's file or
results/README.md makes `moebench report` / `compare` / `trace --plot` / the results index stop
with one line naming the link and exit 2, before anything is written, and the link's target
is left as it was; reading through a link still works. Below them, moebench/util/safe_write.py
itself: folders, files, hard links and FIFOs."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest

from moebench import cli
from moebench.results.synthetic import make_row, synthetic_run, write_run
from moebench.util.safe_write import (
    LinkRefused,
    NotCreatable,
    NotMade,
    TakesNoFiles,
    check_dir,
    check_dir_below,
    refuse_links,
    replace_text,
    safe_dir,
    safe_dir_below,
    write_bytes,
    write_text,
)

FIX = Path(__file__).parents[1] / "fixtures" / "traces"
CPU_TRACE = FIX / "cpu_phases.json.gz"  # a CPU run's torch trace: phase ranges, no GPU kernels


def _main(argv, capsys):
    rc = cli.main([str(a) for a in argv])
    out = capsys.readouterr()
    return rc, out.out, out.err


def _one_line_naming(err: str, path: Path) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert f"{path} is a symbolic link" in lines[0] and "moebench writes no file through a link" in lines[0]


def _victim(tmp_path) -> Path:
    victim = tmp_path / "elsewhere"
    victim.mkdir()
    (victim / "keep.txt").write_text("keep")
    return victim


def _untouched(victim: Path) -> None:
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert (victim / "keep.txt").read_text() == "keep"


# -- moebench report ------------------------------------------------------------------


def test_a_symlinked_report_folder_is_refused(tmp_path, capsys):
    run, victim = synthetic_run(tmp_path / "run"), _victim(tmp_path)
    (run / "report").symlink_to(victim, target_is_directory=True)
    rc, out, err = _main(["report", run], capsys)
    assert rc == 2 and out == ""
    _one_line_naming(err, run / "report")
    _untouched(victim)


def test_a_symlinked_report_md_is_refused_before_any_plot(tmp_path, capsys):
    run, victim = synthetic_run(tmp_path / "run"), _victim(tmp_path)
    (run / "report").mkdir()
    (run / "report" / "report.md").symlink_to(victim / "keep.txt")
    rc, out, err = _main(["report", run], capsys)
    assert rc == 2 and out == ""
    _one_line_naming(err, run / "report" / "report.md")
    _untouched(victim)
    assert sorted(p.name for p in (run / "report").iterdir()) == ["report.md"]  # no plot written either


def test_a_symlinked_plot_or_table_file_is_refused(tmp_path, capsys):
    run, victim = synthetic_run(tmp_path / "run"), _victim(tmp_path)
    (run / "report").mkdir()
    (run / "report" / "latency.png").symlink_to(victim / "keep.txt")
    rc, _, err = _main(["report", run], capsys)
    assert rc == 2
    _one_line_naming(err, run / "report" / "latency.png")
    (run / "report" / "latency.png").unlink()
    (run / "report" / "report.json").symlink_to(victim / "keep.txt")
    rc, _, err = _main(["report", run, "--format", "json"], capsys)
    assert rc == 2
    _one_line_naming(err, run / "report" / "report.json")
    _untouched(victim)
    assert sorted(p.name for p in (run / "report").iterdir()) == ["report.json"]


def test_a_link_in_an_out_folder_is_refused_the_out_folder_itself_may_be_one(tmp_path, capsys):
    base = synthetic_run(tmp_path / "base")
    cand = synthetic_run(tmp_path / "cand", scale=2.0, seed=5)
    victim = _victim(tmp_path)
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").symlink_to(victim / "keep.txt")
    rc, _, err = _main(["compare", base, cand, "--out", out], capsys)
    assert rc == 2
    _one_line_naming(err, out / "report.md")
    _untouched(victim)
    # --out naming a link to a folder: the user's own choice of folder, written into
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "via").symlink_to(real, target_is_directory=True)
    rc, _, _ = _main(["compare", base, cand, "--out", tmp_path / "via"], capsys)
    assert rc == 1 and (real / "report.md").is_file()  # 1: the candidate is slower


def test_a_hard_linked_report_md_is_refused(tmp_path, capsys):
    run, victim = synthetic_run(tmp_path / "run"), _victim(tmp_path)
    (run / "report").mkdir()
    os.link(victim / "keep.txt", run / "report" / "report.md")
    rc, _, err = _main(["report", run], capsys)
    assert rc == 2 and "is a hard link of another file" in err and len(err.strip().splitlines()) == 1
    _untouched(victim)


@pytest.mark.parametrize(
    "argv",
    [
        ["report", "{cand}"],
        ["report", "--baseline", "{base}", "--candidate", "{cand}"],
        ["compare", "{base}", "{cand}"],
        ["compare", "{cand}", "--axis", "reduction=finalize:experts"],
    ],
)
def test_a_report_checks_its_files_for_links_once_before_reading_the_runs(argv, tmp_path, capsys, monkeypatch):
    from moebench.report import document, load

    runs = {"base": synthetic_run(tmp_path / "base"), "cand": synthetic_run(tmp_path / "cand", scale=2.0, seed=5)}
    events: list[str] = []

    def refuse(folder, names):
        events.append("links")
        return refuse_links(folder, names)

    def reading(path):
        events.append("read")
        return load_run(path)

    load_run = load.load_run
    monkeypatch.setattr(document, "refuse_links", refuse)
    for module in (document, load):
        monkeypatch.setattr(module, "load_run", reading)
    rc, _, _ = _main([a.format(**runs) for a in argv], capsys)
    assert rc in (0, 1)
    assert events[0] == "links" and events.count("links") == 1 and "read" in events, events


def test_a_run_reached_through_a_link_is_read_and_reported(tmp_path, capsys):
    """Reading follows links: a run folder named through one reports as usual, inside itself."""
    run = synthetic_run(tmp_path / "run")
    (tmp_path / "latest").symlink_to(run, target_is_directory=True)
    rc, _, _ = _main(["report", tmp_path / "latest"], capsys)
    assert rc == 0 and (run / "report" / "report.md").is_file()


def test_capacity_and_tune_results_refuse_a_linked_output(tmp_path, capsys):
    run, victim = synthetic_run(tmp_path / "run"), _victim(tmp_path)
    (run / "report").mkdir()
    (run / "report" / "capacity.md").symlink_to(victim / "keep.txt")
    rc, _, err = _main(["report", run, "--capacity", "--budget", "16GiB"], capsys)
    assert rc == 2
    _one_line_naming(err, run / "report" / "capacity.md")
    (run / "report" / "best_per_size.json").symlink_to(victim / "keep.txt")
    rc, _, err = _main(["tune", "--results", run], capsys)
    assert rc == 2
    _one_line_naming(err, run / "report" / "best_per_size.json")
    _untouched(victim)


# -- moebench trace --plot ------------------------------------------------------------


def _traced_run(tmp_path) -> tuple[Path, Path]:
    """A run whose traces/ is a link to a folder outside it (the traces themselves are there)."""
    row = make_row(
        "naive",
        "torch",
        "experts",
        "dispatch",
        "bf16",
        16,
        samples_us=[100.0] * 5,
        world_size=2,
        combo_key="k0",
        label="naive/torch/experts/dispatch/bf16/tiny/ws2",
    )
    run = write_run(tmp_path / "run", pd.DataFrame([row]))
    outside = tmp_path / "outside_traces"
    (outside / "k0").mkdir(parents=True)
    for r in (0, 1):
        shutil.copy(CPU_TRACE, outside / "k0" / f"rank{r}_T16.json.gz")
    (run / "traces").symlink_to(outside, target_is_directory=True)
    return run, outside


def test_a_symlinked_traces_folder_is_read_but_not_written_through(tmp_path, capsys):
    run, outside = _traced_run(tmp_path)
    before = sorted(p.relative_to(outside) for p in outside.rglob("*"))
    rc, out, err = _main(["trace", run], capsys)  # reading follows the link
    assert rc == 0 and "naive/torch/experts/dispatch/bf16/tiny/ws2 — rank 0, 16 tokens" in out
    rc, out, err = _main(["trace", run, "--plot"], capsys)  # writing beside the traces would leave the run
    assert rc == 2 and out == ""
    _one_line_naming(err, run / "traces")
    assert "give --out DIR" in err
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before
    # with --out the figures go there, and only there
    rc, out, _ = _main(["trace", run, "--plot", "--out", tmp_path / "plots"], capsys)
    assert rc == 0 and (tmp_path / "plots" / "k0" / "rank0_T16.json.gz.timeline.png").is_file()
    assert sorted(p.relative_to(outside) for p in outside.rglob("*")) == before


def test_a_symlinked_timeline_png_is_refused_before_any_figure(tmp_path, capsys):
    run, outside = _traced_run(tmp_path)
    (run / "traces").unlink()
    shutil.copytree(outside, run / "traces")
    victim = _victim(tmp_path)
    (run / "traces" / "k0" / "rank1_T16.json.gz.timeline.png").symlink_to(victim / "keep.txt")
    rc, out, err = _main(["trace", run, "--plot"], capsys)
    assert rc == 2 and out == ""
    _one_line_naming(err, run / "traces" / "k0" / "rank1_T16.json.gz.timeline.png")
    _untouched(victim)
    assert not list((run / "traces").rglob("rank0_T16.json.gz.timeline.png"))  # nothing written before


# -- results/README.md ----------------------------------------------------------------


def test_the_results_index_refuses_a_linked_readme(tmp_path, capsys):
    from moebench.report import results_index

    root, victim = tmp_path / "results", _victim(tmp_path)
    (root / "q").mkdir(parents=True)
    (root / "q" / "about.md").write_text("# A question?\n")
    (root / "README.md").symlink_to(victim / "keep.txt")
    assert results_index.main(["--root", str(root)]) == 2
    err = capsys.readouterr().err
    assert f"{root / 'README.md'} is a symbolic link" in err and len(err.strip().splitlines()) == 1
    _untouched(victim)
    (root / "README.md").unlink()
    assert results_index.main(["--root", str(root)]) == 0 and "A question?" in (root / "README.md").read_text()


# -- moebench/util/safe_write.py -----------------------------------------------------------


def test_safe_dir_creates_real_folders_and_refuses_a_link_below_the_base(tmp_path):
    victim = _victim(tmp_path)
    base = tmp_path / "run"
    d = safe_dir(base, "report", "vs-x")
    assert d == base / "report" / "vs-x" and d.is_dir() and not d.is_symlink()
    (base / "traces").symlink_to(victim, target_is_directory=True)
    with pytest.raises(LinkRefused, match="traces is a symbolic link"):
        safe_dir(base, "traces", "k0")
    (base / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(LinkRefused):
        safe_dir(base, "dangling")
    assert not (tmp_path / "nowhere").exists()
    (base / "afile").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        safe_dir(base, "afile")
    with pytest.raises(ValueError, match="must not leave it"):
        safe_dir(base, "..", "x")
    with pytest.raises(NotADirectoryError, match="afile"):  # --out naming a file: an environment error, one line
        safe_dir(base / "afile")
    _untouched(victim)


def test_check_dir_refuses_what_safe_dir_would_and_makes_nothing(tmp_path):
    """check_dir: safe_dir's answer (the path, or its refusal) without making a folder, so that a
    command checks its report folder before reading its inputs and leaves none when refused."""
    victim = _victim(tmp_path)
    base = tmp_path / "run"
    assert check_dir(base, "report", "vs-x") == base / "report" / "vs-x"
    assert check_dir(tmp_path / "a" / "b") == tmp_path / "a" / "b"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere"]  # nothing made
    base.mkdir()
    (base / "traces").symlink_to(victim, target_is_directory=True)
    with pytest.raises(LinkRefused, match="traces is a symbolic link"):
        check_dir(base, "traces", "k0")
    (base / "afile").write_text("x")
    with pytest.raises(ValueError, match="is not a folder"):
        check_dir(base, "afile")
    with pytest.raises(ValueError, match="must not leave it"):
        check_dir(base, "..", "x")
    for out in (base / "afile", base / "afile" / "sub"):  # --out naming a file, or one on its way
        with pytest.raises(NotADirectoryError, match="afile"):
            check_dir(out)
    assert sorted(p.name for p in base.iterdir()) == ["afile", "traces"]
    _untouched(victim)


def test_check_dir_below_and_safe_dir_below_take_a_full_path_below_the_base(tmp_path):
    """The report folder is named by its full path (the run's report/vs-x, or --out itself)."""
    base, victim = tmp_path / "base", _victim(tmp_path)
    base.mkdir()
    assert check_dir_below(base, base / "report" / "vs-x") == base / "report" / "vs-x"
    assert check_dir_below(base, base) == base and not list(base.iterdir())  # nothing made
    assert safe_dir_below(base, base / "report" / "vs-x").is_dir()
    (base / "traces").symlink_to(victim, target_is_directory=True)
    for fn in (check_dir_below, safe_dir_below):
        with pytest.raises(LinkRefused, match="traces is a symbolic link"):
            fn(base, base / "traces" / "k0")
        with pytest.raises(ValueError, match="is not below"):
            fn(base, tmp_path / "other")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["base", "elsewhere"]
    _untouched(victim)


@pytest.mark.parametrize("kind", ["read_only", "not_ours", "not_creatable_user", "not_searchable"])
def test_check_dir_says_what_a_write_would_meet_and_makes_nothing(kind, tmp_path, monkeypatch):
    """A read-only file system (statvfs), a folder not ours (os.access), /proc to a user (os.access,
    then mkdir's ENOENT), a folder not searchable (/root to a user: stat and lstat below it answer
    EACCES, which Path.exists() raised bare): check_dir raises what safe_dir's mkdir meets, before anything is made, and
    both name the same folders: the one asked for, and the first that could not be made when that is
    a parent of it (safe_dir named only the first, check_dir only the one asked for). The same for
    root and a user (tests/support/refusing_fs.py)."""
    from refusing_fs import REFUSALS, refusing

    from moebench.results.writable import GIVE_OUT, describe

    code, cause = REFUSALS[kind]
    fs = refusing(monkeypatch, tmp_path / "fs", kind)
    for args, asked, first in [
        ((fs / "out" / "deeper",), fs / "out" / "deeper", fs / "out"),  # a missing base, two folders down
        ((fs / "out", "report"), fs / "out" / "report", fs / "out"),  # a missing base and a folder below it
        ((fs, "report", "vs-x"), fs / "report" / "vs-x", fs / "report"),  # below an existing base
        ((fs, "report"), fs / "report", fs / "report"),  # the first is the one asked for
    ]:
        made = f" ({first} could not be made)" if first != asked else ""
        line = f"{asked}: {cause}{made}; {GIVE_OUT}"
        for fn in (check_dir, safe_dir):
            with pytest.raises(NotMade) as e:
                fn(*args)
            assert e.value.errno == code and describe(e.value) == line, fn
    assert not list(fs.iterdir())  # the base itself, where a file is asked: the test below


@pytest.mark.parametrize("kind", ["read_only", "not_ours", "not_searchable", "not_creatable", "not_creatable_user"])
def test_an_existing_folder_that_takes_no_file_is_refused_by_check_dir_and_the_probe_alike(kind, tmp_path, monkeypatch):
    """check_dir of an existing folder asks it with a probe file, as the sweep's probe (writable.probe_in)
    does, through one probe (moebench/util/probe.py open_probe): a read-only one, one not ours, /root
    itself to a user are NotMade; /proc, where no file is made (ENOENT, to root as to a user), is
    TakesNoFiles. Each is one line naming the folder, the same from both, and nothing is made."""
    from refusing_fs import REFUSALS, refusing

    from moebench.results.writable import GIVE_OUT, NO_FILES, describe, probe_in

    makes_none = kind.startswith("not_creatable")
    code, cause = (errno.ENOENT, NO_FILES) if makes_none else REFUSALS[kind]
    fs = refusing(monkeypatch, tmp_path / "fs", kind)
    for fn in (check_dir, probe_in):
        with pytest.raises(TakesNoFiles if makes_none else NotMade) as e:
            fn(fs)
        assert e.value.errno == code and describe(e.value) == f"{fs}: {cause}; {GIVE_OUT}", fn
    assert not list(fs.iterdir())


@pytest.mark.parametrize("folder", ["/proc", "/sys"])
def test_check_dir_of_a_real_folder_that_takes_no_file(folder):
    """The real ones, not refusing_fs's stand-ins: /proc makes no file (its lookup answers ENOENT
    before any permission is asked, to root as to a user), so check_dir and the probe say TakesNoFiles,
    where os.access lets root write; /sys answers EACCES (or EROFS where it is mounted read-only)."""
    from moebench.results.writable import GIVE_OUT, NO_FILES, describe, probe_in

    if not os.path.ismount(folder):
        pytest.skip(f"{folder} is not mounted here")
    if folder == "/proc" and os.statvfs(folder).f_flag & os.ST_RDONLY:
        pytest.skip("/proc is mounted read-only here: check_dir says so before it asks for a file")
    for fn in (check_dir, probe_in):
        with pytest.raises(NotMade) as e:
            fn(folder)
        line = describe(e.value)
        if folder == "/proc":
            assert isinstance(e.value, TakesNoFiles) and line == f"/proc: {NO_FILES}; {GIVE_OUT}", fn
        else:
            assert e.value.errno in (errno.EACCES, errno.EPERM, errno.EROFS), fn
            assert line is not None and line.startswith("/sys: ") and line.endswith(GIVE_OUT), fn


def test_check_dir_makes_nothing_where_mkdir_contradicts_os_access(tmp_path, monkeypatch):
    """check_dir asks mkdir why os.access says no (/proc to a user: ENOENT, not EACCES); a mkdir that
    succeeds all the same is undone, and the folder is reported as one that can be made."""
    real = os.access

    def access(path, mode, **kwargs):
        return False if Path(path) == tmp_path else real(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", access)
    assert check_dir(tmp_path / "out" / "deeper") == tmp_path / "out" / "deeper"
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("meanwhile", ["filled", "taken"])
def test_check_dir_asks_mkdir_for_a_name_of_its_own_never_the_users(meanwhile, tmp_path, monkeypatch):
    """Where os.access says no but may be wrong (CAP_DAC_OVERRIDE, NFS, ACLs), mkdir is asked for a
    probe folder of moebench's own name in the existing folder, never for the folder the user named:
    that one may be another process's, made meanwhile. A probe that is filled before it is removed
    (rmdir's ENOTEMPTY), or a name taken already (EEXIST), is no error of the user's folder."""
    from moebench.results.store import RunStore
    from moebench.util.probe import PROBE_PREFIX

    real_access, real_mkdir, asked = os.access, os.mkdir, []

    def mkdir(path, *args, **kwargs):
        asked.append(Path(path))
        if meanwhile == "taken":
            raise FileExistsError(17, os.strerror(17), str(path))
        real_mkdir(path, *args, **kwargs)
        (Path(path) / "landed").write_text("another process's")

    monkeypatch.setattr(os, "access", lambda p, mode, **k: False if Path(p) == tmp_path else real_access(p, mode, **k))
    monkeypatch.setattr(os, "mkdir", mkdir)
    assert check_dir(tmp_path / "out") == tmp_path / "out"
    assert [p.parent for p in asked] == [tmp_path] and asked[0].name.startswith(PROBE_PREFIX)
    assert not (tmp_path / "out").exists()
    if meanwhile == "filled":  # a probe folder something was put in is left: not the store's to empty
        assert RunStore(tmp_path).clean_temp() == [] and (asked[0] / "landed").is_file()


def test_safe_dir_says_a_folder_the_file_system_will_not_make_is_not_creatable():
    """mkdir -p under /proc answers ENOENT: NotCreatable, the environment's one line (writable.describe),
    naming the folder asked for and the first one that could not be made."""
    from moebench.results.writable import NOT_CREATABLE, describe

    out = f"/proc/moebench-{os.getpid()}/x"
    with pytest.raises(NotCreatable) as e:
        safe_dir(out)
    assert describe(e.value) == (
        f"{out}: cannot be created here: the file system makes no folders there, as in /proc or /sys "
        f"(/proc/moebench-{os.getpid()} could not be made); give --out a folder you can write"
    )
    assert NOT_CREATABLE in describe(e.value)


def test_writes_refuse_links_hard_links_and_fifos_and_leave_their_targets(tmp_path):
    victim = _victim(tmp_path)
    target = victim / "keep.txt"
    (tmp_path / "soft").symlink_to(target)
    for fn in (write_text, replace_text):
        with pytest.raises(LinkRefused, match="soft is a symbolic link"):
            fn(tmp_path / "soft", "overwritten")
    with pytest.raises(LinkRefused):
        write_bytes(tmp_path / "soft", b"overwritten")
    (tmp_path / "dangling").symlink_to(tmp_path / "created_outside")
    with pytest.raises(LinkRefused):
        write_text(tmp_path / "dangling", "x")
    assert not (tmp_path / "created_outside").exists()
    os.link(target, tmp_path / "hard")
    with pytest.raises(LinkRefused, match="hard link of another file"):
        write_text(tmp_path / "hard", "overwritten")
    # replacing a hard link makes a new file: the other name keeps its text
    replace_text(tmp_path / "hard", "new")
    assert (tmp_path / "hard").read_text() == "new"
    os.mkfifo(tmp_path / "fifo")
    with pytest.raises(ValueError, match="not a regular file"):
        write_text(tmp_path / "fifo", "x")  # neither blocks nor writes
    _untouched(victim)
    # a link for the folder: the file inside it is refused too
    (tmp_path / "dir_link").symlink_to(victim, target_is_directory=True)
    with pytest.raises(LinkRefused, match="dir_link is a symbolic link"):
        write_text(tmp_path / "dir_link" / "new.txt", "x")
    with pytest.raises(LinkRefused, match="dir_link is a symbolic link"):
        refuse_links(tmp_path, ["dir_link/new.txt"])
    _untouched(victim)
    # plain files: written, emptied before rewriting, replaced whole; no temp file left
    assert write_text(tmp_path / "a.txt", "long text").read_text() == "long text"
    assert write_text(tmp_path / "a.txt", "short").read_text() == "short"
    assert replace_text(tmp_path / "a.txt", "whole").read_text() == "whole"
    assert not list(tmp_path.glob(".a.txt.*.tmp"))


def test_a_sweep_that_traces_refuses_a_symlinked_traces_folder_before_any_work(tmp_path, capsys):
    """trace=torch: the ranks would write their traces below RUN/traces; a link there stops the
    sweep with one line and exit 2 before it locks, plans or measures anything. RUN is a run (its
    rows/): a folder holding only the link is no run, refused for that before the link is looked at."""
    run, victim = tmp_path / "run", _victim(tmp_path)
    (run / "rows").mkdir(parents=True)
    (run / "traces").symlink_to(victim)
    rc, out, err = _main(
        [
            "sweep",
            "--out",
            run,
            "backend=local",
            "experts=torch",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.tokens_per_rank=[4]",
            "trace=torch",
            "runner.reps=1",
            "runner.warmup=0",
            "runner.phase_reps=1",
        ],
        capsys,
    )
    assert rc == 2
    _one_line_naming(err, run / "traces")
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"] and sorted(run.rglob("*")) == [
        run / "rows",
        run / "traces",
    ]
