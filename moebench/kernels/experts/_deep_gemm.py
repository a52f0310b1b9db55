"""DeepGEMM (PyPI `deepinfer-gemm` 2.8.2, import name `deep_gemm`): a lazy import
that says how to install it, and the validity rules its experts share.

`deep_gemm` is imported inside functions only, so the `deepgemm*` experts are
registered (and `moebench env` lists them with the reason) on machines without it.

What the 2.8.2 API needs on SM90 (csrc/apis/gemm.hpp, csrc/apis/layout.hpp):
fp8 e4m3 operands, K-major; fp32 scales, activations 1x128 (recipe (1, 128, 128)
is the SM90 default), weights 128x128 as [E, N/128, K/128] contiguous; the
activation scales are wanted MN-major and TMA-aligned (stride 1 along M, the M
stride rounded up to 4) and are transposed into that layout by the library when
they come row-major (a transient tensor). On SM100 the library turns fp32 scales
into UE8M0 powers of two, which our 128x128 fp32 weight scales are not: SM90 only.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

from .._optional import OptionalLibrary
from ..entry import Rule

INSTALL_HINT = (
    "run scripts/install_deep_gemm.sh on the GPU machine (PyPI deepinfer-gemm 2.8.2) "
    "and put third_party/deepgemm_build on PYTHONPATH; see README 'GPU machines and the optional libraries'"
)
# what the experts call; an older or newer build without them is refused by name
REQUIRED_API = (
    "m_grouped_fp8_gemm_nt_contiguous",
    "m_grouped_fp8_gemm_nt_masked",
    "get_mk_alignment_for_contiguous_layout",
)


def _import() -> tuple[Optional[Any], Optional[str]]:
    try:
        import deep_gemm  # its _C extension initialises the JIT
    except Exception as e:  # noqa: BLE001 (ImportError, or OSError / RuntimeError from the extension: unavailable, with why)
        return None, f"{type(e).__name__}: {e}"
    missing = [name for name in REQUIRED_API if not hasattr(deep_gemm, name)]
    if missing:
        version = getattr(deep_gemm, "__version__", "unknown")
        return None, f"deep_gemm {version} lacks {', '.join(missing)}"
    return deep_gemm, None


_LIB = OptionalLibrary("deep_gemm not installed", _import, INSTALL_HINT, module="deep_gemm")
load = _LIB.load  # (module, None) or (None, why not and how to install it)
unavailable_reason = _LIB.unavailable_reason  # why `deep_gemm` cannot be used here, or None
require = _LIB.require  # the module; ImportError with the install hint when missing


def reset_import_cache() -> None:
    """Forget the import outcome (tests simulate a missing or a fake library)."""
    _LIB.reset()
    mk_alignment.cache_clear()


@functools.lru_cache(maxsize=1)
def mk_alignment() -> int:
    """Rows each expert's segment is padded to in the contiguous layout (the M
    block of DeepGEMM's grouped kernels; 128 on SM90)."""
    return int(require().get_mk_alignment_for_contiguous_layout())


def _quant_name(combo: dict) -> str:
    q = combo.get("quant", "fp8_block")
    if hasattr(q, "get"):
        q = q.get("name", "fp8_block")
    return str(q)


def deepgemm_unsupported(combo: dict) -> Optional[str]:
    """Reason the DeepGEMM experts cannot run `combo` here, or None (both layouts): its rule
    before what this machine lacks, which is not asked where the rule decided."""
    return deepgemm_rule(combo) or deepgemm_machine(combo)


def deepgemm_rule(combo: dict) -> Optional[Rule]:
    """Why no machine runs `combo` on the DeepGEMM experts, or None: they run fp8_block only."""
    if _quant_name(combo) != "fp8_block":
        return Rule("DeepGEMM experts need quant=fp8_block (fp8 with 128x128 weight / 1x128 activation scales)")
    return None


def deepgemm_machine(combo: dict) -> Optional[str]:
    """What this machine lacks for the DeepGEMM experts, or None: the library (imported here), a
    CUDA device, an SM90 GPU (torch imported, CUDA started for its compute capability)."""
    _, reason = load()
    if reason:
        return reason
    if not str(combo.get("device", "cuda")).startswith("cuda"):
        return "DeepGEMM runs on CUDA GPUs only (SM90: H100 / H200); use runner.device=cuda"
    import torch

    if not torch.cuda.is_available():
        return "DeepGEMM needs a CUDA GPU (SM90: H100 / H200); none is visible"
    major, minor = torch.cuda.get_device_capability()
    if major != 9:
        return (
            f"DeepGEMM takes our fp32 block scales on SM90 only (this GPU is {major}.{minor}; "
            "SM100 would need UE8M0 scales)"
        )
    return None
