#!/usr/bin/env bash
# Device-aware preemption (issue #36, docs/preemption.md) on a real control plane, two ways:
#   - at Kubernetes 1.38 (tools/controlplane.sh build --kubernetes 1.38): kube-scheduler 1.38
#     asks the extender's preempt verb about nodes where its own dry run found no victim (the GPU
#     resources are ignoredByScheduler), and Tessera names the victims;
#   - with PREEMPTION=self, at the pinned Kubernetes (1.37), whose kube-scheduler never asks:
#     tessera serve --preemption=self evicts the victims itself through the Eviction API.
# The same cases and checks either way:
#   - one GPU of 8192 MiB, two low-priority pods of 4000 MiB (the older started first), a
#     high-priority pod of 4000 MiB: exactly one victim (the younger), the preemptor bound on the
#     freed share, the older pod untouched, the card never over-committed;
#   - a high-priority pod with preemptionPolicy Never stays pending and evicts nobody;
#   - a PodDisruptionBudget that protects the cheaper (younger) victim: the older one goes.
# No kubelet runs here: the test finishes a victim's graceful deletion as a kubelet would.
#
#   test/controlplane/preempt_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

MODE="${PREEMPTION:-extender}"
if [[ "$MODE" == self ]]; then
  E2E_UP_ARGS=(--serve-arg=--preemption=self --serve-arg=--preemption-settle=2s)
  WANT_K8S=v1.37.
else
  E2E_K8S=1.38
  WANT_K8S=v1.38.
fi
# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

check "kube-scheduler is $WANT_K8S" contains "$("$BIN/kube-scheduler" --version 2>&1)" "$WANT_K8S"
k create priorityclass low --value=10 >/dev/null
k create priorityclass high --value=1000 >/dev/null
k create priorityclass polite --value=1000 --preemption-policy=Never >/dev/null

