"""The one-launch alignment against the two-kernel path (kernels/triton/align.py), shared by the
interpreter's test (tests/kernels/test_host_path.py) and the GPU's (tests/gpu/test_triton_fastlaunch.py)."""

from __future__ import annotations

import torch


def one_and_two_launch_layouts(monkeypatch, ids: torch.Tensor, E: int, block_m: int):
    """(the one-launch layout, its padded row count), asserting it equals the two-kernel path's:
    the same padded rows and block experts, each block's pairs as a set (their order inside an
    expert comes from atomics)."""
    from moebench.kernels.triton import align

    one = [t.clone() for t in align.moe_align_block_size(ids, E, block_m)]
    monkeypatch.setattr(align, "ONE_LAUNCH_MAX_PAIRS", -1)
    two = [t.clone() for t in align.moe_align_block_size(ids, E, block_m)]
    n = int(two[2])
    assert int(one[2]) == n
    assert torch.equal(one[1][: n // block_m], two[1][: n // block_m])
    assert torch.equal(one[0][:n].view(-1, block_m).sort(1).values, two[0][:n].view(-1, block_m).sort(1).values)
    return one, n
