#!/usr/bin/env bash
# End to end in a real control plane (issue #20): stock etcd, kube-apiserver and kube-scheduler
# on 127.0.0.1 (tools/controlplane.sh), Tessera as the extender and the mutating webhook under
# deploy/base's RBAC. Two GPU nodes as HAMi v2.8's device plugin registers them; a GPU pod with
# no schedulerName must be given Tessera's scheduler by the webhook and bound by the real
# kube-scheduler through Tessera with HAMi's annotations; a pod that fits nowhere must stay
# Pending with Tessera's reason in kube-scheduler's FailedScheduling event; a pod with silent
# mistakes is admitted with warnings kubectl prints. docs/e2e.md.
#
#   test/controlplane/e2e_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- nodes ----------------------------------------------------------------------------------
make_node gpu-node-1 2
make_node gpu-node-2 2
# Tessera has both nodes' devices in its ledger.
wait_until 30 "Tessera's /debug/ledger lists both nodes' GPUs" ledger_has GPU-gpu-node-1-1 GPU-gpu-node-2-1
phase_done "nodes"

# --- a GPU pod without a schedulerName -------------------------------------------------------
gpu_pod fits 1000
check "the webhook set spec.schedulerName to $SCHEDULER_NAME" \
  test "$(jp fits '{.spec.schedulerName}')" = "$SCHEDULER_NAME"
wait_until 60 "pod fits is bound (spec.nodeName)" is_bound fits
node="$(jp fits '{.spec.nodeName}')"
vgpu_node="$(jp fits '{.metadata.annotations.hami\.io/vgpu-node}')"
allocated="$(jp fits '{.metadata.annotations.hami\.io/vgpu-devices-allocated}')"
to_allocate="$(jp fits '{.metadata.annotations.hami\.io/vgpu-devices-to-allocate}')"
phase="$(jp fits '{.metadata.annotations.hami\.io/bind-phase}')"
echo "e2e: pod fits: nodeName=$node vgpu-node=$vgpu_node bind-phase=$phase vgpu-devices-allocated=$allocated"
is_gpu_node() { [[ "$1" == gpu-node-1 || "$1" == gpu-node-2 ]]; }
check "spec.nodeName is one of the GPU nodes" is_gpu_node "$node"
check "hami.io/vgpu-node = spec.nodeName" test "$vgpu_node" = "$node"
# docs/wire-formats.md: one entry per container, "UUID,NVIDIA,MiB,cores:" then ";"; cores 0
# (the device config's defaultCores); the UUID one of that node's GPUs.
one_device_of() { [[ "$1" =~ ^GPU-$2-[01],NVIDIA,1000,0:\;$ ]]; }
check "hami.io/vgpu-devices-allocated is one device of $node, 1000 MiB, 0 cores (\"$allocated\")" \
  one_device_of "$allocated" "$node"
check "hami.io/vgpu-devices-to-allocate equals vgpu-devices-allocated" test "$to_allocate" = "$allocated"
check "hami.io/bind-phase = allocating" test "$phase" = allocating
check "the pod's PodScheduled condition is True" \
  test "$(jp fits '{.status.conditions[?(@.type=="PodScheduled")].status}')" = True
bind_event="$(k -n e2e get events --field-selector involvedObject.name=fits,reason=BindingSucceed \
  -o jsonpath='{range .items[*]}{.source.component}|{.message}{"\n"}{end}')"
check "Tessera recorded BindingSucceed for the pod on $node (\"$bind_event\")" \
  contains "$bind_event" "hami-scheduler|Successfully binding node [$node] to e2e/fits"
