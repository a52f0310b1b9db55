"""Every answer section of a run's report is there, with its answer or one line saying why there
is none and what would give one (report/answers.py, docs/design.md "What a report answers"): a
run whose every row is host time (the committed triton_vs_torch/events) says nothing is ranked and
why, and still gives its workspace (memory is no timing); a run of one combination per size (a
tuned tile file's) gives that combination's latency per size and its figure; counts agree with
their noun ("median of 1 combination")."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from moebench.report.document import build_report
from moebench.report.fmt import fmt_us
from moebench.results.synthetic import make_row, samples_from, write_run

SECTIONS = (
    "## What each choice does",
    "## Fastest per size",
    "## Workspace per reduction placement",
    "## Shared experts hidden",
)
IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+\.png)\)")


def _answers(run: Path, out: Path) -> str:
    """The report's answer part (above its folded tables), every section there."""
    build_report(run, out)
    head = (out / "report.md").read_text().partition("## Everything else")[0]
    for section in SECTIONS:
        assert section in head, f"no {section!r} in the answers:\n{head}"
    return head


def _section(head: str, name: str) -> list[str]:
    """The bullets of one answer section."""
    body = head.partition(name)[2].partition("\n## ")[0]
    return [x for x in body.splitlines() if x.startswith("- ")]


def _row(experts: str, reduction: str, tokens: int, median: float, rng, model: str = "tiny", held: bool = True):
    """A GPU row timed with a hold before each sample (`held`: GPU time), or an older events row at a
    decode size with neither the hold's count nor the host's enqueue (host time: eager-decode)."""
    extra = dict(host_paced_samples=0.0) if held else dict(host_enqueue_us=np.nan)
    s = samples_from(median, 0.01, 20, rng)
    return make_row("local", experts, reduction, "none", "bf16", tokens, samples_us=s, model=model, **extra)


def test_a_run_of_host_time_rows_says_why_nothing_is_ranked_and_keeps_its_workspace(tmp_path):
    """Every ok row host time: the report lost its effects, its fastest and its workspace without a
    word (the workspace read only GPU-time rows, though a peak is no timing)."""
    rng = np.random.default_rng(0)
    rows = [
        _row(e, r, t, 100.0 + t, rng, held=False)
        for e in ("torch", "triton")
        for r in ("experts", "finalize")
        for t in (16, 64)
    ]
    head = _answers(write_run(tmp_path / "run", pd.DataFrame(rows)), tmp_path / "report")
    (effects,) = _section(head, "## What each choice does")
    assert effects.startswith("- nothing compared: no ok row is GPU time"), effects
    (fastest,) = _section(head, "## Fastest per size")
    assert fastest.startswith("- nothing ranked: all 8 ok rows are host time (events timing at ≤ 256 tokens"), fastest
    assert "a run at today's code times the GPU (`runner.timing=auto`" in fastest, fastest
    workspace = _section(head, "## Workspace per reduction placement")
    assert [x.partition(" at ")[0] for x in workspace] == ["- `reduction=experts`", "- `reduction=finalize`"]
    assert "(median of 2 combinations," in workspace[0], workspace
    assert "![Workspace at 64 tok: " in head
    assert "CPU pipeline check" not in head  # host time on a GPU is no CPU run
    assert (tmp_path / "report" / "workspace.png").is_file()


