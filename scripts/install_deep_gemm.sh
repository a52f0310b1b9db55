#!/usr/bin/env bash
# DeepGEMM for the `deepgemm*` experts: PyPI deepinfer-gemm 2.8.2 (an sdist,
# import name `deep_gemm`), built on the GPU machine into third_party/deepgemm_build.
#
#   scripts/install_deep_gemm.sh --download   on a networked machine: the sdist (sha256
#                                             checked) and Debian's libdw-dev / libelf-dev
#                                             .debs into .deps/ (git-ignored)
#   scripts/install_deep_gemm.sh              on the GPU machine (no network needed): build
#                                             from .deps/ into third_party/deepgemm_build
#                                             (git-ignored), then
#   export PYTHONPATH=$PWD/third_party/deepgemm_build:$PYTHONPATH
#
# What the build needs on the image (see README 'Optional libraries'):
# - elfutils/libdwfl.h: the headers of libdw-dev + libelf-dev, unpacked with dpkg -x
#   onto CPATH (the JIT loads libdw at run time; the image has the library, not headers);
# - CXX=/usr/bin/g++ CC=/usr/bin/gcc: the image's /opt/gcc g++ links libstdc++
#   statically into the extension, which then crashes in std::regex at the first GEMM;
# - $CUDA_HOME/include/cccl on CPATH (CUDA 13 keeps cuda/std there);
# - DG_FORCE_BUILD=1: build from source instead of fetching a release wheel.
# Sources and builds are never committed. FORCE=1 rebuilds over an importable build.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=$ROOT/.deps
DEST=${DEST:-$ROOT/third_party/deepgemm_build}
VERSION=2.8.2
SDIST=deepinfer_gemm-$VERSION.tar.gz
URL=https://files.pythonhosted.org/packages/c3/81/8211cfa3e92b0f5be337116fe15da8a6fa232161899a628fe100d8895fa0/$SDIST
SHA256=aad050965750f809b8dbb744a8db54fc4eba0eb3bc99d565fa9b41010fe25351
say() { echo "[install_deep_gemm] $*"; }

download() {
    mkdir -p "$DEPS/debs"
    if ! echo "$SHA256  $DEPS/$SDIST" | sha256sum -c --status 2>/dev/null; then
        say "downloading $URL"
        python3 -c "import sys, urllib.request; urllib.request.urlretrieve(sys.argv[1], sys.argv[2])" "$URL" "$DEPS/$SDIST.part"
        mv "$DEPS/$SDIST.part" "$DEPS/$SDIST"
    fi
    echo "$SHA256  $DEPS/$SDIST" | sha256sum -c -
    if ! ls "$DEPS"/debs/libdw-dev_*.deb "$DEPS"/debs/libelf-dev_*.deb >/dev/null 2>&1; then
        say "fetching libdw-dev and libelf-dev .debs (headers only are used)"
        (cd "$DEPS/debs" && apt-get download libdw-dev libelf-dev)
    fi
    ls -la "$DEPS" "$DEPS/debs"
}

check() {
    (cd / && PYTHONPATH=$DEST:${PYTHONPATH:-} python3 -c "import deep_gemm; \
print('deep_gemm', deep_gemm.__version__, deep_gemm.__file__, 'mk alignment', deep_gemm.get_mk_alignment_for_contiguous_layout())")
}

build() {
    [[ -f $DEPS/$SDIST ]] || { say "missing $DEPS/$SDIST: run $0 --download on a networked machine first"; exit 1; }
    echo "$SHA256  $DEPS/$SDIST" | sha256sum -c - >/dev/null
    ls "$DEPS"/debs/*.deb >/dev/null 2>&1 || { say "missing $DEPS/debs/*.deb: run $0 --download first"; exit 1; }
    if [[ "${FORCE:-0}" != 1 && -d $DEST/deep_gemm ]] && check; then say "reusing $DEST"; return; fi
    export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")}
    local work
    work=$(mktemp -d /tmp/deep_gemm_build.XXXXXX)
    for f in "$DEPS"/debs/*.deb; do dpkg -x "$f" "$work/dw"; done
    export CPATH=$work/dw/usr/include:$CUDA_HOME/include/cccl${CPATH:+:$CPATH}
    export CXX=/usr/bin/g++ CC=/usr/bin/gcc DG_FORCE_BUILD=1
    export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-16}
    tar xzf "$DEPS/$SDIST" -C "$work"
    rm -rf "$DEST"
    mkdir -p "$DEST"
    say "building into $DEST (about 100 s)"
    (cd "$work/deepinfer_gemm-$VERSION" && \
        python3 -m pip install --no-build-isolation --no-deps --no-index --no-compile --target "$DEST" .)
    rm -rf "$work"
    if ldd "$DEST"/deep_gemm/_C*.so | grep -q "libstdc++"; then :; else
        say "warning: the extension does not link libstdc++ dynamically (static libstdc++ crashes deep_gemm)"
    fi
    check
}

case "${1:-}" in
    --download) download ;;
    "") build; say "done: export PYTHONPATH=$DEST:\$PYTHONPATH" ;;
    -h|--help) sed -n '2,21p' "$0" ;;
    *) say "unknown option $1 (use --download, or nothing to build)"; exit 2 ;;
esac
