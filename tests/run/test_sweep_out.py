"""What a sweep's --out takes (docs/design.md, "The store": a new folder, an empty one or a run to
resume; an existing folder holding anything else is refused before any work), and the lines a sweep
prints: the plan counted in combinations and in rows, each apart; progress off a terminal as plain
lines; a sweep that ran nothing saying why, by reason, and what to do; `list`'s counts at 1."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

import pytest

from moebench import cli
from moebench.run import plan as plan_mod
from moebench.run.progress import LINE_EVERY_S, Progress
from moebench.run.sweep import SweepCounts, dry_run_listing, nothing_ran, summary_line

# Triton's experts on a CPU without the interpreter: a skipped row (this machine's), no rank starts
SKIPPED_HERE = ["backend=local", "experts=triton", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny"]
CPU = ["runner.device=cpu"]
QUICK = ["runner.reps=1", "runner.warmup=0", "runner.phase_reps=1", "workload.tokens_per_rank=[4]"]


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")


def _tree(folder) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("argv", [["sweep"], ["sweep", "--dry-run"], ["run"]], ids=["sweep", "dry-run", "run"])
def test_an_out_holding_other_files_is_refused_before_any_work(argv, tmp_path, capsys):
    """A checkout's root given as --out: it wrote rows/ and env.json among the checkout's files."""
    clone = tmp_path / "clone"
    (clone / ".git").mkdir(parents=True)
    (clone / "README.md").write_text("mine\n")
    before = _tree(clone)
    assert cli.main([*argv, *SKIPPED_HERE, *CPU, "--out", str(clone)]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == [
        f"moebench {argv[0]}: error: {clone} is neither empty nor a moebench run (it holds .git, README.md; "
        "a run holds rows/ and env.json): give --out a new or empty folder, or an existing run to resume"
    ]
    assert captured.out == "" and _tree(clone) == before


def test_a_new_an_empty_and_an_existing_run_are_taken(tmp_path, capsys):
    """A new folder, an empty one, one holding only a killed writer's temp file or a lock (a sweep
    killed before it wrote), and a run (resumed) are all the sweep's to write."""
    empty, leftover, locked = tmp_path / "empty", tmp_path / "leftover", tmp_path / "locked"
    for folder in (empty, leftover, locked):
        folder.mkdir()
    (leftover / ".tmp-probe-0123abcd.tmp").write_text("")
    (locked / ".lock").write_text("")
    for out in (tmp_path / "new", empty, leftover, locked, empty):  # the last: the run made above, resumed
        assert cli.main(["sweep", *SKIPPED_HERE, *CPU, "--out", str(out)]) == 0, capsys.readouterr().err
        assert (out / "rows" / "skipped.parquet").is_file() and (out / "env.json").is_file()
    assert not (leftover / ".tmp-probe-0123abcd.tmp").exists()  # removed before any work (clean_temp)
    capsys.readouterr()


def test_the_plan_is_counted_in_combinations_and_in_rows_apart():
    """'1008 combinations, 72 to run, 1872 skipped rows' mixed the units: each has its parentheses."""
    combos, _ = plan_mod.plan(
        ["backend=local", "experts=torch,torch_batched", "reduction=experts", "overlap=none", "quant=bf16"]
        + ["model=tiny", "workload.tokens_per_rank=[4,8]", *CPU]
    )
    runs, skipped = combos if not combos[0].reason else combos[::-1]
    assert runs.runnable_tokens == [4, 8] and skipped.reason
    said = plan_mod.planned(combos, [(runs, [4, 8])], 2, 0)
    assert said == "2 combinations (1 to run, 1 skipped), 4 rows (2 to run, 2 skipped)"
    said = plan_mod.planned(combos, [(runs, [8])], 2, 1)  # a resume: one token count stored
    assert said == "2 combinations (1 to run, 1 skipped), 4 rows (1 to run, 1 already stored, 2 skipped)"
    said = plan_mod.planned(combos, [], 2, 2)  # all stored
    assert (
        said == "2 combinations (0 to run, 1 already stored, 1 skipped), 4 rows (0 to run, 2 already stored, 2 skipped)"
    )
    assert (
        plan_mod.planned([runs], [(runs, [4, 8])], 0, 0, " on 2 ranks")
        == "1 combination (1 to run on 2 ranks), 2 rows (2 to run)"
    )


def test_nothing_ran_counts_the_reasons_and_says_what_to_do():
    """backend=tp experts=triton on a CPU: 4 combinations this machine skips (Triton), 14 a rule of
    the plan does; the line said only the two counts, not why nor what to do."""
    combos, _ = plan_mod.plan(["backend=tp", "experts=triton", "model=tiny", *CPU], "default")
    lines = nothing_ran(combos).splitlines()
    assert lines[0] == (
        "moebench: nothing ran: every combination was skipped: 4 on this machine, 14 by a rule of the plan "
        "that no machine lifts; combinations by reason:"
    )
    assert lines[1].startswith("     4  Triton experts need a CUDA GPU")
    assert [line.split()[0] for line in lines[2:-1]] == ["6", "4", "4"] and all("[rule]" in ln for ln in lines[2:-1])
    assert lines[-1].startswith("moebench: to measure them, run them on a machine that has what the reasons above")
    assert "no machine runs the [rule] ones: change or drop those options" in lines[-1]
    assert "`moebench list -v` with the same options" in lines[-1]


