"""The cards of moebench's experts: layout, CUDA-graph flags, knobs and `supports`, which
planning reads without importing the implementations (kernels/experts/, named by each
card's `implementation`) or Triton; torch only where the answer needs the GPU's
compute capability (device=cuda)."""

from __future__ import annotations

import os
from typing import Optional

from ..entry import ActivationFormat, ExpertsCard, Rule, first_reason
from ..experts import _deep_gemm
from ..knobs import Knob
from ..registry import card, ep_split

# fp8_block: the contiguous layout from this many expected local pairs per expert on. Measured
# on an H200 (docs/findings/triton-vs-deepgemm.md, experts phase, gathered / contiguous): qwen3_30b_a3b at 64
# pairs per expert 477 / 762 µs, deepseek_v3 (EP-8 share) at 128 1560 / 1348, mixtral_8x7b and
# qwen3_30b_a3b at 256 2040 / 1656 and 1376 / 1116
# bf16 (same, experts phase, gathered / contiguous): mixtral_8x7b at 256 pairs per expert 1925 /
# 1881 µs, at 1024 5792 / 5281; qwen3_30b_a3b at 256 1039 / 1060, at 1024 3059 / 2862;
# deepseek_v3's EP-8 share at 512 (16384 tokens) 3170 / 3319: its tuned gathered tiles win
CONTIGUOUS_MIN_PAIRS_PER_EXPERT = {"bf16": 1024, "fp8_block": 128}
CONTIGUOUS_QUANTS = tuple(CONTIGUOUS_MIN_PAIRS_PER_EXPERT)  # experts.row_layout applies to these
ROW_LAYOUTS = ("auto", "gathered", "contiguous")
ROW_LAYOUT_KNOB = Knob(
    "row_layout",
    "auto",
    "bf16 / fp8_block: gathered rows as vLLM's fused_moe reads them, "
    "contiguous rows permuted per expert (TMA loads), or auto (contiguous from "
    "CONTIGUOUS_MIN_PAIRS_PER_EXPERT expected local pairs per expert)",
    choices=ROW_LAYOUTS,
    tag="{}",
)
CONTIGUOUS_GEMMS = ("auto", "triton", "gluon", "gluon_wide")
GLUON_GEMMS = ("gluon", "gluon_wide")  # the Gluon kernels: SM90 only
# auto: the Gluon kernel for a GEMM of at least this many output columns (N), on an SM90 GPU,
# the Triton one below. Measured on an H200 (docs/findings/triton-vs-deepgemm.md, "The Gluon
# kernel, measured"; results/contiguous_variants/s9_gluon_*.json): with its register epilogue,
# Gluon / Triton GEMM time at 1024, 4096, 16384 tokens was DeepSeek-V3's EP-8 share gate/up
# (N 4096) 0.94, 0.91, 0.94 and down (N 7168) 0.92, 0.85, 0.84; mixtral_8x7b gate/up (N 28672)
# 0.94, 1.01, 0.94 and down (N 4096) 0.96, 0.92, 0.98; qwen3_30b_a3b gate/up (N 1536) 0.94,
# 0.98, 1.05 and down (N 2048) 0.96, 1.03, 1.06 (then GLUON_MIN_N was 4096). With the TMA-store
# epilogue (the default since), at 4096 and 16384 tokens: DeepSeek-V3 gate/up 0.88, 0.89 and
# down 0.72, 0.69; qwen3 gate/up 0.85, 0.86 and down 0.67, 0.73; mixtral (s10_gluon_v4) gate/up 0.85,
# 0.95 and down 0.91, 0.96: every N measured gains. qwen3's GEMMs lose at 1024 tokens (1.09 and 1.59),
# where the layer runs the gathered rows (row_layout=auto), not this choice
GLUON_MIN_N = 0
CONTIGUOUS_GEMM_KNOB = Knob(
    "contiguous_gemm",
    "auto",
    "fp8_block on the contiguous layout: the grouped GEMM in "
    "Triton (kernels/triton/contiguous_gemm.py), the warp-specialized Gluon kernel "
    "(kernels/triton/gluon_contiguous.py, SM90 only; issue #35), the same at a 128 x 192 "
    "tile (gluon_wide, kernels/triton/gluon_wide.py: opt-in, or chosen by a tuned sidecar), or auto "
    "(Gluon on an SM90 GPU, else Triton)",
    choices=CONTIGUOUS_GEMMS,
    tag="gemm={}",
)


