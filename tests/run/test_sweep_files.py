"""Every sweep file of sweeps/: planned in tiny mode (each keeps a row that runs on the CPU), run
end to end in tiny mode (the one-rank `local` ones in the slow tier: default.yaml's local rows take
their path), and what the GPU-only files plan on a CPU."""

from __future__ import annotations

from pathlib import Path

import pytest

from moebench.results.store import RunStore
from moebench.run.sweep import execute


@pytest.fixture(autouse=True)
def no_interpreter(monkeypatch):
    # these tests cover the harness; Triton entries are covered by test_triton_kernels.py
    monkeypatch.setenv("TRITON_INTERPRET", "0")


SWEEPS = sorted(p.stem for p in (Path(__file__).parents[2] / "sweeps").glob("*.yaml"))
# these sweep files run, in tiny mode on the CPU, only one-rank `local` rows with torch experts
# (their Triton / DeepGEMM rows are skipped, the runner options are the test's): the same path as
# default.yaml's local rows. The default tier plans them (below) and runs the others end to end;
# the slow tier runs them too
ONE_RANK_LOCAL = {
    "timing_validation",
    "triton_roofline",
    "triton_roofline_v3",
    "triton_vs_deepgemm",
    "triton_vs_deepgemm_v3",
    "triton_vs_torch_events",
    "weight_reduce_memory",
    "host_path_gpu_time",
    "host_path_gpu_time_v3",
    "gluon_gemm",
    "gluon_gemm_v3",
}
TINY = [
    "model=tiny",
    "workload.tokens_per_rank=[4]",
    "runner.reps=1",
    "runner.warmup=0",
    "runner.phase_reps=1",
    "runner.memory=false",
    "runner.timing=events",
]


def _tiny_extra(sweep: str, tmp_path: Path) -> list[str]:
    """A sweep file's overrides for its CPU run in tiny mode (and the recording routing reads)."""
    # ep_scaling is for 4 and 8 GPUs: on the CPU, 4 gloo ranks with torch experts
    # deepep_ht_sm_budget's knobs are for DeepEP on GPUs: on the CPU its layer over naive
    extra = {
        "ep_scaling": ["runner.world_size=4", "experts=torch,torch_batched", "quant=bf16", "overlap=none,combine"],
        "deepep_ht_sm_budget": ["backend=naive", "backend.num_sms=24", "overlap.shared_sm_carveout=0"],
        # shared_overlap's Triton experts need a GPU: on the CPU its EP layers with torch experts
        "shared_overlap": ["experts=torch,torch_batched", "quant=bf16", "model=tiny"],
        # host_path_gpu_time's rows are Triton's alone (issue #34's GPU check): on the CPU the same
        # layers' torch experts
        "host_path_gpu_time": ["experts=torch"],
        "host_path_gpu_time_v3": ["experts=torch"],
        # gluon_gemm's rows are GPU-only (issue #35's Gluon GEMM, DeepGEMM): on the CPU the same layers'
        # torch experts beside the triton ones (skipped here), which keep the file's knob declared
        "gluon_gemm": ["experts=torch,triton"],
        "gluon_gemm_v3": ["experts=torch,triton"],
        # routing's kernels need a GPU and its recordings are the GPU models': torch experts, a tiny recording
        "routing": ["experts=torch,torch_batched", "quant=bf16", f"workload.routing_file={tmp_path}/%model%.npz"],
    }.get(sweep, [])
    if sweep == "routing":
        import numpy as np

        from moebench.routing import file

        rng = np.random.default_rng(0)
        file.write(
            str(tmp_path / "tiny.npz"),
            np.stack([rng.choice(8, 2, replace=False) for _ in range(64)]),
            num_experts=8,
            source="synthetic: the test's",
        )
    return extra


@pytest.mark.parametrize("sweep", SWEEPS)
def test_every_sweep_file_plans_runnable_rows_in_tiny_mode(sweep, tmp_path):
    """The fast sibling of the runs below: every sweep file composes with the tiny mode's
    overrides and keeps a combination that runs here."""
    from moebench.run.plan import plan

    combos, _ = plan([*TINY, *_tiny_extra(sweep, tmp_path)], sweep, oversubscribe=sweep == "ep_scaling")
    assert [c for c in combos if not c.reason and c.runnable_tokens], "a sweep file whose every row is skipped"


