#!/usr/bin/env bash
# The seed path in a real control plane (issue #20): a deletion Tessera never sees as an event.
# A GPU pod is bound through Tessera; Tessera is frozen (SIGSTOP); kube-apiserver is killed and
# restarted, which severs Tessera's watches; the pod is deleted and etcd compacted past the
# deletion (kube-apiserver --etcd-compaction-interval=2s); Tessera is thawed (SIGCONT). Its
# watches resume from a compacted resourceVersion and get 410 Expired, it relists, the pod is
# gone from the list, and the device's memory must be freed within seconds — not at the next
# 5-minute resync. Then a new GPU pod must still be bound through Tessera. docs/e2e.md.
#
# In the same frozen window a second pod, "ghost", is created, bound and deleted entirely while
# Tessera never runs (written the way another Tessera + kube-scheduler pair would have written
# it; see below): thawed, Tessera must never count it. And from SIGCONT the test measures how long
# Tessera's hami_gpu_memory_allocated_bytes (and /debug/ledger) take to equal the truth computed
# from the API server's pods, and requires that to be below serve's --audit-period.
#
#   test/controlplane/seed_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap; a frozen Tessera is thawed first), and every wait has a deadline.
set -euo pipefail

E2E_UP_ARGS=(--etcd-compaction-interval 2s)
# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

make_node gpu-node-1 2
wait_until 30 "Tessera's /debug/ledger lists the node's GPUs" ledger_has GPU-gpu-node-1-0 GPU-gpu-node-1-1
gpu_pod victim 1000 >/dev/null
wait_until 60 "pod victim is bound" is_bound victim
allocated="$(jp victim '{.metadata.annotations.hami\.io/vgpu-devices-allocated}')"
device="${allocated%%,*}"
check "victim holds 1000 MiB of $device in Tessera's metrics" \
  wait_until 30 "the metric at 1000 MiB" metric_is "$device" 1048576000
check "Tessera's /debug/ledger holds victim" wait_until 10 "victim in the ledger" ledger_has '"victim"'
phase_done "a pod bound through Tessera"

# --- Tessera frozen; its watches severed; the pod deleted; the deletion compacted away --------
expired_before="$(grep -c "410 Expired" "$DIR/tessera.log" || true)"
TESSERA_PID="$(cat "$DIR/tessera.pid")"
SCHEDULER_PID="$(cat "$DIR/kube-scheduler.pid")"
kill -STOP "$TESSERA_PID"
# A frozen process would keep `down` from stopping it with SIGTERM: thaw both before the teardown.
trap 'kill -CONT "$TESSERA_PID" "$SCHEDULER_PID" 2>/dev/null || true; teardown' EXIT
"$CP" restart --kill "$DIR" kube-apiserver
apiserver_ready() { k get --raw /readyz; }
wait_until 60 "kube-apiserver ready again after the restart" apiserver_ready
restarted_at=$(date +%s.%N)
rv_before="$(jp victim '{.metadata.resourceVersion}')"
k -n e2e delete pod victim --grace-period=0 --force >/dev/null 2>&1
phase_done "freeze, sever, delete victim"

# --- ghost: a GPU pod created, bound and deleted while Tessera is frozen ------------------------
# In a real cluster a pod is bound through HAMi's protocol while one Tessera is stopped only when
# another replica pair (Tessera + kube-scheduler, following the same Lease) is the one serving:
# its webhook set spec.schedulerName, its /filter patched the allocation onto the pod, its /bind
# POSTed the Binding with hami.io/bind-phase=allocating and hami.io/bind-time (docs/serve.md
# "Filter and bind"). This bed has one pair, so the test writes what that pair would have, as
# admin, while this pair is stopped: kube-scheduler is frozen too for those few calls, as a
# follower it would not be scheduling (running, it would hand the pod to the frozen extender and
# wait there). The pod carries hami.io/webhook=ignore, the shipped webhook's opt-out label,
# because the registered webhook is the frozen Tessera (the API server would wait out its 10 s
# timeout); the mutation it stands in for is the schedulerName written into the spec.
# kube-scheduler's Lease: it renews every 2 s and gives up after 10 s without a renewal; wait for a
# renewal after the API server's restart, so the freeze (about a second) starts from a fresh one.
renewed_since_restart() {
  local t; t="$(k -n tessera-system get lease hami-scheduler -o jsonpath='{.spec.renewTime}')" || return 1
  python3 -c 'import datetime, sys
t = datetime.datetime.strptime(sys.argv[1], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=datetime.timezone.utc)
sys.exit(not t.timestamp() > float(sys.argv[2]))' "$t" "$restarted_at"
}
wait_quick 15 "kube-scheduler renewed its Lease after the API server's restart" renewed_since_restart
ghost_device=GPU-gpu-node-1-0
[[ "$device" == "$ghost_device" ]] && ghost_device=GPU-gpu-node-1-1   # the GPU victim did not hold
ghost_alloc="$ghost_device,NVIDIA,3000,0:;"
kill -STOP "$SCHEDULER_PID"
ghost_start=$(date +%s.%N)
k apply -f - >/dev/null <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: ghost
  namespace: e2e
  labels:
    hami.io/webhook: ignore