GLUON_MIN_TRITON = (3, 6)  # the Gluon API the kernel is written against (gl.warp_specialize's list form)


def gluon_runtime_unsupported() -> Optional[str]:
    """Why this process cannot run a Gluon kernel whatever the GPU, or None: Triton's interpreter
    runs no Gluon, and Triton before 3.6 has another warp_specialize. Reads the installed
    version's metadata (planning imports no Triton)."""
    if os.environ.get("TRITON_INTERPRET") == "1":
        return "Gluon kernels have no interpreter (TRITON_INTERPRET=1)"
    from importlib import metadata

    try:
        version = metadata.version("triton")
    except metadata.PackageNotFoundError:
        return "Triton is not installed"
    parts = tuple(int(p) if p.isdigit() else 0 for p in version.split("+")[0].split(".")[:2])
    if parts < GLUON_MIN_TRITON:
        return f"its Gluon needs Triton >= {'.'.join(map(str, GLUON_MIN_TRITON))} (installed: {version})"
    return None


def contiguous_gemm_kernel(mode: str, quant: str, capability: Optional[tuple[int, int]], n: int) -> str:
    """The kernel ("triton", "gluon" or "gluon_wide") of one contiguous GEMM with n output columns under
    experts.contiguous_gemm=mode; capability: the GPU's, None where no GPU can run Gluon here
    (no GPU, the interpreter, an older Triton: gluon_runtime_unsupported). auto falls back to
    Triton there; gluon forced there raises (planning refuses it first)."""
    if mode not in CONTIGUOUS_GEMMS:
        raise ValueError(f"contiguous_gemm={mode!r}: expected one of {', '.join(CONTIGUOUS_GEMMS)}")
    if quant != "fp8_block":  # (the Gluon kernel is fp8_block's; planning refuses gluon elsewhere)
        return "triton"
    sm90 = capability is not None and capability[0] == 9
    if mode in GLUON_GEMMS and not sm90:
        raise ValueError(
            f"experts.contiguous_gemm={mode} needs an SM90 GPU that runs Gluon (capability "
            f"{capability}; {gluon_runtime_unsupported() or 'Triton >= 3.6 found'})"
        )
    if mode != "auto":
        return mode
    return "gluon" if sm90 and n >= GLUON_MIN_N else "triton"


DEFAULT_MIN_TOKENS = 256  # triton_or_deepgemm: DeepGEMM from this many rows after dispatch


def contiguous_unsupported(quant: str, hidden, intermediate) -> Optional[str]:
    """Why the contiguous layout cannot run these shapes, or None (the GEMM's N tiles
    are multiples of 128; the rows are permuted 128 columns at a time): a Rule, whatever the GPU."""
    if quant not in CONTIGUOUS_QUANTS:
        return Rule(f"the contiguous layout runs {' and '.join(CONTIGUOUS_QUANTS)}, not quant={quant}")
    bad = [
        f"{n}={v}" for n, v in (("hidden", hidden), ("intermediate", intermediate)) if v is not None and int(v) % 128
    ]
    if bad:
        return Rule(f"the contiguous layout needs hidden and intermediate to be multiples of 128 ({', '.join(bad)})")
    return None


def gluon_unsupported(quant: str, layout: str, device: str) -> Optional[str]:
    """Why the Gluon GEMM cannot run, or None: its rule (gluon_rule) before what the machine
    lacks (gluon_machine)."""
    return gluon_rule(quant, layout) or gluon_machine(device)


