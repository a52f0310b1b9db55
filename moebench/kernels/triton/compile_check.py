"""Compile every fused-MoE Triton kernel for a CUDA target without a GPU.

The CPU interpreter runs kernels as numpy and never sees Triton's frontend type
checks or the GPU passes (layouts, pipelining, wgmma), so a kernel can pass
every interpreter test and still fail to compile on the GPU. This lowers each
kernel, in the variants the experts launch, down to a cubin for the target
(ptxas ships with the triton wheel), with the divisibility hints a real launch
gets, so the software pipeliner runs too.

    python -m moebench.kernels.triton.compile_check [--arch 90] [--quick]

Must run without TRITON_INTERPRET=1 (the kernels must be JIT functions).
"""

from __future__ import annotations

import argparse
import os
import sys

# unit strides: a launch specializes integer args equal to 1 into constants
_UNIT = dict(stride_ak=1, stride_bk=1, stride_cn=1)
# pointer / stride args that a real launch would see 16-divisible (unit strides excluded)
_DIV16_EXCLUDE = ("_ak", "_bk", "_cn", "_ask", "_bsk", "_bsn", "_asm", "_bse", "_sg", "rows_ptr")


def _compile(fn, types: dict, consts: dict, arch: int, num_warps: int = 4, num_stages: int = 3):
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    names = fn.arg_names
    sig = {n: ("constexpr" if n in consts else types[n]) for n in names}
    constexprs = {(names.index(k),): v for k, v in consts.items()}
    attrs = {
        (names.index(n),): [["tt.divisibility", 16]]
        for n, t in types.items()
        if n not in consts and (t.startswith("*") or n.startswith("stride")) and not n.endswith(_DIV16_EXCLUDE)
    }
    if getattr(fn, "is_gluon", lambda: False)():  # a Gluon kernel: its own front end
        from triton.experimental.gluon._runtime import GluonASTSource

        src = GluonASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    else:
        src = ASTSource(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
    return triton.compile(
        src, target=GPUTarget("cuda", arch, 32), options=dict(num_warps=num_warps, num_stages=num_stages)
    )


def _wgmma_serialized(ptx: str, arch: int) -> str:
    """ptxas's warnings that it serialized a kernel's WGMMAs (C7510-C7519: registers of an
    in-flight WGMMA touched, or its chain broken), '' when none: Triton's own ptxas run does
    not show them. Hopper only (the WGMMA instructions)."""
    import subprocess
    import tempfile

    if arch != 90:
        return ""
    from triton.backends.nvidia.compiler import get_ptxas

    with tempfile.TemporaryDirectory() as d:
        src = os.path.join(d, "k.ptx")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [get_ptxas(arch).path, "-arch=sm_90a", "-v", src, "-o", os.path.join(d, "k.cubin")]
        res = subprocess.run(cmd, capture_output=True, text=True)
    return "; ".join(line.strip() for line in (res.stdout + res.stderr).splitlines() if "C751" in line)


def _gemm_types(a: str, c: str, scale: str) -> dict:
    t = dict(
        a_ptr=a,
        b_ptr=a,
        b_desc=a,  # (B_TMA: a descriptor; else b_ptr again)
        c_ptr=c,
        a_scale_ptr=scale,
        b_scale_ptr=scale,
        topk_weights_ptr="*fp32",
        sorted_ids_ptr="*i32",
        expert_ids_ptr="*i32",
        num_post_ptr="*i32",
        N="i32",
        EM="i32",
        num_valid="i32",
    )
    for s in ("am", "ak", "be", "bn", "bk", "cm", "cn", "asm", "ask", "bse", "bsn", "bsk"):
        t[f"stride_{s}"] = "i32"
    return t


def _batched_types(a: str, scale: str) -> dict:
    t = dict(
        a_ptr=a,
        b_ptr=a,
        c_ptr="*bf16",
        a_scale_ptr=scale,
        b_scale_ptr=scale,
        expert_num_tokens_ptr="*i32",
        N="i32",
        X="i32",
    )
    for s in ("ae", "am", "ak", "be", "bn", "bk", "ce", "cm", "cn", "ase", "asm", "ask", "bse", "bsn", "bsk"):
        t[f"stride_{s}"] = "i32"
    return t


def variants(quick: bool):
    """(name, fn, types, constexprs, num_warps, num_stages) of every kernel variant."""
    from . import activation, align, gemm, quant, routing

    quants = [
        ("bf16", 0, "*bf16", "*bf16", 64),
        ("fp8_tensor", 1, "*fp8e4nv", "*fp32", 128),
        ("fp8_block", 2, "*fp8e4nv", "*fp32", 128),
    ]
    # 256-wide tiles span two fp8 weight-scale groups: the per-column scale path (gemm._b_scale_ptrs)
    tiles = (
        [(16, 64, 4, 4), (64, 256, 3, 8)]
        if quick
        else [(16, 64, 4, 4), (64, 128, 3, 4), (128, 128, 3, 8), (64, 256, 3, 8)]
    )
    out: list[tuple] = []  # (the constexpr dicts mix ints, floats and bools)
    ids = dict(ids_ptr="*i64", meta_ptr="*i32", num_pairs="i32", num_experts="i32")
    for scatter in (False, True):
        out.append(
            (
                f"align_count scatter={scatter}",
                align._align_count_kernel,
                dict(ids, expert_ids_ptr="*i32", sorted_ids_ptr="*i32", num_blocks="i32"),
                dict(BLOCK_M=16, NUM_BINS=256, CHUNK=1024, BLOCK_B=32, SCATTER=scatter, PAD_C=16),
                4,
                1,
            )
        )
    from . import batched_layout

    out.append(
        (
            "batched_slots",
            batched_layout._slots_kernel,
            dict(
                ids_ptr="*i64",
                pair_row_ptr="*i64",
                slot_token_ptr="*i64",
                slot_k_ptr="*i64",
                counts_ptr="*i32",
                num_pairs="i32",
                num_experts="i32",
                X="i32",
            ),
            dict(TOPK=8, CHUNK=32, NUM_BINS=256),
            4,
            1,
        )
    )
    for bits, has_scale in (("*u8", True), ("*i16", False)):
        out.append(
            (
                f"batched_fill {bits}",
                batched_layout._fill_kernel,
                dict(
                    x_ptr=bits,
                    xo_ptr=bits,
                    s_ptr="*fp32" if has_scale else bits,
                    so_ptr="*fp32" if has_scale else bits,
                    slot_token_ptr="*i64",
                    slot_k_ptr="*i64",
                    counts_ptr="*i32",
                    num_rows="i32",
                    X="i32",
                    K="i32",
                    G="i32",
                    stride_x="i32",
                    stride_xo="i32",
                    stride_s="i32",
                    stride_so="i32",
                ),
                dict(HAS_SCALE=has_scale, BLOCK_R=16, BLOCK_K=1024, BLOCK_G=64),
                4,
                1,
            )
        )
    out.append(
        (
            "localize_ids",
            routing._localize_kernel,
            dict(ids_ptr="*i64", out_ptr="*i64", num_pairs="i32", first="i32", num_local="i32"),
            dict(BLOCK=1024),
            4,
            1,
        )
    )
    out.append(
        (
            "align_scatter",
            align._align_scatter_kernel,
            dict(ids, sorted_ids_ptr="*i32", num_pair_programs="i32"),
            dict(BLOCK_M=16, BLOCK=256),
            4,
            1,
        )
    )
    for qname, q, a, scale, bk in quants:
        for bm, bn, stages, warps in tiles:
            for atomic in (False, True):
                consts = dict(
                    K=2048,
                    A_ROW_DIV=1 if atomic else 8,
                    C_ROW_DIV=8 if atomic else 1,
                    MUL_ROUTED_WEIGHT=atomic,
                    ATOMIC_ADD=atomic,
                    QUANT=q,
                    GROUP_N=128,
                    GROUP_K=128,
                    BLOCK_SIZE_M=bm,
                    BLOCK_SIZE_N=bn,
                    BLOCK_SIZE_K=bk,
                    GROUP_SIZE_M=8,
                    INTERPRET=False,
                    B_TMA=False,
                    **_UNIT,
                )
                c = "*fp32" if atomic else "*bf16"
                out.append(
                    (
                        f"fused_moe {qname} {bm}x{bn}x{bk} {'atomic' if atomic else 'store'}",
                        gemm.fused_moe_kernel,
                        _gemm_types(a, c, scale),
                        consts,
                        warps,
                        stages,
                    )
                )
                if qname != "fp8_tensor" and bm <= 128 and bn <= 128:  # the weights by TMA (a tuned decision)
                    types = dict(_gemm_types(a, c, scale), b_desc=f"tensordesc<{a[1:]}[{bn}, {bk}]>")
                    out.append(
                        (
                            f"fused_moe {qname} {bm}x{bn}x{bk} {'atomic' if atomic else 'store'} weights by TMA",
                            gemm.fused_moe_kernel,
                            types,
                            dict(consts, B_TMA=True),
                            warps,
                            stages,
                        )
                    )
        for bn in (64, 256):
            out.append(
                (
                    f"batched_moe {qname} 16x{bn}",
                    gemm.batched_moe_kernel,
                    _batched_types(a, scale),
                    dict(
                        K=7168,
                        QUANT=q,
                        GROUP_N=128,
                        GROUP_K=128,
                        BLOCK_SIZE_M=16,
                        BLOCK_SIZE_N=bn,
                        BLOCK_SIZE_K=bk,
                        GROUP_SIZE_M=1,
                        INTERPRET=False,
                        **_UNIT,
                    ),
                    4,
                    4,
                )
            )
    silu = dict(
        h_ptr="*bf16",
        scale_ptr="*fp32",
        amax_ptr="*fp32",
        sorted_ids_ptr="*i32",
        num_post_ptr="*i32",
        num_valid="i32",
        counts_ptr="*i32",
        X="i32",
        I="i32",
        stride_hm="i32",
        stride_om="i32",
        stride_sm="i32",
        stride_sg="i32",
    )
    for mode in range(4):
        for batched in (False, True):
            out.append(
                (
                    f"silu_mul mode={mode} batched={batched}",
                    activation._silu_mul_kernel,
                    dict(silu, out_ptr="*bf16" if mode == 0 else "*fp8e4nv"),
                    dict(
                        BATCHED=batched,
                        MODE=mode,
                        BLOCK_R=16,
                        BLOCK_C=128 if mode == 3 else 256,
                        FP8_MAX=448.0,
                        EPS=1e-10,
                        EXACT_ROUND=False,
                    ),
                    4,
                    1,
                )
            )
    out.append(
        (
            "silu_mul_rows",
            activation._silu_mul_rows_kernel,
            dict(h_ptr="*bf16", out_ptr="*bf16", R="i32", S="i32", stride_hm="i32", stride_om="i32"),
            dict(BLOCK_R=16, BLOCK_C=256, EXACT_ROUND=False),
            4,
            1,
        )
    )
    out.append(
        (
            "zero_rows",
            activation._zero_rows_kernel,
            dict(out_ptr="*bf16", ids_ptr="*i64", num_rows="i32", num_experts="i32", K="i32", stride_om="i32"),
            dict(BLOCK_R=16, BLOCK_C=256),
            4,
            1,
        )
    )
    for rc in (False, True):
        out.append(
            (
                f"group_quant counts={rc}",
                quant._group_quant_kernel,
                dict(
                    x_ptr="*bf16",
                    q_ptr="*fp8e4nv",
                    s_ptr="*fp32",
                    counts_ptr="*i32",
                    R="i32",
                    X="i32",
                    stride_xr="i32",
                    stride_qr="i32",
                    stride_sr="i32",
                    stride_sg="i32",
                ),
                dict(ROW_COUNTS=rc, BLOCK_R=16, GROUP=128, FP8_MAX=448.0, EPS=1e-10, EXACT_ROUND=False),
                4,
                1,
            )
        )
        ids_type = "*i32" if rc else "*i64"  # the fused quantize-and-localize: the router's ids of either width
        out.append(
            (
                f"quant_localize ids={ids_type}",
                quant._quant_localize_kernel,
                dict(
                    x_ptr="*bf16",
                    q_ptr="*fp8e4nv",
                    s_ptr="*fp32",
                    ids_ptr=ids_type,
                    local_ptr="*i64",
                    R="i32",
                    stride_xr="i32",
                    stride_qr="i32",
                    stride_sr="i32",
                    P="i32",
                    first="i32",
                    num_local="i32",
                ),
                dict(BLOCK_R=16, BLOCK_P=8, GROUP=128, FP8_MAX=448.0, EPS=1e-10, EXACT_ROUND=False),
                4,
                1,
            )
        )
        out.append(
            (
                f"amax counts={rc}",
                quant._amax_kernel,
                dict(x_ptr="*bf16", amax_ptr="*fp32", counts_ptr="*i32", R="i32", K="i32", X="i32", stride_xr="i32"),
                dict(ROW_COUNTS=rc, BLOCK_R=16, BLOCK_C=256),
                4,
                1,
            )
        )
        out.append(
            (
                f"tensor_quant counts={rc}",
                quant._tensor_quant_kernel,
                dict(
                    x_ptr="*bf16",
                    q_ptr="*fp8e4nv",
                    amax_ptr="*fp32",
                    scale_ptr="*fp32",
                    counts_ptr="*i32",
                    R="i32",
                    K="i32",
                    X="i32",
                    stride_xr="i32",
                    stride_qr="i32",
                ),
                dict(ROW_COUNTS=rc, BLOCK_R=16, BLOCK_C=256, FP8_MAX=448.0, EPS=1e-10, EXACT_ROUND=False),
                4,
                1,
            )
        )
    # the contiguous layout (kernels/experts/_contiguous.py): the permute in its three modes,
    # the TMA grouped GEMM in the experts' default tiles
    from . import contiguous_gemm, deepgemm_layout

    perm = dict(
        sorted_ids_ptr="*i32",
        expert_ids_ptr="*i32",
        num_post_ptr="*i32",
        m_idx_ptr="*i32",
        inv_ptr="*i32",
        counts_ptr="*i32",
        ends_ptr="*i32",
        num_pairs="i32",
        num_experts="i32",
        Mp="i32",
        K="i32",
        stride_xm="i32",
        stride_xsm="i32",
        stride_xsg="i32",
    )
    for how, x, xs, a, a_s, quant_in, copy in (
        ("fp8 in", "*fp8e4nv", "*fp32", "*fp8e4nv", "*fp32", False, False),
        ("bf16 quantized", "*bf16", "*bf16", "*fp8e4nv", "*fp32", True, False),
        ("bf16 copied", "*bf16", "*bf16", "*bf16", "*bf16", False, True),
    ):
        out.append(
            (
                f"permute_contiguous {how}",
                deepgemm_layout._permute_kernel,
                dict(perm, x_ptr=x, xs_ptr=xs, a_ptr=a, as_ptr=a_s),
                dict(
                    TOPK=8,
                    A=128,
                    GROUP=128,
                    NUM_BINS=256,
                    QUANT_IN=quant_in,
                    COPY=copy,
                    FP8_MAX=448.0,
                    EPS=1e-10,
                    EXACT_ROUND=False,
                ),
                4,
                1,
            )
        )
    for quant_in, x, xs in ((False, "*fp8e4nv", "*fp32"), (True, "*bf16", "*bf16")):  # the masked DeepGEMM experts' pad
        out.append(
            (
                f"pad_batched quant_in={quant_in}",
                deepgemm_layout._pad_batched_kernel,
                dict(
                    x_ptr=x,
                    xs_ptr=xs,
                    counts_ptr="*i32",
                    a_ptr="*fp8e4nv",
                    as_ptr="*fp32",
                    Xp="i32",
                    K="i32",
                    G="i32",
                    stride_xe="i32",
                    stride_xr="i32",
                    stride_xse="i32",
                    stride_xsr="i32",
                    stride_xsg="i32",
                ),
                dict(BLOCK_R=16, GROUP=128, QUANT_IN=quant_in, FP8_MAX=448.0, EPS=1e-10, EXACT_ROUND=False),
                4,
                1,
            )
        )
    for qname, cfg, dt, scaled in (
        ("fp8_block", contiguous_gemm.DEFAULT_CONFIG, "fp8e4nv", True),
        ("bf16", contiguous_gemm.BF16_CONFIG, "bf16", False),
    ):
        bm, bn, bk = cfg["BLOCK_SIZE_M"], cfg["BLOCK_SIZE_N"], cfg["BLOCK_SIZE_K"]
        types = dict(
            a_desc=f"tensordesc<{dt}[{bm}, {bk}]>",
            b_desc=f"tensordesc<{dt}[{bn}, {bk}]>",
            c_ptr="*bf16",
            as_ptr="*fp32" if scaled else "*i32",
            bs_ptr="*fp32" if scaled else "*i32",
            m_idx_ptr="*i32",
            rows_ptr="*i32",
            Mp="i32",
            N="i32",
            num_programs="i32",
            tiles_per_program="i32",
            stride_cm="i32",
            stride_asm="i32",
            stride_asg="i32",
            stride_bse="i32",
            stride_bsn="i32",
            stride_bsk="i32",
        )
        out.append(
            (
                f"contiguous_gemm {qname} {bm}x{bn}x{bk}",
                contiguous_gemm._contiguous_kernel,
                types,
                dict(
                    K=2048,
                    SCALED=scaled,
                    GROUP_N=128,
                    BLOCK_SIZE_M=bm,
                    BLOCK_SIZE_N=bn,
                    BLOCK_SIZE_K=bk,
                    GROUP_SIZE_M=cfg["GROUP_SIZE_M"],
                    INTERPRET=False,
                    BOUNDED=False,
                ),
                cfg["num_warps"],
                cfg["num_stages"],
            )
        )
    # issue #35's Gluon kernel (opt-in; no interpreter runs it, so this is its CPU check)
    from . import gluon_contiguous, gluon_pipelined, gluon_wide

    g = gluon_contiguous.GLUON_CONFIG
    for ws, stages, ahead, epi_tma, bn in gluon_contiguous.GLUON_VARIANTS:
        consts = dict(K=2048, GROUP_N=128, GROUP_SIZE_M=g["GROUP_SIZE_M"], STAGES=stages)
        if bn == gluon_wide.WIDE_N:  # the 128 x 192 tile: its own kernel
            out.append(
                (
                    f"gluon_wide fp8_block 128x{bn}x128 WS stages {stages} TMA epilogue",
                    gluon_wide.gluon_fp8_wide_kernel,
                    gluon_wide.wide_signature_types(),
                    dict(consts, num_warps=4, as_desc=None, SCALE_TMA=False, PRODUCER_1W=False),
                    4,
                    1,
                )
            )
            continue
        fn, warps = (
            (gluon_contiguous._gluon_fp8_ws_kernel, 4) if ws else (gluon_pipelined.gluon_fp8_pipelined_kernel, 8)
        )
        consts["num_warps"] = warps
        types = gluon_contiguous.signature_types(g["BLOCK_SIZE_M"], g["BLOCK_SIZE_N"])
        if ws:
            epi_types, epi_consts = gluon_contiguous.ws_constexprs(epi_tma, g["BLOCK_SIZE_M"], g["BLOCK_SIZE_N"])
            types.update(epi_types)
            consts.update(epi_consts, SCALE_AHEAD=ahead)
        out.append(
            (
                f"gluon_contiguous fp8_block 128x128x128 {'WS ' if ws else ''}stages {stages}"
                + (f" scales {ahead} ahead" if ahead != 1 else "")
                + (" TMA epilogue" if epi_tma else ""),
                fn,
                types,
                consts,
                warps,
                1,
            )
        )
    # the column-band tile order (GROUP_SIZE_N: gluon_common.tile_coords's other branch) of every Gluon variant
    for name, fn, types, consts, warps, stages in [v for v in out if v[0].startswith("gluon_")]:
        out.append((name + " column bands", fn, types, dict(consts, GROUP_SIZE_M=-16), warps, stages))
    # the 128 x 192 tile with its activation scales TMA-loaded with each stage (SCALE_TMA)
    for name, fn, types, consts, warps, stages in [v for v in out if v[0].startswith("gluon_wide")]:
        consts = {k: v for k, v in consts.items() if k != "as_desc"}
        out.append((name + " scales by TMA", fn, types, dict(consts, SCALE_TMA=True), warps, stages))
        if "column bands" not in name:  # (GLUON_EXTRAS: the one-warp producer over SCALE_TMA alone)
            out.append(
                (
                    name + " scales by TMA, one-warp producer",
                    fn,
                    types,
                    dict(consts, SCALE_TMA=True, PRODUCER_1W=True),
                    warps,
                    stages,
                )
            )
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", type=int, default=90, help="compute capability x10 (90 = H100/H200)")
    p.add_argument("--quick", action="store_true", help="one tile config per kernel")
    args = p.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET") == "1":
        print("unset TRITON_INTERPRET: the interpreter replaces the JIT functions", file=sys.stderr)
        return 2
    failed = 0
    for name, fn, types, consts, warps, stages in variants(args.quick):
        try:
            k = _compile(fn, types, consts, args.arch, warps, stages)
            serialized = _wgmma_serialized(k.asm["ptx"], args.arch) if " WS " in f" {name} " else ""
            if serialized:  # the warp-specialized kernel exists to keep its WGMMAs in flight
                failed += 1
                print(f"FAIL  {name}: ptxas serializes its WGMMAs: {serialized}")
                continue
            print(f"ok    {name}  (shared memory {k.metadata.shared} B)")
        except Exception as e:  # noqa: BLE001 (report every failing kernel, not only the first)
            failed += 1
            print(f"FAIL  {name}: {type(e).__name__}: {e}")
    print(f"{failed} of {len(variants(args.quick))} kernel variants failed for sm_{args.arch}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
