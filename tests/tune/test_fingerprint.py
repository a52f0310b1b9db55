"""What a stored tune timing is keyed by (moebench/tune/fingerprint.py): moebench's sources on the
timed path only, one layer's tuned files only, and, for the decisions, DeepGEMM and CUDA."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

import moebench
from moebench.kernels.triton import config as tconfig
from moebench.tune import fingerprint as fp

CPU = torch.device("cpu")


def test_subpackages_left_out_of_the_source_hash_exist_and_only_they_are_left_out():
    root = Path(moebench.__file__).parent
    for name in fp.OFF_TIMED_PATH:
        assert (root / name / "__init__.py").is_file(), f"{name}/ was renamed: the hash would keep it again"
    assert not fp.on_timed_path(Path("report/build.py")) and not fp.on_timed_path(Path("cli/tune.py"))
    for kept in ("kernels/registry.py", "measure/samples.py", "run/worker.py", "tune/bench.py", "__init__.py"):
        assert fp.on_timed_path(Path(kept))


def test_a_change_off_the_timed_path_keeps_the_hash_and_one_on_it_does_not(tmp_path):
    for rel in ("report/a.py", "kernels/b.py"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("x = 1\n")

    def digest():
        import hashlib

        h = hashlib.sha256()
        fp._feed(h, 0, tmp_path, "*.py", fp.on_timed_path)
        return h.hexdigest()

    before = digest()
    (tmp_path / "report/a.py").write_text("x = 2\n")
    assert digest() == before
    (tmp_path / "kernels/b.py").write_text("x = 2\n")
    assert digest() != before


def test_the_decisions_key_sees_its_own_layers_tuned_files_and_no_others(tmp_path, monkeypatch):
    monkeypatch.setenv(tconfig.CONFIG_DIR_ENV, str(tmp_path))
    mine, other = (8, 128), (16, 256)
    base = fp.env_key(CPU, mine)
    (tmp_path / tconfig.config_file_name(*other, "fp8_w8a8", [128, 128])).write_text(json.dumps({"16": {}}))
    assert fp.env_key(CPU, mine) == base  # installing another layer keeps this one's stored timings
    assert fp.env_key(CPU) != base  # (the whole folder, where no layer is named)
    (tmp_path / tconfig.config_file_name(*mine, "fp8_w8a8", [128, 128])).write_text(json.dumps({"16": {}}))
    assert fp.env_key(CPU, mine) != base


def test_the_decisions_key_names_deepgemm_and_cuda_and_says_when_they_differ():
    libs = fp.other_libs()
    assert libs.startswith("deep_gemm ") and "; cuda " in libs
    import triton

    here = fp.Fingerprint("cpu", torch.__version__, triton.__version__, fp.source_sha(True, (8, 128)), libs)
    assert here.key == fp.env_key(CPU, (8, 128))
    upgraded = dataclasses.replace(here, libs="deep_gemm 9.9; cuda 13.0")
    assert upgraded.key != here.key
    assert here.difference(upgraded.stamp()) == f"were measured under libs deep_gemm 9.9; cuda 13.0 (this is {libs})"
    # the tile trials carry no libs: their key and stamp are as before the field
    tiles = dataclasses.replace(here, libs="")
    assert "libs" not in tiles.stamp() and tiles.difference(tiles.stamp()) == ""


def test_the_tunes_timing_modules_import_nothing_the_hash_leaves_out():
    """What OFF_TIMED_PATH leaves out of the hash must never run inside a tune's timing: its
    timing modules, imported in a fresh process, pull in no moebench.cli, report or traces."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "import moebench.tune.bench, moebench.tune.decide, moebench.tune.trials, moebench.tune.decision_trials\n"
        "import moebench.measure.timing, moebench.measure.layer, moebench.kernels.experts.triton\n"
        f"off = {fp.OFF_TIMED_PATH!r}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[:2] in [['moebench', o] for o in off]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out


def test_a_record_from_before_libs_says_none():
    import triton

    here = fp.Fingerprint("cpu", torch.__version__, triton.__version__, "s", "deep_gemm 2.8.2; cuda 13.0")
    old = {"key": "0" * 16, "device": "cpu", "torch": torch.__version__, "triton": triton.__version__}
    assert here.difference(old) == "were measured under libs none (this is deep_gemm 2.8.2; cuda 13.0)"
