#!/usr/bin/env bash
# "Why is my pod pending?" on a real control plane (issue #25): stock etcd, kube-apiserver and
# kube-scheduler on 127.0.0.1 (tools/controlplane.sh), Tessera as the extender. Pending GPU pods
# that cover every reason Tessera writes — no device fits (the nearest miss and its exact
# shortfall) with a reservation holding the device and HAMi's node lock held, a device plugin that
# stopped reporting (stale handshake), an unhealthy device, the namespace quota — each seen as its
# owner sees it: the FilteringFailed event in `kubectl describe pod`, the tessera.io/verdict
# annotation through `kubectl get -o jsonpath`, and `tessera why` run with a namespace user's
# token (get on pods in its namespaces, no cluster-wide right). Then tessera_pending_pods{reason} counts them, and a
# pod whose device is freed is bound and loses its verdict. docs/e2e.md "The why test".
#
#   test/controlplane/why_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# --- a GPU node, and the namespace user: get/list on pods and events in e2e and team, nothing else
make_node gpu-a 1
wait_until 30 "Tessera's /debug/ledger lists gpu-a's GPU" ledger_has GPU-gpu-a-0
k create namespace team >/dev/null
k -n team create serviceaccount default >/dev/null
k -n e2e create serviceaccount dev >/dev/null
USER_SA=system:serviceaccount:e2e:dev
for ns in e2e team; do
  k -n "$ns" create role pod-reader --verb=get,list --resource=pods,events >/dev/null
  k -n "$ns" create rolebinding dev-reads-pods --role=pod-reader --serviceaccount=e2e:dev >/dev/null
done
{
  echo "apiVersion: v1"
  echo "kind: Config"
  echo "clusters: [{name: e2e, cluster: {server: 'https://127.0.0.1:$APISERVER_PORT', certificate-authority: '$DIR/ca.crt'}}]"
  echo "users: [{name: dev, user: {token: '$(k -n e2e create token dev --duration=1h)'}}]"
  echo "contexts: [{name: dev, context: {cluster: e2e, user: dev, namespace: e2e}}]"
  echo "current-context: dev"
} >"$DIR/dev.kubeconfig"
uk() { kubectl --kubeconfig "$DIR/dev.kubeconfig" --request-timeout=20s "$@"; }
check "the user's token is $USER_SA" test "$(uk auth whoami -o jsonpath='{.status.userInfo.username}')" = "$USER_SA"
check "who may get pods in e2e and team" test "$(uk auth can-i get pods -n e2e)/$(uk auth can-i get pods -n team)" = yes/yes
check "but not list pods cluster-wide" test "$(uk auth can-i list pods -A || true)" = no
check "nor read nodes" test "$(uk auth can-i get nodes 2>/dev/null || true)" = no
phase_done "node and namespace user"

