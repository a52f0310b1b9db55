"""Every PNG moebench writes (report plots, timelines, tune maps), as a 256-colour palette
image: a figure of a few line colours on white loses nothing visible (mean error 0.1 / 255
on the committed plots) and takes a third of the bytes of matplotlib's RGBA file, which
matters where reports are committed (results/ travels whole to the GPU machine).

    save_figure(fig, path, **savefig_kwargs)   # instead of fig.savefig(path, ...)
    compact_png(path)                          # an existing PNG, rewritten only if smaller
"""
from __future__ import annotations

import io
from pathlib import Path

from PIL import Image

DPI = 110


def _palette(im: Image.Image) -> Image.Image:
    return im.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)


def save_figure(fig, path, **kwargs) -> Path:
    """fig.savefig into memory at moebench's dpi, then the palette PNG at `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **{"dpi": DPI, **kwargs})
    buf.seek(0)
    with Image.open(buf) as im:
        _palette(im).save(path, format="PNG", optimize=True)
    return path


def compact_png(path) -> tuple[int, int]:
    """Rewrite an existing PNG as a palette image when that is smaller; (bytes before, after)."""
    path = Path(path)
    before = path.stat().st_size
    with Image.open(path) as im:
        if im.mode == "P":
            return before, before
        buf = io.BytesIO()
        _palette(im).save(buf, format="PNG", optimize=True)
    if buf.tell() < before:
        path.write_bytes(buf.getvalue())
        return before, buf.tell()
    return before, before
