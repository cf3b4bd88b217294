#!/bin/sh
# Installs the Debian packages kvsim needs to build, test and plot (the one list: README and .ci/run use it).
# Runs apt-get directly as root, through sudo otherwise. CUDA is not installed here: `make cuda` uses the
# toolkit at /usr/local/cuda when one is present.
#   --with-clang  also install clang (about 60 MB to download, 280 MB installed with LLVM), which kvsim does
#                 not need: .ci/run asks for it to check that the tree still builds with `make CC=clang`.
set -eu
with_clang=0
for arg in "$@"; do
    case "$arg" in
    --with-clang) with_clang=1 ;;
    *) echo "install-debian-deps: unknown option '$arg' (known: --with-clang)" >&2; exit 2 ;;
    esac
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
pkgs="build-essential pkg-config libzstd-dev libsqlite3-dev libcmocka-dev gnuplot-nox"
if [ "$with_clang" -eq 1 ]; then pkgs="$pkgs clang"; fi
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # $pkgs is a list of package names
$SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
echo "install-debian-deps: $pkgs installed"
