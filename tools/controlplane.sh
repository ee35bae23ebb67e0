#!/usr/bin/env bash
# tools/controlplane.sh — build and run a stock Kubernetes control plane on 127.0.0.1 with
# Tessera inside it (issue #20). See docs/e2e.md and `tools/controlplane.sh --help`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/test/controlplane"
CACHE_ROOT="${TESSERA_CONTROLPLANE_CACHE:-$HOME/.cache/tessera/controlplane}"
K8S_VERSION=v1.37.2

die() { echo "controlplane.sh: error: $*" >&2; exit 1; }
log() { echo "controlplane.sh: $*" >&2; }

# The cache key: a hash of everything that decides what the binaries are.
cache_key() {
  (cd "$MODULE" && cat go.mod go.sum $(find cmd -name '*.go' | LC_ALL=C sort) && echo "$K8S_VERSION") \
    | sha256sum | cut -c1-16
}

cmd_build() {
  command -v go >/dev/null || die "go is not on PATH; install Go ($(sed -n 's/^go //p' "$MODULE/go.mod") or newer)"
  local dir="$CACHE_ROOT/$(cache_key)"
  if [[ -x "$dir/etcd" && -x "$dir/kube-apiserver" && -x "$dir/kube-scheduler" ]]; then
    echo "$dir"; return 0
  fi
  mkdir -p "$CACHE_ROOT"
  local tmp; tmp="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
  log "building etcd, kube-apiserver, kube-scheduler ($K8S_VERSION) into $dir (first build takes minutes)"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  if ! (cd "$MODULE" && nice -n 10 go build -trimpath \
        -ldflags "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
        -o "$tmp/" ./cmd/...); then
    rm -rf "$tmp"; die "go build in $MODULE failed (see the output above)"
  fi
  rm -rf "$dir"; mv "$tmp" "$dir"
  echo "$dir"
}

usage() {
  cat <<USAGE
Usage: tools/controlplane.sh build

  build   Build stock etcd, kube-apiserver and kube-scheduler ($K8S_VERSION) from
          test/controlplane once, into \$TESSERA_CONTROLPLANE_CACHE/<key>/ (default
          ~/.cache/tessera/controlplane), <key> being a hash of the module's go.mod, go.sum and
          main files; prints that directory. The same versions are never rebuilt.
USAGE
}

case "${1:-}" in
  build) cmd_build ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
