#!/usr/bin/env bash
# Installs every Debian 12 package Tessera needs to build, test, fuzz and benchmark.
# Idempotent: packages already present are not touched, and apt is not contacted at all
# when nothing is missing. Must run as root (or with sudo available).
set -euo pipefail

PACKAGES=(
  cmake ninja-build g++ clang lld clang-tidy clang-format libclang-rt-14-dev pkg-config
  libssl-dev zlib1g-dev libcurl4-openssl-dev libcpp-httplib-dev libsimdjson-dev nlohmann-json3-dev
  libfmt-dev libcli11-dev libyaml-cpp-dev libabsl-dev prometheus-cpp-dev
  googletest libgtest-dev libgmock-dev libbenchmark-dev
  python3 python3-kubernetes python3-yaml python3-prometheus-client openssl curl ca-certificates git
  nghttp2-server iproute2 ccache
  prometheus  # promtool: check metrics / rules (test/deploy/promtool_test.py)
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ "${#missing[@]}" -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages present"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  SUDO="sudo"
fi
echo "install_deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
echo "install_deps: done"
