#!/usr/bin/env bash
# Run kiln's test suite on a big-endian host: an emulated s390x Debian
# bookworm chroot (debootstrap + qemu-user-static through binfmt_misc).
#
#   sudo tools/bigendian-check.sh [--core-only]
#
# Needs: a Debian/Ubuntu host, root, Debian's mirror and PyPI reachable.
# Idempotent: every step is skipped when its result is already there (host
# packages, the chroot's two debootstrap stages, its apt packages, the venv);
# the source copy, the build and the test runs are always done afresh.
#
#   1. host: apt-get install debootstrap qemu-user-static binfmt-support;
#      mount binfmt_misc if needed and enable the qemu-s390x handler
#   2. debootstrap --arch=s390x --foreign bookworm $ROOT (minbase), copy
#      qemu-s390x-static in, run --second-stage inside the chroot
#   3. chroot: apt-get install python3 python3-dev python3-venv python3-pip
#      gcc python3-numpy python3-pytest python3-hypothesis git; a venv
#      (--system-site-packages) at /opt/kiln-venv with Cython and setuptools
#      pinned by constraints/build.txt, plus packaging>=24.2 (setuptools>=77
#      needs packaging.licenses; bookworm ships packaging 23.0).  Any CA
#      certificates in the host's /usr/local/share/ca-certificates are copied
#      in too (for hosts whose HTTPS goes through a TLS-inspecting proxy).
#   4. the repository's tracked files (git ls-files; no .so, no venvs) are
#      copied to $ROOT/root/kiln and built with
#      `python setup.py build_ext --inplace`; the import check must print
#      "big cython True"
#   5. tests (logs in $LOGS):
#        core:  python -m pytest tests/test_golden.py tests/test_frozen.py
#               tests/test_tensors.py tests/test_byteswap.py
#               tests/test_hostile.py tests/test_differential.py
#               --c-extensions -q -p no:cacheprovider -ra
#        full:  python -m pytest tests --c-extensions -q -p no:cacheprovider
#               --deselect tests/test_dist.py -ra     (skipped by --core-only)
#        cases: python -m kiln cases
#        pure:  KILN_PUREPYTHON=1 python -m pytest tests/test_golden.py
#               tests/test_frozen.py tests/test_tensors.py -q -p no:cacheprovider
#      No -x, so every failure is reported.  The versions, commands and
#      summary lines go to $RESULT.
#
# Environment: KILN_BE_ROOT (chroot, default /srv/s390x), KILN_BE_MIRROR
# (default: the first deb.debian.org-style URI in the host's apt sources,
# else http://deb.debian.org/debian), KILN_BE_RESULT (default
# /tmp/bigendian-result.txt), KILN_BE_LOGS (default /tmp/bigendian-logs).
# The chroot's /proc, /sys, /dev/pts and /dev/shm are mounted while the
# script runs and unmounted when it exits.  Remove the chroot with
# `rm -rf --one-file-system $KILN_BE_ROOT` (after checking nothing is mounted).
# Exit status: 0 when every run passed, 1 when a test run failed, 2 on a
# setup error.
set -euo pipefail

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ROOT=${KILN_BE_ROOT:-/srv/s390x}
RESULT=${KILN_BE_RESULT:-/tmp/bigendian-result.txt}
LOGS=${KILN_BE_LOGS:-/tmp/bigendian-logs}
SUITE=bookworm
CORE_ONLY=0
for a in "$@"; do
    case $a in
        --core-only) CORE_ONLY=1 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "unknown option: $a" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 2; }
