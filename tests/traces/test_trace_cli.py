"""`moebench trace`: run directories without their traces (committed results/ folders,
trace=none runs) fail with a message saying why, instead of reading the run's own
JSON files as traces; the same folder with its traces copied back, a trace file,
a folder of traces and another `trace.dir` are read; the arguments have help text."""

from __future__ import annotations

import shutil
from pathlib import Path

import pandas as pd
import pytest

from moebench import cli
from moebench.report.trace_report import find_traces

REPO = Path(__file__).parents[2]
FIX = Path(__file__).parents[1] / "fixtures" / "traces"
# the allgather_rs rows at 2be9ad1 (issue #4); the triton experts, overlap=combine row is combination
# dfb6438509fd, whose two ranks' traces are the fixtures below
TRACE_RUN = REPO / "results" / "archive" / "trace_vs_ablation-2be9ad1"
TRITON_KEY = "dfb6438509fd"
TRITON_RANKS = [FIX / f"h200_allgather_rs_triton_combine_rank{r}_T4096.json.gz" for r in (0, 1)]
NO_TRACE_RUN = REPO / "results" / "deepep_vs_own_benchmarks" / "ht"  # measured with trace=none


def _copy_run(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("*.png"))
    assert not (dst / "traces").exists()
    return dst


def _trace(argv, capsys):
    rc = cli.main(["trace", *map(str, argv)])
    out = capsys.readouterr()
    return rc, out.out, out.err


def test_committed_results_folder_without_traces_says_why(tmp_path, capsys):
    """Committed rows name no trace that is not committed (tests/project/test_row_paths.py), yet hold
    the figures read from their traces."""
    run = _copy_run(TRACE_RUN, tmp_path / "run")
    rc, out, err = _trace([run], capsys)
    assert rc == 2 and out == ""
    assert f"{run} has no traces/ folder" in err and "hold figures read from traces" in err
    assert "the traces were not kept" in err and "re-run with trace=torch" in err
    # the old fallback read env.json and sweep-*.json as traces
    assert "skipped:" not in err and "traceEvents" not in err and "env.json" not in err
    with pytest.raises(ValueError, match="has no traces/ folder"):
        find_traces(run)


def test_a_run_copied_without_the_traces_its_rows_name_says_why(tmp_path, capsys):
    run = _copy_run(TRACE_RUN, tmp_path / "run")
    for f in sorted((run / "rows").glob("*.parquet")):  # the paths as the sweep wrote them
        df = pd.read_parquet(f)
        df["trace_path"] = [f"traces/{k}/rank0_T4096.json" for k in df["combo_key"]]
        df.to_parquet(f)
    rc, out, err = _trace([run], capsys)
    assert rc == 2 and out == "" and f"{run} has no traces/ folder" in err
    assert "rows name 4 trace files" in err and "traces/2ef5c09335d4/rank0_T4096.json" in err
    assert "results/ folders omit them" in err and "re-run with trace=torch" in err


def test_trace_none_run_says_so(tmp_path, capsys):
    run = _copy_run(NO_TRACE_RUN, tmp_path / "run")
    rc, _, err = _trace([run], capsys)
    assert rc == 2
    assert "has no traces/ folder and its rows name no trace file" in err and "trace=none" in err
    assert "skipped:" not in err and "traceEvents" not in err


def test_a_run_with_rows_only_or_torn_rows_still_gets_the_message(tmp_path, capsys):
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    (run / "rows" / "k-T8.parquet").write_bytes(b"torn")  # a crashed writer's leftover
    (run / "sweep-0.json").write_text('{"run_id": "0"}')
    rc, _, err = _trace([run], capsys)
    assert rc == 2 and "has no traces/ folder and its rows name no trace file" in err


def test_the_same_folder_with_its_traces_copied_back(tmp_path, capsys):
    run = _copy_run(TRACE_RUN, tmp_path / "run")
    d = run / "traces" / TRITON_KEY
    d.mkdir(parents=True)
    for r, f in enumerate(TRITON_RANKS):
        shutil.copy(f, d / f"rank{r}_T4096.json.gz")
    rc, out, err = _trace([run], capsys)
    assert rc == 0 and "skipped:" not in err
    assert out.count("| **trace_overlap_fraction**") == 2  # one overlap table per rank
    # each trace and the ranks are named by the combination's label from the run's rows, the folder beside it
    label = "allgather_rs/triton/experts/combine/bf16/deepseek_v3/ws2"
    assert f"### {label} — rank 0, 4096 tokens\n\ntrace: `{d / 'rank0_T4096.json.gz'}`" in out
    assert f"combos: {label} ({TRITON_KEY})" in out
    assert f"### ranks of {label} at 4096 tokens\n\ntraces: `{d}`" in out
    assert "| 1 (critical) | 7871.8 | 0.0 | 0.399 | 0.399 |" in out


