"""A tuned candidate whose timing had host-paced samples (left after the timing loop's retakes with
doubled holds) never wins on host time: the trial keeps its figures and count, carries an error,
ranks as failed, and the tune's summary and tune.json say which were left out (docs/design.md,
"Reports, comparisons and tuning"). The GPU's answer is stood in for by the timing loop's."""

from __future__ import annotations

import json

import pytest

from moebench import cli
from moebench.measure import timing
from moebench.tune import bench
from moebench.tune.space import config_key


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_a_host_paced_trial_never_wins_and_the_tune_says_so(tmp_path, monkeypatch, capsys):
    current, timed = {}, []
    use = bench.TokenBench.use

    def spy(self, cfg):
        current["cfg"] = cfg
        return use(self, cfg)

    def fake(fns, device, reps, *a, **k):
        if len(fns) > 1:  # the finalists, interleaved: none paced
            return [timing.Samples([20.0 + j] * reps) for j in range(len(fns))]
        timed.append(dict(current["cfg"]))
        # the first config screened (the heuristic baseline) is by far the fastest, but the host paced it
        return [timing.Samples([1.0] * reps, 1) if len(timed) == 1 else timing.Samples([10.0 + len(timed)] * reps)]

    monkeypatch.setattr(bench.TokenBench, "use", spy)
    monkeypatch.setattr(timing, "time_interleaved", fake)
    out = tmp_path / "tune"
    argv = [
        "tune",
        "experts=triton",
        "backend=local",
        "model=tiny",
        "quant=bf16",
        "runner.device=cpu",
        "workload.tokens_per_rank=[4]",
        "--space",
        "small",
        "--reps",
        "2",
        "--final-reps",
        "2",
        "--out",
        str(out),
    ]
    assert cli.main(argv) == 0
    text = capsys.readouterr().out
    paced = config_key(timed[0])
    (res,) = json.loads((out / "tune.json").read_text())["results"]
    assert res["best"] is not None and config_key(res["best"]) != paced and res["best_us"] > 10.0
    assert res["errors"] == {"host-paced": 1}
    assert res["baselines"]["heuristic"]["error"].startswith("host-paced: 1 of 2 samples started on the GPU")
    assert res["speedup_vs_heuristic"] is None  # no speed-up against a host-time figure
    (trial,) = [
        t
        for t in map(json.loads, (out / "trials.jsonl").read_text().splitlines())
        if t["phase"] == "screen" and config_key(t["config"]) == paced
    ]
    assert trial["us"] == 1.0 and trial["error"].startswith("host-paced")  # its figure kept, for reading
    assert "Host-paced trials (never ranked" in text
    assert "4 tokens: 1 screened config left out, their samples host-paced" in text
    assert "baselines among them: " in text and "heuristic" in text.partition("baselines among them: ")[2]
