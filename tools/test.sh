#!/usr/bin/env bash
# Runs every test Tessera has, from a fresh clone on Debian 12 as root: installs the packages,
# checks formatting, then configures, builds and tests the dev (g++), asan (clang ASan+UBSan;
# its ctest run includes every libFuzzer target for TESSERA_FUZZ_SECONDS, default 10 s) and tsan
# (clang TSan, threaded tests) builds. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
stage() { echo; echo "=== $* ($(( $(date +%s) - start )) s)"; }

stage "dependencies"
bash tools/install_deps.sh

stage "clang-format"
bash tools/check_format.sh

stage "dev: g++ Debug, all tests"
cmake --workflow --preset ci-dev

stage "asan: clang ASan+UBSan, all tests and every fuzz target for ${TESSERA_FUZZ_SECONDS:-10} s"
cmake --preset asan -DTESSERA_FUZZ_SECONDS="${TESSERA_FUZZ_SECONDS:-10}" >/dev/null
cmake --build --preset asan
ctest --preset asan

stage "tsan: clang TSan, threaded tests"
cmake --workflow --preset ci-tsan

stage "all test stages passed"
