"""moebench's PNGs are palette images that look like matplotlib's own rendering."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from matplotlib.figure import Figure
from PIL import Image

from moebench.util.pngfile import compact_png, save_figure

ROOT = Path(__file__).resolve().parents[2]


def _figure() -> Figure:
    fig = Figure(figsize=(6, 4))
    ax = fig.subplots()
    x = np.linspace(1, 4096, 50)
    for i, c in enumerate(["C0", "C1", "C2", "C3"]):
        ax.loglog(x, x * (i + 1), color=c, marker="o", label=f"line {i}", ls=["-", "--"][i % 2])
    ax.legend()
    ax.set_title("µs per tokens")
    return fig


def _pixels(path: Path) -> np.ndarray:
    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).astype(int)


def test_a_saved_figure_is_a_palette_png_that_matches_matplotlibs_rendering(tmp_path):
    fig = _figure()
    ours = save_figure(fig, tmp_path / "ours.png")
    fig.savefig(tmp_path / "mpl.png", dpi=110)
    with Image.open(ours) as im:
        assert im.mode == "P" and im.format == "PNG"
    a, b = _pixels(ours), _pixels(tmp_path / "mpl.png")
    assert a.shape == b.shape
    assert np.abs(a - b).mean() < 1.0  # of 255: lines, markers and text where they were
    assert ours.stat().st_size < (tmp_path / "mpl.png").stat().st_size


def test_a_figure_goes_only_into_a_folder_the_caller_made(tmp_path):
    """save_figure makes no folder: a mkdir with its parents would follow a link on the way (here
    link/ -> elsewhere/, making elsewhere/new/ and writing the PNG there). The callers make the
    folder through safe_write, which refuses the link."""
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "elsewhere")
    for folder in (tmp_path / "link" / "new", tmp_path / "missing"):
        with pytest.raises(FileNotFoundError, match="save_figure makes none") as e:
            save_figure(_figure(), folder / "plot.png")
        assert e.value.filename == str(folder)
    assert not list((tmp_path / "elsewhere").iterdir()) and not (tmp_path / "missing").exists()


def test_compacting_an_rgba_png_shrinks_it_once_and_keeps_the_picture(tmp_path):
    p = tmp_path / "plot.png"
    _figure().savefig(p, dpi=110)
    original = _pixels(p)
    before, after = compact_png(p)
    assert after < before and p.stat().st_size == after
    assert np.abs(_pixels(p) - original).mean() < 1.0
    assert compact_png(p) == (after, after)  # already a palette image: left as it is


def test_the_script_compacts_a_folder_and_refuses_a_missing_one(tmp_path):
    _figure().savefig(tmp_path / "a.png", dpi=110)
    script = ROOT / "scripts" / "compact_pngs.py"
    ok = subprocess.run([sys.executable, str(script), str(tmp_path)], capture_output=True, text=True)
    assert ok.returncode == 0 and "MB ->" in ok.stdout
    with Image.open(tmp_path / "a.png") as im:
        assert im.mode == "P"
    bad = subprocess.run([sys.executable, str(script), str(tmp_path / "nope")], capture_output=True, text=True)
    assert bad.returncode == 2 and "does not exist" in bad.stderr
