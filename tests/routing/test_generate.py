"""The routings (issue #32): imbalance modes hit their stated max/mean, simulate_rank=hottest
picks the rank an explicit EP-N split of the same ids loads most, the synthetic routings draw
the ids they drew before, replay reads consecutive windows and refuses bad files with one
line, fill levels produce the stated fills."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from moebench import cli
from moebench.kernels.interfaces import LayerShape
from moebench.measure.workload import make_inputs, make_routed
from moebench.routing import file, generate
from moebench.routing.generate import RoutingSpec

BIG = LayerShape(hidden=64, intermediate=32, num_experts=128, topk=8)  # qwen3's routing shape, small K


def _pairs(ids, E):
    return torch.bincount(ids.flatten(), minlength=E)


@pytest.mark.parametrize("R", [1.5, 2.0, 4.0, 8.0])
def test_imbalanced_experts_loads_the_hot_expert_r_times_the_mean(R):
    spec = RoutingSpec(name="imbalanced_experts", imbalance=R, seed=3)
    r = make_routed(BIG, 4096, spec, 0, 2, "cpu")
    ids = r.inputs[2]
    assert ids.shape == (4096, 8)
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()  # distinct per token
    c = _pairs(ids, 128).double()
    hot = generate.hot_expert(128, 3)
    assert abs(c[hot] / c.mean() - R) / R < 0.05
    assert abs(generate.imbalance(r.expert_pairs, 1).experts - R) / R < 0.05  # the row's figure
    others = torch.cat([c[:hot], c[hot + 1 :]])
    assert others.max() < c[hot] and others.std() / others.mean() < 0.15  # the rest: uniform


@pytest.mark.parametrize("N,R", [(8, 2.0), (8, 4.0), (4, 1.5), (16, 3.0)])
def test_imbalanced_ranks_loads_the_hot_ranks_experts_r_times_a_ranks_mean(N, R):
    spec = RoutingSpec(name="imbalanced_ranks", imbalance=R, seed=5, ep_size=N)
    ids = make_routed(BIG, 2048, spec, 0, 2, "cpu").inputs[2]
    assert (ids.sort(dim=1).values.diff(dim=1) > 0).all()
    by_rank = generate.rank_pairs(ids, 128, N).double()
    hot = generate.hot_rank(N, 5)
    assert int(by_rank.argmax()) == hot
    assert abs(by_rank[hot] / by_rank.mean() - R) / R < 0.05
    assert abs(generate.imbalance(_pairs(ids, 128), N).ranks - R) / R < 0.05


def test_every_rank_of_a_real_ep_run_shares_the_hot_expert_and_rank():
    for name in ("imbalanced_experts", "imbalanced_ranks"):
        spec = RoutingSpec(name=name, imbalance=3.0, seed=1, ep_size=8)
        per_rank = [make_routed(BIG, 512, spec, r, 2, "cpu").inputs[2] for r in range(8)]
        assert not torch.equal(per_rank[0], per_rank[1])  # each rank its own tokens...
        c = sum(_pairs(ids, 128) for ids in per_rank).double()
        if name == "imbalanced_experts":  # ...and one hot expert over all of them
            assert abs(c.max() / c.mean() - 3.0) < 0.15
        else:
            assert abs(c.view(8, -1).sum(1).max() / c.view(8, -1).sum(1).mean() - 3.0) < 0.15


@pytest.mark.parametrize("routing", ["uniform", "zipf", "balanced"])
def test_the_synthetic_routings_draw_what_they_drew_before(routing):
    """make_routed keeps make_inputs' stream: stored rows stay comparable."""
    spec = RoutingSpec(name=routing, skew=1.5, seed=4)
    a = make_inputs(BIG, 64, routing, 1.5, 4, 1, 2, "cpu")
    b = make_routed(BIG, 64, spec, 1, 2, "cpu").inputs
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.parametrize("routing", ["uniform", "zipf", "imbalanced_ranks"])
def test_simulate_rank_hottest_is_the_rank_an_explicit_split_loads_most(routing):
    """N ranks' tokens generated as a real EP-N run's ranks generate them (rank-salted), split
    explicitly: the emulated rank is the most loaded one, it receives exactly the tokens with a
    pair on its experts, and its local ids are theirs renamed."""
    N, T, E = 8, 256, 128
    spec = RoutingSpec(name=routing, skew=1.4, imbalance=2.5, seed=9, ep_size=N)
    ranks = [make_routed(BIG, T, spec, r, 2, "cpu").inputs for r in range(N)]
    ids = torch.cat([x[2] for x in ranks])
    load = [int(((ids >= k * 16) & (ids < (k + 1) * 16)).sum()) for k in range(N)]  # 16 experts a rank
    hottest = max(range(N), key=lambda k: (load[k], -k))
    sim = make_routed(BIG, T, spec, 0, 2, "cpu", simulate_rank="hottest")
    assert sim.simulated_rank == hottest
    got = ((ids >= hottest * 16) & (ids < (hottest + 1) * 16)).any(dim=1)
    assert sim.received_tokens == int(got.sum()) == sim.inputs[0].shape[0]
    assert torch.equal(sim.inputs[0], torch.cat([x[0] for x in ranks])[got])  # the same tokens
    local = sim.inputs[2]
    assert int(((local >= 0) & (local < 16)).sum()) == load[hottest]  # every pair it receives, as 0..15
    assert torch.equal(sim.expert_pairs, _pairs(ids, E))
    fixed = make_routed(BIG, T, spec, 0, 2, "cpu", simulate_rank=str((hottest + 1) % N))
    assert fixed.simulated_rank == (hottest + 1) % N