def gluon_rule(quant: str, layout: str) -> Optional[Rule]:
    """Why the Gluon GEMM never runs these rows, or None: it runs fp8_block rows on the
    contiguous layout."""
    if quant != "fp8_block":
        return Rule(f"it is an fp8_block GEMM, not quant={quant}")
    if layout == "gathered":
        return Rule("it runs the contiguous layout's rows (experts.row_layout=auto or contiguous)")
    return None


def gluon_machine(device: str) -> Optional[str]:
    """What this machine lacks for the Gluon GEMM, or None: a Hopper GPU (its WGMMA and TMA are
    sm_90's; Gluon has no interpreter)."""
    if not device.startswith("cuda"):
        return "Gluon kernels have no interpreter: it runs on a Hopper GPU only"
    why = gluon_runtime_unsupported()
    if why:
        return why
    import torch  # the GPU's compute capability

    if torch.cuda.is_available() and torch.cuda.get_device_capability()[0] != 9:
        major, minor = torch.cuda.get_device_capability()
        return f"its WGMMA is sm_90's (this GPU is {major}.{minor})"
    return None


def _quant_name(combo: dict) -> str:
    q = combo.get("quant", "bf16")
    if isinstance(q, dict) or hasattr(q, "get"):
        q = q.get("name", "bf16")
    return str(q)


def triton_unsupported(combo: dict) -> Optional[str]:
    """Reason the Triton experts cannot run `combo`, or None (both layouts): the knobs' rules
    (a Rule: a quant, layout or shape they never run) before what the machine lacks, which is
    not asked where a rule decided (torch's import, CUDA's start, the Gluon version check)."""
    return triton_rule(combo) or triton_machine(combo)


def triton_rule(combo: dict) -> Optional[str]:
    """The first of the Triton experts' rules `combo` breaks (a Rule), or None; asks nothing of
    the machine."""
    _, quant, layout, gluon = _triton_choices(combo)
    return first_reason(*_triton_rules(combo, quant, layout, gluon))


def triton_machine(combo: dict) -> Optional[str]:
    """The first thing this machine lacks for the Triton experts to run `combo`, or None: ask
    it only where no rule decided (triton_rule)."""
    device, quant, layout, gluon = _triton_choices(combo)
    return first_reason(*_triton_machine(device, quant, layout, gluon))


def _triton_choices(combo: dict) -> tuple[str, str, str, str]:
    """(device, quant, row layout, the Gluon GEMM's reasons' prefix: '' where it is not chosen)."""
    gemm = combo.get("contiguous_gemm", "auto")
    gluon = f"experts.contiguous_gemm={gemm}: " if gemm in GLUON_GEMMS else ""
    return str(combo.get("device", "cuda")), _quant_name(combo), combo.get("row_layout", "auto"), gluon