device="${allocated%%,*}"
# Tessera's /metrics (HAMi's names) books the 1000 MiB on that device, and frees it when the pod
# is deleted (force: no kubelet runs to finish a graceful deletion).
check "hami_gpu_memory_allocated_bytes of $device is 1000 MiB" wait_until 30 "the metric at 1000 MiB" metric_is "$device" 1048576000
# `tessera top` (issue #25 item 3) reads serve's /debug/ledger: the pod on its device.
top="$("$TESSERA_BIN" top --server "http://127.0.0.1:$TESSERA_METRICS_PORT" -n e2e 2>&1)" || true
echo "e2e: tessera top -n e2e:"; echo "$top"
top_shows() { grep -qE "^$node +$device \([01]\) +NVIDIA" <<<"$top" && grep -qE "e2e/fits \[0\] +1000 +0 +bound" <<<"$top"; }
check "tessera top lists e2e/fits, 1000 MiB bound, under $device of $node" top_shows
k -n e2e delete pod fits --grace-period=0 --force >/dev/null 2>&1
check "and 0 once the pod is deleted" wait_until 30 "the metric back at 0" metric_is "$device" 0
phase_done "bind through Tessera"

# --- a GPU pod that fits nowhere --------------------------------------------------------------
gpu_pod too-big 100000
failed_event() {
  k -n e2e get events --field-selector involvedObject.name=too-big,reason=FailedScheduling \
    -o jsonpath='{range .items[*]}{.source.component}{.reportingComponent}|{.message}{"\n"}{end}'
}
wait_until 60 "kube-scheduler's FailedScheduling event for too-big" bash -c "[[ -n \"\$(kubectl --request-timeout=5s -n e2e get events --field-selector involvedObject.name=too-big,reason=FailedScheduling -o name)\" ]]" || true
ev="$(failed_event || true)"
echo "e2e: FailedScheduling of too-big: $ev"
# Tessera's FailedNodes reason for a node whose 2 GPUs both lack the memory, as kube-scheduler
# aggregates it: "0/2 nodes are available: 2 2/2 CardInsufficientMemory."
check "the FailedScheduling event carries Tessera's reason for both nodes" \
  contains "$ev" "0/2 nodes are available: 2 2/2 CardInsufficientMemory"
check "the event comes from the scheduler profile $SCHEDULER_NAME" contains "$ev" "$SCHEDULER_NAME|"
check "too-big stays Pending and unbound" \
  test "$(jp too-big '{.status.phase}/{.spec.nodeName}')" = "Pending/"
phase_done "unschedulable pod"

# --- admission warnings, as kubectl prints them (issue #25 item 5) -----------------------------
# A count without memory (a whole GPU, not a share) and GPU memory written as an annotation:
# the webhook admits the pod and warns; kubectl prints each warning on stderr. Server-side dry
# run: the webhook runs (sideEffects: None), nothing is created.
warned="$(k apply --dry-run=server -f - 2>&1 >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: warned
  namespace: e2e
  annotations:
    nvidia.com/gpumem: "4000"
spec:
  containers:
    - name: main
      image: registry.k8s.io/pause:3.10
      resources:
        limits:
          nvidia.com/gpu: 1
YAML
)" || true
echo "e2e: kubectl apply of warned printed: $warned"
check "kubectl prints the whole-GPU warning" \
  contains "$warned" 'Warning: container "main" asks for nvidia.com/gpu: 1 without nvidia.com/gpumem'
check "kubectl prints the annotation warning" \
  contains "$warned" "Warning: annotation nvidia.com/gpumem is not read by the scheduler"
phase_done "admission warnings"

# --- Tessera ran under deploy/base's RBAC without a refusal ------------------------------------
no_match() { ! grep -Ei "$1" "$2"; }
tk() { kubectl --kubeconfig "$DIR/tessera.kubeconfig" --request-timeout=20s "$@"; }
check "tessera serve's credentials are ServiceAccount tessera-system/tessera" \
  test "$(tk auth whoami -o jsonpath='{.status.userInfo.username}')" = system:serviceaccount:tessera-system:tessera
check "which may not read Secrets (deploy/base's RBAC, not admin)" test "$(tk auth can-i list secrets -A || true)" = no
check "tessera.log has no 403 / forbidden" no_match 'HTTP 403|forbidden' "$DIR/tessera.log"
check "kube-scheduler.log has no forbidden" no_match forbidden "$DIR/kube-scheduler.log"
phase_done "logs"
exit $FAILED
