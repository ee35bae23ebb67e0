#!/usr/bin/env bash
# A refused pod runs the moment its GPU frees (issue #35, docs/requeue.md), on a real control
# plane: stock etcd, kube-apiserver and kube-scheduler on 127.0.0.1 (tools/controlplane.sh),
# Tessera as the extender with --reservation-ttl 5s. For each cause of freed capacity that
# kube-scheduler cannot see and that can be produced here, a GPU pod Tessera refused is bound
# within 5 s of the change (without the requeue kube-scheduler retries it after its 5-minute
# flush), carries the tessera.io/requeue annotation that put it back into kube-scheduler's
# queue, and the time from the change to the binding is printed:
#   - a namespace quota raised (kube-scheduler has no ResourceQuota informer);
#   - a reservation expired (a /filter never followed by a bind);
#   - a device healthy again (its register annotation rewritten; a node annotation change does
#     wake kube-scheduler, so this one also checks that the pod is bound once, by Tessera's
#     decision, whichever wake comes first).
#
#   test/controlplane/requeue_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

E2E_UP_ARGS=(--serve-arg=--reservation-ttl=5s)
# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

k create namespace team >/dev/null
k -n team create serviceaccount default >/dev/null
# pinned_pod NAME MiB NODE [NAMESPACE]: gpu_pod_yaml with a kubernetes.io/hostname selector
pinned_pod() {
  gpu_pod_yaml "$1" "$2" "" "${4:-e2e}" | sed "s/^spec:\$/spec:\n  nodeSelector: {kubernetes.io\/hostname: $3}/" | k apply -f - >/dev/null
}
reason_of() { # reason_of NS/POD: the main reason of the pod's tessera.io/verdict
  k -n "${1%/*}" get pod "${1#*/}" -o jsonpath='{.metadata.annotations.tessera\.io/verdict}' \
    | python3 -c 'import json,sys; print(json.load(sys.stdin)["reason"])' 2>/dev/null
}
refused_for() { [[ "$(reason_of "$1")" == "$2" ]]; } # refused_for NS/POD REASON
requeued() { # requeued NS/POD: the pod carries tessera.io/requeue
  [[ -n "$(k -n "${1%/*}" get pod "${1#*/}" -o jsonpath='{.metadata.annotations.tessera\.io/requeue}')" ]]
}
bound() { [[ -n "$(kubectl --request-timeout=5s -n "${1%/*}" get pod "${1#*/}" -o jsonpath='{.spec.nodeName}')" ]]; }
now() { date +%s.%N; }
# bound_in NS/POD T0 WHAT: waits (0.1 s polls, at most 30 s) for the pod's binding; checks it came
# within 5 s of T0 and prints the time.
bound_in() {
  local pod="$1" t0="$2" what="$3" took
  wait_quick 30 "$pod bound" bound "$pod" || return 0
  took=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
  echo "e2e: $what -> $pod bound in ${took}s"
  TOOK+=("$(printf '%-34s %6ss' "$what" "$took")")
  check "$pod bound within 5 s of: $what (${took}s)" python3 -c "import sys; sys.exit(not $took <= 5)"
  check "$pod was requeued by Tessera (tessera.io/requeue)" requeued "$pod"
}
TOOK=()

# --- a namespace quota raised -----------------------------------------------------------------
make_node gpu-q 1
gpumem_quota team 2000
wait_until 30 "Tessera's /debug/ledger lists gpu-q's GPU" ledger_has GPU-gpu-q-0
pinned_pod over-quota 3000 gpu-q team
check "team/over-quota is refused by the quota" \
  wait_until 60 "ResourceQuotaNotFit" refused_for team/over-quota ResourceQuotaNotFit
sleep 2   # kube-scheduler's retries of the refusal settle into its unschedulable pods
check "and still pending" bash -c "! kubectl --request-timeout=5s -n team get pod over-quota -o jsonpath='{.spec.nodeName}' | grep -q ."
t0=$(now)
gpumem_quota team 8000
bound_in team/over-quota "$t0" "quota raised 2000 -> 8000 MiB"
phase_done "quota raised"

# --- a reservation expired --------------------------------------------------------------------
# holder's /filter is sent as kube-scheduler sends it; its nodeSelector matches no node, so
# kube-scheduler never binds it: the reservation holds gpu-r's 8192 MiB until the 5 s TTL.
make_node gpu-r 1
wait_until 30 "Tessera's /debug/ledger lists gpu-r's GPU" ledger_has GPU-gpu-r-0
pinned_pod holder 8000 nowhere
args="$(k -n e2e get pod holder -o json | python3 -c 'import json,sys; print(json.dumps({"pod": json.load(sys.stdin), "nodenames": ["gpu-r"]}))')"
filtered="$(curl -fsS --max-time 20 --cacert "$DIR/ca.crt" -H 'Content-Type: application/json' \
  -d "$args" "https://127.0.0.1:$TESSERA_PORT/filter")" || filtered="curl failed"
check "Tessera's /filter gave e2e/holder gpu-r" contains "$filtered" '"NodeNames":["gpu-r"]'
pinned_pod waits 4000 gpu-r
check "e2e/waits is refused for the reserved card" \
  wait_until 4 "CardInsufficientMemory" refused_for e2e/waits CardInsufficientMemory
reserved() { ledger_has '"reserved": true'; }
check "the reservation is still held" reserved
wait_quick 10 "the reservation expires" bash -c "! curl -fsS --max-time 2 http://127.0.0.1:$TESSERA_METRICS_PORT/debug/ledger | grep -q '\"reserved\": true'"
bound_in e2e/waits "$(now)" "reservation expired (TTL 5s)"
phase_done "reservation expired"

# --- a device healthy again -------------------------------------------------------------------
make_gpu_node gpu-h "$(gpu_json GPU-gpu-h-0 "NVIDIA-Tesla T4" 8192 | sed 's/"health":true/"health":false/')"
wait_until 30 "Tessera's /debug/ledger lists gpu-h's GPU" ledger_has GPU-gpu-h-0
pinned_pod sick 1000 gpu-h
check "e2e/sick is refused: its only device is unhealthy" \
  wait_until 60 "CardNotHealth" refused_for e2e/sick CardNotHealth
sleep 2
t0=$(now)
k annotate node gpu-h --overwrite "hami.io/node-nvidia-register=[$(gpu_json GPU-gpu-h-0 "NVIDIA-Tesla T4" 8192)]" >/dev/null
wait_quick 30 "e2e/sick bound" bound e2e/sick
took=$(python3 -c "print(f'{$(now) - $t0:.2f}')")
echo "e2e: device healthy again -> e2e/sick bound in ${took}s"
TOOK+=("$(printf '%-34s %6ss' "device healthy again" "$took")")
check "e2e/sick bound within 5 s of its device's health (${took}s)" python3 -c "import sys; sys.exit(not $took <= 5)"
check "to gpu-h" test "$(jp sick '{.spec.nodeName}')" = gpu-h
phase_done "device healthy"

echo "e2e: from the change to the binding"
for t in "${TOOK[@]}"; do echo "  $t"; done
echo "e2e: tessera_pending_pods_requeued_total: $(curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" | sed -n 's/^tessera_pending_pods_requeued_total //p')"
exit $FAILED
