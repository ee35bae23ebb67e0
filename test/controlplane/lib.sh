# Shared by the real-control-plane tests (e2e_test.sh, seed_test.sh); sourced, not run.
# Sourcing parses the arguments (--tessera PATH, --keep, --up-arg ARG, --help), skips (exit 77)
# when a tool is missing, builds the control plane (cached), brings it up in a fresh directory
# with a trap that always tears it down, and defines the helpers below. docs/e2e.md.
# shellcheck shell=bash

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
NAME="$(basename "$0")"
CP="$ROOT/tools/controlplane.sh"
KEEP=0
TESSERA_ARGS=()
# A test may set E2E_UP_ARGS (an array) before sourcing: its own options for controlplane.sh up.
UP_ARGS=(${E2E_UP_ARGS[@]+"${E2E_UP_ARGS[@]}"})
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tessera) TESSERA_ARGS=(--tessera "${2:?}"); shift 2 ;;
    --keep) KEEP=1; shift ;;   # keep the directory (logs) even when the test passes
    --up-arg) UP_ARGS+=("${2:?}"); shift 2 ;;   # one more argument for controlplane.sh up
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "$NAME: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

# A missing tool skips the test (77), unless TESSERA_E2E_REQUIRED=1 (tools/test.sh): then it
# fails, so that CI cannot pass by skipping.
skip_code=77
[ "${TESSERA_E2E_REQUIRED:-0}" = 1 ] && skip_code=1
for t in kubectl openssl python3 curl setsid ss; do
  command -v "$t" >/dev/null || { echo "$NAME: SKIP: $t is not on PATH" >&2; exit "$skip_code"; }
done
python3 -c 'import yaml' 2>/dev/null || { echo "$NAME: SKIP: python3 has no yaml module (apt-get install python3-yaml)" >&2; exit "$skip_code"; }

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
# A test may set E2E_K8S before sourcing: another release (tools/controlplane.sh build --kubernetes).
BIN="$(timeout 1500 "$CP" build ${E2E_K8S:+--kubernetes "$E2E_K8S"})"
echo "e2e: control-plane binaries in $BIN"
phase_done "build (cached)"

DIR="$(mktemp -d "${TMPDIR:-/tmp}/tessera-e2e.XXXXXX")"
trap teardown EXIT
trap 'exit 130' INT TERM

# --- up -------------------------------------------------------------------------------------
timeout 240 "$CP" up --bin-dir "$BIN" "${TESSERA_ARGS[@]}" "${UP_ARGS[@]}" "$DIR"
# shellcheck disable=SC1091
source "$DIR/env"
export KUBECONFIG
phase_done "up"

k() { kubectl --request-timeout=20s "$@"; }
# No kube-controller-manager runs: the namespace's default ServiceAccount (which the ServiceAccount
# admission plugin requires) is created here.
k create namespace e2e >/dev/null
k -n e2e create serviceaccount default >/dev/null

# wait_until SECONDS DESCRIPTION COMMAND...: polls COMMAND every 0.5 s.
wait_until() {
  local secs="$1" what="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if ((SECONDS >= deadline)); then fail "$what: not within ${secs}s"; return 1; fi
    sleep 0.5
  done
}

make_node() { # make_node NAME N: N GPUs of 8192 MiB, HAMi v2.8's JSON register annotation
  local name="$1" n="$2" i devs=()
  for ((i = 0; i < n; i++)); do
    devs+=("$(gpu_json "GPU-$name-$i" "NVIDIA-Tesla T4" 8192 0 "$i")")
  done
  make_gpu_node "$name" "${devs[@]}"
}