@pytest.mark.parametrize("models", [("qwen3",), ("mixtral", "qwen3")])
def test_one_combination_per_size_gives_its_latency_per_size(tmp_path, models):
    """One combination per workload and size (a tuned tile file's run): nothing to rank and no choice
    of two values, and the report showed no latency above its folded tables."""
    rng = np.random.default_rng(1)
    rows = [
        _row("triton", "experts", t, 50.0 + t * (i + 1), rng, model=m)
        for i, m in enumerate(models)
        for t in (16, 64, 256)
    ]
    df = pd.DataFrame(rows)
    head = _answers(write_run(tmp_path / "run", df), tmp_path / "report")
    (effects,) = _section(head, "## What each choice does")
    assert effects.startswith("- nothing compared: every choice has one value"), effects
    assert "local/triton red=experts ovl=none quant=bf16" in effects, effects
    fastest = "\n".join(_section(head, "## Fastest per size"))
    assert fastest.startswith("- one combination per size, nothing to rank"), fastest
    for m in models:
        said = ", ".join(
            f"{fmt_us(r['latency_us_median'])} µs at {r['tokens_per_rank']} tok"
            for _, r in df[df["model"] == m].iterrows()
        )
        assert said in fastest, (said, fastest)
    shown = dict((name, alt) for alt, name in IMAGE.findall(head))
    assert "latency.png" in shown and re.search(r"\d", shown["latency.png"]), shown
    assert "Fastest" not in shown["latency.png"], shown["latency.png"]
    (workspace,) = _section(head, "## Workspace per reduction placement")
    assert f"(median of {len(models)} combination{'s' if len(models) > 1 else ''}," in workspace, workspace


def test_host_time_rows_beside_gpu_rows_are_counted_apart_and_in_the_workspace(tmp_path):
    """One model's rows GPU time, the other's host time (the committed fp8_decode_kernels): the
    fastest gives each model its line, the one's latency and the other's host time, and the
    workspace reads both."""
    rng = np.random.default_rng(2)
    rows = [_row("triton", "experts", t, 80.0 + t, rng, model="mixtral") for t in (16, 64)]
    rows += [_row("triton", "experts", t, 90.0 + t, rng, model="qwen3", held=False) for t in (16, 64)]
    head = _answers(write_run(tmp_path / "run", pd.DataFrame(rows)), tmp_path / "report")
    fastest = _section(head, "## Fastest per size")
    assert fastest[0].startswith("- mixtral: one combination per size, nothing to rank"), fastest
    assert "qwen3" not in fastest[0], fastest
    assert fastest[-1].startswith("- qwen3: nothing ranked: all 2 ok rows are host time (events timing"), fastest
    (workspace,) = _section(head, "## Workspace per reduction placement")
    assert "(median of 2 combinations," in workspace, workspace


def test_a_run_with_no_workspace_peak_says_so(tmp_path):
    rng = np.random.default_rng(3)
    none = dict(workspace_bytes_peak=np.nan, workspace_bytes_analytic=np.nan)
    rows = [_row(e, "experts", 64, 100.0, rng) | none for e in ("torch", "triton")]
    head = _answers(write_run(tmp_path / "run", pd.DataFrame(rows)), tmp_path / "report")
    (workspace,) = _section(head, "## Workspace per reduction placement")
    assert workspace.startswith("- no workspace figure: no ok row recorded a workspace peak"), workspace


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_without_a_peak_the_workspace_is_the_declared_one_as_compare_reads(tmp_path, device):
    """A CPU run said 'no ok row recorded a workspace peak (`runner.memory=true` measures one)',
    though runner.memory is true by default and peaks are measured on CUDA only, while `compare` of
    the same run showed the workspace change from the declared column: both read the peak, else the
    declared workspace, and the report says which and why."""
    rng = np.random.default_rng(3)
    rows = [
        make_row("local", "torch", r, "none", "bf16", 64, samples_us=samples_from(100.0, 0.01, 20, rng),
                 device=device, workspace_bytes_peak=np.nan, workspace_bytes_analytic=mib * 2**20)
        for r, mib in (("experts", 8), ("finalize", 4))
    ]  # fmt: skip
    head = _answers(write_run(tmp_path / "run", pd.DataFrame(rows)), tmp_path / "report")
    workspace = head.partition("## Workspace per reduction placement")[2].partition("\n## ")[0]
    why = "Workspace peaks are measured on CUDA only" if device == "cpu" else "No ok row recorded a workspace peak"
    assert why in workspace and "declared one (`workspace_bytes_analytic`)" in workspace, workspace
    assert "- `reduction=finalize` at 64 tok: declared workspace 4.00 MiB (median of 1 combination" in workspace
    assert "Declared workspace (no peak measured) at 64 tok: reduction=finalize 4 MiB" in head, head
    small = [r | dict(workspace_bytes_analytic=r["workspace_bytes_analytic"] / 16) for r in rows]
    head = _answers(write_run(tmp_path / "small", pd.DataFrame(small)), tmp_path / "small_report")
    assert "reduction=finalize 0.250 MiB, 0.50 × the 0.500 MiB of experts (medians)" in head, head  # not '0 MiB'


