"""The launcher's C entry of a compiled kernel, and tensor descriptors on it (launch.py's handle
path; issues #34, #46).

A kernel without scratch memory launches through its launcher's C entry (`direct`). Where it
takes tensor descriptors (host TMA: triton.tools.tensor_descriptor's, Gluon's), Triton wraps that
entry in driver.wrap_handle_tensordesc, which expands each descriptor on every launch: with TMA
metadata into a freshly filled CUtensorMap (cuTensorMapEncodeTiled), its shape and strides. The
handle path calls the entry itself with that expansion made by the same function
(make_tensordesc_arg), and keeps each fill per (key, argument, base pointer, shape, strides,
padding), all it reads besides the kernel's metadata: a forward whose buffers and weights sit
where they sat refills none (issue #46; `stats["fills"]` counts the fills). A descriptor without
TMA metadata expands to its tensor and is never kept.
A Gluon descriptor's layout keys its binary as the text Triton's signature writes (`layout_text`).
"""

from __future__ import annotations

from typing import Optional

MAX_FILLS = 256  # per key and descriptor argument: the buffers' places seen; cleared when full
MAX_LAYOUTS = 4096  # layouts whose text is kept; cleared when full
# a Gluon descriptor's layout -> (the layout, its text in Triton's signature): by id, the layout kept
_LAYOUT_TEXT: dict = {}


def direct(kernel) -> Optional[tuple]:
    """(the launcher's C entry, function, cooperative-grid flag, PDL flag, packed metadata, the
    tensor descriptors it takes expanded (descriptor_entry)) of a loaded CompiledKernel whose
    launch needs no scratch memory, or None. `CompiledKernel.run` (a property) is Triton 3.6's
    CudaLauncher, whose __call__ only allocates the scratch (size 0 here) and calls this entry:
    calling it directly skips two Python frames (issue #34)."""
    try:
        run = kernel.run
    except Exception:  # noqa: BLE001 (a kernel that cannot load: its JIT launch raised already)
        return None
    if (
        type(run).__name__ != "CudaLauncher"
        or getattr(run, "global_scratch_size", 1) != 0
        or getattr(run, "profile_scratch_size", 1) != 0
        or getattr(run, "num_ctas", 1) != 1
    ):
        return None
    entry = getattr(run, "launch", None)
    if entry is None or kernel.function is None:
        return None
    entry, descs = descriptor_entry(entry)
    return (entry, kernel.function, run.launch_cooperative_grid, run.launch_pdl, kernel.packed_metadata, descs)


def descriptor_entry(entry) -> tuple:
    """(the C entry, its descriptor arguments) of a launcher's `launch`: a kernel that takes tensor
    descriptors has the C entry wrapped by Triton 3.6's driver.wrap_handle_tensordesc (`inner`,
    closing over `launcher`, `tensordesc_indices`, `tensordesc_meta`), which expands each
    descriptor argument on every launch (make_tensordesc_arg). Its descriptor arguments, last
    first: (position among the kernel's parameters, TMA metadata or None, the kept fills, the
    expanding function). Anything else: (entry, ()), entry as it is (a wrapper of another shape
    expands its descriptors itself)."""
    code = getattr(entry, "__code__", None)
    if code is None:  # the C entry itself: no descriptor arguments
        return entry, ()
    if (
        getattr(entry, "__module__", None) != "triton.backends.nvidia.driver"
        or code.co_name != "inner"
        or set(code.co_freevars) != {"launcher", "tensordesc_indices", "tensordesc_meta"}
    ):
        return entry, ()
    cells = dict(zip(code.co_freevars, (c.cell_contents for c in entry.__closure__), strict=True))
    make = entry.__globals__.get("make_tensordesc_arg")
    positions, metas = sorted(cells["tensordesc_indices"]), list(cells["tensordesc_meta"])
    if make is None or len(positions) != len(metas) or not callable(cells["launcher"]):
        return entry, ()
    # inner hands its i-th descriptor argument (in parameter order) the i-th metadata
    descs = tuple((pos, meta, dict[tuple, list](), make) for pos, meta in zip(positions, metas, strict=True))
    return cells["launcher"], descs[::-1]


def expand_descriptors(descs: tuple, args: list, stats: dict) -> list:
    """args (every parameter's value in order) with each tensor descriptor among them expanded as
    driver.wrap_handle_tensordesc expands it, a fill kept per (base pointer, shape, strides, padding):
    the filled CUtensorMap encodes only these and the kernel's metadata, never the bytes there;
    stats["fills"] counts the fills."""
    for pos, meta, fills, make in descs:  # (last first: the positions before it stay put)
        d = args[pos]
        if meta is None:  # no TMA metadata: the base tensor, shape and strides (the tensor not kept)
            args[pos : pos + 1] = make(d, None)
            continue
        key = (d.base.data_ptr(), *d.shape, *d.strides, d.padding)
        filled = fills.get(key)
        if filled is None:
            if len(fills) >= MAX_FILLS:
                fills.clear()
            filled = fills[key] = make(d, meta)
            stats["fills"] += 1
        args[pos : pos + 1] = filled
    return args


def layout_text(layout) -> str:
    """A Gluon layout as Triton's signature writes it (its repr), read once per layout object:
    equal fields of other types (1 and True) write differently, so the text, not ==, keys it."""
    hit = _LAYOUT_TEXT.get(id(layout))
    if hit is None or hit[0] is not layout:
        if len(_LAYOUT_TEXT) >= MAX_LAYOUTS:
            _LAYOUT_TEXT.clear()
        hit = _LAYOUT_TEXT[id(layout)] = (layout, repr(layout))
    return hit[1]
