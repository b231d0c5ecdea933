#!/usr/bin/env bash
# FlashDesk setup: system libraries for Qt, a virtual environment in .venv, and the package.
#
#   bash packaging/setup.sh            # what the app needs; afterwards .venv/bin/flashdesk exists
#   bash packaging/setup.sh --tests    # also pytest, pytest-qt, pytest-xdist and the dflash test oracle
#
# Idempotent: a second run checks, finds everything in place and returns in a second or two.
#
# Environment:
#   FLASHDESK_TORCH            torch version to pin (default 2.13.0), e.g. another CUDA release
#   FLASHDESK_TORCH_INDEX_URL  a package index for torch only, e.g. https://download.pytorch.org/whl/cu130
#   FLASHDESK_PYTHON           the Python used to create .venv (default: the first python3 >= 3.10)
#   FLASHDESK_VENV             where the virtual environment goes (default: .venv in the checkout)
#
# Options:
#   --tests       install the test extra and dflash (z-lab's reference, a test oracle)
#   --force       reinstall the Python packages even if the last run's record says they are current
#   --no-system   do not check or install Debian packages
#   --verbose     show pip's full output
set -euo pipefail

TORCH_VERSION="${FLASHDESK_TORCH:-2.13.0}"
TORCH_INDEX_URL="${FLASHDESK_TORCH_INDEX_URL:-}"
DFLASH_SPEC="dflash==0.1.0"
MIN_PY_MINOR=10

want_tests=0
force=0
system=1
verbose=0
for arg in "$@"; do
    case "$arg" in
        --tests) want_tests=1 ;;
        --force) force=1 ;;
        --no-system) system=0 ;;
        --verbose|-v) verbose=1 ;;
        -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) echo "setup.sh: unknown option '$arg' (try --help)" >&2; exit 2 ;;
    esac
done

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${FLASHDESK_VENV:-$ROOT/.venv}"
STAMP="$VENV/.flashdesk-setup"
START=$SECONDS
[ -f "$ROOT/pyproject.toml" ] || { echo "setup.sh: no pyproject.toml in $ROOT (run it from a FlashDesk checkout)" >&2; exit 1; }

