"""A row with host-paced samples, whatever their count, says so: in `moebench report` (Data quality
names it with its counts, the latency cell carries `‡ n/m`, a bold one too, the summary's fastest
says it), in `moebench compare` (Data quality names the pair with each side's counts) and in
`tune --results`; the host-time table's caption says what the holds did; a report with nothing
bold says nothing of bold (docs/design.md, "Timing" and "Data quality")."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench import cli
from moebench.report.best_per_size import best_per_size, paced_lines, table
from moebench.report.document import write_report
from moebench.report.flags import flags_of, paced_text
from moebench.results.synthetic import make_row, write_run

PACED = "triton"  # the combination whose samples the host paced (5 of 30), the fastest


def _rows(paced: int = 5, device: str = "cuda", **extra) -> pd.DataFrame:
    """Three combinations at 64 tokens, 30 samples each, every one held (host_paced_samples set)."""
    rng = np.random.default_rng(0)
    out = []
    for experts, reduction, median in (
        (PACED, "experts", 100.0),
        ("torch", "experts", 200.0),
        ("torch", "finalize", 210.0),
    ):
        kw = {**extra} if experts == PACED else {}
        out.append(
            make_row(
                "local",
                experts,
                reduction,
                "none",
                "bf16",
                64,
                device=device,
                samples_us=median * np.exp(rng.normal(0, 0.01, 30)),
                host_paced_samples=float(paced if experts == PACED else 0) if device == "cuda" else np.nan,
                **kw,
            )
        )
    return pd.DataFrame(out)


def _section(text: str, head: str) -> str:
    return text.partition(head)[2].partition("\n## ")[0]


def test_paced_counts_of_every_family_are_named():
    row = _rows(5, host_paced_phases=2.0, num_phase_samples=10.0, host_paced_shared=1.0).iloc[0].to_dict()
    assert "host-paced" in flags_of(row)
    assert paced_text(row) == (
        "latency: 5 of 30 samples host-paced, ablation shared experts alone: 1 of 30 samples "
        "host-paced, phases: 2 of 10 samples host-paced"
    )
    clean = _rows(0).iloc[0].to_dict()
    assert "host-paced" not in flags_of(clean) and paced_text(clean) == ""
    phases_only = _rows(0, host_paced_phases=3.0, num_phase_samples=10.0).iloc[0].to_dict()
    assert paced_text(phases_only) == "phases: 3 of 10 samples host-paced"
    # its latency is GPU time: flagged apart, not as a row whose latency the host may have paced
    assert "host-paced-aside" in flags_of(phases_only) and "host-paced" not in flags_of(phases_only)
    assert "host-paced-aside" not in flags_of(row)  # (the latency's own: host-paced, as above)


def test_a_row_paced_in_its_phases_only_is_named_apart_from_one_paced_in_its_latency(tmp_path):
    rows = _rows(5)  # PACED's latency samples: 5 of 30 host-paced
    rows.loc[rows.experts != PACED, ["host_paced_phases", "num_phase_samples"]] = [2.0, 10.0]
    quality = _section(write_report(write_run(tmp_path / "run", rows)).read_text(), "## Data quality")
    lines = [x for x in quality.splitlines() if "host-paced" in x]
    assert len(lines) == 2
    latency, aside = lines
    assert latency.startswith("- 1 row with host-paced samples (the GPU started them") and PACED in latency
    assert aside.startswith("- 2 rows with host-paced samples outside the latency's only")
    assert "the latency is GPU time" in aside and PACED not in aside
    assert aside.count("(phases: 2 of 10 samples host-paced)") == 2


def test_report_names_a_row_with_five_of_thirty_samples_host_paced(tmp_path):
    text = write_report(write_run(tmp_path / "run", _rows(5))).read_text()
    quality = _section(text, "## Data quality")
    line = next(x for x in quality.splitlines() if "host-paced" in x)
    assert line.startswith("- 1 row with host-paced samples") and PACED in line
    assert "(latency: 5 of 30 samples host-paced)" in line
    # it may compete (a fifth or fewer), but its cell is marked with the count, bold or not
    latency = _section(text, "## Latency")
    cell = next(x for x in latency.splitlines() if f"| {PACED} " in x)
    assert "** ‡ 5/30" in cell and cell.count("**") == 2
    assert "‡ n/m: n of the m latency samples host-paced" in latency
    assert "Bold is the fastest" in latency
    # the summary's fastest says it
    summary = text.partition("## Data quality")[0]
    fastest = next(x for x in summary.splitlines() if "fastest" in x)
    assert "host-paced latency samples: the fastest 5 of 30" in fastest
    # the host-time table's caption: what the holds did, not what they should have done
    host = _section(text, "## Host time per forward")
    assert "3 of 3 rows timed each sample behind a hold" in host
    assert "in 1 of them the GPU still started latency samples before the host had enqueued them" in host
    assert "(5 of 30)" in host and "each sample waited behind a hold until" not in host


def test_a_clean_run_has_no_mark_and_its_caption_says_so(tmp_path):
    text = write_report(write_run(tmp_path / "run", _rows(0))).read_text()
    assert "‡" not in text and "host-paced" not in _section(text, "## Data quality")
    assert "in none did the GPU start a latency sample before the host had enqueued it" in _section(
        text, "## Host time per forward"
    )


def test_host_time_caption_beside_a_host_time_row(tmp_path):
    rows = _rows(0)
    rows.loc[0, ["timing_mode", "host_paced_samples", "timing_note"]] = [
        "host",
        30.0,
        "30 of 30 samples started on the GPU before the host had enqueued them",
    ]
    text = write_report(write_run(tmp_path / "run", rows)).read_text()
    host = _section(text, "## Host time per forward")
    assert "† 1 row host time" in host and host.count("†") == 2  # the cell and the caption
    assert "in 1 of them the GPU still started latency samples" in host and "(30 of 30)" in host


def test_cpu_only_report_says_nothing_of_bold(tmp_path):
    text = write_report(write_run(tmp_path / "run", _rows(device="cpu"))).read_text()
    latency = _section(text, "## Latency")
    assert "**" not in latency.partition("\n\n")[0]  # nothing is bold: CPU rows never compete
    assert "bold" not in latency.lower()
    gpu = _section(write_report(write_run(tmp_path / "gpu", _rows(0))).read_text(), "## Latency")
    assert "Bold is the fastest" in gpu


def test_compare_names_the_paced_rows_with_counts_per_side(tmp_path, capsys):
    base = write_run(tmp_path / "old*run", _rows(0))
    cand = write_run(tmp_path / "new*run", _rows(5, host_paced_phases=2.0, num_phase_samples=10.0))
    cli.main(["compare", str(base), str(cand), "--out", str(tmp_path / "r")])
    capsys.readouterr()
    text = (tmp_path / "r" / "report.md").read_text()
    quality = _section(text, "## Data quality")
    line = next(x for x in quality.splitlines() if "host-paced" in x)
    assert line.startswith("- 1 row with host-paced samples") and PACED in line
    # each side by the run's name, escaped once, as the title has it
    new, old = text.splitlines()[0].removeprefix("# moebench compare: ").split(" vs ")
    assert (
        "\\*" in old
        and (f"({old}: none; {new}: latency: 5 of 30 samples host-paced, phases: 2 of 10 samples host-paced)") in line
    )
    latency = _section(text, "## Latency")
    assert "‡ 5/30" in latency and "‡ n/m" in latency


def test_tune_results_marks_the_paced_best(tmp_path):
    from moebench.report.load import load_run

    df, _ = load_run(write_run(tmp_path / "run", _rows(5)))
    best = best_per_size(df)
    assert best.loc[0, "best_paced"] == "‡ 5/30" and best.loc[0, "runner_up_paced"] == ""
    assert "‡ 5/30" in table(best)
    (line,) = paced_lines(best)
    assert PACED in line and "64 tokens (5/30)" in line
    assert paced_lines(best_per_size(load_run(write_run(tmp_path / "clean", _rows(0)))[0])) == []


def test_host_time_caption_says_a_syncing_forward_had_no_hold(tmp_path):
    rows = _rows(0)
    rows.loc[1, ["timing_mode", "host_paced_samples", "host_enqueue_us", "timing_note"]] = [
        "host",
        0.0,
        21_000.0,
        "the forward syncs the host (its enqueue takes 21.0 ms behind a busy GPU)",
    ]
    host = _section(write_report(write_run(tmp_path / "run", rows)).read_text(), "## Host time per forward")
    assert "2 of 3 rows timed each sample behind a hold" in host
    assert "1 row syncs the host inside a forward (enqueue over 15 ms): no hold" in host
    assert "† 1 row host time" in host


def test_a_pair_paced_in_one_sides_latency_and_the_others_phases_is_on_the_host_paced_line_only(tmp_path):
    """One tag a pair: the baseline's latency paced, the candidate's phases only: `host-paced` (its
    latency may hold host gaps), never also `host-paced-aside` (which says the latency is GPU time)."""
    from moebench.report.flags import pair_paced_tag

    base = write_run(tmp_path / "base", _rows(5))
    cand = write_run(tmp_path / "cand", _rows(0, host_paced_phases=2.0, num_phase_samples=10.0))
    cli.main(["compare", str(base), str(cand), "--out", str(tmp_path / "r")])
    quality = _section((tmp_path / "r" / "report.md").read_text(), "## Data quality")
    lines = [x for x in quality.splitlines() if "host-paced" in x]
    assert len(lines) == 1 and lines[0].startswith("- 1 row with host-paced samples (the GPU started them")
    assert "base: latency: 5 of 30 samples host-paced; cand: phases: 2 of 10 samples host-paced" in lines[0]
    paced, aside = {"host_paced_samples": 5.0}, {"host_paced_phases": 2.0, "num_phase_samples": 10.0}
    assert pair_paced_tag(paced, aside) == pair_paced_tag(aside, paced) == "host-paced"
    assert pair_paced_tag({}, aside) == "host-paced-aside" and pair_paced_tag({}, {}) == ""