@pytest.mark.multiprocess
@pytest.mark.parametrize(
    "sweep", [pytest.param(s, marks=pytest.mark.slow) if s in ONE_RANK_LOCAL else s for s in SWEEPS]
)
def test_every_sweep_file_runs_in_tiny_mode(sweep, tmp_path):
    run_dir, counts = execute(
        [*TINY, *_tiny_extra(sweep, tmp_path)],
        sweep,
        str(tmp_path / sweep),
        quiet=True,
        oversubscribe=sweep == "ep_scaling",
    )
    df = RunStore(run_dir).load()
    assert set(df.status) <= {"ok", "skipped"}, df[["label", "status", "reason"]]
    assert (df.status == "ok").any(), "a sweep file whose every row is skipped tests nothing"
    if sweep in ONE_RANK_LOCAL:  # what makes it slow-tier only: default.yaml's local rows take this path
        ok = df[df.status == "ok"]
        assert set(ok.backend) <= {"local", "local_batched"} and (ok.world_size == 1).all(), ok[["label"]]


def test_triton_roofline_sweep_plans_graph_rows_per_token_count():
    """Its graph timing: torch experts (host syncs) skip the sizes timed as graph
    replays and run above graph_max_tokens with events."""
    from moebench.run.plan import plan

    combos, _ = plan(["runner.device=cpu"], "triton_roofline")
    torch_rows = [c for c in combos if c.combo["experts"] == "torch" and not c.reason]
    assert torch_rows and all(c.combo.timing == "graph" for c in torch_rows)
    for c in torch_rows:
        assert set(c.token_reasons) == {16, 64, 256} and c.runnable_tokens == [16384]


def test_ep_scaling_plans_world_sizes_4_and_8_and_refuses_them_without_the_gpus():
    from moebench.run import plan

    combos, _ = plan.plan(["runner.device=cpu"], "ep_scaling")
    sizes = {c.combo["world_size"] for c in combos}
    assert sizes == {4, 8}
    # world sizes 4 and 8 divide both models' experts: nothing is skipped for the world size's
    # arithmetic, only for layouts, libraries, Triton without a GPU, DeepGEMM without fp8, no
    # shared experts
    reasons = {c.reason for c in combos if c.reason}
    assert not [r for r in reasons if "does not divide" in r], reasons
    naive_triton = [
        c
        for c in combos
        if c.combo["backend"] == "naive" and c.combo["experts"] == "triton" and c.combo["model"] == "deepseek_v3"
    ]
    assert naive_triton and all(
        not c.reason or "Triton experts need a CUDA GPU" in c.reason or "this machine has" in c.reason
        for c in naive_triton
    )
    # on CUDA this machine (no GPU, or fewer than 4) is refused before any work
    with pytest.raises(ValueError, match=r"runner.device=cuda but no CUDA GPU|needs \d+ GPUs"):
        plan.plan(["runner.device=cuda"], "ep_scaling")


def test_a_named_sweep_is_taken_by_its_file_name_too_and_a_misspelled_one_is_named(capsys, tmp_path, monkeypatch):
    """`list --sweep default.yaml` said `no sweep 'default.yaml'` where help said '(or a path)' and
    `sweeps/default.yaml` worked."""
    from moebench import cli

    monkeypatch.chdir(tmp_path)  # no default.yaml here: the name is sweeps/'s
    assert cli.main(["list", "--sweep", "default.yaml"]) == 0
    by_file = capsys.readouterr().out
    assert cli.main(["list", "--sweep", "default"]) == 0
    assert capsys.readouterr().out == by_file
    assert cli.main(["list", "--sweep", "defualt.yaml"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "moebench list: error: no sweep 'defualt.yaml': give a sweep's name (default), its file name in "
        "sweeps/ (default.yaml) or a path to a sweep file; named sweeps: "
    )
    assert err.rstrip().endswith("; did you mean default?"), err