verdict_of() { # verdict_of NS/POD: the pod's tessera.io/verdict, read by the namespace user
  uk -n "${1%/*}" get pod "${1#*/}" -o jsonpath='{.metadata.annotations.tessera\.io/verdict}'
}
has_verdict() { [[ -n "$(verdict_of "$1")" ]]; }
# field NS/POD PYTHON-EXPRESSION: the expression over the verdict document v
field() { verdict_of "$1" | python3 -c "import json,sys; v=json.load(sys.stdin); print($2)"; }
# describe_shows TEXT VERDICT: a line of `kubectl describe pod` is a FilteringFailed event whose
# message is VERDICT
describe_shows() {
  python3 -c 'import sys; sys.exit(not any("FilteringFailed" in l and l.rstrip().endswith(sys.argv[2]) for l in sys.argv[1].splitlines()))' "$1" "$2"
}
# shows NS/POD [WHY-ARG]...: the pod as its owner sees it: the verdict (jsonpath), `kubectl
# describe pod` and `tessera why` with the user's token and serve's metrics listener for the live
# replay (WHY holds its output); all three printed.
shows() {
  local pod="$1" verdict describe; shift
  wait_until 60 "a verdict on $pod" has_verdict "$pod" || true
  verdict="$(verdict_of "$pod")"
  echo "e2e: \$ kubectl get pod ${pod#*/} -n ${pod%/*} -o jsonpath='{.metadata.annotations.tessera\\.io/verdict}'"
  echo "$verdict"
  describe="$(uk -n "${pod%/*}" describe pod "${pod#*/}" 2>&1)" || true
  echo "e2e: \$ kubectl describe pod ${pod#*/} -n ${pod%/*} (events)"; sed -n '/^Events:/,$p' <<<"$describe"
  check "$pod: kubectl describe pod shows the FilteringFailed event with the verdict" \
    describe_shows "$describe" "$verdict"
  WHY="$("$TESSERA_BIN" why "$pod" --kubeconfig "$DIR/dev.kubeconfig" \
    --server "http://127.0.0.1:$TESSERA_METRICS_PORT" "$@" 2>&1)" || true
  echo "e2e: \$ tessera why $pod --server http://127.0.0.1:\$TESSERA_METRICS_PORT $*"; echo "$WHY"
}
pending_is() { # pending_is REASON N: tessera_pending_pods{reason="REASON"} is N
  curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" | grep -qxF "tessera_pending_pods{reason=\"$1\"} $2"
}

# --- no device fits: gpu-a's 8192 MiB held by a bound pod and a reservation, and its node lock ------
# trainer (2000 MiB) is bound through Tessera, which leaves HAMi's node lock on gpu-a (no device
# plugin runs here to remove it after Allocate). Then kube-scheduler's /filter of e2e/holder, sent
# as kube-scheduler sends it (ExtenderArgs with NodeNames: nodeCacheCapable) to Tessera's extender
# port, reserves 4000 MiB more for --reservation-ttl; holder's nodeSelector matches no node, so
# kube-scheduler never binds it: the reservation is what a slow bind leaves behind.
gpu_pod trainer 2000 >/dev/null
check "trainer is bound to gpu-a" wait_until 60 "trainer bound" is_bound trainer
pinned_pod() { # pinned_pod NAME MiB NODE [NAMESPACE]: gpu_pod_yaml with a kubernetes.io/hostname selector
  gpu_pod_yaml "$1" "$2" "" "${4:-e2e}" | sed "s/^spec:\$/spec:\n  nodeSelector: {kubernetes.io\/hostname: $3}/" | k apply -f - >/dev/null
}
pinned_pod holder 4000 nowhere
args="$(k -n e2e get pod holder -o json | python3 -c 'import json,sys; print(json.dumps({"pod": json.load(sys.stdin), "nodenames": ["gpu-a"]}))')"
filtered="$(curl -fsS --max-time 20 --cacert "$DIR/ca.crt" -H 'Content-Type: application/json' \
  -d "$args" "https://127.0.0.1:$TESSERA_PORT/filter")" || filtered="curl failed"
echo "e2e: /filter of e2e/holder: $filtered"
check "Tessera's /filter gave e2e/holder gpu-a" contains "$filtered" '"NodeNames":["gpu-a"]'
check "and reserved its GPU" wait_until 10 "the reservation in /debug/ledger" ledger_has '"reserved"'
# waits asks 4000 MiB and names no node: 8192 - 2000 - 4000 = 2192 free.
gpu_pod waits 4000 >/dev/null
shows e2e/waits --if-deleted holder
check "waits: CardInsufficientMemory on 1 of 1 nodes" \
  test "$(field e2e/waits 'v["reason"], v["nodes"], v["reasons"]')" = "CardInsufficientMemory 1 [['CardInsufficientMemory', 1]]"
check "waits: the nearest miss is gpu-a / GPU-gpu-a-0, 4000 MiB needed, 2192 free" \
  test "$(field e2e/waits 'v["nearest"]["node"], v["nearest"]["device"], v["nearest"]["need_mib"], v["nearest"]["free_mib"]')" = "gpu-a GPU-gpu-a-0 4000 2192"
check "waits: held by holder's 4000 MiB reservation (with its expiry) and trainer's 2000 MiB" \
  test "$(field e2e/waits '[(h["pod"], h["mib"], "reserved_until" in h) for h in v["nearest"]["held_by"]]')" = "[('e2e/holder', 4000, True), ('e2e/trainer', 2000, False)]"
check "waits: gpu-a's node lock held by e2e/trainer" \
  test "$(field e2e/waits 'v["lock"]["node"], v["lock"]["holder"]')" = "gpu-a e2e/trainer"
check "tessera why waits: the nearest miss and its shortfall" \
  contains "$WHY" "nearest miss: node gpu-a / GPU-gpu-a-0: needs 4000 MiB, 2192 free"
check "tessera why waits: the reservation's holder and expiry" \
  grep -qE '^  4000 MiB held by the reservation of e2e/holder, expires in [0-9]+m[0-9]+s$' <<<"$WHY"
check "tessera why waits: the bound pod" grep -qxF '  2000 MiB held by e2e/trainer' <<<"$WHY"
check "tessera why waits: the lock's holder and since when" \
  grep -qE '^node lock on gpu-a held by e2e/trainer since [0-9TZ:-]+ \([0-9ms]+ ago\)$' <<<"$WHY"
check "tessera why waits --if-deleted holder: gpu-a would fit" \
  contains "$WHY" $'live replay if pod e2e/holder were deleted:\nnode gpu-a fits'
check "tessera_pending_pods: 1 CardInsufficientMemory (waits)" wait_until 10 "the metric" pending_is CardInsufficientMemory 1
# The operator's view of the same device (serve's ledger): the reservation and its expiry.
top="$("$TESSERA_BIN" top --server "http://127.0.0.1:$TESSERA_METRICS_PORT" 2>&1)" || true
echo "e2e: \$ tessera top --server http://127.0.0.1:\$TESSERA_METRICS_PORT"; echo "$top"
check "tessera top: gpu-a's GPU, 6000 of 8192 MiB booked" grep -qE '^gpu-a +GPU-gpu-a-0 \(0\) +NVIDIA-Tesla T4 +6000/8192 +2192 ' <<<"$top"
check "tessera top: holder's reservation and its expiry" \
  grep -qE '^ +e2e/holder \[0\] +4000 +0 +reserved, expires in [0-9]+m[0-9]+s$' <<<"$top"
check "tessera top: trainer bound" grep -qE '^ +e2e/trainer \[0\] +2000 +0 +bound$' <<<"$top"
# Written only when it changes: kube-scheduler filters waits again and again (HAMi's per-filter
# FilteringFailed event each time), the verdict's event stays one.
failed_events() { # failed_events POD MESSAGE-PREFIX: how many FilteringFailed events of POD start so
  uk -n e2e get events --field-selector "involvedObject.name=$1,reason=FilteringFailed" \
    -o jsonpath='{range .items[*]}{.count}|{.message}{"\n"}{end}' | grep -c "^1|$2" || true
}
at_least_two_filters() { (($(failed_events waits '1 nodes CardInsufficientMemory') >= 2)); }
check "kube-scheduler filtered waits again" wait_until 30 "a second filter of waits" at_least_two_filters
check "and the verdict was written once (one event, count 1)" test "$(failed_events waits '{')" = 1
phase_done "no fit, reservation, lock"

# --- the device freed: trainer deleted, waits is bound and its verdict cleared ---------------------
# kube-scheduler retries a pod an extender refused on any cluster event (else after 5 minutes), so
# the deletion itself requeues waits. Its retry can reach Tessera before Tessera's own watch has
# delivered the deletion: then it is refused once more, and Tessera's requeue puts it back when
# its ledger lets trainer go (docs/requeue.md; docs/e2e.md "The why test").
k -n e2e delete pod trainer --grace-period=0 --force >/dev/null 2>&1
ledger_lacks_trainer() { ! ledger_has '"name": "trainer"'; }
check "Tessera's ledger lets trainer go" wait_until 30 "trainer gone from /debug/ledger" ledger_lacks_trainer
check "waits is bound once e2e/trainer is gone" wait_until 60 "waits bound" is_bound waits
check "to gpu-a" test "$(jp waits '{.spec.nodeName}')" = gpu-a
check "and its verdict is cleared" test -z "$(verdict_of e2e/waits)"
check "tessera_pending_pods: 0 CardInsufficientMemory" wait_until 10 "the metric" pending_is CardInsufficientMemory 0
phase_done "freed and bound"

# --- the other reasons: one node each, each pod pinned to its node ---------------------------------
# A v2.5–v2.7 plugin (delimited register) whose last handshake Tessera answered two minutes ago:
# the plugin stopped reporting (HAMi's 60 s window, docs/serve.md "The node registry").
make_registered_node gpu-c 1 "GPU-gpu-c-0,10,8192,100,NVIDIA-Tesla T4,0,true:" \
  "Requesting_$(date -u -d '-120 sec' '+%Y-%m-%d %H:%M:%S')"
make_gpu_node gpu-d "$(gpu_json GPU-gpu-d-0 "NVIDIA-Tesla T4" 8192 | sed 's/"health":true/"health":false/')"
make_node gpu-e 1   # free, in the quota's way only
gpumem_quota team 2000
wait_until 30 "Tessera's /debug/ledger lists every node's GPU" \
  ledger_has GPU-gpu-c-0 GPU-gpu-d-0 GPU-gpu-e-0
pinned_pod stale 1000 gpu-c
pinned_pod sick 1000 gpu-d
pinned_pod over-quota 3000 gpu-e team

shows e2e/stale --node gpu-c
check "stale: gpu-c is a node whose plugin stopped reporting, not unhealthy devices" \
  test "$(field e2e/stale 'v["reason"], v["nodes"], v["unregistered"], v["unhealthy"]')" = "node unregistered 1 1 0"
check "tessera why stale: says so" \
  contains "$WHY" "1 node without a device registration (the device plugin stopped reporting"

shows e2e/sick --node gpu-d
check "sick: CardNotHealth, 1 device unhealthy, no nearest miss" \
  test "$(field e2e/sick 'v["reason"], v["unhealthy"], v["unregistered"], "nearest" in v')" = "CardNotHealth 1 0 False"
check "tessera why sick: 1 device unhealthy" contains "$WHY" "1 device unhealthy or cordoned"

shows team/over-quota --node gpu-e
check "over-quota: ResourceQuotaNotFit, the quota named" \
  test "$(field team/over-quota 'v["reason"], v["quota"]')" = "ResourceQuotaNotFit namespace team: limits.nvidia.com/gpumem 2000, used 0 + 3000 asked"
check "tessera why over-quota: the quota line" \
  contains "$WHY" "quota: namespace team: limits.nvidia.com/gpumem 2000, used 0 + 3000 asked"
check "tessera why over-quota: the live replay is refused by the quota too" \
  contains "$WHY" $'live replay if only node gpu-e were a candidate:\nno node fits: 1 candidate node failed, mostly ResourceQuotaNotFit'
phase_done "plugin, health, quota"

# --- tessera_pending_pods{reason}: each pending pod under its main reason ---------------------------
check "tessera_pending_pods: 1 node unregistered (stale)" wait_until 10 "the metric" pending_is "node unregistered" 1
check "tessera_pending_pods: 1 CardNotHealth (sick)" wait_until 10 "the metric" pending_is CardNotHealth 1
check "tessera_pending_pods: 1 ResourceQuotaNotFit (over-quota)" wait_until 10 "the metric" pending_is ResourceQuotaNotFit 1
echo "e2e: tessera_pending_pods (the reasons not at 0):"
curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" | grep '^tessera_pending_pods{' | grep -v ' 0$' || true
phase_done "metric"
exit $FAILED
