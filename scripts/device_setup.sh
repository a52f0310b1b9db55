#!/usr/bin/env bash
# The GPU machine (../shared/DEVICE.md): Python 3.12 without hydra-core, omegaconf and nvtx, and no
# network. Their wheels travel with the working tree in .whl/ (git-ignored), DeepGEMM's sdist and
# build headers in .deps/ (scripts/install_deep_gemm.sh). A device call carries both:
# carry [".whl", ".deps", ".moebench-tree.json"] (and the call's own script folder).
#
#   scripts/device_setup.sh --download   on this (networked) machine: the wheels by package name for
#                                        CPython 3.12 on x86_64 into .whl/, then install_deep_gemm.sh
#                                        --download into .deps/
#   source scripts/device_setup.sh       on the GPU machine, from the repository root: installs the
#                                        wheels and moebench (editable) offline, builds DeepGEMM into
#                                        DG_DEST (default /tmp/deepgemm_build: outside the carried
#                                        paths, so it stays while the machine stays warm) unless it
#                                        imports already, and puts it on PYTHONPATH
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
if [ "${1:-}" = "--download" ]; then
    set -euo pipefail
    mkdir -p "$ROOT/.whl"
    # hydra-core pins antlr4-python3-runtime 4.9.3, an sdist only: pure Python, so its wheel is built here
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux_2_28_x86_64 \
        --platform any -d "$ROOT/.whl" "hydra-core>=1.3,<1.4" "omegaconf>=2.3,<2.4" "nvtx>=0.2.10"
    python3 -m pip wheel -q --no-deps -w "$ROOT/.whl" "antlr4-python3-runtime==4.9.3"
    bash "$ROOT/scripts/install_deep_gemm.sh" --download
    ls -la "$ROOT/.whl" "$ROOT/.deps"
    exit 0
fi
# sourced on the GPU machine: no `set -e` (it would end the caller's shell)
export PIP_BREAK_SYSTEM_PACKAGES=1 PIP_DISABLE_PIP_VERSION_CHECK=1
python3 -c "import hydra, omegaconf, nvtx" 2>/dev/null ||
    python3 -m pip install -q --no-index --find-links "$ROOT/.whl" hydra-core omegaconf nvtx antlr4-python3-runtime
# checked from / : from the repository root `python3 -c` imports ./moebench whether installed or not
# (session 20 found it never installed that way: `moebench` not on PATH, benchmarks/ unable to import it)
moebench_installed() {
    (cd / && python3 -c "import moebench, sys; sys.exit(0 if moebench.__file__.startswith('$ROOT') else 1)") 2>/dev/null &&
        command -v moebench >/dev/null
}
# (`|| true`: a caller under `set -e` must reach the fallback below when pip fails)
moebench_installed ||
    python3 -m pip install -q --no-index --no-deps --no-build-isolation -e "$ROOT" || true
if ! moebench_installed; then
    # no setuptools to build the editable install offline: the checkout on PYTHONPATH and a
    # `moebench` that runs its CLI, in a folder outside the checkout
    echo "[device_setup] moebench did not install; using the checkout through PYTHONPATH"
    export PYTHONPATH=$ROOT${PYTHONPATH:+:$PYTHONPATH}
    mkdir -p /tmp/moebench_bin
    # the checkout is written into the launcher, so that it works in a shell without this PYTHONPATH
    printf '#!/bin/sh\nPYTHONPATH="%s${PYTHONPATH:+:$PYTHONPATH}" exec python3 -c "import sys; from moebench.cli import main; sys.argv[0] = \\"moebench\\"; sys.exit(main())" "$@"\n' \
        "$ROOT" > /tmp/moebench_bin/moebench
    chmod +x /tmp/moebench_bin/moebench
    export PATH=/tmp/moebench_bin:$PATH
fi
unset -f moebench_installed
DG_DEST=${DG_DEST:-/tmp/deepgemm_build}
export PYTHONPATH=$DG_DEST${PYTHONPATH:+:$PYTHONPATH}
if ! python3 -c "import deep_gemm" 2>/dev/null; then
    t0=$SECONDS
    DEST=$DG_DEST bash "$ROOT/scripts/install_deep_gemm.sh" 2>&1 | tail -4
    echo "[device_setup] DeepGEMM built in $((SECONDS - t0)) s"
fi
python3 -c "import deep_gemm, torch, triton; print('[device_setup] deep_gemm', torch.__version__, triton.__version__, torch.cuda.get_device_name())" ||
    echo "[device_setup] DeepGEMM does not import: the deepgemm entries will be skipped"
