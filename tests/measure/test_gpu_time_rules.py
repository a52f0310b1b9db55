"""A figure moebench calls latency is GPU time unless the row says otherwise (docs/design.md,
"Timing"): which timing auto chooses, that the local paths never sync the host (so they can be
captured and held), and that no summary, verdict or tuned table rests on host or CPU time."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from moebench import cli
from moebench.config import compose, validity
from moebench.kernels import registry
from moebench.report.best_per_size import best_per_size
from moebench.report.compare import compare_runs
from moebench.report.load import load_run
from moebench.report.summary import reviewer_summary, wins
from moebench.report.time_basis import CPU, GPU, HOST, figure_basis
from moebench.results.synthetic import make_row, write_run


def _combo(*overrides: str, device: str = "cuda"):
    cfg = compose.compose_config(["model=tiny", "quant=bf16", "reduction=experts", "overlap=none", *overrides])
    return compose.to_combo(cfg, device=device)


# -- auto's choice ------------------------------------------------------------------------


def test_auto_replays_graphs_at_every_size_where_the_layer_captures():
    c = _combo("backend=local", "experts=triton")
    assert validity.auto_events(c) is None
    assert [validity.timing_mode(c, t) for t in (16, 4096, 131072)] == ["graph"] * 3
    assert validity.timing_note(c, 4096) == ""
    # forced graph timing keeps its size limit; forced events are events everywhere
    g = _combo("backend=local", "experts=triton", "runner.timing=graph", "runner.graph_max_tokens=1024")
    assert validity.timing_mode(g, 1024) == "graph" and validity.timing_mode(g, 2048) == "events"
    assert "graph_max_tokens=1024" in validity.timing_note(g, 2048)
    e = _combo("backend=local", "experts=triton", "runner.timing=events")
    assert validity.timing_mode(e, 16) == "events" and validity.timing_note(e, 16) == ""


def test_auto_times_eager_forwards_where_a_graph_cannot_or_would_do_other_work(monkeypatch):
    # every local path captures now (no host sync): torch, torch_batched behind local_batched
    for overrides in (
        ("backend=local", "experts=torch"),
        ("backend=local_batched", "experts=torch_batched", "reduction=finalize"),
    ):
        assert validity.timing_mode(_combo(*overrides), 64) == "graph", overrides
    # an entry whose captured forward pads to an upper bound where the eager one reads host counts
    experts = registry.get_experts("torch")
    monkeypatch.setattr(experts, "graph_differs", "pads to the upper bound of rows")
    c = _combo("backend=local", "experts=torch")
    assert validity.timing_mode(c, 64) == "events"
    assert "other work (pads to the upper bound of rows)" in validity.timing_note(c, 64)
    monkeypatch.setattr(experts, "graph_differs", "")
    # one that cannot be captured, and a memory budget (a graph's pool would count against it)
    monkeypatch.setattr(experts, "graph_capturable", False)
    assert validity.timing_mode(c, 64) == "events" and "syncs the host" in validity.timing_note(c, 64)
    monkeypatch.setattr(experts, "graph_capturable", True)
    b = _combo("backend=local", "experts=torch", "runner.memory_budget=1GiB")
    assert validity.timing_mode(b, 64) == "events" and "memory_budget" in validity.timing_note(b, 64)
    # the CPU: the host clock (no events), no note, whatever runner.timing asked
    cpu = _combo("backend=local", "experts=torch", device="cpu")
    assert validity.timing_mode(cpu, 64) == "cpu" and validity.timing_note(cpu, 64) == ""
    assert validity.timing_mode(cpu.replace(timing="events"), 64) == "cpu"


def test_graph_max_tokens_is_no_identity_under_auto():
    a = _combo("backend=local", "experts=triton")
    b = _combo("backend=local", "experts=triton", "runner.graph_max_tokens=4096")
    assert a.key == b.key  # auto replays graphs at every size: the limit cannot matter


# -- the local paths never sync the host ----------------------------------------------------------

# ops whose output size or value reaches the host: a CUDA graph cannot hold them, and a
# held sample would wait for the GPU inside the forward
HOST_READS = (
    "aten::_local_scalar_dense",
    "aten::nonzero",
    "aten::masked_select",
    "aten::unique",
    "aten::_unique2",
    "aten::item",
    "aten::bincount",
)  # sizes its output from the largest value: a read-back on CUDA


class HostReads(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name in HOST_READS or (
            name == "aten::index.Tensor"
            and any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in (args[1] or ()) if i is not None)
        ):
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "backend, experts, reduction",
    [("local", "torch", "experts"), ("local", "torch", "finalize"), ("local_batched", "torch_batched", "finalize")],
)
def test_local_torch_paths_read_nothing_back_to_the_host(backend, experts, reduction):
    from moebench.measure.layer import build_layer
    from moebench.measure.workload import make_inputs

    cfg = compose.compose_config(
        [
            f"backend={backend}",
            f"experts={experts}",
            f"reduction={reduction}",
            "model=tiny",
            "quant=bf16",
            "overlap=none",
            "backend.simulate_ep=2",
        ]
    )
    layer = build_layer(compose.to_combo(cfg, device="cpu"), 0, 1, None, torch.device("cpu"))
    x, w, ids = make_inputs(layer.ctx.shape, 16, "uniform", 1.2, 0, 0, 2, torch.device("cpu"))
    layer.kernel(x, w, ids)  # workspaces and weights outside the check
    with HostReads() as mode:
        layer.kernel(x, w, ids)
    assert mode.seen == [], mode.seen


# -- figures that are not GPU time are never ranked ------------------------------------------------


def _rows(host_mode_fast: bool = True):
    """Two combinations at one size: `torch` in GPU time, `triton` faster by median but its
    samples paced by the host (timing_mode host)."""
    rng = np.random.default_rng(0)
    gpu = make_row(
        "local",
        "torch",
        "experts",
        "none",
        "bf16",
        64,
        samples_us=200 * np.exp(rng.normal(0, 0.01, 30)),
        host_paced_samples=0.0,
    )
    host = make_row(
        "local",
        "triton",
        "experts",
        "none",
        "bf16",
        64,
        samples_us=100 * np.exp(rng.normal(0, 0.01, 30)),
        timing_mode="host" if host_mode_fast else "events",
        host_paced_samples=30.0,
        timing_note="the forward syncs the host (its enqueue takes 21.0 ms behind a busy GPU)",
    )
    third = make_row(
        "local",
        "torch",
        "finalize",
        "none",
        "bf16",
        64,
        samples_us=210 * np.exp(rng.normal(0, 0.01, 30)),
        host_paced_samples=0.0,
    )
    return pd.DataFrame([gpu, host, third])


def test_figure_basis():
    gpu, host, _ = _rows().to_dict("records")
    assert figure_basis(gpu) == (GPU, "")
    assert figure_basis(host)[0] == HOST and "syncs the host" in figure_basis(host)[1]
    assert figure_basis({**gpu, "device": "cpu"})[0] == CPU
    # rows timed before the hold: plain events whose enqueue was ≥ 0.8 of the median
    old = {**gpu, "host_paced_samples": np.nan, "host_enqueue_us": 0.9 * gpu["latency_us_median"]}
    assert figure_basis(old)[0] == HOST
    # held rows: the enqueue may exceed the GPU time, the samples are still the GPU's
    held = {**gpu, "host_enqueue_us": 3 * gpu["latency_us_median"]}
    assert figure_basis(held) == (GPU, "")


def test_no_summary_or_tuned_table_names_a_host_time_row_fastest(tmp_path):
    df, _ = load_run(write_run(tmp_path / "run", _rows()))
    assert wins(df) and all("triton" not in w for w in wins(df))
    text = "\n".join(reviewer_summary(df, []))
    assert "not ranked, host time: 1 row —" in text and "syncs the host" in text
    best = best_per_size(df)
    assert list(best.combination) == ["local/torch red=experts ovl=none quant=bf16"] and best.candidates.tolist() == [2]
    assert len(best.attrs["left_out"]) == 1


def test_a_host_time_pair_gets_no_verdict(tmp_path):
    base = _rows(host_mode_fast=False)
    cand = base.copy()
    cand.loc[1, "timing_mode"] = "host"  # the same combination, now paced by the host
    cand.loc[1, ["latency_us_median", "latency_us_p20", "latency_us_p80"]] = [500.0, 495.0, 505.0]
    cand.at[1, "samples_us"] = [500.0] * 30
    base.loc[1, "host_paced_samples"] = 0.0
    cmp = compare_runs(base, cand)
    row = cmp.matched.set_index("experts").loc["triton"]
    assert row.verdict == "host" and "syncs the host" in row.no_verdict_why
    assert cmp.counts()["slower"] == 0 and len(cmp.judged) == 2


def _cpu_run(path, scale: float):
    rng = np.random.default_rng(int(scale * 10))
    rows = [
        make_row(
            "local",
            e,
            "experts",
            "none",
            "bf16",
            16,
            device="cpu",
            samples_us=scale * m * np.exp(rng.normal(0, 0.005, 20)),
        )
        for e, m in (("torch", 100.0), ("triton", 300.0))
    ]
    return write_run(path, pd.DataFrame(rows))


def test_two_cpu_runs_compare_without_a_verdict(tmp_path, capsys):
    a, b = _cpu_run(tmp_path / "a", 1.0), _cpu_run(tmp_path / "b", 1.5)  # b reads 1.5x slower
    code = cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "r")])
    out = capsys.readouterr().out
    assert code == 0
    assert "No verdict" in out and "CPU figures are pipeline checks" in out and "--cpu-verdict" in out
    assert "slower" not in out.split("\n")[0]
    # asked for, the verdict comes (and the exit status with it)
    assert cli.main(["compare", str(a), str(b), "--out", str(tmp_path / "r2"), "--cpu-verdict"]) == 1
    assert "2 slower" in capsys.readouterr().out