mkdir -p "$LOGS"
log() { printf '[bigendian-check %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

if [ -z "${KILN_BE_MIRROR:-}" ]; then
    KILN_BE_MIRROR=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.sources \
        /etc/apt/sources.list.d/*.list 2>/dev/null |
        grep -oE 'https?://[^ ]+/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ' || true)
    KILN_BE_MIRROR=${KILN_BE_MIRROR:-http://deb.debian.org/debian}
fi
KILN_BE_MIRROR=${KILN_BE_MIRROR%/}
SECURITY_MIRROR=${KILN_BE_MIRROR%/debian}/debian-security

# --- 1. host tools and binfmt ------------------------------------------------
need=()
for p in debootstrap qemu-user-static binfmt-support; do
    dpkg -s "$p" >/dev/null 2>&1 || need+=("$p")
done
if [ ${#need[@]} -gt 0 ]; then
    log "host: installing ${need[*]}"
    apt-get update -q >"$LOGS/host-apt.log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need[@]}" >>"$LOGS/host-apt.log" 2>&1
fi
if [ ! -e /proc/sys/fs/binfmt_misc/register ]; then
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc || die "cannot mount binfmt_misc"
fi
if ! grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-s390x 2>/dev/null; then
    update-binfmts --enable qemu-s390x || die "cannot enable the qemu-s390x binfmt handler"
fi
grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-s390x || die "qemu-s390x binfmt handler not enabled"

# --- 2. the s390x chroot -----------------------------------------------------
if [ -s "$ROOT/var/lib/dpkg/status" ] && [ ! -e "$ROOT/debootstrap" ]; then
    touch "$ROOT/.kiln-be-stage1" "$ROOT/.kiln-be-stage2"  # a finished chroot made earlier
fi
if [ ! -e "$ROOT/.kiln-be-stage1" ]; then
    # a half-made first stage is started over
    if [ -e "$ROOT" ]; then
        ! grep -q " $ROOT/" /proc/mounts || die "$ROOT is half made and has mounts: unmount them first"
        rm -rf --one-file-system "$ROOT"
    fi
    log "debootstrap first stage ($SUITE s390x from $KILN_BE_MIRROR)"
    debootstrap --arch=s390x --foreign --variant=minbase "$SUITE" "$ROOT" "$KILN_BE_MIRROR" \
        >"$LOGS/debootstrap1.log" 2>&1 || die "debootstrap first stage failed: $LOGS/debootstrap1.log"
    touch "$ROOT/.kiln-be-stage1"
fi
cp /usr/bin/qemu-s390x-static "$ROOT/usr/bin/"
if [ ! -e "$ROOT/.kiln-be-stage2" ]; then
    log "debootstrap second stage (emulated, a few minutes)"
    chroot "$ROOT" /debootstrap/debootstrap --second-stage >"$LOGS/debootstrap2.log" 2>&1 ||
        die "debootstrap second stage failed: $LOGS/debootstrap2.log"
    touch "$ROOT/.kiln-be-stage2"
fi

MOUNTED=()
cleanup() {
    local i
    for ((i=${#MOUNTED[@]}-1; i>=0; i--)); do umount "${MOUNTED[$i]}" 2>/dev/null || umount -l "${MOUNTED[$i]}" || true; done
}
trap cleanup EXIT
mnt() {  # mnt TYPE DIR
    mkdir -p "$ROOT/$2"
    if ! mountpoint -q "$ROOT/$2"; then mount -t "$1" "$1" "$ROOT/$2"; MOUNTED+=("$ROOT/$2"); fi
}
mnt proc proc; mnt sysfs sys; mnt devpts dev/pts; mnt tmpfs dev/shm
cp /etc/resolv.conf "$ROOT/etc/resolv.conf" 2>/dev/null || true

# a clean environment in the chroot: nothing of the host's PIP_*/SSL_* paths
CH=(env -i PATH=/opt/kiln-venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
    HOME=/root LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive PIP_DISABLE_PIP_VERSION_CHECK=1
    chroot "$ROOT")

# --- 3. packages and the venv --------------------------------------------------
PKGS=(python3 python3-dev python3-venv python3-pip gcc libc6-dev python3-numpy python3-pytest
      python3-hypothesis git ca-certificates)
if ! "${CH[@]}" dpkg -s "${PKGS[@]}" >/dev/null 2>&1; then
    log "chroot: apt-get install (emulated, several minutes)"
    cat >"$ROOT/etc/apt/sources.list" <<EOF
deb $KILN_BE_MIRROR $SUITE main
deb $KILN_BE_MIRROR $SUITE-updates main
deb $SECURITY_MIRROR $SUITE-security main
EOF
    { "${CH[@]}" apt-get update -q && "${CH[@]}" apt-get install -y -q --no-install-recommends "${PKGS[@]}"; } \
        >"$LOGS/chroot-apt.log" 2>&1 || die "apt-get in the chroot failed: $LOGS/chroot-apt.log"
fi
shopt -s nullglob
cas=(/usr/local/share/ca-certificates/*.crt)
shopt -u nullglob
if [ ${#cas[@]} -gt 0 ]; then
    changed=0
    for c in "${cas[@]}"; do
        cmp -s "$c" "$ROOT/usr/local/share/ca-certificates/$(basename "$c")" ||
            { cp "$c" "$ROOT/usr/local/share/ca-certificates/"; changed=1; }
    done
    [ $changed = 0 ] || "${CH[@]}" update-ca-certificates >/dev/null 2>&1
fi
cp "$REPO/constraints/build.txt" "$ROOT/tmp/kiln-build-constraints.txt"
[ -x "$ROOT/opt/kiln-venv/bin/python" ] || "${CH[@]}" python3 -m venv --system-site-packages /opt/kiln-venv
if ! "${CH[@]}" python -c 'import Cython, setuptools, packaging.licenses' >/dev/null 2>&1; then
    log "chroot: pip install Cython, setuptools, packaging"
    "${CH[@]}" pip install -q --no-compile -c /tmp/kiln-build-constraints.txt \
        'Cython>=3.1,<3.4' 'setuptools>=77' 'packaging>=24.2' >"$LOGS/chroot-pip.log" 2>&1 ||
        die "pip in the chroot failed: $LOGS/chroot-pip.log"
fi

# --- 4. copy and build ---------------------------------------------------------
log "copying the tracked files to $ROOT/root/kiln"
rm -rf "$ROOT/root/kiln"
mkdir -p "$ROOT/root/kiln"
(cd "$REPO" && git ls-files -z | grep -zvE '(\.so$|(^|/)\.venv[^/]*/)' |
    xargs -0 cp --parents -t "$ROOT/root/kiln")
