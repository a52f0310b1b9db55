"""Record the routing a model makes, for `workload.routing=replay` (the file: routing/file.py).

`RoutingRecorder` hooks any `torch.nn.Module` whose output carries a layer's top-k choice and
keeps, per layer, every token's expert ids (and router weights) in the order the model routed
them; `save` writes them as one recording. The Hugging Face MoE blocks are found and hooked by
routing/hf.py; a vLLM model takes the same recorder (docs/routing.md, "Capture").

    rec = RoutingRecorder(max_tokens=100_000)
    with rec:
        rec.attach(router, layer=3)          # output: (ids [T, P] int, weights [T, P] float), any order
        model(inputs)
    rec.save("routing.npz", num_experts=128, source="my model on traffic X")

Legend: T tokens of one forward call (a batch [B, S, P] counts B*S), P experts per token (top-k).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Optional

import numpy as np
import torch

from moebench.routing import file

# parse(module, inputs, output) -> (ids, weights or None), as a forward hook sees the call
Parse = Callable[[torch.nn.Module, tuple, Any], tuple[Any, Optional[Any]]]


def default_parse(module: torch.nn.Module, inputs: tuple, output: Any) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
    """The ids and weights in a router's output: a tuple/list (or an object whose attributes
    hold tensors, e.g. a dataclass) with exactly one integer tensor of 2 or 3 dimensions (the
    ids) and, optionally, a float tensor of the same shape (the weights), in any order. Other
    floats (the router logits [T, E]) are ignored because their shape differs."""
    if isinstance(output, (tuple, list)):
        items = list(output)
    elif isinstance(output, torch.Tensor):
        items = [output]
    else:
        items = [v for v in vars(output).values()] if hasattr(output, "__dict__") else []
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    ints = [t for t in tensors if not t.is_floating_point() and t.dtype != torch.bool and t.dim() in (2, 3)]
    if len(ints) != 1:
        raise ValueError(
            f"cannot find the top-k ids in the output of {type(module).__name__}: expected one integer "
            f"tensor [T, P] among {_describe(tensors)}; pass parse=(module, inputs, output) -> "
            "(ids, weights)"
        )
    ids = ints[0]
    same = [t for t in tensors if t.is_floating_point() and t.shape == ids.shape]
    if len(same) > 1:
        raise ValueError(
            f"{type(module).__name__} returns {len(same)} float tensors shaped like its ids "
            f"{list(ids.shape)}: which are the weights is ambiguous; pass parse="
        )
    return ids, (same[0] if same else None)


def _describe(tensors: list) -> str:
    return ", ".join(f"{t.dtype} {list(t.shape)}" for t in tensors) or "no tensor"


@dataclass(frozen=True)
class LayerSummary:
    """What one layer recorded: `tokens` rows kept, `dropped` rows past `max_tokens` (not kept),
    `steps` forward calls seen (recorded or not)."""

    layer: int
    tokens: int
    dropped: int
    steps: int


class RoutingRecorder:
    """Per-layer top-k ids and weights from forward hooks, held in host memory.

    Each forward call of a hooked module is one `step` of its layer (0, 1, ... counted per
    layer). Rows are copied to the CPU at hook time (int32 ids, float32 weights), which
    synchronizes a GPU stream: capture is for recording traffic, not for timing. With
    `max_tokens`, a layer keeps its first `max_tokens` rows and counts the rest in `dropped`
    (a call that crosses the limit is cut there), so memory stays bounded: ~P·8 bytes a row.
    """

    def __init__(self, max_tokens: Optional[int] = None):
        if max_tokens is not None and max_tokens <= 0:
            raise ValueError(f"max_tokens={max_tokens}: give a positive row count per layer, or None for no limit")
        self.max_tokens = max_tokens
        self._ids: dict[int, list[np.ndarray]] = {}
        self._weights: dict[int, list[Optional[np.ndarray]]] = {}
        self._steps: dict[int, list[np.ndarray]] = {}
        self._calls: dict[int, int] = {}
        self._kept: dict[int, int] = {}
        self.dropped: dict[int, int] = {}
        self._handles: list = []
        self._topk: Optional[int] = None

    # -- hooks ---------------------------------------------------------------------------
    def attach(self, module: torch.nn.Module, layer: int, parse: Optional[Parse] = None):
        """Record `module`'s routing as layer `layer` on each forward call from now on; returns
        the hook's handle (`detach()` removes every hook this recorder attached)."""
        fn = parse or default_parse
        layer = int(layer)

        def hook(mod, inputs, output):
            ids, weights = fn(mod, inputs, output)
            self.record(layer, ids, weights)

        handle = module.register_forward_hook(hook)
        self._handles.append(handle)
        return handle

    def detach(self) -> None:
        """Remove every hook this recorder attached (what it recorded stays)."""
        for h in self._handles:
            h.remove()
        self._handles.clear()

    def __enter__(self) -> "RoutingRecorder":
        return self

    def __exit__(self, *exc) -> None:
        self.detach()

    # -- rows ----------------------------------------------------------------------------
    def record(self, layer: int, ids, weights=None) -> None:
        """One forward call of layer `layer`: ids [T, P] or [B, S, P] (int; a 1-D [T] is top-1),
        weights shaped alike or None. Callable directly from a hook of one's own (vLLM)."""
        ids_TP = _rows(ids, "ids")
        if ids_TP.dtype.kind not in "iu":
            raise ValueError(
                f"layer {layer}: the ids are {ids_TP.dtype}, not integers: the parse picked the wrong tensor"
            )
        w_TP = None
        if weights is not None:
            w_TP = _rows(weights, "weights").astype(np.float32, copy=False)
            if w_TP.shape != ids_TP.shape:
                raise ValueError(
                    f"layer {layer}: weights {list(w_TP.shape)} and ids {list(ids_TP.shape)} differ in shape"
                )
        if self._topk is None:
            self._topk = ids_TP.shape[1]
        elif ids_TP.shape[1] != self._topk:
            raise ValueError(
                f"layer {layer} picks {ids_TP.shape[1]} experts per token, an earlier call picked "
                f"{self._topk}: one recording holds one top-k; record those layers apart"
            )
        step = self._calls.get(layer, 0)
        self._calls[layer] = step + 1
        kept = self._kept.get(layer, 0)
        room = len(ids_TP) if self.max_tokens is None else max(0, min(len(ids_TP), self.max_tokens - kept))
        self.dropped[layer] = self.dropped.get(layer, 0) + len(ids_TP) - room
        self._kept[layer] = kept + room
        if room == 0:
            return
        self._ids.setdefault(layer, []).append(ids_TP[:room].astype(np.int32))
        self._weights.setdefault(layer, []).append(None if w_TP is None else w_TP[:room].copy())
        self._steps.setdefault(layer, []).append(np.full(room, step, dtype=np.int32))

    @property
    def layers(self) -> list[int]:
        """The layers that recorded a row, ascending."""
        return sorted(self._ids)

    def summary(self) -> list[LayerSummary]:
        """One entry per layer seen (a layer whose every row was dropped included)."""
        return [
            LayerSummary(layer=k, tokens=self._kept.get(k, 0), dropped=self.dropped.get(k, 0), steps=self._calls[k])
            for k in sorted(self._calls)
        ]

    def arrays(self) -> dict[str, np.ndarray]:
        """The file's arrays: topk_ids [N, P] int32, layer [N], step [N] (int32) and, where every
        call gave weights, topk_weights [N, P] float32; layers ascending, each in routing order."""
        if not self._ids:
            raise ValueError("nothing recorded: no hooked module ran a forward call (attach, then run the model)")
        ids, weights, layer, step = [], [], [], []
        for k in self.layers:
            ids += self._ids[k]
            weights += self._weights[k]
            step += self._steps[k]
            layer.append(np.full(self._kept[k], k, dtype=np.int32))
        out = {"topk_ids": np.concatenate(ids), "layer": np.concatenate(layer), "step": np.concatenate(step)}
        given = [w is not None for w in weights]
        if all(given):
            out["topk_weights"] = np.concatenate(weights)  # type: ignore[arg-type]  # all not None, checked above
        elif any(given):
            raise ValueError(
                f"{given.count(False)} of {len(given)} recorded calls gave no weights: a parse "
                "returns weights for every call or for none"
            )
        return out

    def save(self, path: str, num_experts: Optional[int] = None, source: str = "") -> str:
        """Write what was recorded to `path` (.npz, routing/file.py's format); returns its
        sha256. `num_experts`: the model's expert count, checked against the ids."""
        a = self.arrays()
        if num_experts is not None and int(a["topk_ids"].max()) >= num_experts:
            raise ValueError(f"expert id {int(a['topk_ids'].max())} recorded, but num_experts={num_experts}")
        return file.write(
            path,
            a["topk_ids"],
            a.get("topk_weights"),
            layer=a["layer"],
            step=a["step"],
            num_experts=num_experts,
            source=source,
        )


def _rows(x, what: str) -> np.ndarray:
    """x as a host array [rows, P]: [B, S, P] flattened to [B*S, P], a 1-D [T] as [T, 1]."""
    if isinstance(x, torch.Tensor):
        x = x.detach().to("cpu")
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()  # numpy has no bfloat16
        x = x.numpy()
    a = np.asarray(x)
    if a.ndim == 1:
        a = a[:, None]
    elif a.ndim == 3:
        a = a.reshape(-1, a.shape[-1])
    elif a.ndim != 2:
        raise ValueError(f"the {what} have shape {list(a.shape)}: expected [T, P], [B, S, P] or [T]")
    return a
