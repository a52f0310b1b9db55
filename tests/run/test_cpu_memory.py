"""A CPU combination whose expert weights do not fit this machine's memory (run/cpu_memory.py): refused
before any work where the command line names the model, skipped with the reason where a sweep file
does (as a world size the machine lacks is); the machine's memory is monkeypatched."""

from __future__ import annotations

import pytest

from moebench import cli
from moebench.run import cpu_memory
from moebench.run.plan import plan

GIB = 2**30
V3 = ["backend=local", "experts=torch", "reduction=experts", "overlap=none", "quant=bf16", "runner.device=cpu"]


@pytest.fixture
def machine(monkeypatch):
    def set_gib(gib):
        monkeypatch.setattr(cpu_memory, "available_memory_bytes", lambda: None if gib is None else int(gib * GIB))

    return set_gib


def test_the_estimate_is_every_ranks_weights_at_their_build_and_the_reference():
    (c,), _ = plan([*V3, "model=deepseek_v3", "workload.tokens_per_rank=[4]"])
    weights, reference = cpu_memory.need_bytes(c.combo)
    routed = 256 * 3 * 7168 * 2048 * (2 + 2)  # per-expert bf16 copies beside their stack
    shared = 1 * 3 * 7168 * 2048 * 2
    assert (weights, reference) == (routed + shared, 3 * 7168 * 2048 * 4)  # one expert's reference at a time
    (eighth,), _ = plan([*V3, "model=deepseek_v3", "backend.simulate_ep=8", "workload.tokens_per_rank=[4]"])
    assert cpu_memory.need_bytes(eighth.combo)[0] == routed // 8 + shared


def test_a_model_named_on_the_command_line_that_does_not_fit_is_refused_before_any_work(machine, tmp_path, capsys):
    machine(24)
    out = tmp_path / "run"
    assert cli.main(["sweep", "--dry-run", *V3, "model=deepseek_v3", "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and not out.exists()
    assert captured.err.splitlines() == [
        "moebench sweep: error: not enough memory: model=deepseek_v3 quant=bf16 on the CPU needs about 42.1 GiB "
        "to build its expert weights and 0.2 GiB for the float32 reference; this machine has 24.0 GiB available: "
        "keep one EP rank's share (backend=local backend.simulate_ep=2), use a smaller model (model=tiny), "
        "or run it on a GPU"
    ]
    assert cli.main(["run", *V3, "model=deepseek_v3", "workload.tokens_per_rank=[4]", "--out", str(out)]) == 2
    assert "not enough memory" in capsys.readouterr().err and not out.exists()
    # its share fits, as a smaller model does; a machine whose memory is unknown is not asked
    for argv in (["model=deepseek_v3", "backend.simulate_ep=8"], ["model=tiny"]):
        assert cli.main(["sweep", "--dry-run", *V3, *argv, "--out", str(out)]) == 0, capsys.readouterr().err
    machine(None)
    assert cli.main(["sweep", "--dry-run", *V3, "model=deepseek_v3", "--out", str(out)]) == 0
    capsys.readouterr()


def test_a_model_a_sweep_file_names_is_skipped_with_the_reason(machine, tmp_path, capsys):
    machine(24)
    sweep = tmp_path / "big.yaml"
    sweep.write_text("overrides:\n  model: deepseek_v3,tiny\n")
    out = tmp_path / "run"
    assert cli.main(["sweep", "--dry-run", "--sweep", str(sweep), *V3, "--out", str(out)]) == 0
    said = capsys.readouterr().out
    assert "would run 1 combination" in said and "/tiny  tokens" in said and "/deepseek_v3  tokens" not in said
    assert "not enough memory: model=deepseek_v3 quant=bf16 on the CPU needs about 42.1 GiB" in said


def test_fp8_counts_the_float32_temporaries_of_quantizing_the_stacked_w13():
    """fp8 quantizes each rank's stacked w13 whole in float32 (kernels/quant.py), so its build peaks above
    bf16's though it stores one byte an element: measured on qwen3_30b_a3b's EP-4 share (session 26's
    review) 0.60 GiB for bf16, 1.62 for fp8_block and 1.43 for fp8_tensor; the estimate stays above both fp8 figures
    (bf16's, 0.56, leaves out the build's small temporaries)."""
    share = ["model=qwen3_30b_a3b", "backend.simulate_ep=4", "workload.tokens_per_rank=[4]"]
    est = {}
    for q in ("bf16", "fp8_block", "fp8_tensor"):
        (c,), _ = plan([*V3[:-2], f"quant={q}", "runner.device=cpu", *share])
        est[q] = cpu_memory.need_bytes(c.combo)[0] / GIB
    assert est["fp8_block"] > est["bf16"] and est["fp8_tensor"] > est["bf16"]
    assert est["fp8_block"] >= 1.62 and est["fp8_tensor"] >= 1.43
