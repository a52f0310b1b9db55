#!/usr/bin/env bash
# DeepGEMM for the `deepgemm*` experts: PyPI deepinfer-gemm 2.8.2 (an sdist,
# import name `deep_gemm`), built on the GPU machine into third_party/deepgemm_build.
#
#   scripts/install_deep_gemm.sh --download   on a networked machine: the sdist by name from
#                                             pip's configured index (sha256
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
DEPS=${DEPS:-$ROOT/.deps}
DEST=${DEST:-$ROOT/third_party/deepgemm_build}
VERSION=2.8.2
SDIST=deepinfer_gemm-$VERSION.tar.gz
SHA256=aad050965750f809b8dbb744a8db54fc4eba0eb3bc99d565fa9b41010fe25351
say() { echo "[install_deep_gemm] $*"; }

# The sdist by name from pip's own configured indexes (PIP_INDEX_URL / `pip config`,
# else pip's default; then the extra indexes), through the simple repository API:
# `pip download` cannot fetch it on a machine without CUDA, since pip first builds the
# sdist's metadata and its setup.py wants torch and CUDA_HOME. No host is named here.
fetch_sdist() {  # fetch_sdist DEST_FILE
    python3 - "$1" "deepinfer-gemm" "$SDIST" "$SHA256" <<'PY'
import hashlib, html.parser, json, os, re, subprocess, sys, urllib.parse, urllib.request

dest, project, filename, sha256 = sys.argv[1:5]


def pip_config() -> dict:
    """pip's settings as `pip config list` shows them (env and files), later lines winning."""
    out = subprocess.run([sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True).stdout
    conf = {}
    for line in out.splitlines():
        m = re.fullmatch(r"(?:[\w:-]*)\.([\w-]+)='(.*)'", line.strip())
        if m:
            conf[m[1]] = m[2]
    return conf


def indexes() -> list:
    conf = pip_config()
    main = os.environ.get("PIP_INDEX_URL") or conf.get("index-url")
    if not main:  # pip's built-in default, asked from pip itself
        from pip._internal.models.index import PyPI
        main = PyPI.simple_url
    extra = (os.environ.get("PIP_EXTRA_INDEX_URL") or conf.get("extra-index-url") or "").split()
    return [main] + extra


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.links = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            href = dict(attrs).get("href")
            if href:
                self.links.append(href)


def files_of(index: str) -> list:
    """(filename, url, sha256 or None) of `project` on one simple-API index."""
    base = index.rstrip("/") + f"/{project}/"
    if base.startswith("file:"):
        path = urllib.request.url2pathname(urllib.parse.urlparse(base).path)
        page = os.path.join(path, "index.html")
        if not os.path.isfile(page):
            return []
        text, kind = open(page, encoding="utf-8").read(), "text/html"
    else:
        req = urllib.request.Request(base, headers={"Accept": "application/vnd.pypi.simple.v1+json, text/html;q=0.1"})
        try:
            with urllib.request.urlopen(req, timeout=60) as r:
                kind, text = r.headers.get("Content-Type", ""), r.read().decode("utf-8")
        except OSError as e:
            print(f"[install_deep_gemm] {base}: {e}", file=sys.stderr)
            return []
    if "json" in kind:
        return [(f["filename"], urllib.parse.urljoin(base, f["url"]), f.get("hashes", {}).get("sha256"))
                for f in json.loads(text)["files"]]
    p = Links()
    p.feed(text)
    out = []
    for href in p.links:
        url, _, frag = urllib.parse.urljoin(base, href).partition("#")
        name = urllib.parse.unquote(url.rsplit("/", 1)[-1])
        out.append((name, url, frag[len("sha256="):] if frag.startswith("sha256=") else None))
    return out


for index in indexes():
    for name, url, digest in files_of(index):
        if name != filename:
            continue
        if digest and digest != sha256:
            sys.exit(f"[install_deep_gemm] {url}: the index gives sha256 {digest}, expected {sha256}")
        print(f"[install_deep_gemm] downloading {url}", file=sys.stderr)
        h = hashlib.sha256()
        with urllib.request.urlopen(url, timeout=120) as r, open(dest + ".part", "wb") as f:
            for chunk in iter(lambda: r.read(1 << 20), b""):
                h.update(chunk)
                f.write(chunk)
        if h.hexdigest() != sha256:
            os.unlink(dest + ".part")
            sys.exit(f"[install_deep_gemm] {url}: sha256 {h.hexdigest()}, expected {sha256}")
        os.replace(dest + ".part", dest)
        sys.exit(0)
sys.exit(f"[install_deep_gemm] {filename} is on none of pip's indexes ({', '.join(indexes())})")
PY
}

download() {
    mkdir -p "$DEPS/debs"
    if ! echo "$SHA256  $DEPS/$SDIST" | sha256sum -c --status 2>/dev/null; then
        fetch_sdist "$DEPS/$SDIST"
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
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' ;;
    *) say "unknown option $1 (use --download, or nothing to build)"; exit 2 ;;
esac