spec:
  schedulerName: $SCHEDULER_NAME
  containers:
    - name: main
      image: registry.k8s.io/pause:3.10
      resources:
        limits:
          nvidia.com/gpu: 1
          nvidia.com/gpumem: 3000
YAML
k -n e2e patch pod ghost --type=merge -p "{\"metadata\":{\"annotations\":{\"hami.io/vgpu-node\":\"gpu-node-1\",\"hami.io/vgpu-time\":\"$(date +%s)\",\"hami.io/vgpu-devices-to-allocate\":\"$ghost_alloc\",\"hami.io/vgpu-devices-allocated\":\"$ghost_alloc\"},\"labels\":{\"hami.io/vgpu-node\":\"gpu-node-1\"}}}" >/dev/null
k create --raw /api/v1/namespaces/e2e/pods/ghost/binding -f - >/dev/null <<JSON
{"apiVersion":"v1","kind":"Binding","metadata":{"name":"ghost","namespace":"e2e","annotations":{"hami.io/bind-phase":"allocating","hami.io/bind-time":"$(date +%s)"}},"target":{"apiVersion":"v1","kind":"Node","name":"gpu-node-1"}}
JSON
ghost_state="$(jp ghost '{.spec.nodeName}|{.metadata.annotations.hami\.io/vgpu-devices-allocated}|{.metadata.annotations.hami\.io/bind-phase}|{.metadata.resourceVersion}')"
rv_ghost="${ghost_state##*|}"
check "ghost was bound to gpu-node-1 with its allocation ($ghost_state)" \
  test "${ghost_state%|*}" = "gpu-node-1|$ghost_alloc|allocating"
k -n e2e delete pod ghost --grace-period=0 --force >/dev/null 2>&1
kill -CONT "$SCHEDULER_PID"
echo "e2e: ghost created, bound and deleted in $(python3 -c "print(f'{$(date +%s.%N) - $ghost_start:.1f}')") s (kube-scheduler frozen meanwhile)"
check "kube-scheduler survived its freeze" kill -0 "$SCHEDULER_PID"
phase_done "ghost (renewal wait included)"

for i in 1 2 3; do k -n e2e create configmap "churn-$i" >/dev/null; done
# A revision is compacted once an exact LIST at it is refused (410): the one victim still existed
# at, and the last one of ghost's life.
compacted() { ! k get --raw "/api/v1/namespaces/e2e/pods?resourceVersion=$1&resourceVersionMatch=Exact&limit=1"; }
check "etcd compacted the revisions from before the deletion (resourceVersion $rv_before)" \
  wait_until 30 "compaction past $rv_before" compacted "$rv_before"
echo "e2e: compacted past victim's revision $(python3 -c "print(f'{$(date +%s.%N) - $PHASE_START:.1f}')") s after ghost's deletion"
check "and every revision at which ghost existed (resourceVersion $rv_ghost)" \
  wait_until 30 "compaction past $rv_ghost" compacted "$rv_ghost"
