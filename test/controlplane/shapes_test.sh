#!/usr/bin/env bash
# Pods of every shape in a real control plane (issue #20): stock etcd, kube-apiserver and
# kube-scheduler on 127.0.0.1 (tools/controlplane.sh), Tessera as the extender and the mutating
# webhook under deploy/base's RBAC. Whole GPUs, MiB, percentage, cores, multi-GPU, init and
# multi-container pods, numa-bind, GPU type and UUID constraints: each pod is created by kubectl
# without a schedulerName, must be given hami-scheduler by the webhook, bound by kube-scheduler
# through Tessera's /filter and /bind, and carry exactly the HAMi allocation string derived here
# from the protocol; pods that a constraint makes unschedulable must stay Pending with Tessera's
# reason in kube-scheduler's event. docs/e2e.md "The shapes test".
#
#   test/controlplane/shapes_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- the nodes --------------------------------------------------------------------------------
# Placement is deterministic by construction: pods are placed one at a time on an idle cluster
# (each is deleted, and gone from Tessera's ledger, before the next is created); deploy/base
# runs serve with the defaults --node-scheduler-policy binpack and --gpu-scheduler-policy spread.
# Rules used below (docs/hami-protocol.md §4.3–§4.5; the ties, which HAMi leaves to Go's map
# order, as docs/scheduling.md fixes them):
#   node:   binpack takes the highest node score; idle nodes all score 0, and equal scores go to
#           the node name ascending — so node-a, unless a constraint rules it out.
#   device: spread sorts score descending, then NUMA ascending, then index ascending, and the fit
#           walks the list from its end: on an idle node the highest NUMA id first, in it the
#           highest index. With numa-bind the NUMA id is the first key, and a device on another
#           NUMA node than the previous one restarts the collection.
#   memory: the MiB asked for, else pct × this device's MiB / 100 in integer arithmetic, else
#           (neither asked, defaultMemory 0) the whole card; cores as asked, else defaultCores 0.
#   string: per container, init containers first, "UUID,NVIDIA,MiB,cores:" per device, then ";".
T4="NVIDIA-Tesla T4"
A100="NVIDIA A100-SXM4-40GB"
# node-a: two T4s of 15360 MiB on NUMA 0 → walk order a-1, a-0.
make_gpu_node node-a "$(gpu_json GPU-node-a-0 "$T4" 15360)" "$(gpu_json GPU-node-a-1 "$T4" 15360 0 1)"
# node-b: two A100s of 40960 MiB on NUMA 0 → b-1, b-0.
make_gpu_node node-b "$(gpu_json GPU-node-b-0 "$A100" 40960)" "$(gpu_json GPU-node-b-1 "$A100" 40960 0 1)"
# node-c: three T4s, index 0 alone on NUMA 1, indices 1 and 2 on NUMA 0 → c-0, c-2, c-1.
make_gpu_node node-c "$(gpu_json GPU-node-c-0 "$T4" 15360 1)" "$(gpu_json GPU-node-c-1 "$T4" 15360 0 1)" \
  "$(gpu_json GPU-node-c-2 "$T4" 15360 0 2)"
check "the register annotation of node-c is HAMi's JSON, byte for byte" test \
  "$(k get node node-c -o jsonpath='{.metadata.annotations.hami\.io/node-nvidia-register}')" = \
  '[{"id":"GPU-node-c-0","count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4","numa":1,"mode":"hami-core","health":true},{"id":"GPU-node-c-1","index":1,"count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4","mode":"hami-core","health":true},{"id":"GPU-node-c-2","index":2,"count":10,"devmem":15360,"devcore":100,"type":"NVIDIA-Tesla T4","mode":"hami-core","health":true}]'
wait_until 30 "Tessera's /debug/ledger lists the GPUs of node-a, node-b and node-c" \
  ledger_has GPU-node-a-1 GPU-node-b-1 GPU-node-c-2
phase_done "nodes"