COMMIT=$(git -C "$REPO" rev-parse HEAD)
DIRTY=$(git -C "$REPO" status --porcelain --untracked-files=no | wc -l)
IN=("${CH[@]}" sh -c)
log "building the extension (emulated, about 2 minutes)"
"${IN[@]}" 'cd /root/kiln && python setup.py build_ext --inplace' >"$LOGS/build.log" 2>&1 ||
    die "build failed: $LOGS/build.log"
CHECK=$("${IN[@]}" 'cd /root/kiln && python -c "import sys, kiln; print(sys.byteorder, kiln.IMPLEMENTATION, kiln._kernels_c.HOST_BIG_ENDIAN)"' 2>&1) ||
    die "import check failed: $CHECK"
[ "$CHECK" = "big cython True" ] || die "import check printed '$CHECK', not 'big cython True'"

# --- 5. tests --------------------------------------------------------------------
CORE="tests/test_golden.py tests/test_frozen.py tests/test_tensors.py tests/test_byteswap.py tests/test_hostile.py tests/test_differential.py"
declare -A CMD RC
ORDER=(core)
CMD[core]="python -m pytest $CORE --c-extensions -q -p no:cacheprovider -ra"
if [ $CORE_ONLY = 0 ]; then
    ORDER+=(full)
    CMD[full]="python -m pytest tests --c-extensions -q -p no:cacheprovider --deselect tests/test_dist.py -ra"
fi
ORDER+=(cases pure)
CMD[cases]="python -m kiln cases"
CMD[pure]="KILN_PUREPYTHON=1 python -m pytest tests/test_golden.py tests/test_frozen.py tests/test_tensors.py -q -p no:cacheprovider -ra"
status=0
for n in "${ORDER[@]}"; do
    log "run $n: ${CMD[$n]}"
    start=$(date +%s)
    set +e
    "${IN[@]}" "cd /root/kiln && ${CMD[$n]}" >"$LOGS/$n.log" 2>&1
    RC[$n]=$?
    set -e
    echo "[exit ${RC[$n]}, $(( $(date +%s) - start )) s wall]" >>"$LOGS/$n.log"
    [ "${RC[$n]}" = 0 ] || status=1
    log "run $n: exit ${RC[$n]}"
done

# --- result ------------------------------------------------------------------------
{
    echo "kiln big-endian check (tools/bigendian-check.sh), $(date -u '+%Y-%m-%d %H:%M UTC')"
    echo "repository: $REPO at $COMMIT ($DIRTY modified tracked files)"
    echo "chroot: $ROOT, Debian $SUITE s390x under $(qemu-s390x-static --version | head -n1)"
    echo "mirror: $KILN_BE_MIRROR"
    echo
    echo "== versions inside the chroot"
    "${IN[@]}" 'uname -m; python -c "import sys, numpy, Cython, setuptools, pytest, hypothesis; print(\"python\", sys.version.split()[0], sys.byteorder + \"-endian\"); print(\"numpy\", numpy.__version__); print(\"Cython\", Cython.__version__); print(\"setuptools\", setuptools.__version__); print(\"pytest\", pytest.__version__); print(\"hypothesis\", hypothesis.__version__)"; gcc --version | head -n1' 2>&1
    echo
    echo "== build: python setup.py build_ext --inplace"
    echo "compiler warnings: $(grep -c 'warning:' "$LOGS/build.log" || true)"
    echo "import check: $CHECK"
    for n in "${ORDER[@]}"; do
        echo
        echo "== $n: ${CMD[$n]}"
        echo "exit status ${RC[$n]}; log $LOGS/$n.log"
        if [ "$n" = cases ]; then
            tail -n 15 "$LOGS/$n.log"
        else
            grep -E '^(FAILED|ERROR|SKIPPED|XFAIL|XPASS) |^=+ .*(passed|failed|error).* =+$|^[0-9]+ (passed|failed)|in [0-9.]+s' "$LOGS/$n.log" || tail -n 5 "$LOGS/$n.log"
        fi
    done
} >"$RESULT"
log "result in $RESULT (exit $status)"
exit $status
