#!/bin/sh
# gpu_session.sh — the one command for a GPU machine: builds kvsim with the CUDA backend, runs the
# whole test suite with it (kernel-vs-CPU tests, CPU/CUDA parity on stories260K, a verified CUDA trace), then
# `make bench-cuda`, writing logs to $OUT (or ./gpu-out). Needs the .gpu/ folder of tools/gpu_prepare.sh
# carried with the tree: the GPU image has nvcc and cuBLAS but not zstd, SQLite or cmocka and cannot install.
#   device run: carry [".gpu"], command "sh tools/gpu_session.sh"
# The whole run may not fit one 10-minute device command (the benchmark writes a 2 GB checkpoint and runs
# transformers): then run "SKIP_BENCH=1 sh tools/gpu_session.sh" and, next, "ONLY_BENCH=1 sh tools/gpu_session.sh".
set -u
cd "$(dirname "$0")/.." || exit 1
g=$(pwd)/.gpu
out=${OUT:-$(pwd)/gpu-out}
mkdir -p "$out"
[ -d "$g/lib" ] || { echo "gpu_session: $g missing: run tools/gpu_prepare.sh first and carry .gpu" >&2; exit 1; }
if [ ! -d ../shared/models ] && [ -d "$g/models" ]; then mkdir -p ../shared && cp -r "$g/models" ../shared/; fi
export LD_LIBRARY_PATH="$g/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KVSIM_REQUIRE_GPU=1 # test_cuda fails, rather than skips, when the GPU or a model is missing
jobs=$(nproc 2>/dev/null || echo 8)
flags="CFLAGS=-I$g/include LDFLAGS=-L$g/lib CUDA_KVSIM=build/cuda/kvsim"
{ nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true; nvcc --version | tail -2; } \
    2>&1 | tee "$out/machine.txt"
status=0
if [ "${ONLY_BENCH:-0}" != 1 ]; then
    # shellcheck disable=SC2086 # $flags is a list of make variable assignments
    make -j"$jobs" cuda-test $flags > "$out/cuda-test.log" 2>&1 || status=1
    grep -E "^tests:|FAILED|SKIP" "$out/cuda-test.log" | tail -40
fi
if [ "$status" -eq 0 ] && [ "${SKIP_BENCH:-0}" != 1 ]; then
    # shellcheck disable=SC2086 # $flags is a list of make variable assignments
    make bench-cuda $flags > "$out/bench-cuda.log" 2>&1 || status=1
    tail -30 "$out/bench-cuda.log"
fi
echo "gpu_session: exit $status (logs in $out)"
exit $status
