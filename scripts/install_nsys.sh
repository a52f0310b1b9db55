#!/usr/bin/env bash
# Nsight Systems for trace=nsys: Debian's non-free nsight-systems(-target) 2024.2.3.38~12.5.0-2+b1
# (suite experimental), the one build seen to capture every kernel on the H200 image (driver 13.0,
# with a note that it uses its 12.5 libraries); 2023.4.4 (trixie, sid) missed cuBLAS launches.
# Nothing downloaded or unpacked is committed.
#
#   scripts/install_nsys.sh --download    on a networked CPU machine (Debian): fetch the .debs by
#                                         name with apt into .deps/nsys/debs, then
#                                         - .deps/nsys-target/  the target (nsys profile), pruned to
#                                           what a CUDA + NVTX capture needs, xz-packed (80 MB
#                                           unpacked, 16 MiB packed; at most 30): carry it to the
#                                           GPU machine;
#                                         - .deps/nsys-host/    QdstrmImporter and `nsys export`
#                                           with their libraries: stays on the CPU machine;
#                                         - .deps/nsys-importer/ (optional) the importer's own closure,
#                                           14 MiB xz: carried beside the target where the tree
#                                           leaves room, the captures are imported on the GPU machine.
#   scripts/install_nsys.sh --target-env  prints the exports that put the carried target first on
#                                         PATH (eval "$(scripts/install_nsys.sh --target-env)"),
#                                         unpacking it once into NSYS_UNPACK_DIR (default
#                                         /tmp/moebench-nsys-target); no network needed (the GPU machine).
#   scripts/install_nsys.sh --host-env    likewise for the importer and exporter (the CPU machine).
#   scripts/install_nsys.sh --check       versions of both, and a CPU-only NVTX capture.
#
# The target writes only .qdstrm files (its importer lives in the host package, 154 MB: too large
# to travel, and the importer's own closure is ~54 MB, which with the tree is over the 64 MiB a
# call may carry): capture on the GPU machine, bring the .qdstrm back (xz), and run
# `moebench trace --import RUN` here, which runs QdstrmImporter and `nsys export --type sqlite`.
#
# apt runs with its own sources, lists and cache under a temporary folder (the machine's apt state
# is untouched): the archive URI is read at run time from this machine's own apt sources, with
# suite experimental and the components contrib non-free added.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=${DEPS:-$ROOT/.deps}
TARGET=${NSYS_TARGET_DIR:-$DEPS/nsys-target}
HOST=${NSYS_HOST_DIR:-$DEPS/nsys-host}
IMPORTER=${NSYS_IMPORTER_DIR:-$DEPS/nsys-importer}
DEBS=$DEPS/nsys/debs
NSYS_VERSION=2024.2.3.38~12.5.0-2+b1
ARROW_VERSION=0~~12.5.0-2+b1
PACKAGES=("nsight-systems-target=$NSYS_VERSION" "nsight-systems=$NSYS_VERSION"
          "libarrow500=$ARROW_VERSION" "libparquet500=$ARROW_VERSION" libssh-4)
MAX_TARGET_MIB=30
say() { echo "[install_nsys] $*" >&2; }

# The deb822 stanza of a temporary apt source: this machine's Debian archive (the entry that
# carries its release's own suite), with suite experimental and contrib non-free added.
temp_source() {
    python3 - <<'PY'
import glob, re, sys

codename = ""
for line in open("/etc/os-release"):
    if line.startswith("VERSION_CODENAME="):
        codename = line.split("=", 1)[1].strip().strip('"')
entries = []  # (uris, suites, signed_by)
for f in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
    for stanza in re.split(r"\n\s*\n", open(f).read()):
        fields = {}
        for line in stanza.splitlines():
            if line.startswith("#") or ":" not in line:
                continue
            k, v = line.split(":", 1)
            fields[k.strip().lower()] = v.strip()
        if "deb" in fields.get("types", "").split() and fields.get("enabled", "yes") != "no":
            entries.append((fields.get("uris", "").split(), fields.get("suites", "").split(), fields.get("signed-by", "")))
for f in ["/etc/apt/sources.list"] + sorted(glob.glob("/etc/apt/sources.list.d/*.list")):
    try:
        lines = open(f).read().splitlines()
    except OSError:
        continue
    for line in lines:
        m = re.match(r"\s*deb\s+(?:\[([^\]]*)\]\s+)?(\S+)\s+(\S+)", line)
        if m:
            opts = dict(o.split("=", 1) for o in (m[1] or "").split() if "=" in o)
            entries.append(([m[2]], [m[3]], opts.get("signed-by", "")))
for uris, suites, signed in entries:
    if codename in suites and uris:
        print("Types: deb")
        print(f"URIs: {uris[0]}")
        print(f"Suites: experimental {codename}")
        print("Components: main contrib non-free")
        if signed:
            print(f"Signed-By: {signed}")
        sys.exit(0)
sys.exit(f"[install_nsys] no apt source of this machine carries its release's suite {codename!r}: "
         "cannot tell which Debian archive to ask")
PY
}