# gpu_pod_yaml NAME MiB [CORES] [NAMESPACE]: the manifest of a pod with one container asking
# nvidia.com/gpu 1, nvidia.com/gpumem MiB (and nvidia.com/gpucores CORES), naming no scheduler.
gpu_pod_yaml() {
  cat <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: $1
  namespace: ${4:-e2e}
spec:
  containers:
    - name: main
      image: registry.k8s.io/pause:3.10
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: $2
YAML
  [[ -z "${3:-}" ]] || echo "          nvidia.com/gpucores: $3"
}
gpu_pod() { # gpu_pod NAME MiB: gpu_pod_yaml applied in e2e
  gpu_pod_yaml "$1" "$2" | k apply -f -
}
metric_is() { # metric_is DEVICE BYTES: Tessera's hami_gpu_memory_allocated_bytes of DEVICE
  curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" \
    | grep -E "^hami_gpu_memory_allocated_bytes\{.*device_uuid=\"$1\".*\} $2\$"
}

# ==== shapes and truth helpers (shapes_test.sh, seed_test.sh; issue #20 item 4) =============
# gpu_json ID TYPE MIB [NUMA] [INDEX]: one device of HAMi v2.8+'s JSON register annotation, keys
# in the struct order the device plugin marshals (id,index,count,devmem,devcore,type,numa,mode,
# health), zero index and numa omitted (omitempty); split count 10, 100 cores, healthy.
gpu_json() {
  local id="$1" type="$2" mib="$3" numa="${4:-0}" index="${5:-0}" out
  out="{\"id\":\"$id\""
  ((index != 0)) && out+=",\"index\":$index"
  out+=",\"count\":10,\"devmem\":$mib,\"devcore\":100,\"type\":\"$type\""
  ((numa != 0)) && out+=",\"numa\":$numa"
  echo "$out,\"mode\":\"hami-core\",\"health\":true}"
}
# make_gpu_node NAME DEVICE_JSON...: a node whose device plugin registered these devices (the
# register annotation is '[' the arguments joined by ',' ']', byte for byte), with what a kubelet
# reports (allocatable nvidia.com/gpu = 10 per device) and Ready; the not-ready taint removed as
# the node lifecycle controller would. make_node is the shorthand for N identical 8192 MiB T4s.
make_gpu_node() {
  local name="$1"; shift
  make_registered_node "$name" "$#" "[$(IFS=,; echo "$*")]"
}
# make_registered_node NAME GPUS REGISTER [HANDSHAKE]: make_gpu_node with the register annotation's
# value as given (either format, docs/wire-formats.md) and, when HANDSHAKE is given, the v2.5–v2.7
# plugin's hami.io/node-handshake; GPUS devices for the allocatable count.
make_registered_node() {
  local name="$1" gpus="$2" register="$3" handshake="${4:-}"
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $name
  labels:
    kubernetes.io/hostname: $name
  annotations:
    hami.io/node-nvidia-register: '$register'
$([[ -z "$handshake" ]] || echo "    hami.io/node-handshake: '$handshake'")
YAML
  # What a kubelet reports: capacity, allocatable (nvidia.com/gpu = GPUs x split count) and Ready.
  local now; now=$(date -u +%Y-%m-%dT%H:%M:%SZ)
  local res="{\"cpu\":\"32\",\"memory\":\"128Gi\",\"pods\":\"110\",\"nvidia.com/gpu\":\"$((gpus * 10))\"}"
  k patch node "$name" --subresource=status --type=merge -p "{\"status\":{\"capacity\":$res,\"allocatable\":$res,\"conditions\":[{\"type\":\"Ready\",\"status\":\"True\",\"reason\":\"KubeletReady\",\"message\":\"e2e\",\"lastHeartbeatTime\":\"$now\",\"lastTransitionTime\":\"$now\"}]}}" >/dev/null
  # The TaintNodesByCondition admission plugin tainted the node not-ready at creation; with no
  # kube-controller-manager here, do what its node lifecycle controller does once Ready is True.
  k taint node "$name" node.kubernetes.io/not-ready:NoSchedule- >/dev/null
}
# wait_quick SECONDS DESCRIPTION COMMAND...: wait_until, polling every 0.1 s (for measured steps).
wait_quick() {
  local secs="$1" what="$2"; shift 2
  local deadline; deadline=$(($(date +%s%N) + secs * 1000000000))
  until "$@" >/dev/null 2>&1; do
    if (($(date +%s%N) >= deadline)); then fail "$what: not within ${secs}s"; return 1; fi
    sleep 0.1
  done
}
# audit_period_seconds: the --audit-period tessera serve runs with here: its recorded command line
# ($DIR/tessera.cmd), else the default that `tessera serve --help` prints. In seconds.
audit_period_seconds() {
  local -a argv; local i v=""
  eval "argv=($(cat "$DIR/tessera.cmd"))"
  for ((i = 0; i < ${#argv[@]}; i++)); do
    case "${argv[i]}" in
      --audit-period) v="${argv[i + 1]}" ;;
      --audit-period=*) v="${argv[i]#--audit-period=}" ;;
    esac
  done
  [[ -n "$v" ]] || v="$("${argv[0]}" serve --help 2>&1 | sed -n 's/.*--audit-period TEXT=\([^ ]*\).*/\1/p')"
  python3 - "$v" <<'PY'
import re, sys
v = sys.argv[1]
units = {"ms": 0.001, "s": 1, "m": 60, "h": 3600}
parts = re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h)", v)
if not v or "".join(n + u for n, u in parts) != v:
    sys.exit(f"audit_period_seconds: cannot read the duration {v!r}")
print(sum(float(n) * units[u] for n, u in parts))
PY
}
# truth_snapshot FILE: what the API server's objects say every registered GPU holds, as JSON
# {"<node>/<uuid>": bytes}. The rule of docs/self-healing.md "Which pods hold devices", computed
# here without Tessera: a pod holds the MiB of each device entry of hami.io/vgpu-devices-allocated
# (UUID,Type,MiB,cores: per container, ';' after each) when its phase is not Succeeded/Failed
# and it is bound to the node its hami.io/vgpu-node names, on a device that node registers
# (JSON register annotations, the only form these tests write). With one entry per container
# (init containers first), a device holds max(init containers' peak, app containers' sum) — HAMi
# v2.10's collapse; otherwise the sum. A pod carrying an allocation but not bound is an
# in-flight reservation whose truth this cannot know: the snapshot fails.
truth_snapshot() {
  local pods nodes
  pods="$(k get pods -A -o json)" && nodes="$(k get nodes -o json)" || return 1
  python3 - "$1" "$pods" "$nodes" <<'PY'
import json, sys
out, pods, nodes = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
truth = {}
for n in nodes["items"]:
    reg = (n["metadata"].get("annotations") or {}).get("hami.io/node-nvidia-register")
    for d in json.loads(reg) if reg else []:
        truth[n["metadata"]["name"] + "/" + d["id"]] = 0
for p in pods["items"]:
    a = p["metadata"].get("annotations") or {}
    alloc = a.get("hami.io/vgpu-devices-allocated")
    if alloc is None or p.get("status", {}).get("phase") in ("Succeeded", "Failed"):
        continue
    node = p["spec"].get("nodeName", "")
    if not node:
        sys.exit(f"truth_snapshot: {p['metadata']['name']} carries an allocation but is not bound")
    if node != a.get("hami.io/vgpu-node"):
        continue  # a conflict holds nothing
    entries = alloc.split(";")
    if entries[-1] == "":
        entries.pop()  # ';' ends an entry
    n_init = len(p["spec"].get("initContainers") or [])
    collapse = len(entries) == n_init + len(p["spec"]["containers"])
    init_peak, app_sum = {}, {}
    for i, entry in enumerate(entries):
        for piece in entry.split(":"):
            f = piece.split(",")
            if len(f) >= 4 and node + "/" + f[0] in truth:
                key, mib = node + "/" + f[0], int(f[2])
                if collapse and i < n_init:  # init containers run one at a time
                    init_peak[key] = max(init_peak.get(key, 0), mib)
                else:
                    app_sum[key] = app_sum.get(key, 0) + mib
    for key in set(init_peak) | set(app_sum):
        truth[key] += max(init_peak.get(key, 0), app_sum.get(key, 0)) * 1048576
json.dump(truth, open(out, "w"), sort_keys=True)
PY
}
# truth_diff TRUTH METRICS LEDGER [METRICS LEDGER]...: for each pair of files (a scrape of
# /metrics and one of /debug/ledger), one line on stdout: "equal", or "differs:" and the devices
# whose hami_gpu_memory_allocated_bytes or usedmem_mib (× 1 MiB) differ from the snapshot TRUTH
# (truth_snapshot), or which only one side has. Exit 0 when every pair is equal.
truth_diff() {
  python3 - "$@" <<'PY'
import json, re, sys
truth, files, rc = json.load(open(sys.argv[1])), sys.argv[2:], 0
for m, l in zip(files[0::2], files[1::2]):
    metric, book = {}, {}
    for line in open(m).read().splitlines():
        if line.startswith("hami_gpu_memory_allocated_bytes{"):
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', line[: line.rindex("}")]))
            metric[labels["node"] + "/" + labels["device_uuid"]] = float(line.rsplit(" ", 1)[1])
    for n in json.load(open(l))["nodes"]:
        for d in n["devices"]:
            book[n["name"] + "/" + d["uuid"]] = d["usedmem_mib"] * 1048576
    bad = [f"{name} {k}: {got.get(k)} (truth {truth.get(k)})"
           for name, got in (("metric", metric), ("ledger", book))
           for k in sorted(set(truth) | set(got)) if got.get(k) != truth.get(k)]
    print("differs: " + "; ".join(bad) if bad else "equal")
    rc |= bool(bad)
sys.exit(rc)
PY
}
# metrics_match_truth TRUTH: Tessera's /metrics and /debug/ledger, scraped now, equal the
# snapshot TRUTH (truth_diff); the differences go to stderr.
metrics_match_truth() {
  local m="$DIR/.scrape.metrics" l="$DIR/.scrape.ledger" out
  curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" -o "$m" || return 1
  curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/debug/ledger" -o "$l" || return 1
  out="$(truth_diff "$1" "$m" "$l")" && return 0
  echo "$out" >&2
  return 1
}
# ==== end of the shapes and truth helpers ====================================================

gpumem_quota() { # gpumem_quota NS MiB: ResourceQuota NS/gpu with limits.nvidia.com/gpumem MiB (applied)
  k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: ResourceQuota
metadata: {name: gpu, namespace: $1}
spec:
  hard:
    limits.nvidia.com/gpumem: "$2"
YAML
}
jp() { k -n e2e get pod "$1" -o jsonpath="$2"; }   # jp POD JSONPATH
bound_node() { kubectl --request-timeout=5s -n e2e get pod "$1" -o jsonpath='{.spec.nodeName}'; }
is_bound() { [[ -n "$(bound_node "$1")" ]]; }
ledger_has() { # ledger_has TEXT...: Tessera's /debug/ledger (on the metrics listener) mentions every TEXT
  local l t
  l="$(curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/debug/ledger")" || return 1
  for t in "$@"; do [[ "$l" == *"$t"* ]] || return 1; done
}