echo "e2e: compacted past ghost's revisions $(python3 -c "print(f'{$(date +%s.%N) - $PHASE_START:.1f}')") s after ghost's deletion"
frozen() { ! curl -fsS --max-time 1 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" >/dev/null 2>&1; }
check "Tessera is still frozen (its /metrics does not answer)" frozen
phase_done "compact"

# --- thawed: 410, relist, the memory freed ---------------------------------------------------
# The truth while nothing changes on the API server: neither victim nor ghost holds anything.
TRUTH="$DIR/truth.json"
truth_snapshot "$TRUTH"
AUDIT_PERIOD="$(audit_period_seconds)"
# A sampler scrapes /metrics and then /debug/ledger back to back, from before the thaw (its first
# request waits in the frozen Tessera's accept queue and is answered on SIGCONT) until told to
# stop; "N START END" (ns) per complete sample in $SAMPLES/index.
SAMPLES="$DIR/samples"
mkdir -p "$SAMPLES"
sampler() {
  local n=0 t0 base="http://127.0.0.1:$TESSERA_METRICS_PORT"
  while [[ ! -e "$SAMPLES/stop" ]]; do
    t0=$(date +%s%N)
    if curl -fsS --max-time 20 "$base/metrics" -o "$SAMPLES/$n.metrics" &&
      curl -fsS --max-time 20 "$base/debug/ledger" -o "$SAMPLES/$n.ledger"; then
      echo "$n $t0 $(date +%s%N)" >>"$SAMPLES/index"
    fi
    n=$((n + 1))
    sleep 0.05
  done
}
sampler &
SAMPLER_PID=$!
# (In a trap errexit still applies: every step before teardown is shielded by "|| true".)
trap '{ touch "$SAMPLES/stop"; pkill -P "$SAMPLER_PID"; kill "$SAMPLER_PID"; kill -CONT "$TESSERA_PID" "$SCHEDULER_PID"; } 2>/dev/null || true; teardown' EXIT
sleep 0.3
kill -CONT "$TESSERA_PID"
thawed=$(date +%s%N)
check "the metrics and the ledger reach the truth within 60 s of SIGCONT" \
  wait_quick 60 "metrics = truth" metrics_match_truth "$TRUTH"
sleep 1   # a second of samples more: a late apply of ghost would show up there
touch "$SAMPLES/stop"
wait "$SAMPLER_PID" || true
# Every sample: equal to the truth or not; ghost in the ledger or on its GPU's metric.
mapfile -t idx <"$SAMPLES/index"
pairs=() ghost_seen="" follower_samples="" n_samples=${#idx[@]}
for line in "${idx[@]}"; do
  read -r n _ _ <<<"$line"
  pairs+=("$SAMPLES/$n.metrics" "$SAMPLES/$n.ledger")
  grep -q '"ghost"' "$SAMPLES/$n.ledger" && ghost_seen+=" $n:ledger"
  # Only the leader exports hami_* (docs/metrics.md); Tessera follows kube-scheduler's Lease,
  # which can expire while both are frozen, so a sample answered at the thaw may come from a
  # follower: it has no device family and counts nothing.
  grep -qx 'tessera_leader 1' "$SAMPLES/$n.metrics" || { follower_samples+=" $n"; continue; }
  grep -qE "^hami_gpu_memory_allocated_bytes\{.*device_uuid=\"$ghost_device\".*\} 0\$" "$SAMPLES/$n.metrics" \
    || ghost_seen+=" $n:metric"
done
verdicts="$(truth_diff "$TRUTH" "${pairs[@]}" || true)"
read -r lo hi first <<<"$(python3 - "$thawed" "$verdicts" "${idx[@]}" <<'PY'
import sys
thawed, verdicts, idx = int(sys.argv[1]), sys.argv[2].splitlines(), [l.split() for l in sys.argv[3:]]
first_equal = next((i for i, v in enumerate(verdicts) if v == "equal"), None)
if first_equal is None:
    print("nan nan none"); sys.exit()
# Converged after the start of the last sample that differed (or the thaw) and before the end of
# the first that was equal.
lo = max([thawed] + [int(idx[i][1]) for i in range(first_equal)])
print(f"{(lo - thawed) / 1e9:.2f} {(int(idx[first_equal][2]) - thawed) / 1e9:.2f} "
      f"{'equal' if first_equal == 0 else 'stale'}")
PY
)"
echo "e2e: measured: /metrics and /debug/ledger equal the truth between ${lo} and ${hi} s after SIGCONT" \
  "($n_samples samples; the first, queued before the thaw, was ${first}; --audit-period ${AUDIT_PERIOD} s)"
check "the metrics equal the truth within the audit period (by ${hi} s < ${AUDIT_PERIOD} s)" \
  python3 -c "import sys; sys.exit(not $hi < $AUDIT_PERIOD)"
check "Tessera never counted ghost after the thaw ($n_samples samples of its ledger and metric${follower_samples:+, the metric of samples$follower_samples from a follower}${ghost_seen:+; seen in samples$ghost_seen})" \
  test -z "$ghost_seen"
truth_snapshot "$DIR/truth-after.json"
check "the API server's truth did not change meanwhile" cmp -s "$TRUTH" "$DIR/truth-after.json"
check "the metrics still equal it" metrics_match_truth "$TRUTH"
check "the device's memory is freed within 30 s (not at the 5-minute resync)" \
  wait_until 30 "the metric back at 0" metric_is "$device" 0
expired_after() { (($(grep -c "410 Expired" "$DIR/tessera.log" || true) > expired_before)); }
check "Tessera's watches resumed into 410 Expired (and relisted)" expired_after
gone_from_ledger() { ledger_has '"gpu-node-1"' && ! ledger_has '"victim"'; }
check "Tessera's /debug/ledger no longer holds victim" gone_from_ledger
phase_done "thaw and heal"

# --- still scheduling ---------------------------------------------------------------------------
scheduler_alive() { kill -0 "$(cat "$DIR/kube-scheduler.pid")"; }
check "kube-scheduler kept running through the API server restart" scheduler_alive
gpu_pod after 1000 >/dev/null
check "a new GPU pod is bound through Tessera after the heal" wait_until 60 "pod after is bound" is_bound after
check "and got an allocation" test -n "$(jp after '{.metadata.annotations.hami\.io/vgpu-devices-allocated}')"
no_match() { ! grep -Ei "$1" "$2"; }
check "tessera.log has no 403 / forbidden" no_match 'HTTP 403|forbidden' "$DIR/tessera.log"
phase_done "schedule again"
exit $FAILED