def _triton_rules(combo: dict, quant: str, layout: str, gluon: str) -> tuple[Optional[Rule], ...]:
    """The knobs' rules, each a Rule or None, in the order they are told: the row layout's
    quants, the Gluon GEMM's rows (`gluon`: its reasons' prefix, '' where it is not chosen), the
    contiguous layout's shapes (of the rank's shard)."""
    quants = None
    if layout != "auto" and quant not in CONTIGUOUS_QUANTS:
        quants = Rule(
            f"experts.row_layout={layout} picks the row layout of quant={' or '.join(CONTIGUOUS_QUANTS)} only"
        )
    rows = gluon_rule(quant, layout) if gluon else None
    shapes = None
    if layout == "contiguous":
        inter = combo.get("intermediate")
        tp = ep_split(combo).tp  # (backend=tp: world_size; else simulate_tp)
        shapes = contiguous_unsupported(quant, combo.get("hidden"), inter // tp if inter is not None else None)
    return (
        quants,
        Rule(gluon + rows) if rows else None,
        Rule("experts.row_layout=contiguous: " + shapes) if shapes else None,
    )


def _triton_machine(device: str, quant: str, layout: str, gluon: str) -> tuple[Optional[str], ...]:
    """What the machine lacks for the Triton experts, each a reason or None, in the order they
    are told: a GPU (or the interpreter), an fp8 dot's compute capability, what the Gluon GEMM
    needs (`gluon`: as _triton_rules's), the contiguous layout's TMA."""
    needs = gluon_machine(device) if gluon else None
    gluon_needs = gluon + needs if needs else None
    if not device.startswith("cuda"):
        interpreted = os.environ.get("TRITON_INTERPRET") == "1"
        return (
            None if interpreted else "Triton experts need a CUDA GPU (or TRITON_INTERPRET=1 for the interpreter)",
            gluon_needs,
        )
    import torch  # the GPU's compute capability: only where the combination runs on CUDA

    asked = quant.startswith("fp8") or layout == "contiguous"  # else no reason needs it: CUDA not started
    cap = torch.cuda.get_device_capability() if asked and torch.cuda.is_available() else None
    fp8 = None
    if cap and quant.startswith("fp8") and cap < (8, 9):
        fp8 = f"fp8 tl.dot needs compute capability >= 8.9 (this GPU is {cap[0]}.{cap[1]})"
    tma = None
    if cap and cap[0] < 9 and layout == "contiguous":
        tma = "experts.row_layout=contiguous loads through TMA: it needs SM90 or newer"
    return (fp8, gluon_needs, tma)


@card("experts", "torch")
class TorchCard(ExpertsCard):
    implementation = "experts.torch"
    activation_format = ActivationFormat.STANDARD
    graph_capturable = True


@card("experts", "torch_batched")
class TorchBatchedCard(ExpertsCard):
    implementation = "experts.torch_batched"
    activation_format = ActivationFormat.BATCHED
    graph_capturable = True  # dense bmm over the buffers, counts read on the GPU


@card("experts", "triton")
class TritonCard(ExpertsCard):
    implementation = "experts.triton"
    activation_format = ActivationFormat.STANDARD
    graph_capturable = True
    knobs = (ROW_LAYOUT_KNOB, CONTIGUOUS_GEMM_KNOB)

    @classmethod
    def supports(cls, combo):
        return triton_unsupported(combo)


@card("experts", "triton_batched")
class TritonBatchedCard(ExpertsCard):
    implementation = "experts.triton_batched"
    activation_format = ActivationFormat.BATCHED
    graph_capturable = True

    @classmethod
    def supports(cls, combo):
        return triton_unsupported(combo)


@card("experts", "deepgemm")
class DeepGemmCard(ExpertsCard):
    implementation = "experts.deepgemm"
    activation_format = ActivationFormat.STANDARD
    graph_capturable = True  # no host sync: Mp is an upper bound, the layouts live on the device

    @classmethod
    def supports(cls, combo):
        return _deep_gemm.deepgemm_unsupported(combo)


@card("experts", "deepgemm_masked")
class DeepGemmMaskedCard(ExpertsCard):
    implementation = "experts.deepgemm_masked"
    activation_format = ActivationFormat.BATCHED
    graph_capturable = True  # no host sync (expected_m comes from the shapes)

    @classmethod
    def supports(cls, combo):
        return _deep_gemm.deepgemm_unsupported(combo)


@card("experts", "triton_or_deepgemm")
class TritonOrDeepGemmCard(ExpertsCard):
    implementation = "experts.triton_or_deepgemm"
    activation_format = ActivationFormat.STANDARD
    graph_capturable = DeepGemmCard.graph_capturable and TritonCard.graph_capturable
    knobs = (
        Knob(
            "deepgemm_min_tokens",
            DEFAULT_MIN_TOKENS,
            "DeepGEMM at or above this many rows after dispatch, Triton below",
            minimum=1,
            tag="dgmin{}",
        ),
    )

    @classmethod
    def supports(cls, combo):
        # it runs both: either side's rules before either side's machine, which is asked only
        # where no rule decided (DeepGEMM's import, torch's, CUDA's compute capability)
        return (
            _deep_gemm.deepgemm_rule(combo)
            or triton_rule(combo)
            or _deep_gemm.deepgemm_machine(combo)
            or triton_machine(combo)
        )
