#!/usr/bin/env bash
# The seed path in a real control plane (issue #20): a deletion Tessera never sees as an event.
# A GPU pod is bound through Tessera; Tessera is frozen (SIGSTOP); kube-apiserver is killed and
# restarted, which severs Tessera's watches; the pod is deleted and etcd compacted past the
# deletion (kube-apiserver --etcd-compaction-interval=2s); Tessera is thawed (SIGCONT). Its
# watches resume from a compacted resourceVersion and get 410 Expired, it relists, the pod is
# gone from the list, and the device's memory must be freed within seconds — not at the next
# 5-minute resync. Then a new GPU pod must still be bound through Tessera. docs/e2e.md.
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
kill -STOP "$TESSERA_PID"
# A frozen Tessera would keep `down` from stopping it with SIGTERM: thaw it before the teardown.
trap 'kill -CONT "$TESSERA_PID" 2>/dev/null || true; teardown' EXIT
"$CP" restart --kill "$DIR" kube-apiserver
apiserver_ready() { k get --raw /readyz; }
wait_until 60 "kube-apiserver ready again after the restart" apiserver_ready
rv_before="$(jp victim '{.metadata.resourceVersion}')"
k -n e2e delete pod victim --grace-period=0 --force >/dev/null 2>&1
for i in 1 2 3; do k -n e2e create configmap "churn-$i" >/dev/null; done
# The revision the pod still existed at is compacted once an exact LIST at it is refused (410).
compacted() { ! k get --raw "/api/v1/namespaces/e2e/pods?resourceVersion=$rv_before&resourceVersionMatch=Exact&limit=1"; }
check "etcd compacted the revisions from before the deletion (resourceVersion $rv_before)" \
  wait_until 30 "compaction past $rv_before" compacted
frozen() { ! curl -fsS --max-time 1 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics" >/dev/null 2>&1; }
check "Tessera is still frozen (its /metrics does not answer)" frozen
phase_done "freeze, sever, delete, compact"

# --- thawed: 410, relist, the memory freed ---------------------------------------------------
kill -CONT "$TESSERA_PID"
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
