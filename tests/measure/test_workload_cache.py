"""A rank draws each workload's inputs and computes its float32 reference once and keeps them
for the next combinations (measure/workload.py, issue #33): the same tensors as drawn afresh,
never shared with a kernel that writes its inputs, bounded in bytes, and the rows unchanged."""

from __future__ import annotations

import torch

from moebench.kernels.interfaces import LayerShape
from moebench.measure import samples, workload
from moebench.routing.generate import RoutingSpec
from moebench.run import plan, worker
from moebench.run.messages import Task

SHAPE = LayerShape(hidden=64, intermediate=32, num_experts=16, topk=4)


def _fresh(monkeypatch):
    monkeypatch.setattr(workload, "_routed", workload._Kept(4 << 30))
    monkeypatch.setattr(workload, "_references", workload._Kept(4 << 30))


def test_kept_inputs_equal_a_fresh_draw_and_a_kernel_cannot_write_them(monkeypatch):
    _fresh(monkeypatch)
    for spec, sim in (
        (RoutingSpec(name="zipf", skew=1.5, seed=3), ""),
        (RoutingSpec(name="uniform", seed=1, ep_size=4), "hottest"),
    ):
        first = workload.make_routed(SHAPE, 32, spec, 1, 2, "cpu", sim)
        drawn = workload._draw(SHAPE, 32, spec, 1, 2, sim)
        for a, b in zip(first.inputs, drawn.inputs, strict=True):
            assert torch.equal(a, b)
        first.inputs[0].fill_(7)  # a kernel that writes its input
        again = workload.make_routed(SHAPE, 32, spec, 1, 2, "cpu", sim)
        assert torch.equal(again.inputs[0], drawn.inputs[0])
        assert again.simulated_rank == drawn.simulated_rank and again.received_tokens == drawn.received_tokens
        assert torch.equal(again.expert_pairs, drawn.expert_pairs)
    assert len(workload._routed.items) == 2
    # another salt is another draw, kept beside the others
    zipf = RoutingSpec(name="zipf", skew=1.5, seed=3)
    other = workload.make_routed(SHAPE, 32, zipf, 1, 1, "cpu")
    assert not torch.equal(other.inputs[0], workload._draw(SHAPE, 32, zipf, 1, 2).inputs[0])
    assert len(workload._routed.items) == 3


def test_kept_tensors_stay_within_their_bytes_newest_always():
    kept = workload._Kept(max_bytes=3 * 400)
    made = []

    def make(i):
        made.append(i)
        return torch.zeros(100, dtype=torch.float32) + i  # 400 bytes

    for i in (0, 1, 2):
        kept.get((i,), lambda i=i: make(i), workload._nbytes)
    kept.get((0,), lambda: make(0), workload._nbytes)  # a hit: 0 becomes the newest
    kept.get((3,), lambda: make(3), workload._nbytes)  # over the bound: 1, the least recent, goes
    assert [k for k in kept.items] == [(2,), (0,), (3,)] and made == [0, 1, 2, 3]
    big = workload._Kept(max_bytes=10)
    big.get(("x",), lambda: torch.zeros(100), workload._nbytes)
    assert list(big.items) == [("x",)]  # larger than the bound alone: still kept, the newest


def test_a_reference_is_computed_once_per_workload_and_the_rows_do_not_change(monkeypatch, tmp_path):
    _fresh(monkeypatch)
    calls = []
    real = samples.reference_moe
    monkeypatch.setattr(samples, "reference_moe", lambda *a: (calls.append(1), real(*a))[1])
    base = [
        "backend=local",
        "model=tiny",
        "overlap=none",
        "runner.device=cpu",
        "runner.reps=2",
        "runner.warmup=1",
        "runner.phase_reps=1",
        "workload.tokens_per_rank=[4,8]",
    ]
    rows = {}
    for experts, reduction in (("torch", "experts"), ("torch", "finalize"), ("torch", "experts")):
        (c,), _ = plan.plan([*base, f"experts={experts}", f"reduction={reduction}"])
        out = [
            r
            for _, r in worker.run_combination(Task(0, c.combo, (4, 8)), 0, 1, None, torch.device("cpu"), str(tmp_path))
            if r is not None
        ]
        assert all(r.status == "ok" for r in out)
        rows.setdefault(reduction, []).append(out)
    assert len(calls) == 2  # one reference per token count, for three combinations of one workload
    first, again = rows["experts"]
    for a, b in zip(first, again, strict=True):  # the kept reference and inputs give the same figures
        assert a.rel_err == b.rel_err and a.imbalance_experts == b.imbalance_experts
    # another quant is another reference
    (c,), _ = plan.plan([*base, "experts=torch", "reduction=experts", "quant=fp8_tensor"])
    list(worker.run_combination(Task(0, c.combo, (4,)), 0, 1, None, torch.device("cpu"), str(tmp_path)))
    assert len(calls) == 3


def test_a_family_builds_each_set_of_expert_weights_once_and_keeps_one_set(monkeypatch, tmp_path):
    """The worker keeps the last combination's expert weights for the next one of the same model,
    quant, seed and share (measure/workload.py); another set replaces them, never beside them;
    the rows are those of weights built afresh."""
    _fresh(monkeypatch)
    monkeypatch.setattr(workload, "_weights", {})
    built = []
    real = workload.build_expert_weights
    monkeypatch.setattr(workload, "build_expert_weights", lambda *a: (built.append(a[0].quant.name), real(*a))[1])
    base = [
        "backend=local",
        "model=tiny",
        "overlap=none",
        "runner.device=cpu",
        "runner.reps=2",
        "runner.warmup=1",
        "runner.phase_reps=1",
        "workload.tokens_per_rank=[4]",
        "experts=torch",
    ]
    layers = []
    monkeypatch.setattr(worker, "build_layer", lambda *a, **k: layers.append(build(*a, **k)) or layers[-1])
    from moebench.measure.layer import build_layer as build

    rows = []
    for extra in (
        ["reduction=experts"],
        ["reduction=finalize"],
        ["reduction=experts", "quant=fp8_tensor"],
        ["reduction=experts"],
    ):
        (c,), _ = plan.plan([*base, *extra])
        rows += [
            r
            for _, r in worker.run_combination(Task(0, c.combo, (4,)), 0, 1, None, torch.device("cpu"), str(tmp_path))
            if r is not None
        ]
        assert len(workload._weights) == 1
    assert [r.status for r in rows] == ["ok"] * 4
    assert built == ["bf16", "fp8_tensor", "bf16"]  # the second combination reused the first's weights
    assert layers[1].weights is layers[0].weights and layers[2].weights is not layers[0].weights
    fresh = real(layers[3].ctx, c.combo.seed)
    assert torch.equal(layers[3].weights.w13_ENK, fresh.w13_ENK) and torch.equal(layers[3].weights.w2_EKI, fresh.w2_EKI)
    assert rows[3].rel_err == rows[0].rel_err