def test_a_trace_file_as_deep_as_the_tool_writes_is_named_from_its_run(tmp_path, capsys):
    """A profiler-timed combination's trace, <run>/traces/profiler/<combo_key>/, the deepest file the
    tool writes below its run (results/store_read.py RUN_DEPTH), given alone: named by its row's label
    (the climb to the run stopped a folder short of it)."""
    run = _copy_run(TRACE_RUN, tmp_path / "run")
    f = run / "traces" / "profiler" / TRITON_KEY / "rank0_T4096.json.gz"
    f.parent.mkdir(parents=True)
    shutil.copy(TRITON_RANKS[0], f)
    rc, out, _ = _trace([f], capsys)
    label = "allgather_rs/triton/experts/combine/bf16/deepseek_v3/ws2"
    assert rc == 0 and f"### {label} — rank 0, 4096 tokens" in out


def test_another_trace_dir_named_by_the_rows_is_read(tmp_path, capsys):
    """trace.dir=mytraces: no traces/ folder, but the rows say where the traces are."""
    run = tmp_path / "run"
    (run / "rows").mkdir(parents=True)
    (run / "env.json").write_text("{}")
    d = run / "mytraces" / TRITON_KEY
    d.mkdir(parents=True)
    shutil.copy(TRITON_RANKS[0], d / "rank0_T4096.json.gz")
    pd.DataFrame(
        [
            {"combo_key": TRITON_KEY, "trace_path": f"mytraces/{TRITON_KEY}/rank0_T4096.json.gz"},
            {"combo_key": "other", "trace_path": ""},
        ]
    ).to_parquet(run / "rows" / "k-T4096.parquet")
    assert find_traces(run) == [d / "rank0_T4096.json.gz"]
    rc, out, err = _trace([run, "--plot", "--out", tmp_path / "plots"], capsys)
    assert rc == 0 and "skipped:" not in err
    # --out mirrors the layout below the traces' folder
    assert (tmp_path / "plots" / TRITON_KEY / "rank0_T4096.json.gz.timeline.png").is_file()


def test_a_real_trace_file(capsys):
    rc, out, err = _trace([FIX / "h200_deepep_ht_combine_rank0_T4096.json.gz"], capsys)
    assert rc == 0 and err == ""
    assert "| **trace_overlap_fraction** (plain intersection) | 0.600 |" in out


def test_a_folder_of_traces_is_read_whole(tmp_path, capsys):
    """A combination's folder (no traces/ below it, not a run directory) is a folder of traces."""
    for r, f in enumerate(TRITON_RANKS):
        shutil.copy(f, tmp_path / f"rank{r}_T4096.json.gz")
    rc, out, _ = _trace([tmp_path], capsys)
    assert rc == 0 and f"### ranks of {tmp_path} at 4096 tokens" in out


