"""Every PNG moebench writes (report plots, timelines, tune maps), as a 256-colour palette
image: a figure of a few line colours on white loses nothing visible (mean error 0.1 / 255
on the committed plots) and takes a third of the bytes of matplotlib's RGBA file, which
matters where reports are committed (results/ travels whole to the GPU machine).

    save_figure(fig, path, **savefig_kwargs)   # instead of fig.savefig(path, ...)
    compact_png(path)                          # an existing PNG, rewritten only if smaller

Both write through moebench/util/safe_write.py: never through a link (a link at `path` or at its
folder is refused, one line, exit 2). Neither makes a folder: the caller makes it first with
safe_write.safe_dir (or the report's ReportDir.make), which knows the folder the user named and
refuses a link on the way below it; a mkdir here would follow one.
"""

from __future__ import annotations

import errno
import io
from pathlib import Path

from PIL import Image

from moebench.util.safe_write import write_bytes

DPI = 110


def _palette(im: Image.Image) -> Image.Image:
    return im.convert("RGB").quantize(colors=256, dither=Image.Dither.NONE)


def save_figure(fig, path, **kwargs) -> Path:
    """fig.savefig into memory at moebench's dpi, then the palette PNG at `path`, whose folder the
    caller made (FileNotFoundError naming it otherwise, before any drawing; a link at `path` or its
    folder refused: module doc)."""
    path = Path(path)
    if not path.parent.is_dir():  # a defect of the caller's: its traceback, not an environment error
        raise FileNotFoundError(
            errno.ENOENT, "no such folder: save_figure makes none (make it with safe_write.safe_dir)", str(path.parent)
        )
    buf = io.BytesIO()
    fig.savefig(buf, format="png", **{"dpi": DPI, **kwargs})
    buf.seek(0)
    out = io.BytesIO()
    with Image.open(buf) as im:
        _palette(im).save(out, format="PNG", optimize=True)
    return write_bytes(path, out.getvalue())


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
        write_bytes(path, buf.getvalue())
        return before, buf.tell()
    return before, before
