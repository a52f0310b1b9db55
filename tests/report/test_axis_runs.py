"""moebench compare BASE CAND --axis FIELD=A:B: a baseline run against a change's run that differs
in one field; runs (or an axis) no row of which pairs are bad input, exit 2, with what to do."""

from __future__ import annotations

import numpy as np
import pandas as pd

from moebench import cli
from moebench.results.synthetic import make_row, write_run


def _rows(reduction: str, scale: float = 1.0, seed: int = 0, model: str = "tiny") -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame(
        [
            make_row(
                "local",
                experts,
                reduction,
                "none",
                "bf16",
                t,
                model=model,
                samples_us=100.0 * scale * (1 + 0.01 * rng.standard_normal(20)),
            )  # fmt: skip
            for experts in ("torch", "triton")
            for t in (16, 64)
        ]
    )


def _compare(capsys, *argv):
    code = cli.main(["compare", *argv])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_two_runs_apart_in_one_field_exit_2_with_the_command_that_compares_them(tmp_path, capsys):
    base = str(write_run(tmp_path / "a", _rows("finalize")))
    cand = str(write_run(tmp_path / "b", _rows("experts")))
    code, out, err = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))
    assert code == 2, (out, err)
    assert f"moebench compare {base} {cand} --axis reduction=finalize:experts" in err, err
    assert "share no value of reduction only (reduction (finalize vs experts))" in err, err
    assert len(err.strip().splitlines()) == 1 and not (tmp_path / "r").exists()
    code, _, err = cli.main(["report", cand, "--baseline", base, "--out", str(tmp_path / "r")]), None, None
    assert code == 2 and not (tmp_path / "r").exists()


def test_two_runs_compared_along_the_field_they_differ_in(tmp_path, capsys):
    base = str(write_run(tmp_path / "a", _rows("finalize")))
    cand = str(write_run(tmp_path / "b", _rows("experts", scale=1.2, seed=1)))
    code, out, err = _compare(capsys, base, cand, "--axis", "reduction=finalize:experts", "--out", str(tmp_path / "r"))
    assert code == 1, (out, err)  # every pair 20 % slower
    first = out.splitlines()[0]
    assert first.startswith("**Verdict (b (reduction=experts) vs a (reduction=finalize)): 4 slower**"), first
    report = (tmp_path / "r" / "report.md").read_text().splitlines()
    assert report[0] == "# moebench compare: b (reduction=experts) vs a (reduction=finalize)", report[0]
    assert "finalize→experts" in "\n".join(report)  # the paired column, in the table
    assert "environments: comparable" in out  # two runs: two environments checked
    # the default folder names the axis beside the baseline
    code, _, _ = _compare(capsys, base, cand, "--axis", "reduction=finalize:experts")
    assert code == 1 and (tmp_path / "b" / "report" / "vs-a-axis-reduction-finalize-experts" / "report.md").exists()


def test_an_axis_value_a_side_lacks_and_unrelated_runs_are_bad_input(tmp_path, capsys):
    base = str(write_run(tmp_path / "a", _rows("finalize")))
    cand = str(write_run(tmp_path / "b", _rows("experts", model="other")))
    code, _, err = _compare(capsys, base, cand, "--axis", "reduction=experts:finalize")
    assert code == 2 and "no row of BASE has reduction=experts (BASE has reduction = finalize)" in err, err
    code, _, err = _compare(capsys, base, cand, "--axis", "reduction=finalize:experts")
    assert code == 2 and "nothing to compare" in err, err
    code, _, err = _compare(capsys, base, cand, "--out", str(tmp_path / "r"))
    assert code == 2 and "--axis FIELD=A:B" in err and "model (tiny vs other)" in err, err
    assert not (tmp_path / "r").exists()


def test_an_axis_within_one_run_whose_rows_never_pair_is_bad_input(tmp_path, capsys):
    rows = pd.concat([_rows("finalize"), _rows("experts", model="other")], ignore_index=True)
    run = str(write_run(tmp_path / "run", rows))
    code, _, err = _compare(capsys, run, "--axis", "reduction=finalize:experts", "--out", str(tmp_path / "r"))
    assert code == 2 and "nothing to compare" in err, err
    assert not (tmp_path / "r").exists()