# prio_pod NAME MiB CLASS NODE [LABEL]: a GPU pod of priority class CLASS pinned to NODE.
prio_pod() {
  gpu_pod_yaml "$1" "$2" \
    | sed "s/^spec:\$/spec:\n  priorityClassName: $3\n  nodeSelector: {kubernetes.io\/hostname: $4}/" \
    | sed "s/^  namespace: e2e\$/  namespace: e2e\n  labels: {app: ${5:-$1}}/" \
    | k apply -f - >/dev/null
}
bound_to() { [[ "$(k -n e2e get pod "$1" -o jsonpath='{.spec.nodeName}')" == "$2" ]]; }
gone() { ! k -n e2e get pod "$1" >/dev/null 2>&1; }
deleting() { [[ -n "$(k -n e2e get pod "$1" -o jsonpath='{.metadata.deletionTimestamp}' 2>/dev/null)" ]]; }
untouched() { k -n e2e get pod "$1" >/dev/null 2>&1 && ! deleting "$1"; }
pending() { [[ -z "$(k -n e2e get pod "$1" -o jsonpath='{.spec.nodeName}')" ]]; }
# running NAME START: what a kubelet reports once the pod runs (phase, startTime).
running() {
  k -n e2e patch pod "$1" --subresource=status --type=merge \
    -p "{\"status\":{\"phase\":\"Running\",\"startTime\":\"$2\"}}" >/dev/null
}
# allocated NAME NODE: what the device plugin's Allocate does once the pod's containers start:
# hami.io/bind-phase success and the node lock released (the next bind on the node waits for it).
allocated() {
  k -n e2e annotate pod "$1" hami.io/bind-phase=success --overwrite >/dev/null
  k annotate node "$2" hami.io/mutex.lock- >/dev/null
}
# finish_deletion NAME: the kubelet's part of a graceful deletion (the pod's containers stopped),
# 3 s into the grace period: kube-scheduler retries the preemptor meanwhile, and no retry may
# name a second victim.
finish_deletion() {
  wait_until 60 "e2e/$1 is being deleted (a victim)" deleting "$1" || return 0
  sleep 3
  k -n e2e delete pod "$1" --grace-period=0 --force >/dev/null 2>&1 || true
}
# two_low_pods NODE OLD YOUNG [YOUNG_LABEL]: NODE with one 8192 MiB card, and two pods of class
# low holding 4000 MiB each there, running, OLD started an hour before YOUNG.
two_low_pods() {
  make_node "$1" 1
  wait_until 30 "Tessera's /debug/ledger lists $1's GPU" ledger_has "GPU-$1-0"
  local pod start
  for pod in "$2" "$3"; do
    [[ "$pod" == "$2" ]] && start=2026-01-01T10:00:00Z || start=2026-01-01T11:00:00Z
    prio_pod "$pod" 4000 low "$1" "$([[ "$pod" == "$3" ]] && echo "${4:-$pod}" || echo "$pod")"
    wait_until 60 "e2e/$pod bound" bound_to "$pod" "$1"
    running "$pod" "$start"
    allocated "$pod" "$1"
  done
}
# allocated_mib GPU: the MiB Tessera's hami_gpu_memory_allocated_bytes shows on GPU.
allocated_mib() {
  curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" \
    | sed -n "s/^hami_gpu_memory_allocated_bytes{.*device_uuid=\"$1\".*} \(.*\)$/\1/p" \
    | python3 -c 'import sys; v=sys.stdin.read().split(); print(int(float(v[0])) // 1048576 if v else 0)'
}
SAMPLES=()
sample() { SAMPLES+=("$(allocated_mib "$1")"); }
never_over() { # never_over MIB: every sample at most MIB
  local s; for s in "${SAMPLES[@]}"; do ((s <= $1)) || return 1; done
}

# --- one victim frees exactly the share ---------------------------------------------------------
two_low_pods gpu-p low-old low-young
sample GPU-gpu-p-0
t0=$(date +%s.%N)
prio_pod high 4000 high gpu-p
finish_deletion low-young
for _ in $(seq 1 40); do sample GPU-gpu-p-0; bound_to high gpu-p && break; sleep 0.5; done
check "e2e/high is bound to gpu-p" wait_until 60 "e2e/high bound" bound_to high gpu-p
allocated high gpu-p
echo "e2e: preemption: high bound $(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")s after its creation"
check "exactly the younger low pod was the victim" gone low-young
check "the older low pod is untouched" untouched low-old
sample GPU-gpu-p-0
check "gpu-p's card never held more than 8192 MiB (samples: ${SAMPLES[*]})" never_over 8192
if [[ "$MODE" == self ]]; then
  check "Tessera logged the eviction" grep -q '"self-preemption" pod="e2e/high".*node="gpu-p" evicted="e2e/low-young"' "$DIR/tessera.log"
  told() { k -n e2e get events --field-selector involvedObject.name=high -o jsonpath='{.items[*].message}' | grep -q 'to free a GPU share on gpu-p, Tessera evicted: e2e/low-young'; }
  check "e2e/high's event names the victim" wait_until 10 "the PreemptionVictimsEvicted event" told
  victim_told() { k -n e2e get events --field-selector involvedObject.name=low-young,reason=Preempted -o jsonpath='{.items[*].message}' | grep -q 'free a GPU share on gpu-p for e2e/high'; }
  check "e2e/low-young's event names the preemptor" wait_until 10 "the Preempted event" victim_told
else
  check "Tessera logged the preemption" grep -q '"preempt" pod="e2e/high".*added="gpu-p=\[e2e/low-young\]"' "$DIR/tessera.log"
  proposed() { k -n e2e get events --field-selector involvedObject.name=high -o jsonpath='{.items[*].message}' | grep -q 'Tessera proposes evicting: gpu-p=\[e2e/low-young\]'; }
  check "e2e/high's event names the victim" wait_until 10 "the PreemptionVictimsProposed event" proposed
fi
phase_done "one victim"

# --- preemptionPolicy Never -------------------------------------------------------------------
prio_pod polite 4000 polite gpu-p
sleep 8   # kube-scheduler tries, fails, and would preempt now if it were allowed to
check "e2e/polite stays pending" pending polite
check "and evicted nobody (low-old)" untouched low-old
check "and evicted nobody (high)" untouched high
k -n e2e delete pod polite --grace-period=0 --force >/dev/null 2>&1
phase_done "preemptionPolicy Never"

# --- a PodDisruptionBudget spares the cheaper victim ----------------------------------------------
two_low_pods gpu-b b-old b-young guarded
# No disruption controller runs here, so the budget's status.disruptionsAllowed stays 0.
k -n e2e create poddisruptionbudget guarded --selector=app=guarded --min-available=1 >/dev/null
prio_pod b-high 4000 high gpu-b
finish_deletion b-old
check "e2e/b-high is bound to gpu-b" wait_until 60 "e2e/b-high bound" bound_to b-high gpu-b
allocated b-high gpu-b
check "the budget spared b-young" untouched b-young
check "b-old was the victim instead" gone b-old
phase_done "PodDisruptionBudget"
