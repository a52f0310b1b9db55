"""The options `moebench tune --decisions` times at a token count (tune/decide.py times and ranks them),
each one whole layer (prepare, experts, finalize: one forward of MoEKernel, the shared experts left
out since no option changes them):

  gathered            experts.row_layout=gathered on this tune's winning tile at that count
                      (else the layer's own look-up)
  gathered-btma       the same, the weights' tiles loaded through a TMA descriptor (gemm.py's
                      B_TMA; the sidecar entry's b_tma); SM90 or newer, or the interpreter
  contiguous/triton   the contiguous layout on kernels/triton/contiguous_gemm.py
  contiguous/gluon:V  the contiguous layout on the Gluon kernel, variant V of
                      gluon_contiguous.GLUON_VARIANTS (stages, scale look-ahead, epilogue, tile:
                      gluon_wide is the 128 x 192 one), and GLUON_EXTRAS (a variant in column
                      bands, -bands16; the 128 x 192 tile's scales by TMA, -scaletma, and with a
                      one-warp TMA producer, -scaletma-1w); fp8_block
                      on an SM90 GPU only
  deepgemm            the `deepgemm` experts (triton_or_deepgemm's other side); where DeepGEMM runs
  current             the baseline: what the layer builds today (row_layout / contiguous_gemm auto:
                      the constants, or an installed sidecar), never a winner itself

An option that cannot run here is skipped with its reason (on the CPU: every Gluon variant and
DeepGEMM), and how a count is timed follows the runner's rule (decision_timing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from moebench.config.validity import timing_mode
from moebench.kernels import registry
from moebench.kernels.cards.experts import contiguous_unsupported, gluon_unsupported
from moebench.kernels.experts._deep_gemm import deepgemm_unsupported
from moebench.kernels.interfaces import QuantSpec
from moebench.kernels.triton.decisions import GLUON_WIDE_N, gluon_config_of
from moebench.kernels.triton.gemm import b_tma_device_error

CURRENT = "current"
DEEPGEMM = "deepgemm"


@dataclass(frozen=True)
class Option:
    """One way the layer can run: the experts entry and the options its context gets."""

    name: str
    experts: str = "triton"
    options: tuple = ()  # sorted (key, value) pairs; gluon_config / triton_config as sorted pairs too

    def opts(self) -> dict:
        return {k: dict(v) if isinstance(v, tuple) else v for k, v in self.options}

    def entry(self) -> dict:
        """The sidecar entry this option stands for ({} for deepgemm and the baseline)."""
        o = self.opts()
        if self.experts != "triton" or self.name == CURRENT:
            return {}
        if o.get("row_layout") == "gathered":
            return {
                "row_layout": "gathered",
                **({"b_tma": True} if (o.get("triton_config") or {}).get("B_TMA") else {}),
            }
        e: dict = {"row_layout": "contiguous", "contiguous_gemm": "gluon" if "gluon_config" in o else "triton"}
        if "gluon_config" in o:
            e["gluon_config"] = o["gluon_config"]
        return e


def _opt(name: str, experts: str = "triton", **options) -> Option:
    pairs = ((k, tuple(sorted(v.items())) if isinstance(v, dict) else v) for k, v in options.items())
    return Option(name, experts, tuple(sorted(pairs)))


def variant_name(cfg: dict) -> str:
    """gluon:ws4-tma / gluon:ws6 / gluon:pipelined4 / gluon:ws4-ahead2 / gluon_wide:ws4-tma, and with a
    GLUON_EXTRAS entry's options: gluon:ws4-tma-bands16 / gluon_wide:ws4-tma-bands16-scaletma /
    gluon_wide:ws4-tma-scaletma-1w."""
    kind = (
        ("gluon_wide" if cfg["BLOCK_SIZE_N"] == GLUON_WIDE_N else "gluon") + ":" + ("ws" if cfg["WS"] else "pipelined")
    )
    tail = ("-tma" if cfg["EPILOGUE_TMA"] else "") + ("-ahead2" if cfg["SCALE_AHEAD"] == 2 else "")
    tail += (
        (f"-bands{cfg['GROUP_SIZE_N']}" if cfg.get("GROUP_SIZE_N") else "")
        + ("-scaletma" if cfg.get("SCALE_TMA") else "")
        + ("-1w" if cfg.get("PRODUCER_1W") else "")
    )
    return f"{kind}{cfg['STAGES']}{tail}"


def b_tma_unsupported(
    device: torch.device, tile: Optional[dict], hidden: int, inter: int, quant: str = ""
) -> Optional[str]:
    """Why the gathered kernel cannot load the weights' tiles by TMA here (gemm.py's B_TMA; None: it
    can): TMA needs SM90 or newer (or the interpreter), and the kernel a tile whose K step divides both
    GEMMs' K (hidden for gate/up, the rank's intermediate for down)."""
    why = b_tma_device_error(device)
    if why:
        return why
    if tile is None:
        return "the weights by TMA: over this tune's gathered tile, and none was tuned at this count"
    bk = tile["BLOCK_SIZE_K"]
    q = QuantSpec(quant)
    if q.is_block:  # the layer keeps a K tile inside one scale group (TritonConfigMixin._config)
        bk = min(bk, q.block_k)
    if hidden % bk or inter % bk:
        return f"the weights by TMA: BLOCK_SIZE_K {bk} must divide hidden {hidden} and intermediate {inter}"
    return None


def options_of(combo, device: torch.device, tile: Optional[dict]) -> tuple[list[Option], list[tuple[str, str]]]:
    """(the options timed at a count whose gathered tile is `tile`, [(options skipped, why)])."""
    quant = str(combo["quant"])
    flat = {k: combo[k] for k in combo.keys()}
    out = [_opt(CURRENT, row_layout="auto", contiguous_gemm="auto")]
    gathered = {"row_layout": "gathered"} if tile is None else {"row_layout": "gathered", "triton_config": tile}
    out.append(_opt("gathered", **gathered))
    skipped = []
    inter = combo["intermediate"] // registry.ep_split(combo).tp  # one rank's shard under TP (backend=tp too)
    bwhy = b_tma_unsupported(device, tile, combo["hidden"], inter, quant)
    if bwhy:
        skipped.append(("gathered-btma", bwhy))
    else:
        out.append(_opt("gathered-btma", row_layout="gathered", triton_config={**(tile or {}), "B_TMA": True}))
    why = contiguous_unsupported(quant, combo["hidden"], inter)
    if why is None and device.type == "cuda" and torch.cuda.get_device_capability(device)[0] < 9:
        why = "the contiguous layout loads through TMA: SM90 or newer"
    if why:
        skipped.append(("contiguous (every GEMM kernel)", why))
    else:
        out.append(_opt("contiguous/triton", row_layout="contiguous", contiguous_gemm="triton"))
        gwhy = gluon_unsupported(quant, "contiguous", str(device))
        if gwhy:
            skipped.append(("contiguous/gluon (every GLUON_VARIANTS and GLUON_EXTRAS entry)", gwhy))
        else:
            from moebench.kernels.triton.gluon_contiguous import GLUON_EXTRAS, GLUON_VARIANTS

            for v, extra in [(v, None) for v in GLUON_VARIANTS] + list(GLUON_EXTRAS):
                cfg = gluon_config_of(v, extra)
                name = "contiguous/" + variant_name(cfg)
                out.append(_opt(name, row_layout="contiguous", contiguous_gemm="gluon", gluon_config=cfg))
    dwhy = deepgemm_unsupported({**flat, "device": device.type})
    if dwhy:
        skipped.append((DEEPGEMM, dwhy))
    else:
        out.append(_opt(DEEPGEMM, DEEPGEMM))
    return out, skipped


def decision_timing(combo, T: int, device_type: str) -> str:
    """How the decisions at T tokens are timed: as the runner times the layer (worker.py), by
    validity.timing_mode of the combination: graph (replays; auto at every size wherever the
    layer can be captured, graph up to runner.graph_max_tokens) | events (held eager forwards;
    profiler too: the decisions are never profiled) | host (not CUDA: the host's clock)."""
    if device_type != "cuda":
        return "host"
    return "graph" if timing_mode(combo, T) == "graph" else "events"