def test_list_counts_one_combination_in_the_singular(capsys):
    one = ["backend=local", "reduction=experts", "overlap=none", "quant=bf16", "model=tiny", *CPU]
    assert cli.main(["list", *one, "experts=torch"]) == 0
    assert "\n1 valid, 0 skipped of 1 combination\n" in capsys.readouterr().out  # the plugins' lines follow
    assert cli.main(["list", *one, "experts=torch_batched"]) == 0
    out = capsys.readouterr().out
    assert "skipped, by reason (1 combination; --verbose lists each):" in out
    assert "\n0 valid, 1 skipped of 1 combination\n" in out


def test_progress_off_a_terminal_is_a_line_now_and_then(capsys):
    clock = [0.0]
    progress = Progress(5, tty=False, clock=lambda: clock[0])
    seen = Counter()
    for i in range(5):
        clock[0] += 4.0  # a combination every 4 s: a line at 12 s (after 10 s), then the last at 20 s
        seen["ok"] += 1
        progress.update(f"c{i}", seen)
    progress.update("c4", seen, step=0)  # part of a combination (the rest follows): no line
    progress.close()
    lines = capsys.readouterr().err.splitlines()
    assert LINE_EVERY_S == 10.0
    assert lines == [
        "moebench: 3 of 5 combinations done (60 %) in 12 s, about 8 s left; last: c2 ok=3",
        "moebench: 5 of 5 combinations done (100 %) in 20 s; last: c4 ok=5",
    ]


@pytest.mark.multiprocess
def test_a_sweep_logged_to_a_file_has_no_carriage_return(tmp_path):
    """stderr to a file: the bar's carriage-return redraws made one line of kilobytes there."""
    log = tmp_path / "sweep.log"
    two = ["backend=local", "experts=torch", "reduction=experts,finalize", "overlap=none", "quant=bf16", "model=tiny"]
    argv = [sys.executable, "-m", "moebench", "sweep", *two, *CPU, *QUICK, "--out", str(tmp_path / "run")]
    with open(log, "w") as f:
        done = subprocess.run(argv, stderr=f, stdout=subprocess.DEVNULL, timeout=300)
    text = log.read_text()
    assert done.returncode == 0, text
    assert "\r" not in text
    assert "moebench: 2 of 2 combinations done (100 %) in " in text, text
    assert "moebench: 2 combinations (2 to run), 2 rows (2 to run) -> " in text, text


def test_a_run_given_to_another_request_says_it_adds_to_it(tmp_path, capsys):
    """`--out runs/a reduction=finalize` on a run of reduction=experts went on quietly: the run
    then held both and its report changed. Extending is allowed; it is said in one line, once the
    request differs and adds combinations; the same request resumed says nothing."""
    out = str(tmp_path / "a")
    first = [o if o != "reduction=experts" else "reduction=finalize" for o in SKIPPED_HERE]
    assert cli.main(["sweep", *first, *CPU, "--out", out]) == 0
    assert "a separate --out" not in capsys.readouterr().err
    for argv in (["sweep", "--dry-run"], ["sweep"]):
        assert cli.main([*argv, *SKIPPED_HERE, *CPU, "--out", out]) == 0
        err = capsys.readouterr().err
        said = [line for line in err.splitlines() if "a separate --out" in line]
        verb = "would add" if "--dry-run" in argv else "adds"
        assert said == [
            f"moebench: this sweep {verb} 1 combination to {out}, a run that holds rows of "
            f"`{' '.join(first + CPU)}` (its report and comparisons will hold both); "
            "a separate --out keeps them apart"
        ], err
    assert cli.main(["sweep", *SKIPPED_HERE, *CPU, "--out", out]) == 0  # nothing new: nothing said
    assert cli.main(["sweep", *first, *CPU, "--out", out]) == 0  # the first request resumed
    assert "a separate --out" not in capsys.readouterr().err


def test_a_finished_or_stopped_sweep_says_what_happened_in_words(tmp_path):
    """A dry run of a finished run printed 'would run 0 combinations, 0 rows:' (a colon before
    nothing); a finished sweep re-run ended 'skipped=0 (this invocation, 2 rows already stored)', and
    one stopped by SIGTERM before its first row 'skipped=0 (this invocation)'."""
    combos, _ = plan_mod.plan([*SKIPPED_HERE[:1], "experts=torch", *SKIPPED_HERE[2:], *CPU, *QUICK])
    assert dry_run_listing([], combos, 2) == (
        "would run nothing: all 2 rows that can run are already stored (--redo failed|all to re-run them)"
    )
    assert dry_run_listing([], combos, 0) == "would run nothing: no combination can run here"
    assert dry_run_listing([(combos[0], [4])], combos, 0).startswith("would run 1 combination, 1 row:\n  ")
    done = summary_line(SweepCounts({"skipped": 0}), 2, True, tmp_path)
    assert done == (
        "moebench: nothing to do: all 2 rows that can run are already stored (--redo failed|all to re-run them); "
        f"results in {tmp_path}"
    )
    stopped = summary_line(SweepCounts({"skipped": 0}), 0, False, tmp_path)
    assert stopped == f"moebench: this invocation wrote no row; results in {tmp_path}"
    some = summary_line(SweepCounts({"ok": 2, "failed": 1, "skipped": 0}), 1, False, tmp_path)
    assert (
        some
        == f"moebench: this invocation wrote 3 rows (1 failed, 2 ok); 1 row was stored before it; results in {tmp_path}"
    )