def test_simulate_rank_without_it_keeps_simulate_eps_meaning():
    spec = RoutingSpec(name="uniform", seed=0, ep_size=8)
    r = make_routed(BIG, 64, spec, 0, 2, "cpu")
    assert r.simulated_rank is None and r.inputs[0].shape[0] == 64
    assert all(
        torch.equal(x, y) for x, y in zip(r.inputs, make_inputs(BIG, 64, "uniform", 1.2, 0, 0, 2, "cpu"), strict=True)
    )


# -- replay ------------------------------------------------------------------------------------
def _recording(tmp_path, n=1000, E=128, P=8, layers=None, **kw):
    rng = np.random.default_rng(0)
    ids = np.stack([rng.choice(E, P, replace=False) for _ in range(n)])
    w = rng.random((n, P)).astype(np.float32)
    path = str(tmp_path / "rec.npz")
    file.write(path, ids, w, layer=layers, num_experts=E, source="test recording", **kw)
    return path, ids, w


def test_replay_reads_consecutive_windows_rank_after_rank(tmp_path):
    path, ids, w = _recording(tmp_path)
    spec = RoutingSpec(name="replay", seed=2, file=path, ep_size=2)
    start = file.window_start(1000, 2)
    r0 = make_routed(BIG, 300, spec, 0, 2, "cpu")
    r1 = make_routed(BIG, 300, spec, 1, 2, "cpu")
    rows0 = (start + np.arange(300)) % 1000
    rows1 = (start + 300 + np.arange(300)) % 1000
    assert np.array_equal(r0.inputs[2].numpy(), ids[rows0]) and np.array_equal(r1.inputs[2].numpy(), ids[rows1])
    assert np.allclose(r0.inputs[1].numpy(), w[rows0])
    assert r0.window.startswith(f"{start}:{start + 300} of 1000")
    again = make_routed(BIG, 300, spec, 0, 1, "cpu")  # the check's inputs: the same window
    assert torch.equal(again.inputs[2], r0.inputs[2])
    sim = make_routed(BIG, 300, spec, 0, 2, "cpu", simulate_rank="hottest")
    assert sim.window.startswith(f"{start}:{start + 600} of 1000")


def test_a_recordings_layer_is_picked_and_its_digest_is_the_combinations_identity(tmp_path, capsys):
    path, ids, _ = _recording(tmp_path, layers=np.arange(1000) % 2)
    assert (
        cli.main(
            [
                "list",
                "backend=local",
                "experts=torch",
                "model=qwen3_30b_a3b",
                "workload.routing=replay",
                f"workload.routing_file={path}",
            ]
        )
        == 2
    )
    assert "holds 2 layers (0, 1): pick one with workload.routing_layer=N" in capsys.readouterr().err
    from moebench.run.plan import plan

    (a,), _ = plan(
        [
            "backend=local",
            "experts=torch",
            "model=qwen3_30b_a3b",
            "workload.routing=replay",
            f"workload.routing_file={path}",
            "workload.routing_layer=1",
        ],
        None,
    )
    assert a.combo.routing_file_sha256 == file.sha256_of(path) and a.combo.routing_layer == 1
    rec = file.load(path, 1)
    assert np.array_equal(rec.ids, ids[1::2])
    other = str(tmp_path / "other.npz")
    file.write(other, ids[:500], layer=(np.arange(500) % 2))
    (b,), _ = plan(
        [
            "backend=local",
            "experts=torch",
            "model=qwen3_30b_a3b",
            "workload.routing=replay",
            f"workload.routing_file={other}",
            "workload.routing_layer=1",
        ],
        None,
    )
    assert a.key != b.key  # another recording: another combination
    assert f"rec{file.sha256_of(path)[:8]}" in a.label


