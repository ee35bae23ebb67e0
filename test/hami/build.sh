#!/usr/bin/env bash
# test/hami/build.sh [--own] VERSION — builds HAMi's scheduler at VERSION (v2.5.2 or v2.10.0) behind
# our own main (test/hami/VERSION/main.go) for tools/bench_controlplane.sh's HAMi column, and prints
# the binary's path. See test/hami/README.md.
#
# --cached: only print the path of a binary built earlier; exit 1 (nothing built) without one.
# --oracle: VERSION/ascendoracle instead (HAMi's Ascend vendor answering generated cases for
# Tessera's differential test, tools/gen/ascend_vectors.sh), cached like our main.
# --own: HAMi's own, unmodified cmd/scheduler instead (with its metrics listener), built in the
# export with HAMi's go.mod and go.sum, for `tessera simulate --scheduler hami`; cached in
# $HAMI_BIN_DIR/<version>-own/hami-scheduler (a tag's source does not change).
#
# HAMi's source: the Go module proxy refuses github.com/Project-HAMi/HAMi at every version (HTTP
# 403 "This module version is not available"), so it comes from a git clone of HAMi:
# $HAMI_GIT (a repository, bare or not, that has the tag), exported into VERSION/src/ (ignored
# by git), which VERSION/go.mod replaces the module with. Every other module (k8s.io, ...) comes
# from the module proxy at the versions VERSION/go.sum pins. The build runs at nice 10 with
# GOFLAGS=-p=1 (a shared machine) and is cached in $HAMI_BIN_DIR (default
# ~/.cache/tessera/hami/<version>-<hash of main.go, go.mod, go.sum>).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OWN=0
CACHED=0
ORACLE=0
[[ "${1:-}" == --own ]] && { OWN=1; shift; }
[[ "${1:-}" == --oracle ]] && { ORACLE=1; shift; }
[[ "${1:-}" == --cached ]] && { CACHED=1; shift; }
V="${1:?usage: test/hami/build.sh [--own|--oracle] [--cached] VERSION (v2.5.2 or v2.10.0)}"
MOD="$HERE/$V"
[[ -f "$MOD/go.mod" ]] || { echo "build.sh: no module for $V in $MOD" >&2; exit 2; }
if ((OWN)); then
  out="${HAMI_BIN_DIR:-$HOME/.cache/tessera/hami}/$V-own/hami-scheduler"
elif ((ORACLE)); then
  [[ -d "$MOD/ascendoracle" ]] || { echo "build.sh: no ascend oracle for $V" >&2; exit 2; }
  key="$(cat "$MOD/ascendoracle/main.go" "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-16)"
  out="${HAMI_BIN_DIR:-$HOME/.cache/tessera/hami}/$V-$key/ascend-oracle"
else
  key="$(cat "$MOD/main.go" "$MOD/go.mod" "$MOD/go.sum" | sha256sum | cut -c1-16)"
  out="${HAMI_BIN_DIR:-$HOME/.cache/tessera/hami}/$V-$key/hami-scheduler-bench"
fi
if [[ -x "$out" ]]; then echo "$out"; exit 0; fi
((CACHED)) && { echo "build.sh: no binary of $V built yet in $(dirname "$out")" >&2; exit 1; }
if [[ ! -f "$MOD/src/go.mod" ]]; then
  [[ -n "${HAMI_GIT:-}" ]] || { echo "build.sh: set HAMI_GIT to a git repository of github.com/Project-HAMi/HAMi (the module proxy does not serve it)" >&2; exit 1; }
  rm -rf "$MOD/src.tmp" && mkdir -p "$MOD/src.tmp"
  git -C "$HAMI_GIT" archive "$V" | tar -x -C "$MOD/src.tmp"
  mv "$MOD/src.tmp" "$MOD/src"
fi
mkdir -p "$(dirname "$out")"
if ((OWN)); then
  (cd "$MOD/src" && GOFLAGS="-p=1 -buildvcs=false -mod=readonly" nice -n 10 go build -trimpath -o "$out.tmp" ./cmd/scheduler)
  mv "$out.tmp" "$out"
  echo "$out"
  exit 0
fi
pkg=.
((ORACLE)) && pkg=./ascendoracle
(cd "$MOD" && GOFLAGS="-p=1 -buildvcs=false -mod=readonly" nice -n 10 go build -trimpath -o "$out.tmp" "$pkg")
mv "$out.tmp" "$out"
echo "$out"