def test_arguments_have_help(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["trace", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "a trace file (.json, .json.gz from trace=torch; .sqlite from nsys export) or a run directory" in text
    assert "--out OUT with --plot: write the PNGs under this directory" in text


def test_plot_labels_top_kernels_shades_the_overlap_and_stacks_the_ranks(tmp_path, capsys):
    """--plot on a combination's ranks: one PNG per rank and one with the ranks stacked; the top
    kernels carry their short names, the shared ∩ comm intervals are shaded with their total."""
    from moebench.report.timeline import TOP_KERNELS, _lanes, _overlap, _select, short_name
    from moebench.traces.files import load_traces
    from moebench.traces.metrics import length

    for r, f in enumerate(TRITON_RANKS):
        shutil.copy(f, tmp_path / f"rank{r}_T4096.json.gz")
    rc, out, _ = _trace([tmp_path, "--plot"], capsys)
    assert rc == 0 and f"ranks timeline: {tmp_path / 'T4096.ranks.timeline.png'}" in out
    assert (tmp_path / "T4096.ranks.timeline.png").read_bytes()[:4] == b"\x89PNG"
    (trace,) = load_traces(tmp_path / "rank0_T4096.json.gz")
    t0, t1, _, idx, ranges, kernels = _select(trace, None)
    texts = [b[6] for name, bars, _ in _lanes(ranges, kernels, t0, t1) if name.startswith("GPU") for b in bars if b[6]]
    assert 0 < len(texts) <= TOP_KERNELS * len({k.lane for k in kernels})
    assert all(len(t) <= 30 and "<" not in t and "(" not in t for t in texts), texts
    # the shaded time is the sample's shared ∩ comm intersection, as the overlap table has it
    from moebench.traces.metrics import summarize

    per_sample = {f["sample"]: f for f in summarize(trace).per_sample}
    assert length(_overlap(kernels)) == pytest.approx(per_sample[idx]["overlap_us"], abs=1e-6)
    assert short_name("_ZN7cutlass13device_kernelIN2xx") == "device_kernel"
    assert (
        short_name("void at::native::vectorized_elementwise_kernel<4, float>(int)") == "vectorized_elementwise_kernel"
    )


def test_a_cpu_run_names_its_combinations_and_draws_no_empty_figure(tmp_path, capsys):
    """Two gloo ranks on the CPU (issue #31, item 12): each trace is named by its row's label (the
    key beside it; a folder no row names keeps its key), there is no overlap table of dashes and
    no ranks table of dashes but a line each saying why, and the stacked ranks' figure, which
    draws GPU lanes only, is not written: a line says why."""
    from moebench.report.trace_markdown import OVERLAP_HEADER
    from moebench.results.synthetic import make_row, write_run

    label = "naive/torch/experts/dispatch/bf16/tiny/ws2/trace_torch"
    row = make_row(
        "naive",
        "torch",
        "experts",
        "dispatch",
        "bf16",
        16,
        samples_us=[100.0] * 5,
        world_size=2,
        combo_key="0123456789ab",
        label=label,
    )
    run = write_run(tmp_path / "run", pd.DataFrame([row]))
    for key, ranks in (("0123456789ab", (0, 1)), ("ffffffffffff", (0,))):
        (run / "traces" / key).mkdir(parents=True)
        for r in ranks:
            shutil.copy(FIX / "cpu_phases.json.gz", run / "traces" / key / f"rank{r}_T16.json.gz")
    rc, out, err = _trace([run, "--plot", "--out", tmp_path / "plots"], capsys)
    assert rc == 0 and err == ""
    d = run / "traces" / "0123456789ab"
    assert f"### {label} — rank 1, 16 tokens\n\ntrace: `{d / 'rank1_T16.json.gz'}`" in out
    assert f"### ranks of {label} at 16 tokens\n\ntraces: `{d}`" in out
    assert f"### {run / 'traces' / 'ffffffffffff' / 'rank0_T16.json.gz'}\n" in out  # no row names it: its path
    assert OVERLAP_HEADER not in out and "| – | – |" not in out and "| rank |" not in out
    assert out.count("overlap: none to measure — no GPU activity in the trace (a CPU run") == 3
    assert "ranks: nothing to compare — no GPU activity in the 2 ranks' traces (a CPU run)" in out
    assert (
        "ranks timeline: not drawn — no GPU kernels in the traces (a CPU run): the ranks' panels draw GPU lanes only"
    ) in out
    assert not list((tmp_path / "plots").rglob("*.ranks.timeline.png"))
    # each rank's own figure has its CPU lanes to draw
    assert sorted(p.name for p in (tmp_path / "plots" / "0123456789ab").iterdir()) == [
        "rank0_T16.json.gz.timeline.png",
        "rank1_T16.json.gz.timeline.png",
    ]


def test_committed_profiler_traces_say_their_combination_in_token_order(tmp_path, capsys, monkeypatch):
    """results/fp8_decode_kernels' profiler-mode traces (written before profiler mode opened a
    `combo/` range; their folder is the combination key): each heading, combos line and timeline
    title names the combination, and the token counts come as numbers (16, 64, 128, 256), not as
    strings (128, 16, 256, 64)."""
    import moebench.report.timeline as timeline

    titles = []
    monkeypatch.setattr(timeline, "plot_timeline", lambda trace, path, name=None: titles.append(name) or path)
    rc, out, _ = _trace([REPO / "results" / "fp8_decode_kernels", "--plot", "--out", tmp_path], capsys)
    assert rc == 0
    heads = [x.removeprefix("### ") for x in out.splitlines() if x.startswith("### ")]
    for model in ("mixtral_8x7b", "qwen3_30b_a3b"):
        label = f"local/triton/experts/none/fp8_block/{model}"
        mine = [h for h in heads if h.startswith(label + " — ")]
        assert [int(h.split(", ")[-1].split()[0]) for h in mine] == [16, 64, 128, 256], heads
    assert "combos: –" not in out and out.count("by its folder (no `combo/` range in the trace)") == len(heads)
    assert titles == heads  # each timeline's title is its section's heading


def test_a_profiler_mode_trace_names_its_combination(tmp_path):
    """profile_kernels opens the `combo/<key>` range its trace=torch sibling does, so `moebench
    trace` reads the combination from the trace itself."""
    from moebench.measure.capture import profile_kernels
    from moebench.measure.samples import RankSync
    from moebench.traces.files import load_traces

    path = tmp_path / "rank0_T16.json.gz"
    x = __import__("torch").ones(8, 8)
    profile_kernels(lambda: x @ x, str(path), samples=3, sync=RankSync(None, None, None, None), key="abc123")
    assert load_traces(path)[0].combos() == ["abc123"]