def _bad(tmp_path, name, **arrays):
    path = str(tmp_path / name)
    with open(path, "wb") as f:
        np.savez(f, **arrays)
    return path


@pytest.mark.parametrize(
    "case,needle",
    [
        ("out_of_range", "expert id 200 is outside the model's 128 experts"),
        ("wrong_topk", "pick 4 experts per token, the model picks 8"),
        ("nan", "topk_weights holds NaN or infinite values in 1 of 10 tokens"),
        ("empty", "is empty"),
        ("pickled", "cannot be read without unpickling"),
        ("no_ids", "holds no topk_ids array"),
        ("not_npz", "is not a readable .npz"),
        ("missing", "cannot read it"),
        ("duplicate", "pick one expert twice"),
    ],
)
def test_every_bad_recording_is_one_line_and_exit_2_before_any_work(tmp_path, capsys, case, needle):
    rng = np.random.default_rng(1)
    ids = np.stack([rng.choice(128, 8, replace=False) for _ in range(10)])
    if case == "out_of_range":
        ids[3, 2] = 200
        path = _bad(tmp_path, "a.npz", topk_ids=ids)
    elif case == "wrong_topk":
        path = _bad(tmp_path, "a.npz", topk_ids=ids[:, :4])
    elif case == "nan":
        w = rng.random((10, 8)).astype(np.float32)
        w[4, 1] = np.nan
        path = _bad(tmp_path, "a.npz", topk_ids=ids, topk_weights=w)
    elif case == "empty":
        path = str(tmp_path / "a.npz")
        open(path, "wb").close()
    elif case == "pickled":
        path = _bad(tmp_path, "a.npz", topk_ids=ids, source=np.array([{"a": 1}], dtype=object))
    elif case == "no_ids":
        path = _bad(tmp_path, "a.npz", ids=ids)
    elif case == "not_npz":
        path = str(tmp_path / "a.npz")
        with open(path, "w") as f:
            f.write("topk_ids,1,2\n")
    elif case == "missing":
        path = str(tmp_path / "nowhere.npz")
    else:
        ids[2, 1] = ids[2, 0]
        path = _bad(tmp_path, "a.npz", topk_ids=ids)
    rc = cli.main(
        [
            "sweep",
            "--out",
            str(tmp_path / "run"),
            "backend=local",
            "experts=torch",
            "model=qwen3_30b_a3b",
            "workload.routing=replay",
            f"workload.routing_file={path}",
        ]
    )
    err = capsys.readouterr().err
    assert rc == 2, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and needle in lines[0] and path in lines[0], err
    assert not (tmp_path / "run").exists()  # before any work


@pytest.mark.parametrize(
    "overrides,needle",
    [
        (["workload.routing=replay"], "needs workload.routing_file=PATH"),
        (["workload.routing=imbalanced_experts", "workload.imbalance=0.5"], "must be >= 1"),
        (["workload.routing=imbalanced_experts", "workload.imbalance=20"], "exceeds E/P = 128/8 = 16"),
        (["workload.fill=1.5"], "workload.fill=1.5 must be in (0, 1]"),
        (["backend.simulate_rank=hottest"], "set backend.simulate_ep=N too"),
        (["backend.simulate_ep=8", "backend.simulate_rank=8"], "is not a rank of EP-8 (0 .. 7)"),
        (["backend.simulate_ep=8", "backend.simulate_rank=hot"], "valid: hottest, or a rank"),
    ],
)
def test_bad_routing_keys_are_one_line_and_exit_2(capsys, overrides, needle):
    assert cli.main(["list", "backend=local", "experts=torch", "model=qwen3_30b_a3b", *overrides]) == 2
    assert needle in capsys.readouterr().err


