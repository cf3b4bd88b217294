#!/bin/sh
# gpu_prepare.sh — run HERE (a Debian machine with the packages of install-debian-deps.sh) before using a GPU
# machine that can install nothing: gathers into .gpu/ (ignored by git through .git/info/exclude) what the
# build and the tests need there and the GPU image lacks: the zstd/SQLite/cmocka headers, static libzstd.a and
# libsqlite3.a, cmocka's shared library (Debian ships no static one), and a copy of ../shared/models (the real
# models of the golden and parity tests; ../shared does not travel). Then carry `.gpu` and run
# tools/gpu_session.sh there. About 8 MB.
set -eu
cd "$(dirname "$0")/.."
g=.gpu
rm -rf "$g"
mkdir -p "$g/include" "$g/lib"
for h in zstd.h zstd_errors.h zdict.h sqlite3.h sqlite3ext.h cmocka.h; do cp "/usr/include/$h" "$g/include/"; done
arch=$(gcc -print-multiarch)
cp "/usr/lib/$arch/libzstd.a" "/usr/lib/$arch/libsqlite3.a" "$g/lib/"
# Regular copies under both names (links may not travel): the linker wants libcmocka.so, the loader .so.0.
cp -L "/usr/lib/$arch/libcmocka.so.0" "$g/lib/libcmocka.so.0"
cp -L "/usr/lib/$arch/libcmocka.so.0" "$g/lib/libcmocka.so"
if [ -d ../shared/models ]; then cp -r ../shared/models "$g/models"; else echo "gpu_prepare: no ../shared/models (tests will skip)"; fi
du -sh "$g"
