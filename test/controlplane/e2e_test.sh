#!/usr/bin/env bash
# End to end in a real control plane (issue #20): stock etcd, kube-apiserver and kube-scheduler
# on 127.0.0.1 (tools/controlplane.sh), Tessera as the extender and the mutating webhook under
# deploy/base's RBAC. Two GPU nodes as HAMi v2.8's device plugin registers them; a GPU pod with
# no schedulerName must be given Tessera's scheduler by the webhook and bound by the real
# kube-scheduler through Tessera with HAMi's annotations; a pod that fits nowhere must stay
# Pending with Tessera's reason in kube-scheduler's FailedScheduling event. docs/e2e.md.
#
#   test/controlplane/e2e_test.sh [--tessera PATH] [--keep]
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
CP="$ROOT/tools/controlplane.sh"
KEEP=0
TESSERA_ARGS=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tessera) TESSERA_ARGS=(--tessera "${2:?}"); shift 2 ;;
    --keep) KEEP=1; shift ;;   # keep the directory (logs) even when the test passes
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "e2e_test.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

for t in kubectl openssl python3 curl setsid ss; do
  command -v "$t" >/dev/null || { echo "e2e_test.sh: SKIP: $t is not on PATH" >&2; exit 77; }
done
python3 -c 'import yaml' 2>/dev/null || { echo "e2e_test.sh: SKIP: python3 has no yaml module (apt-get install python3-yaml)" >&2; exit 77; }

T0=$(date +%s.%N)
PHASE_START=$T0
TIMES=()
phase_done() {
  local now; now=$(date +%s.%N)
  local took; took=$(python3 -c "print(f'{$now - $PHASE_START:.1f}')")
  TIMES+=("$(printf '%-28s %6ss' "$1" "$took")")
  echo "e2e: phase \"$1\" took ${took}s"
  PHASE_START=$now
}
print_times() {
  echo "e2e: timings"
  local t
  for t in "${TIMES[@]}"; do echo "  $t"; done
  printf '  %-28s %6ss\n' total "$(python3 -c "print(f'{$(date +%s.%N) - $T0:.1f}')")"
}

FAILED=0
fail() { echo "e2e: FAIL: $*" >&2; FAILED=1; }
check() { # check DESCRIPTION CONDITION-COMMAND...
  local what="$1"; shift
  if "$@"; then echo "e2e: ok: $what"; else fail "$what"; fi
}

contains() { [[ "$1" == *"$2"* ]]; }