def test_routings_an_ep_split_cannot_take_are_skipped_with_the_reason():
    from moebench.run.plan import plan

    # a sweep crossing routings names the recording once: the other routings leave it out
    (c,), _ = plan(["backend=local", "experts=torch", "model=tiny", "workload.routing_file=x.npz"], None)
    assert c.combo.routing_file == "" and c.combo.routing_file_sha256 == "" and not c.reason

    combos, _ = plan(
        ["backend=local", "experts=torch", "model=qwen3_30b_a3b", "workload.routing=imbalanced_ranks"], None
    )
    assert "needs an EP split" in combos[0].reason
    combos, _ = plan(
        [
            "backend=local",
            "experts=torch",
            "model=qwen3_30b_a3b",
            "workload.routing=imbalanced_ranks",
            "backend.simulate_ep=2",
            "workload.imbalance=1.9",
        ],
        None,
    )
    assert combos[0].reason is None
    combos, _ = plan(["backend=local", "experts=torch", "model=qwen3_30b_a3b", "workload.fill=0.5"], None)
    assert "sizes the batched layouts' buffers" in combos[0].reason


def test_fill_sizes_the_batched_rows_so_the_busiest_expert_fills_the_stated_share(tmp_path):
    """local_batched with workload.fill: the rows per expert the layer ran with, and the pairs
    the layer's own batched buffers held (its expert counts), give the stated fill."""
    from moebench.results.store import RunStore

    out = tmp_path / "f"
    rc = cli.main(
        [
            "sweep",
            "--out",
            str(out),
            "backend=local_batched",
            "experts=torch_batched",
            "reduction=finalize",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.fill=1.0,0.25,0.05",
            "workload.tokens_per_rank=[64]",
            "runner.reps=2",
            "runner.warmup=0",
            "runner.phase_reps=1",
            "runner.memory=false",
        ]
    )
    assert rc == 0
    df = RunStore(out).load().sort_values("fill")
    assert (df.status == "ok").all(), df.reason.tolist()
    for r in df.itertuples():
        assert abs(r.fill_max - r.fill) <= 1.0 / r.fill_rows + 1e-9, (r.fill, r.fill_max, r.fill_rows)
        assert r.fill_mean <= r.fill_max
    # 64 tokens x top-2 over 8 experts: ~16 pairs an expert; fill 0.05 -> ~20x the rows
    assert df.fill_rows.tolist() == sorted(df.fill_rows.tolist(), reverse=True)


def test_fill_rows_reach_the_layers_buffers():
    from moebench.kernels.interfaces import KernelContext, QuantSpec
    from moebench.kernels.prepare_finalize.local_batched import LocalBatchedPrepareFinalize

    shape = LayerShape(hidden=64, intermediate=32, num_experts=8, topk=2)
    pf = LocalBatchedPrepareFinalize(KernelContext(shape=shape, quant=QuantSpec("bf16"), device=torch.device("cpu")))
    x, w, ids = make_inputs(shape, 40, "uniform", 1.2, 0, 0, 2, "cpu")
    most = int(_pairs(ids, 8).max())
    pf.rows_per_expert = generate.fill_rows(most, 0.1)
    prepared = pf.prepare_async(x, w, ids, QuantSpec("bf16"))()
    X = prepared.x.shape[1]
    assert X == pf.rows_per_expert and abs(int(prepared.expert_num_tokens_E.max()) / X - 0.1) <= 1 / X


def test_a_models_placeholder_picks_each_models_own_recording(tmp_path):
    from moebench.run.plan import plan

    for name, E in (("qwen3_30b_a3b", 128), ("deepseek_v3", 256)):
        rng = np.random.default_rng(E)
        file.write(
            str(tmp_path / f"{name}.npz"), np.stack([rng.choice(E, 8, replace=False) for _ in range(64)]), num_experts=E
        )
    combos, _ = plan(
        [
            "backend=local",
            "experts=torch",
            "model=qwen3_30b_a3b,deepseek_v3",
            "workload.routing=replay",
            f"workload.routing_file={tmp_path}/%model%.npz",
        ],
        None,
    )
    assert {c.combo.model: c.combo.routing_file for c in combos} == {
        "qwen3_30b_a3b": f"{tmp_path}/qwen3_30b_a3b.npz",
        "deepseek_v3": f"{tmp_path}/deepseek_v3.npz",
    }
    assert len({c.combo.routing_file_sha256 for c in combos}) == 2


