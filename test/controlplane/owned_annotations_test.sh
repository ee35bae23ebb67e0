#!/usr/bin/env bash
# The scheduler-owned annotations on a real control plane (issue 41): stock kube-apiserver with
# deploy/base's MutatingWebhookConfiguration, whose owned-annotations.tessera.dev webhook has CEL
# matchConditions and failurePolicy Fail. A pod's owner (a namespace user with get/patch/create
# on pods, no cluster right) cannot rewrite its bound pod's allocation, add, change or remove any
# owned annotation, nor create a pod carrying one — not even with the hami.io/webhook=ignore label
# — while its other writes (labels, its own annotations) pass; with Tessera stopped those other
# writes still pass at once (matchConditions keep them away from the webhook) and the owned ones
# are refused (Fail). Tessera's own filter and bind patches pass (its ServiceAccount, derived from
# its token, as the start log shows). docs/e2e.md "The owned-annotations test".
#
#   test/controlplane/owned_annotations_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- a GPU node, a bound GPU pod, and the pod's owner --------------------------------------------
make_node gpu-a 1
wait_until 30 "Tessera's /debug/ledger lists gpu-a's GPU" ledger_has GPU-gpu-a-0
check "Tessera derived its own user from its token (start log)" \
  grep -q "scheduler-owned annotations written by system:serviceaccount:tessera-system:tessera" \
  "$DIR/tessera.log"
gpu_pod fits 1000 >/dev/null
wait_until 60 "fits is bound" is_bound fits
allocated="$(jp fits '{.metadata.annotations.hami\.io/vgpu-devices-allocated}')"
check "Tessera's filter and bind patches went through (allocation \"$allocated\")" test -n "$allocated"
check "bind-phase allocating" test "$(jp fits '{.metadata.annotations.hami\.io/bind-phase}')" = allocating

k -n e2e create serviceaccount dev >/dev/null
k -n e2e create role pod-owner --verb=get,list,create,update,patch --resource=pods >/dev/null
k -n e2e create rolebinding dev-owns-pods --role=pod-owner --serviceaccount=e2e:dev >/dev/null
{
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "clusters: [{name: e2e, cluster: {server: 'https://127.0.0.1:$APISERVER_PORT', certificate-authority: '$DIR/ca.crt'}}]"
  echo "users: [{name: dev, user: {token: '$(k -n e2e create token dev --duration=1h)'}}]"
  echo "contexts: [{name: dev, context: {cluster: e2e, user: dev, namespace: e2e}}]"
  echo "current-context: dev"
} >"$DIR/dev.kubeconfig"
uk() { kubectl --kubeconfig "$DIR/dev.kubeconfig" --request-timeout=20s "$@"; }
check "the owner may patch its pods" test "$(uk auth can-i patch pods -n e2e)" = yes
phase_done "bound pod and its owner"

# denied WHAT OUTPUT: OUTPUT is the API server's refusal by owned-annotations.tessera.dev of WHAT
denied() {
  contains "$2" 'admission webhook "owned-annotations.tessera.dev" denied the request' &&
    contains "$2" "annotation $1 is written by the scheduler and cannot be set by system:serviceaccount:e2e:dev"
}

# --- the owner rewrites its allocation (issue 41's 12,000 → 1 MiB): refused, nothing changes ------
forged="GPU-gpu-a-0,NVIDIA,1,0:;"
out="$(uk annotate pod fits --overwrite "hami.io/vgpu-devices-allocated=$forged" 2>&1)" && rc=0 || rc=$?
echo "e2e: \$ kubectl annotate pod fits --overwrite hami.io/vgpu-devices-allocated=$forged"; echo "$out"
check "the owner's rewrite of vgpu-devices-allocated is refused with the key and the user" \
  denied hami.io/vgpu-devices-allocated "$out"
check "and changes nothing" test "$(jp fits '{.metadata.annotations.hami\.io/vgpu-devices-allocated}')" = "$allocated"
out="$(uk annotate pod fits hami.io/vgpu-node- 2>&1)" || true
check "removing vgpu-node is refused" denied hami.io/vgpu-node "$out"
out="$(uk patch pod fits --type=merge -p '{"metadata":{"annotations":{"hami.io/vgpu-mig-allocations":"[]"}}}' 2>&1)" || true
check "adding vgpu-mig-allocations is refused" denied hami.io/vgpu-mig-allocations "$out"
out="$(uk annotate pod fits --overwrite hami.io/bind-phase=success 2>&1)" || true
check "the owner cannot play the device plugin (bind-phase)" denied hami.io/bind-phase "$out"

# --- a CREATE carrying an owned annotation, with the tenant's opt-out label: refused -------------
out="$(gpu_pod_yaml forged 1000 | python3 -c '
import sys, yaml
p = yaml.safe_load(sys.stdin)
p["metadata"]["labels"] = {"hami.io/webhook": "ignore"}
p["metadata"]["annotations"] = {"tessera.io/verdict": "{}"}
print(yaml.safe_dump(p))' | uk apply -f - 2>&1)" || true
check "a pod created with tessera.io/verdict and hami.io/webhook=ignore is refused" \
  contains "$out" "annotation tessera.io/verdict is written by the scheduler and cannot be set"
check "and does not exist" test -z "$(k -n e2e get pod forged --ignore-not-found -o name)"

# --- the owner's other writes pass -------------------------------------------------------------
check "a label change passes" uk label pod fits team=ml
check "an annotation of the owner's passes" uk annotate pod fits note=mine
phase_done "owner's writes judged"

# --- Tessera stopped: other writes do not call the webhook, owned ones are refused (Fail) --------
TESSERA_PID="$(cat "$DIR/tessera.pid")"
kill -STOP "$TESSERA_PID"
trap 'kill -CONT "$TESSERA_PID" 2>/dev/null || true; teardown' EXIT
t0=$(date +%s.%N)
check "with Tessera stopped a label change passes" uk label pod fits --overwrite team=vision
took=$(python3 -c "import sys; print(round(float(sys.argv[2]) - float(sys.argv[1]), 2))" "$t0" "$(date +%s.%N)")
check "at once, without waiting for the webhook (${took}s)" python3 -c "import sys; sys.exit(float(sys.argv[1]) >= 5)" "$took"
out="$(uk annotate pod fits --overwrite "hami.io/vgpu-devices-allocated=$forged" 2>&1)" && rc=0 || rc=$?
echo "e2e: with Tessera stopped: $out"
check "with Tessera stopped the rewrite is refused, not let in" test "$rc" != 0
check "and changes nothing" test "$(jp fits '{.metadata.annotations.hami\.io/vgpu-devices-allocated}')" = "$allocated"
kill -CONT "$TESSERA_PID"
phase_done "Tessera stopped"
