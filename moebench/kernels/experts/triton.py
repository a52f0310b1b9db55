"""Standard-layout experts on our own Triton fused-MoE kernels (kernels/triton/).

Pairs are aligned by expert on the device (no host sync), the gate/up and down
GEMMs are vLLM-style grouped GEMMs over the sorted pairs, SiLU-and-mul is fused
with the fp8 activation quantization. reduction="experts" weights and sums in
the down-GEMM epilogue: fp32 atomics into an accumulator carved from ws13
(whose gate/up rows are consumed by then), so no [M, P, K] buffer exists.

bf16 and fp8_block with many rows per expert (prefill) take the contiguous layout
instead: the pairs' rows are copied into per-expert segments padded to 128 rows (the
layout the `deepgemm` experts build) so that both GEMM operands load through TMA
(kernels/triton/contiguous_gemm.py), then un-permuted with the reduction
(kernels/experts/_contiguous.py). The layout is chosen per call from the expected
local pairs per expert (`CONTIGUOUS_MIN_PAIRS_PER_EXPERT`, measured on an H200:
docs/findings/triton-vs-deepgemm.md); the knob experts.row_layout = gathered | contiguous forces one.
fp8_block's contiguous GEMMs run on the warp-specialized Gluon kernel (kernels/triton/
gluon_contiguous.py, SM90 only, issue #35), measured faster than the Triton one:
experts.contiguous_gemm=auto (the default) takes it on an SM90 GPU for GEMMs of at least
GLUON_MIN_N output columns (0 since its TMA-store epilogue: all); triton or gluon force one.
Each such weight's GEMM (gluon_contiguous.GluonGemm: its kernel and TMA descriptors) is set up
once, in __init__ (issue #46: a forward's host enqueue).
Where `moebench tune --decisions` left a sidecar beside the layer's tiles file (kernels/triton/
decisions.py, issue #51), its entry nearest M (the tiles' rule) decides the row layout under
row_layout=auto and the contiguous GEMM's kernel and Gluon variant under contiguous_gemm=auto; read
once in __init__ (every plan's GEMMs set up there), then cached per (M, topk): no per-forward work.
A Gluon choice where Gluon cannot run falls back to auto's answer; no entry: the constants above.

Legend: M rows, P top-k, K hidden, N = 2I, E local experts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import torch

from ..cards.experts import (  # noqa: F401 (re-exported: the tuner and the tests import them from here)
    CONTIGUOUS_GEMM_KNOB,
    CONTIGUOUS_MIN_PAIRS_PER_EXPERT,
    CONTIGUOUS_QUANTS,
    GLUON_GEMMS,
    GLUON_MIN_N,
    ROW_LAYOUT_KNOB,
    ROW_LAYOUTS,
    TritonCard,
    contiguous_gemm_kernel,
    contiguous_unsupported,
    gluon_runtime_unsupported,
    triton_unsupported,
)
from ..interfaces import Experts, ExpertWeights, KernelContext
from ..registry import register_experts
from ..triton.align import max_padded_rows
from ..triton.config import config_block_shape, config_dtype, files_label, get_config, tiles_file
from ..triton.contiguous_gemm import ALIGN, contiguous_gemm
from ..triton.decisions import GLUON_WIDE_N, load_decisions
from ..triton.deepgemm_layout import contiguous_scratch_numel
from ..triton.gemm import b_tma_device_error, b_tma_error
from ..triton.moe import alloc_bytes, fused_moe_standard, input_quant_bytes, standard_ws2_tail_rows
from ._contiguous import ContiguousWeights, contiguous_apply, contiguous_workspace_shapes


def gluon_runs(capability, quant: str) -> bool:
    """Whether a tuned Gluon choice can run here: fp8_block on an SM90 GPU that runs Gluon
    (capability None: none here, gluon_runtime_unsupported)."""
    return capability is not None and capability[0] == 9 and quant == "fp8_block"


class TritonConfigMixin:
    """Tile config per row count: ctx.options["triton_config"] (a dict with
    vLLM's keys, e.g. from the tuner) overrides kernels/configs/ and the heuristic."""

    # the Experts' attributes this mixes into
    ctx: KernelContext
    w: ExpertWeights
    _config_cache: dict[tuple[int, int], dict]  # set on first use; the tuner's bench pops it

    def _file_args(self) -> tuple:
        """(E, N, dtype, block_shape): the tiles file's key for this layer (vLLM's name's fields)."""
        q = self.w.quant
        E, _, I = self.w.w2_EKI.shape
        return E, I, config_dtype(q.name), config_block_shape(q.name, q.block_n, q.block_k)

    def _tiles_file(self) -> Optional[Path]:
        """The tiles file `_config` reads for this layer (config.tiles_file: the same look-up), None
        where there is none or ctx.options["triton_config"] stands in for it."""
        if self.ctx.options and self.ctx.options.get("triton_config"):
            return None
        return tiles_file(*self._file_args())

    def _config(self, M: int, topk: int) -> dict:
        cache: Optional[dict] = self.__dict__.get("_config_cache")  # no file look-ups in the hot path
        if cache is None:  # (the tuner's bench pops it when it swaps the tile)
            cache = self._config_cache = {}
        if (M, topk) not in cache:
            override = self.ctx.options.get("triton_config") if self.ctx.options else None
            if override:
                cfg = dict(override)
                if self.w.quant.is_block:  # a K tile must stay inside one scale group
                    cfg["BLOCK_SIZE_K"] = min(cfg["BLOCK_SIZE_K"], self.w.quant.block_k)
            else:
                E, N, dtype, block_shape = self._file_args()
                # (a tuned decision's additions: on the looked-up tile only, never an explicit one)
                cfg = self._tuned_tile(M, get_config(E, N, M, dtype, block_shape, topk=topk))
            cache[(M, topk)] = cfg
        return cache[(M, topk)]

    def _tuned_tile(self, M: int, cfg: dict) -> dict:
        """The tile with what a tuned decision adds to it (TritonExperts: B_TMA); here, cfg."""
        return cfg


@register_experts("triton")
class TritonExperts(TritonCard, TritonConfigMixin, Experts):
    def __init__(self, weights, reduction, ctx):
        super().__init__(weights, reduction, ctx)
        # the contiguous layout's view of the weights ([E, N, K], fp32 scales: no copy when stored so)
        q = weights.quant
        E, N, K = weights.w13_ENK.shape
        self._contiguous_ok = contiguous_unsupported(q.name, K, N // 2) is None
        self._contiguous_w = ContiguousWeights(weights) if self._contiguous_ok else None
        self.last_layout = ""  # bf16 / fp8_block: the layout the last apply() ran
        # experts.contiguous_gemm: each contiguous GEMM's kernel by its output columns (gate/up N, down K)
        opts = ctx.options or {}
        mode = opts.get("contiguous_gemm", "auto")
        dev = ctx.device
        cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" and not gluon_runtime_unsupported() else None
        self._sm90 = gluon_runs(cap, q.name)
        self._gemm_kernel = {n: contiguous_gemm_kernel(mode, q.name, cap, n) for n in (N, K)}
        # `moebench tune --decisions`' choices for this layer on this GPU (kernels/triton/decisions.py),
        # read once here; None: today's constants decide
        self.decisions = load_decisions(
            E, N // 2, config_dtype(q.name), config_block_shape(q.name, q.block_n, q.block_k), K
        )
        self._tuned_gemm = mode == "auto"  # a forced kernel is never replaced by a tuned one
        # the rows' tuned_files: the tiles file and the sidecar this layer read ("" : the heuristic
        # tiles and today's constants), named once here, never per forward
        self.tuned_files = files_label([self._tiles_file(), self.decisions.path if self.decisions else None])
        # "gate/up's kernel/down's kernel" of the last apply() on the contiguous layout, else ""
        self.last_gemm = ""
        # each GEMM plan the layer may run (the default, and each tuned entry's): its callable, with
        # the Gluon GEMM of each weight whose GEMM runs on a Gluon kernel set up here (its module
        # imported only then: Hopper only): a forward neither imports nor rebuilds the weight's TMA
        # descriptors (issue #46)
        self._gemm_fns = {}  # plan -> its gemm
        self._gluons = {}  # plan -> its Gluon GEMMs
        self._default_plan = self._plan_of(mode, opts.get("gluon_config"))
        plans = [self._default_plan]
        if self.decisions is not None and self._tuned_gemm:
            plans += [self._tuned_plan(e) for e in self.decisions.entries.values()]
        for plan in plans:
            if self._contiguous_ok and plan not in self._gemm_fns:
                self._gemm_fns[plan] = self._gemm_fn(plan)
        # (contiguous?, its gemm, label) per (M, topk): _run_plan
        self._run_cache: dict[tuple[int, int], tuple] = {}

    def _plan_of(self, mode: str, gluon_config) -> tuple:
        """(gate/up kernel, down kernel, Gluon config items or ()) under contiguous_gemm=mode."""
        _, N, K = self.w.w13_ENK.shape
        kernels: tuple = (self._gemm_kernel[N], self._gemm_kernel[K])
        if not (gluon_config and any(k in GLUON_GEMMS for k in kernels)):
            return (*kernels, ())
        if gluon_config.get("BLOCK_SIZE_N") == GLUON_WIDE_N:  # the tuner's forced variant: its tile names it
            kernels = tuple("gluon_wide" if k in GLUON_GEMMS else k for k in kernels)
        return (*kernels, tuple(sorted(gluon_config.items())))

    def _tuned_tile(self, M: int, cfg: dict) -> dict:
        """The gathered kernel's tile for M rows with the tuned entry's b_tma (the weights' tiles by
        TMA: gemm.py's B_TMA) where it can run: an SM90 or newer GPU or the interpreter, and both
        weights TMA-loadable in this tile. Read at the first forward of each (M, topk), into
        _config's cache; never on an explicit triton_config (the tuner's own tiles say what they
        time), and by the entries' nearest-key rule, as the row layout is."""
        if self.decisions is None or not self.decisions.at(M).get("b_tma") or "B_TMA" in cfg:
            return cfg
        if b_tma_device_error(self.ctx.device) or any(b_tma_error(w, cfg) for w in (self.w.w13_ENK, self.w.w2_EKI)):
            return cfg
        return {**cfg, "B_TMA": True}

    def _tuned_plan(self, entry: dict) -> tuple:
        """A tuned entry's GEMM plan; a Gluon choice where Gluon cannot run (no SM90 GPU, the
        interpreter) and an entry without one: the default plan."""
        kernel = entry.get("contiguous_gemm")
        if kernel == "triton":
            return ("triton", "triton", ())
        if kernel == "gluon" and self._sm90:
            cfg = entry.get("gluon_config") or {}
            label = "gluon_wide" if cfg.get("BLOCK_SIZE_N") == GLUON_WIDE_N else "gluon"
            return (label, label, tuple(sorted(cfg.items())))
        return self._default_plan

    def _gemm_fn(self, plan: tuple):
        """The contiguous layout's gemm(a, a_s, w, w_s, out, layout) of one plan."""
        cw = self._contiguous_w
        gluons = []
        if any(k in GLUON_GEMMS for k in plan[:2]):
            from ..triton.gluon_contiguous import GluonGemm

            for kernel, (wt, st) in zip(plan[:2], ((cw.w13, cw.s13), (cw.w2, cw.s2)), strict=True):
                if kernel in GLUON_GEMMS:
                    wide = {"BLOCK_SIZE_N": GLUON_WIDE_N} if kernel == "gluon_wide" else {}
                    gluons.append(GluonGemm(wt, st, {**dict(plan[2]), **wide} or None))
        self._gluons[plan] = gluons

        def gemm(a, a_s, w, w_s, out, layout):
            for g in gluons:  # (at most two: the weight itself picks its GEMM)
                if g.w is w:  # w's scales are the ones it holds (w_s: the same tensor)
                    g(a, a_s, out, layout.m_indices_Mp, layout.num_post)
                    return
            contiguous_gemm(a, a_s, w, w_s, out, layout.m_indices_Mp, rows_in_use=layout.num_post)

        return gemm

    def _run_plan(self, M: int, topk: int) -> tuple:
        """(contiguous?, its gemm or None, the rows' gemm label) for M rows: decided once per (M, topk)."""
        hit = self._run_cache.get((M, topk))
        if hit is None:
            contiguous = self._contiguous(M, topk)
            plan = self._default_plan
            if contiguous and self.decisions is not None and self._tuned_gemm:
                plan = self._tuned_plan(self.decisions.at(M))
            label = f"{plan[0]}/{plan[1]}" if contiguous else ""
            self._run_cache[(M, topk)] = hit = (contiguous, self._gemm_fns.get(plan) if contiguous else None, label)
        return hit

    def contiguous(self, M: int, topk: int) -> bool:
        """Whether M token rows run on the contiguous layout (module doc); decided once per
        (M, topk): it reads the options and the device's capability (issue #34)."""
        return self._run_plan(M, topk)[0]

    def _contiguous(self, M: int, topk: int) -> bool:
        layout = (self.ctx.options or {}).get("row_layout", "auto")
        if layout not in ROW_LAYOUTS:
            raise ValueError(f"row_layout={layout!r}: expected one of {', '.join(ROW_LAYOUTS)}")
        if not self._contiguous_ok:
            if layout == "contiguous":
                q, (_, N, K) = self.w.quant, self.w.w13_ENK.shape
                raise ValueError(f"row_layout=contiguous: {contiguous_unsupported(q.name, K, N // 2)}")
            return False
        if layout != "auto":
            return layout == "contiguous"
        dev = self.ctx.device
        if dev.type == "cuda" and torch.cuda.get_device_capability(dev)[0] < 9:
            return False  # TMA: SM90 and later
        tuned = self.decisions.at(M).get("row_layout") if self.decisions is not None else None
        if tuned is not None:
            return tuned == "contiguous"
        # ids hold all top-k picks of a row; about E_local / E_global of them are local
        local_pairs = M * topk * self.ctx.num_local_experts / self.ctx.shape.num_experts
        return local_pairs >= CONTIGUOUS_MIN_PAIRS_PER_EXPERT[self.w.quant.name] * self.ctx.num_local_experts

    def workspace_shapes(self, M, N, K, topk, num_local_experts):
        if self.contiguous(M, topk):
            mp = max_padded_rows(M * topk, num_local_experts, ALIGN)
            return contiguous_workspace_shapes(mp, M, N, K, topk, self.reduction, scaled=self.w.quant.is_block)
        # ws13: gate/up rows of every pair [M*P, N] (later: the fp32 [M, K] reduce
        # accumulator); ws2: the activation [M*P, N/2] (fp8 modes: its fp8 bytes and scales)
        # ws2's rows past the activation hold the int32 sort scratch (moe.standard_ws2_tail_rows)
        out = (M, K) if self.reduction == "experts" else (M, topk, K)
        bm = self._config(M, topk)["BLOCK_SIZE_M"] if M else 1
        tail = standard_ws2_tail_rows(M, topk, num_local_experts, bm, N // 2) if M else 0
        return (M * topk, N), (M * topk + tail, N // 2), out

    def transient_bytes(self, M, N, K, topk, num_local_experts):
        """An fp32 [M, K] accumulator only if ws13 is too small (K > P * I); an fp8 input copy
        only if a bf16 input does not fit in ws2's activation bytes (the int32 sort scratch
        sits in ws2's tail: workspace_shapes)."""
        if M * topk == 0:
            return 0
        if self.contiguous(M, topk):  # one int32 scratch: the sort, the layout, the pairs' slots
            return alloc_bytes(4 * contiguous_scratch_numel(M * topk, num_local_experts, ALIGN))
        n = 0
        if self.reduction == "experts" and 4 * M * K > 2 * M * topk * N:
            n += alloc_bytes(4 * M * K)
        q = self.w.quant
        if q.is_fp8 and input_quant_bytes(M, K, q) > 2 * M * topk * (N // 2):
            n += alloc_bytes(M * K) + (alloc_bytes(4 * M * (K // q.block_k)) if q.is_block else 0)
        return n

    def apply(self, output, prepared, workspace13, workspace2):
        ids = prepared.topk_ids_MP
        contiguous, gemm, label = self._run_plan(*ids.shape)
        if self._contiguous_ok:  # what ran, for the rows (experts.row_layout=auto decides per call)
            self.last_layout = "contiguous" if contiguous else "gathered"
            self.last_gemm = label
        if contiguous:
            contiguous_apply(gemm, self._contiguous_w, ALIGN, self.reduction, output, prepared, workspace13, workspace2)
            return
        fused_moe_standard(
            prepared.x,
            prepared.x_scale,
            ids,
            prepared.topk_weights_MP,
            self.w,
            output,
            workspace13,
            workspace2,
            self._config(ids.shape[0], ids.shape[1]),
            self.reduction,
        )