# --- helpers ------------------------------------------------------------------------------------
PAUSE=registry.k8s.io/pause:3.10
# pod NAME [KEY=VALUE]... < SPEC-BODY: creates pod NAME in e2e with these annotations; stdin is the
# rest of the spec (indented two spaces). No schedulerName: the webhook must set it.
pod() {
  local name="$1" a; shift
  {
    printf 'apiVersion: v1\nkind: Pod\nmetadata:\n  name: %s\n  namespace: e2e\n' "$name"
    (($#)) && echo "  annotations:"
    for a in "$@"; do printf '    %s: "%s"\n' "${a%%=*}" "${a#*=}"; done
    echo "spec:"
    cat
  } | k apply -f - >/dev/null
}
# one_container_pod NAME 'LIMITS' [KEY=VALUE]...: one app container with these limits (a YAML flow
# map); with $PIN set, a nodeSelector for that node (kube-scheduler then hands Tessera only it).
one_container_pod() {
  local name="$1" limits="$2"; shift 2
  {
    [[ -n "${PIN:-}" ]] && printf '  nodeSelector:\n    kubernetes.io/hostname: %s\n' "$PIN"
    printf '  containers:\n    - name: main\n      image: %s\n      resources:\n        limits: %s\n' "$PAUSE" "$limits"
  } | pod "$name" "$@"
}
# facts POD: the pod's fields that the checks read, one "key<TAB>value" per line, from one GET.
declare -A F
facts() {
  F=()
  local key val
  while IFS=$'\t' read -r key val; do F[$key]="$val"; done < <(k -n e2e get pod "$1" -o json | python3 -c '
import json, sys
p = json.load(sys.stdin)
md, spec, st = p["metadata"], p["spec"], p.get("status", {})
a, l = md.get("annotations") or {}, md.get("labels") or {}
out = {
    "schedulerName": spec.get("schedulerName", ""),
    "nodeName": spec.get("nodeName", ""),
    "phase": st.get("phase", ""),
    "PodScheduled": "".join(c["status"] for c in st.get("conditions", []) if c["type"] == "PodScheduled"),
    "label:hami.io/vgpu-node": l.get("hami.io/vgpu-node", "<absent>"),
}
for k in ("hami.io/vgpu-node", "hami.io/vgpu-devices-to-allocate", "hami.io/vgpu-devices-allocated",
          "hami.io/bind-phase", "hami.io/bind-time", "hami.io/vgpu-time"):
    out[k] = a.get(k, "<absent>")
for c in (spec.get("initContainers") or []) + spec["containers"]:
    for r, v in ((c.get("resources") or {}).get("limits") or {}).items():
        out["limits:" + c["name"] + ":" + r] = v
for k, v in out.items():
    print(k + "\t" + v)
')
}
same() { [[ "$1" == "$2" ]]; }
recent_unix() { [[ "$1" =~ ^[0-9]+$ ]] && (($1 >= T_START - 5 && $1 <= $(date +%s) + 5)); }
T_START=$(date +%s)
gone_from_ledger() { ! ledger_has "\"$1\""; }
# placed POD NODE ALLOCATION [CONTAINER:RESOURCE=VALUE]...: POD is bound to NODE through Tessera
# and both allocation annotations are ALLOCATION byte for byte; each CONTAINER:RESOURCE=VALUE is
# a limit the pod must carry after the webhook. Then the pod is deleted (forced: no kubelet) and
# waited out of Tessera's ledger, so the next pod meets an idle cluster again.
placed() {
  local pod="$1" node="$2" want="$3"; shift 3
  if wait_quick 30 "$pod is bound" is_bound "$pod"; then
    facts "$pod"
    echo "e2e: $pod: nodeName=${F[nodeName]} vgpu-devices-allocated=${F[hami.io/vgpu-devices-allocated]}"
    check "$pod: the webhook set spec.schedulerName $SCHEDULER_NAME" same "${F[schedulerName]}" "$SCHEDULER_NAME"
    check "$pod: bound to $node" same "${F[nodeName]}" "$node"
    check "$pod: PodScheduled is True" same "${F[PodScheduled]}" True
    check "$pod: hami.io/vgpu-node annotation = $node" same "${F[hami.io/vgpu-node]}" "$node"
    check "$pod: hami.io/vgpu-node label = $node" same "${F[label:hami.io/vgpu-node]}" "$node"
    check "$pod: hami.io/vgpu-devices-allocated = \"$want\" (got \"${F[hami.io/vgpu-devices-allocated]}\")" \
      same "${F[hami.io/vgpu-devices-allocated]}" "$want"
    check "$pod: hami.io/vgpu-devices-to-allocate = \"$want\" (got \"${F[hami.io/vgpu-devices-to-allocate]}\")" \
      same "${F[hami.io/vgpu-devices-to-allocate]}" "$want"
    check "$pod: hami.io/bind-phase = allocating" same "${F[hami.io/bind-phase]}" allocating
    check "$pod: hami.io/vgpu-time is this run's Unix time (${F[hami.io/vgpu-time]})" recent_unix "${F[hami.io/vgpu-time]}"
    check "$pod: hami.io/bind-time is this run's Unix time (${F[hami.io/bind-time]})" recent_unix "${F[hami.io/bind-time]}"
    local l
    for l in "$@"; do
      check "$pod: limit ${l%%=*} = ${l#*=} (got \"${F[limits:${l%%=*}]:-<absent>}\")" \
        same "${F[limits:${l%%=*}]:-<absent>}" "${l#*=}"
    done
    [[ -n "${AFTER_BIND:-}" ]] && "$AFTER_BIND"
  fi
  k -n e2e delete pod "$pod" --grace-period=0 --force >/dev/null 2>&1
  wait_quick 30 "$pod gone from Tessera's ledger" gone_from_ledger "$pod" || true
}
# failed_scheduling POD: kube-scheduler's FailedScheduling messages for POD, one per line.
failed_scheduling() {
  k -n e2e get events --field-selector "involvedObject.name=$1,reason=FailedScheduling" \
    -o jsonpath='{range .items[*]}{.message}{"\n"}{end}'
}
has_failed_event() { [[ -n "$(failed_scheduling "$1")" ]]; }
# pending POD MESSAGE: POD stays Pending and unbound, Tessera wrote no allocation, and
# kube-scheduler's FailedScheduling event starts with MESSAGE (its aggregation of Tessera's
# FailedNodes reasons: "<count of nodes> <reason>", sorted, joined by ", ", then "."; a
# preemption note may follow).
pending() {
  local pod="$1" want="$2" ev
  wait_quick 30 "kube-scheduler's FailedScheduling event for $pod" has_failed_event "$pod" || true
  ev="$(failed_scheduling "$pod")"
  ev="${ev%%$'\n'*}"   # the first (kube-scheduler retries; no `| head`: a SIGPIPE fails the pipe)
  echo "e2e: FailedScheduling of $pod: $ev"
  check "$pod: the event says \"$want\"" same "${ev:0:${#want}}" "$want"
  facts "$pod"
  check "$pod: Pending, unbound" same "${F[phase]}/${F[nodeName]}" "Pending/"
  check "$pod: the webhook set spec.schedulerName $SCHEDULER_NAME" same "${F[schedulerName]}" "$SCHEDULER_NAME"
  check "$pod: no hami.io/vgpu-devices-allocated" same "${F[hami.io/vgpu-devices-allocated]}" "<absent>"
  k -n e2e delete pod "$pod" --grace-period=0 --force >/dev/null 2>&1
}

# --- pods a constraint makes unschedulable (created together; none reserves anything) ---------
# Every GPU's type contains "Tesla" or "A100": nothing passes the type check anywhere.
one_container_pod type-none '{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}' nvidia.com/nouse-gputype='Tesla,a100'
# No node has this UUID.
one_container_pod uuid-none '{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}' nvidia.com/use-gpuuuid=GPU-nowhere
# node-c has three GPUs but at most two share a NUMA node: walking c-0 (NUMA 1) then c-2 (NUMA 0)
# restarts the collection (c-0 is dropped: 1 NumaNotFit), c-2 and c-1 are taken, and the walk
# ends one short (2 collected: AllocatedCardsInsufficientRequest 2). Pinned to node-c, so the two
# other nodes fail kube-scheduler's own NodeAffinity filter and Tessera sees node-c alone.
PIN=node-c one_container_pod numa-none '{nvidia.com/gpu: 3, nvidia.com/gpumem: 1000}' nvidia.com/numa-bind=true
pending type-none "0/3 nodes are available: 1 3/3 CardTypeMismatch, 2 2/2 CardTypeMismatch."
pending uuid-none "0/3 nodes are available: 1 3/3 CardUuidMismatch, 2 2/2 CardUuidMismatch."
pending numa-none "0/3 nodes are available: 1 1/3 NumaNotFit, 2/3 AllocatedCardsInsufficientRequest, 2 node(s) didn't match Pod's node affinity/selector."
phase_done "unschedulable by constraint"

# --- whole GPUs, MiB, percentage, cores --------------------------------------------------------
# gpu 1, nothing else: the webhook makes a whole-GPU request exclusive (gpucores 100); memory is
# the whole card (no MiB, no percentage, defaultMemory 0): 15360 MiB of a-1.
one_container_pod whole-1 '{nvidia.com/gpu: 1}'
placed whole-1 node-a "GPU-node-a-1,NVIDIA,15360,100:;" main:nvidia.com/gpucores=100
# gpu 2: both T4s of node-a in walk order, each whole and exclusive.
one_container_pod whole-2 '{nvidia.com/gpu: 2}'
placed whole-2 node-a "GPU-node-a-1,NVIDIA,15360,100:GPU-node-a-0,NVIDIA,15360,100:;" main:nvidia.com/gpucores=100
# gpumem 3000 alone: the webhook adds nvidia.com/gpu = defaultGPUNum 1 and no cores (memory given).
one_container_pod mib '{nvidia.com/gpumem: 3000}'
placed mib node-a "GPU-node-a-1,NVIDIA,3000,0:;" main:nvidia.com/gpu=1 main:nvidia.com/gpucores='<absent>'
# gpumem-percentage 33 of a 15360 MiB T4: 15360 × 33 / 100 = 506880 / 100 = 5068 (5068.8 truncated).
one_container_pod percent '{nvidia.com/gpumem-percentage: 33}'
placed percent node-a "GPU-node-a-1,NVIDIA,5068,0:;" main:nvidia.com/gpu=1 main:nvidia.com/gpucores='<absent>'
# gpumem-percentage 100 alone: count 1 added, and the memory is the whole card, so the request is
# exclusive like whole-1's and gets gpucores 100 (HAMi v2.10's webhook rule: a count, no cores,
# 100 % or no memory asked).
one_container_pod percent-100 '{nvidia.com/gpumem-percentage: 100}'
placed percent-100 node-a "GPU-node-a-1,NVIDIA,15360,100:;" main:nvidia.com/gpu=1 main:nvidia.com/gpucores=100
# gpucores 30 alone: count 1 added; no memory asked, so the whole card, with 30 cores.
one_container_pod cores '{nvidia.com/gpucores: 30}'
placed cores node-a "GPU-node-a-1,NVIDIA,15360,30:;" main:nvidia.com/gpu=1 main:nvidia.com/gpucores=30
phase_done "whole, MiB, percentage, cores"

# --- several GPUs in one container -------------------------------------------------------------
one_container_pod multi-2 '{nvidia.com/gpu: 2, nvidia.com/gpumem: 4000}'
placed multi-2 node-a "GPU-node-a-1,NVIDIA,4000,0:GPU-node-a-0,NVIDIA,4000,0:;"
# gpu 3: node-a and node-b have two GPUs each (NodeInsufficientDevice); node-c, walked c-0
# (NUMA 1), c-2, c-1.
one_container_pod multi-3 '{nvidia.com/gpu: 3, nvidia.com/gpumem: 1000}'
placed multi-3 node-c "GPU-node-c-0,NVIDIA,1000,0:GPU-node-c-2,NVIDIA,1000,0:GPU-node-c-1,NVIDIA,1000,0:;"
phase_done "multi-GPU"

# --- an init container and three app containers, one asking nothing ----------------------------
# Entries init first: prep, then c0, c1, c2. prep is fitted on its own copy of idle node-a: a-1.
# The app containers share one copy: c0 takes a-1 (3000); then a-1 scores 10 × (1/10 + 0/100 +
# 3000/15360) > 0 = a-0's score, so spread walks to a-0 for c1 (1000 MiB, 20 cores; the webhook
# adds its count); c2 asks nothing: an empty entry, just ";".
pod init-multi <<YAML
  initContainers:
    - name: prep
      image: $PAUSE
      resources:
        limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 2000}
  containers:
    - name: c0
      image: $PAUSE
      resources:
        limits: {nvidia.com/gpu: 1, nvidia.com/gpumem: 3000}
    - name: c1
      image: $PAUSE
      resources:
        limits: {nvidia.com/gpumem: 1000, nvidia.com/gpucores: 20}
    - name: c2
      image: $PAUSE
YAML
# While it is bound, Tessera's metrics and ledger must book what the truth rule gives: a-1 holds
# max(init peak 2000, app sum 3000) = 3000 MiB, a-0 1000 MiB (HAMi v2.10's collapse).
TRUTH="$DIR/truth.json"
booked_as_truth() {
  truth_snapshot "$TRUTH" &&
    check "init-multi: Tessera's metrics and ledger book what the API server's pods hold" \
      wait_quick 10 "metrics = truth" metrics_match_truth "$TRUTH"
  check "init-multi: the truth itself is a-1 3000 MiB, a-0 1000 MiB" python3 -c '
import json, sys
t = json.load(open(sys.argv[1]))
sys.exit(not (t["node-a/GPU-node-a-1"] == 3000 * 1048576 and t["node-a/GPU-node-a-0"] == 1000 * 1048576))' "$TRUTH"
}
AFTER_BIND=booked_as_truth placed init-multi node-a \
  "GPU-node-a-1,NVIDIA,2000,0:;GPU-node-a-1,NVIDIA,3000,0:;GPU-node-a-0,NVIDIA,1000,20:;;" \
  c1:nvidia.com/gpu=1 c2:nvidia.com/gpu='<absent>'
phase_done "init and multi-container"

# --- numa-bind -----------------------------------------------------------------------------------
# gpu 2 on node-c without numa-bind: c-0 (NUMA 1) and c-2 (NUMA 0), across NUMA nodes.
PIN=node-c one_container_pod numa-free '{nvidia.com/gpu: 2, nvidia.com/gpumem: 1000}'
placed numa-free node-c "GPU-node-c-0,NVIDIA,1000,0:GPU-node-c-2,NVIDIA,1000,0:;"
# With numa-bind: c-0 is taken, c-2 (NUMA 0) restarts the collection, c-2 and c-1 share NUMA 0.
PIN=node-c one_container_pod numa-bound '{nvidia.com/gpu: 2, nvidia.com/gpumem: 1000}' nvidia.com/numa-bind=true
placed numa-bound node-c "GPU-node-c-2,NVIDIA,1000,0:GPU-node-c-1,NVIDIA,1000,0:;"
phase_done "numa-bind"

# --- GPU type -----------------------------------------------------------------------------------
# use-gputype "a100" (a case-insensitive substring of node-b's type): node-b, b-1; 33 % of
# 40960 MiB = 1351680 / 100 = 13516 (13516.8 truncated): the percentage is of this device's MiB.
one_container_pod type-use '{nvidia.com/gpumem-percentage: 33}' nvidia.com/use-gputype=a100
placed type-use node-b "GPU-node-b-1,NVIDIA,13516,0:;"
# nouse-gputype "Tesla" rules out node-a and node-c.
one_container_pod type-nouse '{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}' nvidia.com/nouse-gputype=Tesla
placed type-nouse node-b "GPU-node-b-1,NVIDIA,1000,0:;"
phase_done "GPU type"

# --- GPU UUID -----------------------------------------------------------------------------------
# use-gpuuuid: only b-0 passes anywhere (unconstrained: node-a, a-1).
one_container_pod uuid-use '{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}' nvidia.com/use-gpuuuid=GPU-node-b-0
placed uuid-use node-b "GPU-node-b-0,NVIDIA,1000,0:;"
# nouse-gpuuuid a-1: node-a still wins, with a-0.
one_container_pod uuid-nouse '{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}' nvidia.com/nouse-gpuuuid=GPU-node-a-1
placed uuid-nouse node-a "GPU-node-a-0,NVIDIA,1000,0:;"
# Both apply (HAMi v2.10; v2.5.2 ignored nouse when use was given and would take a-1): a-1 is
# excluded, a-0 is not listed, so node-a fails and c-1 is the only device left.
one_container_pod uuid-both '{nvidia.com/gpu: 1, nvidia.com/gpumem: 1000}' \
  nvidia.com/use-gpuuuid='GPU-node-a-1, GPU-node-c-1' nvidia.com/nouse-gpuuuid=GPU-node-a-1
placed uuid-both node-c "GPU-node-c-1,NVIDIA,1000,0:;"
phase_done "GPU UUID"

# --- nothing left behind -------------------------------------------------------------------------
truth_snapshot "$TRUTH"
check "every pod deleted: Tessera's metrics and ledger are at the truth, every GPU at 0" \
  wait_quick 10 "metrics = truth" metrics_match_truth "$TRUTH"
no_match() { ! grep -Ei "$1" "$2"; }
check "tessera.log has no 403 / forbidden" no_match 'HTTP 403|forbidden' "$DIR/tessera.log"
phase_done "nothing left"
exit $FAILED
