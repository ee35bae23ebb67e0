#!/usr/bin/env bash
# The Helm chart against the real kube-apiserver (docs/deploy.md, "Helm chart"): `helm template`
# with the cluster's version, piped to `kubectl apply --dry-run=server`, so that the API server
# itself admits every object the chart renders (defaulting, validation, the RBAC escalation check
# of the roles and bindings). Renderings: the default values (with the Namespace), every option
# that needs no CRD on (NetworkPolicy, priorityClassName, cert-manager left out: its kinds need
# cert-manager's CRDs), and the HAMi-structured values file of helm_chart_test into kube-system.
# A rendering with a value the API server must refuse (an unknown failurePolicy) must fail. A real
# `helm install` takes kube-scheduler's tag from the server and uninstalls cleanly. And
# the OpenAPI the server serves defines every kind the chart renders as the swagger.json the
# kubeconform schemas are generated from (tools/helm_schemas.py) does.
#
#   test/controlplane/helm_dry_run_test.sh [--tessera PATH] [--keep]
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). docs/e2e.md.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# helm (cached; a cold build takes a few minutes) before the control plane comes up.
HELM_DIR="$(timeout 1500 "$HERE/../../tools/helm.sh" build)" || {
  echo "helm_dry_run_test.sh: tools/helm.sh build failed" >&2; exit 1; }
HELM="$HELM_DIR/helm"

# shellcheck source=test/controlplane/lib.sh
source "$HERE/lib.sh"

CHART="$ROOT/deploy/helm/tessera"
# Helm's own state (repositories, cache) in the test's directory, not the user's home.
export HELM_CACHE_HOME="$DIR/helm/cache" HELM_CONFIG_HOME="$DIR/helm/config" HELM_DATA_HOME="$DIR/helm/data"
server_version="$(k version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])')"
echo "e2e: kube-apiserver $server_version"

# dry_run WHAT NAMESPACE HELM-ARGS...: renders and applies with --dry-run=server; every rendered
# object must be reported by the server.
dry_run() {
  local what="$1" ns="$2"; shift 2
  local rendered="$DIR/helm-$what.yaml" out="$DIR/helm-$what.apply"
  "$HELM" template tessera "$CHART" -n "$ns" --kube-version "$server_version" "$@" >"$rendered"
  local want got
  want="$(grep -c '^kind: ' "$rendered")"
  if k apply --dry-run=server -f "$rendered" >"$out" 2>&1; then
    got="$(grep -c '(server dry run)' "$out" || true)"
    check "$what: the API server admits all $want objects (got $got)" test "$got" = "$want"
  else
    fail "$what: kubectl apply --dry-run=server refused: $(tail -n 5 "$out" | tr '\n' ' ')"
  fi
}

dry_run default tessera-system --set namespace.create=true
check "default: kube-scheduler's image is the server's version" \
  grep -q "image: registry.k8s.io/kube-scheduler:${server_version%%+*}$" "$DIR/helm-default.yaml"
dry_run options tessera-system --set networkPolicy.enabled=true \
  --set 'networkPolicy.apiServerCIDRs={10.0.0.0/24}' --set scheduler.priorityClassName=system-cluster-critical \
  --set scheduler.service.type=NodePort --set scheduler.service.httpTargetPort=443
dry_run hami-values kube-system -f "$ROOT/test/deploy/testdata/hami-values.yaml"
phase_done "helm template | kubectl apply --dry-run=server"

# A real `helm install` (and uninstall): Helm takes .Capabilities.KubeVersion from the server
# itself, so kube-scheduler's image tag must be the server's version without --kube-version.
# The webhook is left out: no pod runs to answer it, and pod creations elsewhere would call it.
if "$HELM" install tessera-e2e "$CHART" -n helm-e2e --create-namespace \
     --set scheduler.admissionWebhook.enabled=false >"$DIR/helm-install.log" 2>&1; then
  image="$(k -n helm-e2e get deploy tessera-e2e -o jsonpath='{.spec.template.spec.containers[?(@.name=="kube-scheduler")].image}')"
  check "helm install: kube-scheduler's image tag is the cluster's version ($image)" \
    test "$image" = "registry.k8s.io/kube-scheduler:${server_version%%+*}"
  check "helm install: the release is deployed" \
    grep -q '"status":"deployed"' <("$HELM" status tessera-e2e -n helm-e2e -o json)
  "$HELM" uninstall tessera-e2e -n helm-e2e >>"$DIR/helm-install.log" 2>&1 || fail "helm uninstall failed"
  check "helm uninstall removes the release's ClusterRole" \
    test -z "$(k get clusterrole tessera-e2e --ignore-not-found -o name)"
else
  fail "helm install failed: $(tail -n 5 "$DIR/helm-install.log" | tr '\n' ' ')"
fi
phase_done "helm install, uninstall"

# The check can fail: the API server refuses a webhook with an unknown failurePolicy.
"$HELM" template tessera "$CHART" -n tessera-system --kube-version "$server_version" \
  --set scheduler.admissionWebhook.failurePolicy=Sometimes >"$DIR/helm-bad.yaml"
if k apply --dry-run=server -f "$DIR/helm-bad.yaml" >"$DIR/helm-bad.apply" 2>&1; then
  fail "the API server admitted failurePolicy: Sometimes"
else
  check "the API server refuses failurePolicy: Sometimes" grep -q "failurePolicy" "$DIR/helm-bad.apply"
fi

# The schemas' source: every kind the chart renders is defined alike by the served OpenAPI and by
# the module's swagger.json.
swagger="$(cd "$ROOT/test/controlplane" && go mod download -json "k8s.io/kubernetes@$server_version" 2>/dev/null \
  | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])' || true)/api/openapi-spec/swagger.json"
k get --raw /openapi/v2 >"$DIR/openapi-v2.json"
if [[ -f "$swagger" ]]; then
  if python3 - "$DIR/openapi-v2.json" "$swagger" "$DIR"/helm-default.yaml "$DIR"/helm-options.yaml <<'PY'
import json, sys, yaml
served, shipped = (json.load(open(p))["definitions"] for p in sys.argv[1:3])
def strip(n):
    if isinstance(n, dict):
        return {k: strip(v) for k, v in n.items() if k != "description"}
    if isinstance(n, list):
        return [strip(v) for v in n]
    return n
def by_gvk(defs):
    out = {}
    for name, d in defs.items():
        for g in d.get("x-kubernetes-group-version-kind", []):
            out[(g["group"], g["version"], g["kind"])] = name
    return out
s_gvk, m_gvk = by_gvk(served), by_gvk(shipped)
kinds = set()
for path in sys.argv[3:]:
    for d in yaml.safe_load_all(open(path)):
        if d:
            group, _, version = d["apiVersion"].rpartition("/")
            kinds.add((group, version, d["kind"]))
bad = [k for k in sorted(kinds) if k not in s_gvk or k not in m_gvk
       or strip(served[s_gvk[k]]) != strip(shipped[m_gvk[k]])]
print(f"{len(kinds)} kinds compared; differing: {bad}")
sys.exit(1 if bad else 0)
PY
  then check "the served OpenAPI defines the chart's kinds as swagger.json does" true
  else fail "the served OpenAPI and swagger.json differ (see above)"
  fi
else
  fail "no swagger.json for k8s.io/kubernetes@$server_version in the module cache"
fi
phase_done "OpenAPI = the schemas' source"
