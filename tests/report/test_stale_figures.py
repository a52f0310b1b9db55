"""A report written into a folder that holds an earlier report removes that report's figures it
does not draw itself (report.md no longer links them: a CPU run's report draws no phases.png),
from the folder's top level only, regular files only: an unknown file, a subfolder's figures
(compare's vs-* and axis-*) and a link stay as they are; a link at a report's own figure name is
refused before any work, as a write through it would be (moebench/util/safe_write.py)."""

from __future__ import annotations

import os
import re

from moebench import cli
from moebench.report.document import REPORT_FIGURES, build_report
from moebench.util.safe_write import remove_files
from tests.report.test_answers import cpu_run

OLD = b"an earlier report's figure"


def _linked(md: str) -> set[str]:
    return set(re.findall(r"\]\(([^)]+\.png)\)", md))


def test_a_report_removes_the_figures_an_earlier_report_left_and_nothing_else(tmp_path):
    run = cpu_run(tmp_path / "run")
    out = tmp_path / "report"
    (out / "vs-base").mkdir(parents=True)
    (out / "axis-quant-bf16-fp8").mkdir()
    outside = tmp_path / "outside.png"
    outside.write_bytes(OLD)
    for name in ("phases.png", "overlap.png", "comparison.png", "comparison_workspace.png"):
        (out / name).write_bytes(OLD)  # an earlier GPU run's, an older moebench's, a --baseline report's
    for kept in ("notes.png", "mine.txt", "vs-base/phases.png", "axis-quant-bf16-fp8/latency.png"):
        (out / kept).write_bytes(OLD)
    (out / "elsewhere.png").symlink_to(outside)

    build_report(run, out)
    md = (out / "report.md").read_text()
    drawn = {p.name for p in out.glob("*.png") if not p.is_symlink()} - {"notes.png"}
    assert drawn and drawn == _linked(md)  # each figure left at the top is one report.md shows
    for gone in ("phases.png", "overlap.png", "comparison.png", "comparison_workspace.png"):
        assert not os.path.lexists(out / gone), gone
    for kept in ("notes.png", "mine.txt", "vs-base/phases.png", "axis-quant-bf16-fp8/latency.png"):
        assert (out / kept).read_bytes() == OLD, kept
    assert (out / "elsewhere.png").is_symlink() and outside.read_bytes() == OLD


def test_a_plain_report_after_one_with_a_baseline_keeps_no_comparison_figure(tmp_path):
    run, base = cpu_run(tmp_path / "run"), cpu_run(tmp_path / "base")
    out = tmp_path / "report"
    build_report(run, out, baseline=base)
    assert (out / "comparison_latency.png").exists()
    build_report(run, out)
    md = (out / "report.md").read_text()
    assert {p.name for p in out.glob("*.png")} == _linked(md)


def test_a_link_at_a_figures_name_is_refused_before_any_work(tmp_path, capsys):
    run = cpu_run(tmp_path / "run")
    out = tmp_path / "report"
    out.mkdir()
    outside = tmp_path / "outside.png"
    outside.write_bytes(OLD)
    (out / "phases.png").symlink_to(outside)
    assert cli.main(["report", str(run), "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "phases.png" in err and "symbolic link" in err, err
    assert (out / "phases.png").is_symlink() and outside.read_bytes() == OLD
    assert sorted(p.name for p in out.iterdir()) == ["phases.png"]  # nothing written, nothing removed


def test_remove_files_removes_regular_files_and_leaves_links_folders_and_hard_links(tmp_path):
    target = tmp_path / "target"
    target.write_bytes(OLD)
    d = tmp_path / "d"
    d.mkdir()
    (d / "plain.png").write_bytes(OLD)
    (d / "link.png").symlink_to(target)
    (d / "dangling.png").symlink_to(tmp_path / "missing")
    (d / "folder.png").mkdir()
    os.link(target, d / "hard.png")
    names = ["plain.png", "link.png", "dangling.png", "folder.png", "hard.png", "absent.png"]
    assert remove_files(d, names) == ["plain.png"]
    assert sorted(p.name for p in d.iterdir()) == ["dangling.png", "folder.png", "hard.png", "link.png"]
    assert target.read_bytes() == OLD and (d / "link.png").is_symlink()


def test_the_figures_a_report_may_remove_are_its_own_pngs():
    assert set(REPORT_FIGURES) == {
        "effects.png",
        "latency.png",
        "phases.png",
        "overlap.png",
        "workspace.png",
        "comparison.png",
        "comparison_latency.png",
        "comparison_workspace.png",
    }
