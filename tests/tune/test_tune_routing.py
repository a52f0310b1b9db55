"""`moebench tune` on a routing (issue #32): the tiles are timed on the combination's routing,
and with backend.simulate_rank the table's entry is keyed by the rows the emulated rank's
experts receive (what the experts' config look-up keys on), not the tokens per rank."""

from __future__ import annotations

import json

import pytest

from moebench import cli
from moebench.kernels.triton import config as tconfig
from moebench.measure.layer import layer_shape
from moebench.measure.workload import make_routed, routing_spec
from moebench.run.plan import plan


@pytest.fixture(autouse=True)
def interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def test_tune_on_the_hottest_rank_keys_its_entry_by_the_rows_that_rank_receives(tmp_path):
    out = tmp_path / "tune"
    over = [
        "experts=triton",
        "backend=local",
        "model=tiny",
        "quant=bf16",
        "runner.device=cpu",
        "backend.simulate_ep=2",
        "backend.simulate_rank=hottest",
        "workload.routing=zipf",
        "workload.tokens_per_rank=[4]",
    ]
    assert cli.main(["tune", *over, "--space", "small", "--reps", "2", "--final-reps", "1", "--out", str(out)]) == 0
    (c,), _ = plan(over, None)
    rows = make_routed(layer_shape(c.combo), 4, routing_spec(c.combo), 0, 7, "cpu", "hottest").received_tokens
    assert 4 < rows <= 8  # both ranks' 4 tokens, those with a pair on the hottest rank
    (res,) = json.loads((out / "tune.json").read_text())["results"]
    assert res["tokens"] == 4 and res["rows"] == rows
    name = tconfig.config_file_name(4, 128, None, None)  # 8 experts over EP-2: 4 local
    assert set(json.loads((out / "configs" / name).read_text())) == {str(rows)}
