#!/usr/bin/env bash
# tools/helm.sh — Helm and kubeconform for the chart's tests (deploy/helm/tessera, docs/deploy.md
# "Helm chart"), built from the Go module test/helm and cached like the control plane's binaries,
# and the Kubernetes JSON schemas kubeconform validates against.
#
#   tools/helm.sh build     builds helm and kubeconform once per go.mod/go.sum; prints the directory
#   tools/helm.sh schemas   writes the JSON schemas of the release test/controlplane pins (from
#                           k8s.io/kubernetes's api/openapi-spec/swagger.json); prints the directory
#   tools/helm.sh path      prints the build directory if it is built (exit 1 if not)
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/test/helm"
CACHE_ROOT="${TESSERA_HELM_CACHE:-$HOME/.cache/tessera/helm}"
CP_MODULE="$ROOT/test/controlplane"
K8S_VERSION="$(sed -n 's|^[[:space:]]*k8s.io/kubernetes \(v[0-9.]*\).*|\1|p' "$CP_MODULE/go.mod" | head -n 1)"

die() { echo "helm.sh: error: $*" >&2; exit 1; }
log() { echo "helm.sh: $*" >&2; }

# What decides the binaries: the module's go.mod and go.sum (they pin helm and kubeconform).
build_key() { (cd "$MODULE" && cat go.mod go.sum; sed -n "/^cmd_build/,/^}/p" "$ROOT/tools/helm.sh") | sha256sum | cut -c1-16; }
build_dir() { echo "$CACHE_ROOT/bin-$(build_key)"; }

cmd_build() {
  local dir; dir="$(build_dir)"
  if [[ -x "$dir/helm" && -x "$dir/kubeconform" ]]; then echo "$dir"; return 0; fi
  command -v go >/dev/null || die "go is not on PATH; install Go ($(sed -n 's/^go //p' "$MODULE/go.mod") or newer)"
  mkdir -p "$CACHE_ROOT"
  local tmp; tmp="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
  log "building helm and kubeconform ($(tools_versions)) into $dir (first build takes minutes)"
  # The version stamps helm's and kubeconform's release builds set, and the Kubernetes version
  # `helm template` assumes without --kube-version: its client-go's, as helm's Makefile does.
  local k8s; k8s="$(mod_version k8s.io/client-go)"; k8s="${k8s#v0.}"; k8s="${k8s%%.*}"
  local ldflags="-X helm.sh/helm/v3/internal/version.version=$(mod_version helm.sh/helm/v3)"
  ldflags+=" -X main.version=$(mod_version github.com/yannh/kubeconform)"
  local pkg
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$k8s"
  done
  if ! (cd "$MODULE" && GOFLAGS="${GOFLAGS:--p=1}" nice -n 10 go build -trimpath -ldflags "$ldflags" \
          -o "$tmp/" helm.sh/helm/v3/cmd/helm github.com/yannh/kubeconform/cmd/kubeconform); then
    rm -rf "$tmp"; die "go build in $MODULE failed (see the output above)"
  fi
  rm -rf "$dir"
  mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"   # a parallel build got there first
  echo "$dir"
}

# mod_version PATH: the version go.mod requires of the module PATH.
mod_version() { sed -n "s#^[[:space:]]*$1 \(v[^ ]*\).*#\1#p" "$MODULE/go.mod" | head -n 1; }
tools_versions() {
  echo "helm $(mod_version helm.sh/helm/v3), kubeconform $(mod_version github.com/yannh/kubeconform)"
}

cmd_path() {
  local dir; dir="$(build_dir)"
  [[ -x "$dir/helm" && -x "$dir/kubeconform" ]] || return 1
  echo "$dir"
}

# The schemas: one file per kind the API server serves, generated from the OpenAPI v2 document
# that k8s.io/kubernetes ships for the release (the module test/controlplane pins with go.sum, so
# the same bytes the control plane's kube-apiserver is built from), by tools/helm_schemas.py.
cmd_schemas() {
  [[ -n "$K8S_VERSION" ]] || die "no k8s.io/kubernetes requirement in $CP_MODULE/go.mod"
  local key dir
  key="$( (cat "$ROOT/tools/helm_schemas.py"; echo "$K8S_VERSION") | sha256sum | cut -c1-16)"
  dir="$CACHE_ROOT/schemas-$K8S_VERSION-$key"
  if [[ -f "$dir/.complete" ]]; then echo "$dir"; return 0; fi
  command -v go >/dev/null || die "go is not on PATH (needed to fetch k8s.io/kubernetes $K8S_VERSION)"
  local src
  src="$(cd "$CP_MODULE" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" \
           | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])')" \
    || die "go mod download k8s.io/kubernetes@$K8S_VERSION failed"
  mkdir -p "$CACHE_ROOT"
  local tmp; tmp="$(mktemp -d "$CACHE_ROOT/.schemas.XXXXXX")"
  if ! python3 "$ROOT/tools/helm_schemas.py" "$src/api/openapi-spec/swagger.json" "$tmp" >&2; then
    rm -rf "$tmp"; die "generating the schemas failed"
  fi
  touch "$tmp/.complete"
  rm -rf "$dir"
  mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
  echo "$dir"
}

case "${1:-}" in
  build) cmd_build ;;
  path) cmd_path ;;
  schemas) cmd_schemas ;;
  *) echo "usage: tools/helm.sh build|path|schemas" >&2; exit 2 ;;
esac