DIR=""
teardown() {
  local rc=$?
  [[ -n "$DIR" ]] || exit $rc
  # A failure anywhere (an assertion or a broken step) keeps the logs.
  if [[ $rc != 0 || $FAILED != 0 ]]; then
    echo "e2e: logs of the failed run: $DIR/*.log" >&2
    local f
    for f in tessera kube-scheduler; do
      [[ -f "$DIR/$f.log" ]] && { echo "--- last lines of $DIR/$f.log" >&2; tail -n 20 "$DIR/$f.log" >&2; }
    done
  fi
  PHASE_START=$(date +%s.%N)
  "$CP" down "$DIR" || rc=1
  phase_done "down"
  # Nothing may survive down.
  if pgrep -f -- "$DIR/" >/dev/null; then
    echo "e2e: FAIL: processes of $DIR survive down: $(pgrep -f -a -- "$DIR/" | tr '\n' ';')" >&2; rc=1
  fi
  local p
  for p in "$DIR"/*.pid; do
    [[ -e "$p" ]] || continue
    if kill -0 "$(cat "$p")" 2>/dev/null; then echo "e2e: FAIL: $(basename "$p" .pid) still running" >&2; rc=1; fi
  done
  print_times
  if [[ $rc == 0 && $FAILED == 0 && $KEEP == 0 ]]; then rm -rf "$DIR"; fi
  [[ $rc == 0 && $FAILED != 0 ]] && rc=1
  [[ $rc == 0 ]] && echo "e2e: PASS" || echo "e2e: FAIL (exit $rc)"
  exit $rc
}

# --- build (outside the timed budget of the test proper; a cold cache takes minutes) ---------
BIN="$(timeout 1500 "$CP" build)"
echo "e2e: control-plane binaries in $BIN"
phase_done "build (cached)"

DIR="$(mktemp -d "${TMPDIR:-/tmp}/tessera-e2e.XXXXXX")"
trap teardown EXIT
trap 'exit 130' INT TERM

# --- up -------------------------------------------------------------------------------------
timeout 240 "$CP" up --bin-dir "$BIN" "${TESSERA_ARGS[@]}" "$DIR"
# shellcheck disable=SC1091
source "$DIR/env"
export KUBECONFIG
phase_done "up"

k() { kubectl --request-timeout=20s "$@"; }
# wait_until SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.5 s.
wait_until() {
  local secs="$1" what="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then fail "$what: not within ${secs}s"; return 1; fi
    sleep 0.5
  done
}

# --- nodes ----------------------------------------------------------------------------------
# No kube-controller-manager runs: the namespace's default ServiceAccount (which the ServiceAccount
# admission plugin requires) is created here.
k create namespace e2e >/dev/null
k -n e2e create serviceaccount default >/dev/null

make_node() { # make_node NAME N: N GPUs of 8192 MiB, HAMi v2.8's JSON register annotation
  local name="$1" n="$2" i devs=""
  for ((i = 0; i < n; i++)); do
    local idx=""; ((i > 0)) && idx="\"index\":$i,"
    devs+="${devs:+,}{\"id\":\"GPU-$name-$i\",${idx}\"count\":10,\"devmem\":8192,\"devcore\":100,\"type\":\"NVIDIA-Tesla T4\",\"mode\":\"hami-core\",\"health\":true}"
  done
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $name
  labels:
    kubernetes.io/hostname: $name
  annotations:
    hami.io/node-nvidia-register: '[$devs]'
YAML
  # What a kubelet reports: capacity, allocatable (nvidia.com/gpu = GPUs x split count) and Ready.
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local res="{\"cpu\":\"32\",\"memory\":\"128Gi\",\"pods\":\"110\",\"nvidia.com/gpu\":\"$((n * 10))\"}"
  k patch node "$name" --subresource=status --type=merge -p "{\"status\":{\"capacity\":$res,\"allocatable\":$res,\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"message\":\"e2e\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$now\"}]}}" >/dev/null
  # The TaintNodesByCondition admission plugin tainted the node not-ready at creation; with no
  # kube-controller-manager here, do what its node lifecycle controller does once Ready is True.
  k taint node "$name" node.kubernetes.io/not-ready:NoSchedule- >/dev/null
}
make_node gpu-node-1 2
make_node gpu-node-2 2
# Tessera has both nodes' devices in its ledger.
ledger_has_nodes() {
  local l; l="$(curl -fsS --max-time 2 --cacert "$CONTROLPLANE_DIR/ca.crt" "https://127.0.0.1:$TESSERA_PORT/debug/ledger")"
  [[ "$l" == *GPU-gpu-node-1-1* && "$l" == *GPU-gpu-node-2-1* ]]
}
wait_until 30 "Tessera's /debug/ledger lists both nodes' GPUs" ledger_has_nodes
phase_done "nodes"

# --- a GPU pod without a schedulerName -------------------------------------------------------
gpu_pod() { # gpu_pod NAME MiB
  k apply -f - <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: e2e
spec:
  containers:
    - name: main
      image: registry.k8s.io/pause:3.10
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: $2
YAML
}
gpu_pod fits 1000
jp() { k -n e2e get pod "$1" -o jsonpath="$2"; }
check "the webhook set spec.schedulerName to $SCHEDULER_NAME" \
  test "$(jp fits '{.spec.schedulerName}')" = "$SCHEDULER_NAME"
wait_until 60 "pod fits is bound (spec.nodeName)" bash -c "[[ -n \"\$(kubectl --request-timeout=5s -n e2e get pod fits -o jsonpath='{.spec.nodeName}')\" ]]"
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
metric_is() { # metric_is DEVICE BYTES
  curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" \
    | grep -E "^hami_gpu_memory_allocated_bytes\{.*device_uuid=\"$1\".*\} $2\$"
}
check "hami_gpu_memory_allocated_bytes of $device is 1000 MiB" wait_until 30 "the metric at 1000 MiB" metric_is "$device" 1048576000
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

# --- Tessera ran under deploy/base's RBAC without a refusal ------------------------------------
no_match() { ! grep -Ei "$1" "$2"; }
tk() { kubectl --kubeconfig "$DIR/tessera.kubeconfig" --request-timeout=20s "$@"; }
check "tessera serve's credentials are ServiceAccount tessera-system/tessera" \
  test "$(tk auth whoami -o jsonpath='{.status.userInfo.username}')" = system:serviceaccount:tessera-system:tessera
check "which may not read Secrets (deploy/base's RBAC, not admin)" test "$(tk auth can-i list secrets -A || true)" = no
check "tessera.log has no 403 / forbidden" no_match '\b403\b|forbidden' "$DIR/tessera.log"
check "kube-scheduler.log has no forbidden" no_match forbidden "$DIR/kube-scheduler.log"
phase_done "logs"
exit $FAILED
