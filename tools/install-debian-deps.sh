#!/bin/sh
# Installs the Debian packages kvsim needs to build, test and plot (the one list: README and .ci/run use it).
# Runs apt-get directly as root, through sudo otherwise. CUDA is not installed here: `make cuda` uses the
# toolkit at /usr/local/cuda when one is present.
set -eu
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends \
    build-essential pkg-config libzstd-dev libsqlite3-dev libcmocka-dev gnuplot-nox >/dev/null
echo "install-debian-deps: build-essential libzstd-dev libsqlite3-dev libcmocka-dev gnuplot-nox installed"