fetch_debs() {
    mkdir -p "$DEBS"
    local missing=0 p
    for p in nsight-systems-target nsight-systems libarrow500 libparquet500 libssh-4; do
        ls "$DEBS/${p}_"*.deb >/dev/null 2>&1 || missing=1
    done
    if [[ $missing == 0 ]]; then say "reusing $DEBS"; return; fi
    local tmp
    tmp=$(mktemp -d /tmp/install_nsys.XXXXXX)
    mkdir -p "$tmp/sources.list.d" "$tmp/lists/partial" "$tmp/cache/archives/partial"
    : >"$tmp/sources.list"
    temp_source >"$tmp/sources.list.d/moebench-nsys.sources"
    say "temporary apt source:"; sed 's/^/    /' "$tmp/sources.list.d/moebench-nsys.sources" >&2
    local o=(-o "Dir::Etc::SourceList=$tmp/sources.list" -o "Dir::Etc::SourceParts=$tmp/sources.list.d"
             -o "Dir::State::Lists=$tmp/lists" -o "Dir::Cache=$tmp/cache" -o "Debug::NoLocking=1"
             -o "APT::Architecture=amd64" -o "APT::Architectures=amd64" -o "APT::Sandbox::User=root")
    apt-get "${o[@]}" -q update >&2
    (cd "$DEBS" && apt-get "${o[@]}" -q download "${PACKAGES[@]}" >&2)
    rm -rf "$tmp"
}

# The packages unpack to <root>/usr/lib/x86_64-linux-gnu/nsight-systems/{target,host}-linux-x64
# (Debian moves the target under the multiarch folder; /usr/lib/nsight-systems links to it).
target_dir() { find "$1/usr/lib" -maxdepth 3 -type d -name target-linux-x64 | head -n1; }
host_dir() { find "$1/usr/lib" -maxdepth 3 -type d -name host-linux-x64 | head -n1; }

# What `nsys profile -t cuda,nvtx --sample=none --cpuctxsw=none` needs, and nothing else: the
# CLI and its launcher, the injection library (CUDA, NVTX) and its proxy, CUPTI 12.5 (the newest
# this build has: it says so when it uses it under a 13.x driver), the GPU info probe (the report's
# TARGET_INFO_GPU), logging. Left out: CUPTI 10.0-11.8, the cuBLAS/cuDNN/MPI/SHMEM/UCX/Python
# injections, the graphics metrics library, CollectX, the GPU-metrics and Vulkan bits, sqlite3,
# the report scripts.
TARGET_KEEP=(nsys nsys-launcher launcher libLauncher64.so libToolsInjection64.so libToolsInjectionProxy64.so
             libToolsInjectionMemoryAllocator.so libPreRunProcessInjector.so libLinuxKeyboardInterceptorProxy.so
             libcupti.so.12.5 CudaGpuInfoDumper libnvlog.so nvlog.config.template)
TARGET_ARCHIVE=target-linux-x64.tar.xz

pack_target() {  # the pruned target, xz-compressed: what travels
    local full work f
    full=$(target_dir "$HOST")
    work=$(mktemp -d /tmp/install_nsys.XXXXXX)
    mkdir -p "$work/target-linux-x64"
    for f in "${TARGET_KEEP[@]}"; do cp -a "$full/$f" "$work/target-linux-x64/"; done
    rm -rf "$TARGET"
    mkdir -p "$TARGET"
    say "packing the pruned target ($(du -sh "$work/target-linux-x64" | cut -f1) unpacked; xz takes ~40 s)"
    tar -C "$work" -cJf "$TARGET/$TARGET_ARCHIVE.part" target-linux-x64
    mv "$TARGET/$TARGET_ARCHIVE.part" "$TARGET/$TARGET_ARCHIVE"
    rm -rf "$work"
    local mib=$(( $(stat -c %s "$TARGET/$TARGET_ARCHIVE") / 1048576 ))
    (( mib <= MAX_TARGET_MIB )) || { say "the pruned target is $mib MiB (> $MAX_TARGET_MIB)"; exit 1; }
    say "$TARGET/$TARGET_ARCHIVE: $mib MiB"
}

