"""Recorded routing: the `.npz` file `workload.routing=replay` reads and the capture helper
(`routing/capture.py`) writes.

A recording is one NumPy `.npz` (read with `allow_pickle=False`: nothing in it can run code):

    topk_ids      int   [T, P]  required: each recorded token's P expert ids, in [0, num_experts)
    topk_weights  float [T, P]  optional: their router weights (finite); absent, the replay draws
                                weights as the synthetic routings do
    layer         int   [T]     optional: which MoE layer recorded the token (several layers in
                                one file: `workload.routing_layer` picks one)
    step          int   [T]     optional: which forward call (decode step, prefill) it came from
    num_experts   int   []      optional: the recording model's expert count (must equal the
                                model's; absent, only its ids are checked against the model's)
    source        str   []      optional: what made it ("vLLM capture of traffic X", "synthetic:
                                randomly initialized transformers Qwen2-MoE"): rows and the
                                report carry it as `routing_source`

Rows of one layer keep the file's order (a layer's tokens in the order they were routed), so
a window of consecutive rows is a run of consecutive real tokens.

Errors are `RoutingFileError` (a ValueError): one line naming the file (and the member, where
one is at fault) and what to do; the planner turns them into exit 2 before any work. Members
are checked before they are read (routing/npz.py): an uncompressed size over the limit (1 GiB,
`MOEBENCH_ROUTING_MAX_BYTES`) is refused before anything is inflated, a member cut short is
called truncated or corrupt, an object array is refused without unpickling.
"""

from __future__ import annotations

import hashlib
import io
import os
import zipfile
from dataclasses import dataclass
from typing import Optional

import numpy as np

from moebench.routing.npz import MemberError, limit, members, read_member
from moebench.util.safe_write import replace_bytes

REQUIRED = ("topk_ids",)
OPTIONAL = ("topk_weights", "layer", "step", "num_experts", "source")


class RoutingFileError(ValueError):
    pass


@dataclass(frozen=True)
class Recording:
    """One layer of a recording, validated."""

    path: str
    sha256: str
    ids: np.ndarray  # [n, P] int64
    weights: Optional[np.ndarray]  # [n, P] float32, or None
    layer: Optional[int]  # the layer picked (None: the file holds one)
    layers: tuple  # every layer in the file (empty: no `layer` array)
    source: str
    num_experts: Optional[int] = None  # the recording model's expert count, where the file says it

    @property
    def tokens(self) -> int:
        return int(self.ids.shape[0])

    @property
    def topk(self) -> int:
        return int(self.ids.shape[1])


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _fail(path: str, what: str) -> RoutingFileError:
    return RoutingFileError(f"workload.routing_file={path}: {what}")


_CACHE: dict = {}