@pytest.mark.parametrize("other", ["host time", "one combination"])
def test_each_fastest_line_names_its_workload_and_a_workload_without_rivals_gets_its_line(tmp_path, other):
    """Two models (the committed triton_vs_torch/profiler): mixtral's rows GPU time, torch against
    triton; qwen3's all host time, or one combination per size. The fastest lines read
    'triton · 64 tok: fastest, ...' with mixtral's figures and no model, and qwen3 had no line."""
    rng = np.random.default_rng(4)
    rows = [_row(e, "experts", t, (50.0 if e == "triton" else 90.0) + t, rng, model="mixtral")
            for e in ("torch", "triton") for t in (16, 64)]  # fmt: skip
    if other == "host time":
        rows += [_row(e, "experts", t, 70.0 + t, rng, model="qwen3", held=False)
                 for e in ("torch", "triton") for t in (16, 64)]  # fmt: skip
    else:
        rows += [_row("triton", "experts", t, 70.0 + t, rng, model="qwen3") for t in (16, 64)]
    head = _answers(write_run(tmp_path / "run", pd.DataFrame(rows)), tmp_path / "report")
    fastest = _section(head, "## Fastest per size")
    ranked = [x for x in fastest if "fastest, " in x]
    assert len(ranked) == 2 and all(x.startswith("- mixtral · triton · ") for x in ranked), fastest
    (qwen,) = [x for x in fastest if "qwen3" in x]
    if other == "host time":
        assert qwen.startswith("- qwen3: nothing ranked: all 4 ok rows are host time (events timing"), qwen
        assert "a run at today's code times the GPU" in qwen, qwen
    else:
        said = "local/triton red=experts ovl=none quant=bf16 takes "
        assert qwen.startswith(f"- qwen3: one combination per size, nothing to rank: {said}"), qwen
        assert re.search(r"µs at 16 tok, .* µs at 64 tok \(GPU time, median\)$", qwen), qwen
    shown = dict((name, alt) for alt, name in IMAGE.findall(head))
    if other == "host time":  # the figure ranks mixtral's rows alone, and says so
        assert shown["latency.png"].startswith("Fastest on mixtral at 64 tok: triton"), shown


def test_the_committed_profiler_run_names_each_fastests_model():
    """results/triton_vs_torch/profiler (qwen3_30b_a3b all host time, mixtral_8x7b ranked): its
    fastest printed mixtral's figures without the model, and qwen3 had no line of its own."""
    from moebench.report.answers import answers
    from moebench.report.load import load_run

    df, _ = load_run(Path(__file__).resolve().parents[2] / "results" / "triton_vs_torch" / "profiler")
    fastest = _section("\n".join(answers(df, None, []).lines), "## Fastest per size")
    assert fastest[0].startswith("- mixtral_8x7b · triton red=experts quant=bf16 · 64 tok: fastest, 1.38× ahead"), (
        fastest
    )
    assert any(x.startswith("- mixtral_8x7b: not ranked: 5 ok rows are host time (GPU busy") for x in fastest), fastest
    assert fastest[-1].startswith("- qwen3_30b_a3b: nothing ranked: all 24 ok rows are host time (GPU busy"), fastest
    assert all(x.startswith(("- mixtral_8x7b", "- qwen3_30b_a3b")) for x in fastest), fastest