say()  { printf '==> %s\n' "$*"; }
note() { printf '    %s\n' "$*"; }
die()  { printf 'setup.sh: error: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }
have_apt() { command -v apt-get >/dev/null 2>&1 && command -v dpkg-query >/dev/null 2>&1; }

# ---------------------------------------------------------------------------------------------
# System packages (Debian / Ubuntu). "a|b" means either name satisfies (Ubuntu 24.04 renamed
# some libraries with a t64 suffix); the first one apt knows is installed when none is present.
# The list is what PySide6-Essentials 6.12's Qt libraries and platform plugins link against
# (readelf NEEDED of QtCore/QtGui/QtWidgets/QtDBus, the xcb, wayland and offscreen plugins).
# ---------------------------------------------------------------------------------------------
QT_PACKAGES=(
    # QtCore, QtGui, QtWidgets, QtDBus, and the offscreen platform plugin
    "libglib2.0-0|libglib2.0-0t64" libdbus-1-3 libfontconfig1 libfreetype6 libxkbcommon0
    libegl1 libgl1 libx11-6 zlib1g libzstd1
    # the xcb platform plugin (X11 desktops, XWayland, Xvfb)
    libx11-xcb1 libxcb1 libxcb-cursor0 libxcb-glx0 libxcb-icccm4 libxcb-image0 libxcb-keysyms1
    libxcb-randr0 libxcb-render0 libxcb-render-util0 libxcb-shape0 libxcb-shm0 libxcb-sync1
    libxcb-util1 libxcb-xfixes0 libxcb-xkb1 libxkbcommon-x11-0
    # the wayland platform plugin
    libwayland-client0 libwayland-cursor0 libwayland-egl1
    # at least one font, or every label is empty
    fonts-dejavu-core
)

pkg_installed() {
    [ "$(dpkg-query -W -f='${db:Status-Status}' "$1" 2>/dev/null || true)" = "installed" ]
}

apt_has() {
    local cand
    cand="$(apt-cache policy "$1" 2>/dev/null | awk '/Candidate:/ {print $2; exit}')"
    [ -n "$cand" ] && [ "$cand" != "(none)" ]
}

# Sets MISSING to the entries of the given list of which no alternative is installed.
find_missing() {
    MISSING=()
    local entry alt found
    for entry in "$@"; do
        found=0
        IFS='|' read -r -a alts <<< "$entry"
        for alt in "${alts[@]}"; do
            if pkg_installed "$alt"; then found=1; break; fi
        done
        [ $found -eq 1 ] || MISSING+=("$entry")
    done
}

# Installs the entries in MISSING (apt-get update first, once).
APT_UPDATED=0
apt_install_missing() {
    local what="$1" entry alt pick names=()
    if [ $APT_UPDATED -eq 0 ]; then
        say "apt-get update (needed to install $what)"
        DEBIAN_FRONTEND=noninteractive apt-get update -qq || die "apt-get update failed"
        APT_UPDATED=1
    fi
    for entry in "${MISSING[@]}"; do
        IFS='|' read -r -a alts <<< "$entry"
        pick=""
        for alt in "${alts[@]}"; do
            if apt_has "$alt"; then pick="$alt"; break; fi
        done
        [ -n "$pick" ] || die "no Debian package found for '$entry'"
        names+=("$pick")
    done
    say "apt-get install ${names[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${names[@]}" \
        >/dev/null || die "apt-get install failed"
}

ensure_system_packages() {
    local what="$1"; shift
    if [ $system -eq 0 ]; then return 0; fi
    if ! have_apt; then
        say "Not a Debian-based system (no apt-get/dpkg): skipping the check for $what."
        note "Qt needs libEGL, libGL, fontconfig, libxkbcommon(-x11) and the xcb-util libraries."
        return 0
    fi
    find_missing "$@"
    if [ ${#MISSING[@]} -eq 0 ]; then
        say "System libraries for $what: all present"
        return 0
    fi
    if is_root; then
        apt_install_missing "$what"
    else
        say "Missing system packages for $what (not root, so not installing):"
        note "${MISSING[*]//|/ or }"
        note "Install them with: sudo apt-get install ${MISSING[*]%%|*}"
    fi
}

# ---------------------------------------------------------------------------------------------
# Python
# ---------------------------------------------------------------------------------------------
py_ok() {  # usage: py_ok /path/to/python -> true if it runs and is >= 3.MIN_PY_MINOR
    "$1" -c "import sys; sys.exit(0 if sys.version_info >= (3, $MIN_PY_MINOR) else 1)" \
        >/dev/null 2>&1
}

find_python() {
    local c
    if [ -n "${FLASHDESK_PYTHON:-}" ]; then
        py_ok "$FLASHDESK_PYTHON" || die "FLASHDESK_PYTHON=$FLASHDESK_PYTHON is not Python >= 3.$MIN_PY_MINOR"
        echo "$FLASHDESK_PYTHON"; return 0
    fi
    for c in python3 python3.13 python3.12 python3.11 python3.10; do
        if command -v "$c" >/dev/null 2>&1 && py_ok "$(command -v "$c")"; then
            command -v "$c"; return 0
        fi
    done
    return 1
}

ensure_python() {
    PYTHON="$(find_python || true)"
    if [ -z "$PYTHON" ] || ! "$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1; then
        # Debian ships venv/ensurepip in python3-venv; a minimal image may lack python3 entirely.
        if [ $system -eq 1 ] && have_apt && is_root; then
            find_missing python3 python3-venv
            [ ${#MISSING[@]} -eq 0 ] || apt_install_missing "Python"
            PYTHON="$(find_python || true)"
        fi
    fi
    [ -n "$PYTHON" ] || die "need Python >= 3.$MIN_PY_MINOR (set FLASHDESK_PYTHON, or install python3 and python3-venv)"
    "$PYTHON" -c "import venv, ensurepip" >/dev/null 2>&1 \
        || die "$PYTHON cannot create virtual environments (on Debian: apt-get install python3-venv)"
}

# ---------------------------------------------------------------------------------------------
say "FlashDesk setup in $ROOT$([ $want_tests -eq 1 ] && echo ' (with test tools)')"

ensure_system_packages "Qt (PySide6)" "${QT_PACKAGES[@]}"

if [ -x "$VENV/bin/python" ] && py_ok "$VENV/bin/python"; then
    say "Virtual environment: $VENV ($("$VENV/bin/python" -c 'import platform; print("Python", platform.python_version())'))"
else
    ensure_python
    if [ -e "$VENV" ]; then
        say "Removing the unusable virtual environment at $VENV"
        rm -rf "$VENV"
    fi
    say "Creating the virtual environment $VENV with $PYTHON ($("$PYTHON" -c 'import platform; print("Python", platform.python_version())'))"
    "$PYTHON" -m venv "$VENV"
fi
VPY="$VENV/bin/python"

# What the last successful run installed. The key covers everything that changes the result:
# the dependency list in pyproject.toml, the torch pin and index, the interpreter.
hash_of() { "$VPY" -c 'import hashlib, sys; print(hashlib.sha256(sys.stdin.buffer.read()).hexdigest()[:16])'; }
BASE_KEY="$({ cat "$ROOT/pyproject.toml"; echo "torch==$TORCH_VERSION $TORCH_INDEX_URL"; "$VPY" -VV; } | hash_of)"
TESTS_KEY="$(echo "$BASE_KEY $DFLASH_SPEC" | hash_of)"
stamp_has() { [ -f "$STAMP" ] && grep -qx "$1" "$STAMP"; }

# A cheap check that the record still tells the truth (someone may have pip-uninstalled things).
installed_version() {
    "$VPY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1" 2>/dev/null || true
}
torch_now="$(installed_version torch)"
need_base=1; need_tests=0
if [ $force -eq 0 ] && stamp_has "base=$BASE_KEY" && [ -x "$VENV/bin/flashdesk" ] \
   && [ "${torch_now%%+*}" = "${TORCH_VERSION%%+*}" ] \
   && "$VPY" -c "import flashdesk" >/dev/null 2>&1; then
    need_base=0
fi
if [ $want_tests -eq 1 ]; then
    if [ $force -eq 1 ] || [ $need_base -eq 1 ] || ! stamp_has "tests=$TESTS_KEY" \
       || [ -z "$(installed_version pytest-qt)" ] || [ -z "$(installed_version pytest-xdist)" ] \
       || [ -z "$(installed_version dflash)" ]; then
        need_tests=1
    fi
fi

PIP=("$VPY" -m pip install)
[ $verbose -eq 1 ] || PIP+=(--quiet)
if [ ! -t 1 ] || [ -n "${CI:-}" ]; then PIP+=(--progress-bar off); fi

if [ $need_base -eq 0 ] && [ $need_tests -eq 0 ]; then
    say "Python packages: up to date (torch $torch_now; flashdesk installed in editable mode)"
else
    rm -f "$STAMP"
    say "Upgrading pip"
    "${PIP[@]}" --upgrade pip

    # torch first and pinned: an unpinned torch would let pip pick the newest (CUDA) build.
    torch_args=("torch==$TORCH_VERSION")
    [ -z "$TORCH_INDEX_URL" ] || torch_args+=(--index-url "$TORCH_INDEX_URL")
    if [ "${torch_now}" = "${TORCH_VERSION}" ] || [ "${torch_now%%+*}" = "$TORCH_VERSION" ]; then
        say "torch $torch_now: already installed"
    else
        say "Installing torch==$TORCH_VERSION (large download unless a local wheel exists; may take minutes)"
        "${PIP[@]}" "${torch_args[@]}"
    fi
    torch_now="$(installed_version torch)"

    extras=""
    [ $want_tests -eq 1 ] && extras="[test]"
    say "Installing FlashDesk (editable) and its dependencies${extras:+ with the test extra}"
    # Naming the installed torch again keeps pip from replacing it while resolving the rest.
    "${PIP[@]}" -e "$ROOT$extras" "torch==$torch_now"

    if [ $want_tests -eq 1 ]; then
        say "Installing $DFLASH_SPEC without dependencies (z-lab's reference, a test oracle)"
        "${PIP[@]}" --no-deps "$DFLASH_SPEC"
    fi

    echo "base=$BASE_KEY" > "$STAMP"
    if [ $want_tests -eq 1 ]; then echo "tests=$TESTS_KEY" >> "$STAMP"; fi
fi

[ -x "$VENV/bin/flashdesk" ] || die "$VENV/bin/flashdesk was not created"

say "Done in $((SECONDS - START)) s. Next:"
note "$VENV/bin/flashdesk            # open the app"
note "$VENV/bin/flashdesk doctor     # check torch, CUDA, the GPU and NVML"
[ $want_tests -eq 0 ] || note "$VPY -m pytest -q   # run the tests"
