#!/usr/bin/env bash
# Runs every test Tessera has, from a fresh clone on Debian 12 as root: installs the packages,
# checks formatting, then configures, builds and tests the dev (g++) build, runs clang-tidy over
# the product sources (files that passed before and have not changed are skipped), runs the
# end-to-end tests in the real control plane (built from Go modules, cached), then the asan (clang
# ASan+UBSan; its ctest run includes every libFuzzer target for TESSERA_FUZZ_SECONDS, default
# 10 s) and tsan (clang TSan, threaded tests) builds. Exits non-zero on the first failure.
set -euo pipefail
cd "$(dirname "$0")/.."

start=$(date +%s)
stage() { echo; echo "=== $* ($(( $(date +%s) - start )) s)"; }

stage "dependencies"
bash tools/install_deps.sh

# Every build goes through ccache, its cache outside the clone: a run on a fresh clone compiles
# only what changed since the last run on this machine (paths are relative to the clone, so the
# clone's location does not matter).
if command -v ccache >/dev/null; then
  export CMAKE_CXX_COMPILER_LAUNCHER=ccache CCACHE_DIR="${HOME}/.cache/tessera/ccache"
  export CCACHE_BASEDIR="$PWD" CCACHE_NOHASHDIR=1 CCACHE_MAXSIZE=12G
  export CCACHE_SLOPPINESS=pch_defines,time_macros,include_file_mtime,include_file_ctime
fi

# Disk: a run needs about 15 GiB (three builds, the Go and ccache caches). On a machine short of
# it, our own caches are trimmed first (rebuilt as needed) rather than failing halfway with
# "No space left on device".
free_kib=$(df -Pk . | awk 'NR == 2 {print $4}')
echo "disk: $((free_kib / 1048576)) GiB free for the clone"
if ((free_kib < 15 * 1048576)); then
  echo "disk: under 15 GiB free: trimming the Go build cache and ccache to 4 GiB"
  if command -v go >/dev/null; then go clean -cache || true; fi
  if command -v ccache >/dev/null; then CCACHE_MAXSIZE=4G ccache -c >/dev/null || true; fi
  echo "disk: now $(($(df -Pk . | awk 'NR == 2 {print $4}') / 1048576)) GiB free"
fi

stage "helm, kubeconform (tools/helm.sh: Go modules, cached) and the e2e release's JSON schemas"
bash tools/helm.sh build >/dev/null; bash tools/helm.sh schemas >/dev/null
export TESSERA_HELM_REQUIRED=1   # helm_chart_test fails rather than skips without them

stage "clang-format"
bash tools/check_format.sh

stage "dev: g++ Debug, all tests"
cmake --workflow --preset ci-dev

stage "clang-tidy: .clang-tidy's checks over the product sources (tools/tidy.sh, cached by content)"
bash tools/tidy.sh build/dev

stage "e2e: Tessera in the real control plane (stock etcd, kube-apiserver, kube-scheduler; docs/e2e.md)"
# The control plane is built once per version into a cache outside the clone (a cold build takes
# ~5 minutes on 2 cores; the Go module and build caches are reused).
bash tools/controlplane.sh build
cmake --preset dev -DTESSERA_CONTROLPLANE_E2E=ON >/dev/null
TESSERA_E2E_REQUIRED=1 ctest --preset dev -R '^(controlplane|simulate_real)_' --output-on-failure

stage "asan: clang ASan+UBSan, all tests and every fuzz target for ${TESSERA_FUZZ_SECONDS:-10} s"
cmake --preset asan -DTESSERA_FUZZ_SECONDS="${TESSERA_FUZZ_SECONDS:-10}" >/dev/null
cmake --build --preset asan
ctest --preset asan

stage "tsan: clang TSan, threaded tests"
cmake --workflow --preset ci-tsan

stage "all test stages passed"
