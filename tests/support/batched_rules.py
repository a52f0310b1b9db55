"""The plan's layout rules for a batched EP backend (tests/kernels/test_deepep_skip.py,
tests/kernels/test_pplx_skip.py): standard experts do not pair with it, reduction=experts is
refused, and on the CPU the valid pairing still needs CUDA."""

from __future__ import annotations

from moebench.run import plan


def check_batched_layout_rules(backend: str, model: str) -> None:
    combos, _ = plan.plan(
        [
            f"backend={backend}",
            "experts=torch_batched,torch",
            "reduction=finalize,experts",
            "overlap=none",
            "quant=bf16",
            f"model={model}",
            "runner.device=cpu",
        ],
        None,
    )
    by = {(c.combo["experts"], c.combo["reduction"]): c for c in combos}
    assert "layouts differ" in by[("torch", "finalize")].reason
    assert "only reduction=finalize" in by[("torch_batched", "experts")].reason
    assert "CUDA" in by[("torch_batched", "finalize")].reason  # device=cpu
