"""Text read from a run folder reaches Markdown inert (issue #31, item 3): env.json's fields, a
row's reason, labels and identity values, sweep-*.json's cli_overrides, a trace's names. The
report's Markdown keeps its own structure: no heading, HTML tag, link, image or extra table
cell comes out of that text, and no content closes a code block."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from moebench import cli
from moebench.report.mdsafe import code_block, md_code, md_text, shell_join
from moebench.results.synthetic import default_env, make_rows, write_run

HOSTILE = "\n# Verdict\n<img src=x> [x](http://e) ![i](x) <b>bold</b> `tick` | pipe *em* _u_ $m$"


CODE_SPAN = re.compile(r"(?<![`\\])(`+)(?!`)(.+?)(?<!`)\1(?!`)")


def assert_inert(md: str) -> None:
    """No heading, tag, link, image, emphasis or code span from HOSTILE outside a code span (whose
    content is literal text), and every table row as wide as its header."""
    text = CODE_SPAN.sub("", md)
    for bad in (r"<img", r"<b>", r"\]\(http://e\)", r"\]\(x\)", r"\*em", r"`tick", r"_u_", r"\$m"):
        assert not re.search(r"(?<!\\)" + bad, text), (bad, text)
    assert not re.search(r"(?m)^\s*#+\s*Verdict", md)
    header = None
    for line in md.splitlines():
        if not line.startswith("|"):
            header = None
            continue
        cells = len(re.split(r"(?<!\\)\|", line))
        if header is None:
            header = cells
        assert cells == header, line


@pytest.mark.parametrize(
    "text, want",
    [
        ("\n# Verdict\n<img src=x>", "⏎ # Verdict ⏎ &lt;img src=x&gt;"),
        ("# Verdict", "\\# Verdict"),
        ("> quote", "&gt; quote"),
        ("- item", "\\- item"),
        ("+ item", "\\+ item"),
        ("* item", "\\* item"),
        ("1. item", "1\\. item"),
        ("---", "\\---"),
        ("===", "\\==="),
        ("[x](http://e)", "\\[x\\](http://e)"),
        ("![i](x)", "!\\[i\\](x)"),
        ("<b>", "&lt;b&gt;"),
        ("a | b", "a \\| b"),
        ("`code`", "\\`code\\`"),
        ("*em* _u_", "\\*em\\* \\_u\\_"),
        ("tokens_per_rank", "tokens_per_rank"),
        ("-0.5", "-0.5"),
        ("1.5 ms", "1.5 ms"),
        ("NVIDIA H200 (of 2)", "NVIDIA H200 (of 2)"),
        ("a\\b", "a\\\\b"),
        ("x\x1b[31m", "x\ufffd\\[31m"),
    ],
)
def test_md_text_neutralizes_markdown_and_html(text, want):
    assert md_text(text) == want


def test_code_spans_blocks_and_commands_cannot_be_closed_by_their_content():
    assert md_code("a`b") == "``a`b``" and md_code("``") == "``` `` ```" and md_code("x\ny") == "`x ⏎ y`"
    block = code_block("moebench sweep\n```\n# evil", "bash")
    assert block.startswith("````bash\n") and block.endswith("\n````")
    assert shell_join(["moebench", "sweep", "a=1\n```\n# evil"]) == "moebench sweep $'a=1\\n```\\n# evil'"
    assert shell_join(["moebench", "model=tiny", "x y"]) == "moebench model=tiny 'x y'"


def _hostile_run(path: Path, scale: float = 1.0, seed: int = 0) -> Path:
    df = make_rows(scale=scale, seed=seed)
    df["reason"] = df["reason"].where(df["status"] == "ok", HOSTILE)
    for col in ("run_id", "sweep", "gpu", "git_sha", "timestamp"):
        df[col] = HOSTILE
    env = default_env() | {
        "gpu": HOSTILE,
        "cuda": HOSTILE,
        "torch": HOSTILE,
        "hostname": HOSTILE,
        "git_sha": HOSTILE,
        "git_dirty": True,
        "git_tree": "x",
        "git_diff_paths": [HOSTILE],
    }
    return write_run(path, df, env)


def test_env_json_and_row_text_reach_the_report_escaped(tmp_path, capsys):
    run = _hostile_run(tmp_path / "run")
    assert cli.main(["report", str(run)]) == 0
    stdout = capsys.readouterr().out
    md = (run / "report" / "report.md").read_text()
    assert_inert(md)
    assert_inert(stdout)
    assert "GPU 2 ×  ⏎ # Verdict ⏎ &lt;img src=x&gt;" in md  # shown, as text, one line
    assert "\\[x\\](http://e) !\\[i\\](x) &lt;b&gt;bold&lt;/b&gt;" in md  # the failed row's reason
    assert md.startswith("# moebench report: run\n")


def test_a_comparison_escapes_reasons_names_and_environments(tmp_path, capsys):
    base = _hostile_run(tmp_path / "base")
    cand_df = make_rows(scale=1.0, seed=1)
    cand_df.loc[cand_df["status"] == "ok", ["status"]] = "failed"  # every ok row breaks, with a reason
    cand_df.loc[cand_df["status"] == "failed", "reason"] = HOSTILE
    cand = write_run(tmp_path / "cand", cand_df, default_env() | {"gpu": HOSTILE})
    assert cli.main(["compare", str(base), str(cand), "--out", str(tmp_path / "out")]) == 1
    stdout = capsys.readouterr().out
    md = (tmp_path / "out" / "report.md").read_text()
    assert_inert(md)
    assert_inert(stdout)
    assert "**broken**" in md and "ok → failed: ⏎ # Verdict ⏎ &lt;img src=x&gt; \\[x\\](http://e)" in md  # the reason
    assert "environments: **not comparable** — CUDA: ⏎ # Verdict ⏎ &lt;img src=x&gt;" in md


def _results_tree(root: Path, overrides: list[str]) -> Path:
    (root / "q" / "run").mkdir(parents=True)
    (root / "q" / "about.md").write_text("# Does it hold?\n")
    (root / "q" / "run" / "env.json").write_text(json.dumps({"gpu": HOSTILE, "git_sha": HOSTILE}))
    (root / "q" / "run" / "sweep-0.json").write_text(
        json.dumps({"sweep": {"name": "adhoc"}, "cli_overrides": overrides})
    )
    return root


def test_cli_overrides_cannot_break_out_of_the_results_index_bash_block(tmp_path):
    from moebench.config.sweeps import load_sweep
    from moebench.report import results_index

    given = [f"{k}={v}" for k, v in load_sweep("default")["overrides"].items() if k != "model"]
    evil = "model=tiny\n```\n# Verdict\n<img src=x>"
    text = results_index.render(_results_tree(tmp_path / "results", given + [evil]))
    blocks = re.findall(r"(?ms)^(`{3,})bash\n(.*?)\n\1$", text)
    assert len(blocks) == 1
    fence, body = blocks[0]
    assert "```" in body and len(fence) == 4  # the fence outgrows the backticks inside
    lines = body.splitlines()
    assert lines[0] == "# run" and len(lines) == 2  # one comment, one command: the override stays on its line
    assert lines[1].endswith("$'model=tiny\\n```\\n# Verdict\\n<img src=x>'")
    outside = text.replace(f"{fence}bash\n{body}\n{fence}", "")
    assert_inert(outside)
    assert "| 1 × ⏎ # Verdict ⏎ &lt;img src=x&gt;" in outside  # env.json's gpu in the machine cell, as text


def test_trace_names_reach_the_markdown_escaped():
    from moebench.report.trace_markdown import to_markdown
    from moebench.report.trace_report import ranks_table
    from moebench.traces.metrics import StreamStats, TraceSummary

    s = TraceSummary(
        source=HOSTILE,
        fmt="torch",
        num_samples=1,
        combos=[HOSTILE],
        phases={},
        streams=[StreamStats(HOSTILE, 1, 1.0, 0.5, 0.5, {HOSTILE: 1.0})],
        shared_us=0.5,
        comm_us=0.5,
        overlap_us=0.2,
        trace_overlap_fraction=0.4,
        shared_exposed_us=0.3,
        intersection_fraction=0.4,
        notes=[HOSTILE],
    )
    assert_inert(to_markdown(s))
    assert_inert(to_markdown(s, {HOSTILE: HOSTILE}, HOSTILE))
    assert_inert(ranks_table(HOSTILE, "16", {0: s, 1: s}, None, HOSTILE))
    assert_inert(ranks_table(HOSTILE, "16", {0: s, 1: s}))


def test_the_repositorys_own_caveats_stay_verbatim(tmp_path):
    """caveats.md is the repository's text: its Markdown (a list, code) is kept as written."""
    run = _hostile_run(tmp_path / "run")
    (run / "caveats.md").write_text("- a caveat with `code` and a [link](../x.md)\n")
    assert cli.main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    assert "- a caveat with `code` and a [link](../x.md)" in md
    assert_inert(md.replace("[link](../x.md)", "").replace("`code`", ""))


def test_a_normal_run_reads_as_before(tmp_path):
    """Escaping leaves ordinary values as they were: no backslash in a synthetic run's report."""
    run = write_run(tmp_path / "plain", make_rows())
    assert cli.main(["report", str(run)]) == 0
    md = (run / "report" / "report.md").read_text()
    assert "\\" not in md and "&lt;" not in md and "⏎" not in md
    assert "GPU 2 × NVIDIA H200 · driver 580.159.04" in md and "| skipped | layouts differ" in md