def load(
    path: str, layer: Optional[int] = None, num_experts: Optional[int] = None, topk: Optional[int] = None
) -> Recording:
    """The recording at `path`, layer `layer` (None: the file must hold one layer), checked
    against the model's `num_experts` and `topk` where given. Cached per (path, size, mtime)."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise _fail(path, f"cannot read it ({e.strerror or e}): give the path of a recording (.npz)") from None
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns, layer)
    rec = _CACHE.get(key)
    if rec is None:
        rec = _read(path, layer)
        _CACHE[key] = rec
    if topk is not None and rec.topk != topk:
        raise _fail(
            path,
            f"its topk_ids pick {rec.topk} experts per token, the model picks {topk} "
            f"(model.topk): record the same model, or set model.topk={rec.topk}",
        )
    if num_experts is not None and rec.num_experts is not None and rec.num_experts != num_experts:
        raise _fail(
            path,
            f"it was recorded on a model of {rec.num_experts} experts, the model has {num_experts} "
            "(model.num_experts): record the same model",
        )
    if num_experts is not None:
        hi = int(rec.ids.max())
        if hi >= num_experts:
            raise _fail(
                path,
                f"expert id {hi} is outside the model's {num_experts} experts (model.num_experts): "
                "the recording comes from another model",
            )
    return rec


def _read(path: str, layer: Optional[int]) -> Recording:
    if os.path.isdir(path):
        raise _fail(path, "is a folder: give the .npz file")
    if os.path.getsize(path) == 0:
        raise _fail(path, "is empty: record some routing first (docs/routing.md)")
    with open(path, "rb") as f:
        if f.read(4) != b"PK\x03\x04":  # np.load would take it for a pickle or a .npy
            raise _fail(
                path,
                "is not a readable .npz (not a zip archive): save it with numpy.savez or moebench.routing.file.write",
            )
    try:
        max_bytes = limit()
        with zipfile.ZipFile(path) as zf:
            found = members(zf)
            missing = [n for n in REQUIRED if n not in found]
            if missing:
                raise _fail(
                    path,
                    f"holds no {missing[0]} array (it holds: {', '.join(sorted(found)) or 'nothing'}); "
                    "see docs/routing.md for the format",
                )
            arrays = {n: read_member(zf, found[n], max_bytes) for n in REQUIRED + OPTIONAL if n in found}
    except RoutingFileError:
        raise
    except MemberError as e:
        raise _fail(path, str(e)) from None
    except (OSError, zipfile.BadZipFile, EOFError) as e:
        raise _fail(path, f"is not a readable .npz, or is cut short ({type(e).__name__}: {e})") from None
    ids = arrays["topk_ids"]
    if ids.dtype.kind not in "iu" or ids.ndim != 2 or ids.shape[0] == 0 or ids.shape[1] == 0:
        raise _fail(
            path, f"topk_ids must be a non-empty integer array [tokens, topk] (got {ids.dtype} {list(ids.shape)})"
        )
    n = ids.shape[0]
    if ids.min() < 0:
        raise _fail(path, f"topk_ids holds a negative expert id ({int(ids.min())}): record every token's experts")
    weights = arrays.get("topk_weights")
    if weights is not None:
        if weights.dtype.kind != "f" or weights.shape != ids.shape:
            raise _fail(
                path,
                f"topk_weights must be a float array shaped like topk_ids {list(ids.shape)} "
                f"(got {weights.dtype} {list(weights.shape)})",
            )
        if not np.isfinite(weights).all():
            bad = int((~np.isfinite(weights)).any(axis=1).sum())
            raise _fail(path, f"topk_weights holds NaN or infinite values in {bad} of {n} tokens")
    for name in ("layer", "step"):
        a = arrays.get(name)
        if a is not None and (a.dtype.kind not in "iu" or a.shape != (n,)):
            raise _fail(
                path, f"{name} must be an integer array with one entry per token ({n}); got {a.dtype} {list(a.shape)}"
            )
    ne = arrays.get("num_experts")
    if ne is not None and (ne.shape != () or ne.dtype.kind not in "iu" or int(ne) <= int(ids.max())):
        raise _fail(path, f"num_experts={ne!r} does not hold every id of topk_ids (max {int(ids.max())})")
    dup = (np.sort(ids, axis=1)[:, 1:] == np.sort(ids, axis=1)[:, :-1]).any(axis=1)
    if dup.any():
        raise _fail(path, f"{int(dup.sum())} of {n} tokens pick one expert twice: a top-k picks distinct experts")
    source = str(arrays["source"]) if "source" in arrays else ""
    layers: tuple = ()
    picked = None
    if "layer" in arrays:
        layers = tuple(int(v) for v in np.unique(arrays["layer"]))
        if layer is None and len(layers) > 1:
            raise _fail(path, f"holds {len(layers)} layers ({_short(layers)}): pick one with workload.routing_layer=N")
        picked = layer if layer is not None else layers[0]
        if picked not in layers:
            raise _fail(path, f"has no layer {picked} (workload.routing_layer); it holds {_short(layers)}")
        keep = arrays["layer"] == picked
        ids = ids[keep]
        weights = weights[keep] if weights is not None else None
    elif layer is not None:
        raise _fail(path, f"has no `layer` array, so workload.routing_layer={layer} picks nothing: leave it unset")
    return Recording(
        path=path,
        sha256=sha256_of(path),
        ids=ids.astype(np.int64),
        weights=weights.astype(np.float32) if weights is not None else None,
        layer=picked,
        layers=layers,
        source=source[:200],
        num_experts=None if ne is None else int(ne),
    )


def _short(layers) -> str:
    return ", ".join(map(str, layers[:8])) + (f", … ({len(layers)} in all)" if len(layers) > 8 else "")


def window_start(rec_tokens: int, seed: int) -> int:
    """Where the seed's windows start in a layer's rows (deterministic by seed)."""
    return int(np.random.default_rng([seed, 0x5EED]).integers(rec_tokens))


def window(rec: Recording, tokens: int, rank: int, seed: int) -> tuple[np.ndarray, str]:
    """Rank `rank`'s `tokens` consecutive rows (rank r takes the window after rank r-1's, so an
    EP-N run reads N·tokens consecutive rows) and its description "start:end of n" ("wraps"
    when the rows run past the end and continue from row 0)."""
    n = rec.tokens
    first = (window_start(n, seed) + rank * tokens) % n
    rows = (first + np.arange(tokens)) % n
    wraps = first + tokens > n
    return rows, f"{first}:{first + tokens} of {n}" + (" (wraps)" if wraps else "")


def write(
    path: str, topk_ids, topk_weights=None, layer=None, step=None, num_experts: Optional[int] = None, source: str = ""
) -> str:
    """Write a recording (the format above); returns its sha256. Arrays may be NumPy or torch."""

    def arr(a, dtype):
        if hasattr(a, "detach"):
            a = a.detach().cpu().numpy()
        return np.ascontiguousarray(np.asarray(a, dtype=dtype))

    out = {"topk_ids": arr(topk_ids, np.int32 if int(np.max(arr(topk_ids, np.int64))) < 2**31 else np.int64)}
    if topk_weights is not None:
        out["topk_weights"] = arr(topk_weights, np.float32)
    if layer is not None:
        out["layer"] = arr(layer, np.int32)
    if step is not None:
        out["step"] = arr(step, np.int32)
    if num_experts is not None:
        out["num_experts"] = np.asarray(int(num_experts), dtype=np.int64)
    if source:
        out["source"] = np.asarray(str(source))
    buf = io.BytesIO()  # written whole through a temporary name and a rename (no torn recording)
    np.savez_compressed(buf, **out)
    data = buf.getvalue()
    replace_bytes(path, data)
    return hashlib.sha256(data).hexdigest()  # what sha256_of(path) reads back, without reading it