# Optional: the importer and the libraries it links (its ldd closure, 69 MB, 14 MiB xz), to carry
# beside the target when the tree leaves room (64 MiB a call): the target then finds it at
# ../host-linux-x64 and writes .nsys-rep and, with --export=sqlite, .sqlite on the GPU machine.
pack_importer() {
    local h work
    h=$(host_dir "$HOST")
    work=$(mktemp -d /tmp/install_nsys.XXXXXX)
    mkdir -p "$work/host-linux-x64"
    cp -L "$h/QdstrmImporter" "$work/host-linux-x64/"
    LD_LIBRARY_PATH=$h:$HOST/usr/lib/x86_64-linux-gnu ldd "$h/QdstrmImporter" | awk '/=> \// {print $3}' \
        | grep -F "$HOST/" | sort -u | xargs -I{} cp -L {} "$work/host-linux-x64/"
    cp -L "$HOST"/usr/lib/x86_64-linux-gnu/libssh.so* "$work/host-linux-x64/"  # opened by name at run time
    rm -rf "$IMPORTER"
    mkdir -p "$IMPORTER"
    tar -C "$work" -cJf "$IMPORTER/host-linux-x64.tar.xz.part" host-linux-x64
    mv "$IMPORTER/host-linux-x64.tar.xz.part" "$IMPORTER/host-linux-x64.tar.xz"
    rm -rf "$work"
    say "$IMPORTER/host-linux-x64.tar.xz: $(( $(stat -c %s "$IMPORTER/host-linux-x64.tar.xz") / 1048576 )) MiB (optional)"
}

unpack_host() {  # everything the importer and `nsys export` need, here
    local f
    rm -rf "$HOST"
    mkdir -p "$HOST"
    for f in "$DEBS"/nsight-systems_*.deb "$DEBS"/nsight-systems-target_*.deb "$DEBS"/libarrow500_*.deb \
             "$DEBS"/libparquet500_*.deb "$DEBS"/libssh-4_*.deb; do
        dpkg -x "$f" "$HOST"
    done
    # the importer opens libssh.so (no version suffix)
    ln -sf libssh.so.4 "$HOST/usr/lib/x86_64-linux-gnu/libssh.so"
}

# The carried target, unpacked once per machine (a few seconds) into NSYS_UNPACK_DIR.
unpacked_target() {
    local dest=${NSYS_UNPACK_DIR:-/tmp/moebench-nsys-target}
    if [[ ! -x $dest/target-linux-x64/nsys ]]; then
        [[ -f $TARGET/$TARGET_ARCHIVE ]] || {
            say "no $TARGET/$TARGET_ARCHIVE: run $0 --download on a networked machine, then carry .deps/nsys-target"
            exit 1; }
        mkdir -p "$dest"
        local a
        for a in "$TARGET/$TARGET_ARCHIVE" "$IMPORTER/host-linux-x64.tar.xz"; do
            [[ -f $a ]] || continue
            if command -v xz >/dev/null; then
                tar -C "$dest" -xJf "$a"
            else  # an image without xz-utils: Python's lzma
                python3 -c "import sys, tarfile; tarfile.open(sys.argv[1], 'r:xz').extractall(sys.argv[2])" "$a" "$dest"
            fi
        done
    fi
    echo "$dest/target-linux-x64"
}

target_env() {
    local t
    t=$(unpacked_target)
    local libs=$t
    [[ -d $t/../host-linux-x64 ]] && libs=$t:$(cd "$t/../host-linux-x64" && pwd)  # the optional importer
    echo "export PATH=$t\${PATH:+:\$PATH}"
    echo "export LD_LIBRARY_PATH=$libs\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
}

host_env() {
    local h t
    h=$(host_dir "$HOST"); t=$(target_dir "$HOST")
    [[ -n $h && -x $h/QdstrmImporter ]] || { say "no QdstrmImporter under $HOST: run $0 --download"; exit 1; }
    echo "export PATH=$t:$h\${PATH:+:\$PATH}"
    echo "export LD_LIBRARY_PATH=$h:$HOST/usr/lib/x86_64-linux-gnu\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}"
    echo "export MOEBENCH_QDSTRM_IMPORTER=$h/QdstrmImporter"
}

check() {  # both installs start here, and the pruned target captures NVTX on the CPU
    local t work
    t=$(unpacked_target)
    "$t/nsys" --version
    work=$(mktemp -d /tmp/install_nsys_check.XXXXXX)
    "$t/nsys" profile -t nvtx --sample=none --cpuctxsw=none -o "$work/check" python3 -c "print('profiled')" >&2
    ls -la "$work" >&2
    # a .qdstrm alone; a .nsys-rep where the optional importer was unpacked beside the target
    [[ -f $work/check.qdstrm || -f $work/check.nsys-rep ]] || { say "the pruned target wrote no capture"; exit 1; }
    (eval "$(host_env)"; { [[ -f $work/check.nsys-rep ]] || QdstrmImporter -i "$work/check.qdstrm" >/dev/null; } \
        && nsys export --type sqlite -o "$work/check.sqlite" "$work/check.nsys-rep" >/dev/null \
        && ls -la "$work/check.sqlite" >&2)
    rm -rf "$work"
}

case "${1:-}" in
    --download) fetch_debs; unpack_host; pack_target; pack_importer; du -sh "$TARGET" "$IMPORTER" "$HOST" >&2 ;;
    --target-env) target_env ;;
    --host-env) host_env ;;
    --check) check ;;
    -h|--help|"") sed -n '2,/^set -euo/p' "$0" | sed '$d' ;;
    *) say "unknown option $1 (see --help)"; exit 2 ;;
esac