@pytest.mark.multiprocess
def test_a_replayed_sweep_stores_the_recordings_digest_window_and_source_and_the_report_says_so(tmp_path):
    from moebench.report.document import write_report
    from moebench.results.store import RunStore

    rng = np.random.default_rng(7)
    path = str(tmp_path / "rec.npz")
    digest = file.write(
        path,
        np.stack([rng.choice(8, 2, replace=False) for _ in range(100)]),
        rng.random((100, 2)).astype(np.float32),
        num_experts=8,
        source="synthetic: a test's ids",
    )
    out = tmp_path / "r"
    rc = cli.main(
        [
            "sweep",
            "--out",
            str(out),
            "backend=local",
            "experts=torch",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.routing=replay",
            f"workload.routing_file={path}",
            "workload.tokens_per_rank=[16,64]",
            "runner.reps=2",
            "runner.warmup=0",
            "runner.phase_reps=1",
            "runner.memory=false",
        ]
    )
    assert rc == 0
    df = RunStore(out).load()
    assert (df.status == "ok").all() and (df.routing_file_sha256 == digest).all() and (df.routing_file == path).all()
    assert (df.routing_source == "synthetic: a test's ids").all()
    start = file.window_start(100, 0)
    assert sorted(df.routing_window) == sorted(
        [
            f"{start}:{start + 16} of 100" + (" (wraps)" if start + 16 > 100 else ""),
            f"{start}:{start + 64} of 100" + (" (wraps)" if start + 64 > 100 else ""),
        ]
    )
    assert df.imbalance_experts.gt(1.0).all()
    text = write_report(out).read_text()
    assert "## Routing" in text and "synthetic: a test's ids" in text and digest[:12] in text


@pytest.mark.multiprocess
def test_a_recording_round_trips_from_the_capture_helper_through_a_sweep(tmp_path):
    """capture helper -> file -> sweep -> rows with the file's digest and the recorded ids."""
    from moebench.results.store import RunStore
    from moebench.routing.capture import RoutingRecorder

    class Router(torch.nn.Module):  # any module whose output gives the top-k: here (weights, ids)
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(32, 8)

        def forward(self, x):
            return torch.topk(torch.softmax(self.lin(x), dim=-1), 2, dim=-1)

    torch.manual_seed(0)
    router, rec = Router(), RoutingRecorder()
    with rec, torch.no_grad():
        rec.attach(router, layer=3)
        for _ in range(4):
            router(torch.randn(40, 32))
    path = str(tmp_path / "captured.npz")
    digest = rec.save(path, num_experts=8, source="a test router")
    recording = file.load(path, 3, num_experts=8, topk=2)
    assert recording.tokens == 160 and recording.layers == (3,)
    out = tmp_path / "r"
    rc = cli.main(
        [
            "sweep",
            "--out",
            str(out),
            "backend=local",
            "experts=torch",
            "reduction=experts",
            "overlap=none",
            "quant=bf16",
            "model=tiny",
            "workload.routing=replay",
            f"workload.routing_file={path}",
            "workload.routing_layer=3",
            "workload.tokens_per_rank=[32]",
            "runner.reps=2",
            "runner.warmup=0",
            "runner.phase_reps=1",
            "runner.memory=false",
        ]
    )
    assert rc == 0
    (row,) = RunStore(out).load().itertuples()
    assert row.status == "ok" and row.routing_file_sha256 == digest and row.routing_layer == 3
    assert row.routing_source == "a test router"
    spec = RoutingSpec(name="replay", file=path, layer=3)
    ids = make_routed(LayerShape(hidden=256, intermediate=128, num_experts=8, topk=2), 32, spec, 0, 2, "cpu").inputs[2]
    start = file.window_start(160, 0)
    assert np.array_equal(ids.numpy(), recording.ids[(start + np.arange(32)) % 160])


def test_a_recording_of_a_model_with_other_experts_is_refused_naming_both_counts(tmp_path, capsys):
    """A 4-expert model's recording (every id valid for 8 experts too) replayed on the 8-expert
    `tiny` model: one line naming both counts, exit 2, before any work."""
    rng = np.random.default_rng(3)
    ids = np.stack([rng.choice(4, 2, replace=False) for _ in range(64)])
    path = str(tmp_path / "four.npz")
    file.write(path, ids, num_experts=4, source="a 4-expert model")
    out = tmp_path / "run"
    rc = cli.main(
        [
            "sweep",
            "--out",
            str(out),
            "backend=local",
            "experts=torch",
            "model=tiny",
            "quant=bf16",
            "workload.routing=replay",
            f"workload.routing_file={path}",
        ]
    )
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2 and len(lines) == 1, err
    assert "recorded on a model of 4 experts, the model has 8" in lines[0] and path in lines[0]
    assert not (out / "rows").exists()
    # the same ids recorded on an 8-expert model replay
    same = str(tmp_path / "eight.npz")
    file.write(same, ids, num_experts=8)
    assert file.load(same, num_experts=8, topk=2).num_experts == 8