def test_a_cpu_runs_overlap_is_a_pipeline_check(tmp_path):
    """A CPU run's *Shared experts hidden* read 'hides 0% ... (median of 15 rows, 0%–100%)' under a
    bare heading, like a finding, though *What each choice does* said CPU; then, under a CPU heading,
    still quoted that median and range: it says only that the overlap ran and recorded its fraction."""
    from moebench.report.answers import answers
    from moebench.report.load import load_run

    rng = np.random.default_rng(5)
    rows = [
        make_row("allgather_rs", "torch", "experts", ovl, "bf16", t, samples_us=samples_from(100.0 + t, 0.01, 20, rng),
                 world_size=2, device="cpu", overlap_fraction=0.0 if ovl != "none" else np.nan)
        for ovl in ("none", "combine") for t in (16, 64)
    ]  # fmt: skip
    df, _ = load_run(write_run(tmp_path / "run", pd.DataFrame(rows)))
    lines = answers(df, None, []).lines
    heads = [x for x in lines if x.startswith("## ")]
    assert "## Shared experts hidden (CPU: a pipeline check, not performance)" in heads, heads
    body = "\n".join(lines).partition("## Shared experts hidden")[2].partition("\n## ")[0]
    assert "a CPU run's overlap says nothing about a GPU's" in body, body
    assert "`overlap=combine` at 16 tok: ran, its hidden fraction recorded in 1 of 1 row" in body, body
    assert "hides" not in body and "median" not in body, body  # no figure to read as a finding


def test_counts_in_the_figures_captions_and_titles_agree_with_their_noun(tmp_path):
    """latency.png's caption read '1 slower combinations left out', effects.png's '1 smaller effects',
    workspace.png's title '0.76 × of experts's 54 MiB', a paced row's note '1 samples host-paced'
    where the samples' count is unknown, a comparison's caption '... of 1 rows'."""
    from moebench.report import answer_plots as ap
    from moebench.report.answers import workspace_stats
    from moebench.report.columns import combo_labels
    from moebench.report.effects import Effect
    from moebench.report.flags import paced_text

    rng = np.random.default_rng(6)
    experts = ("torch", "triton", "torch_batched", "triton_batched", "deepgemm", "triton_or_deepgemm", "cutlass")
    ok = pd.DataFrame([_row(e, "experts", 64, 100.0 + 10 * i, rng) for i, e in enumerate(experts)])
    fastest = ap.plot_fastest(ok, combo_labels, tmp_path / "latency.png")
    assert fastest is not None and fastest.left_out.startswith("1 slower combination left out ("), fastest
    effects = [Effect("quant", "fp8", "bf16", 2**k, 0.5 + 0.01 * k, 0.4, 0.6, 2) for k in range(ap.MAX_EFFECT_ROWS + 1)]
    drawn = ap.plot_effects(effects, tmp_path / "effects.png")
    assert drawn is not None and drawn.left_out.startswith("1 smaller effect left out ("), drawn
    mem = pd.DataFrame(
        [
            _row("triton", r, 256, 100.0, rng) | dict(workspace_bytes_peak=mib * 2**20)
            for r, mib in (("experts", 54), ("finalize", 41))
        ]
    )
    ws = workspace_stats(mem)
    assert ws is not None
    memory = ap.plot_memory(ws, tmp_path / "workspace.png")
    assert memory is not None and "reduction=finalize 41 MiB, 0.76 × the 54 MiB of experts (medians)" in memory.title
    assert paced_text({"host_paced_samples": 1.0}) == "latency: 1 sample host-paced"
    base = write_run(tmp_path / "base", pd.DataFrame([_row("triton", "experts", 64, 100.0, rng)]))
    cand = write_run(tmp_path / "cand", pd.DataFrame([_row("triton", "experts", 64, 150.0, rng)]))
    build_report(cand, tmp_path / "cmp", baseline=base)
    md = (tmp_path / "cmp" / "report.md").read_text()
    assert "Latency change per row: 1 slower of 1 row, geometric mean" in md, md
