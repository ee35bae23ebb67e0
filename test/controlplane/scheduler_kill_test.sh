#!/usr/bin/env bash
# kube-scheduler killed mid-burst in a real control plane (issue #20): one tessera serve +
# kube-scheduler pair; a burst of fractional-GPU pods, more than one node holds; mid-burst
# `tools/controlplane.sh restart --kill DIR kube-scheduler` (SIGKILL, started again at once with
# the same command line, as a kubelet would restart the container). The new kube-scheduler
# waits for the dead one's Lease to expire, then schedules the rest through the same Tessera,
# which kept the reservations and annotations of binds that were in flight. Asserts: every pod
# that fits is bound within a printed deadline, no GPU is over-committed, no pod is bound twice,
# Tessera's metrics equal the pods' truth, no 403. docs/e2e.md.
#
#   test/controlplane/scheduler_kill_test.sh [--stall] [--tessera PATH] [--keep] [--up-arg ARG]...
#
# --stall: the device-plugin stand-in is paused (SIGSTOP) from just before the kill until 20 s
# after it, as a slow Allocate would: Tessera's binds from the dead kube-scheduler then wait for
# node locks (up to --node-lock-retry-timeout, 28 s) while the restarted kube-scheduler, which
# leads after about 15 s, filters the same pods again through the same Tessera.
#
# Exit 0 = pass, 1 = fail, 77 = skipped (a tool is missing). The control plane is always torn
# down (trap), and every wait has a deadline.
set -euo pipefail

STALL=0
if [[ "${1:-}" == --stall ]]; then STALL=1; shift; fi

# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=test/controlplane/burst.sh
source "$(dirname "${BASH_SOURCE[0]}")/burst.sh"

python3 "$BURST_PY" selftest >/dev/null || { fail "burst.py selftest"; exit 1; }
holder() { kubectl --request-timeout=5s -n tessera-system get lease hami-scheduler -o jsonpath='{.spec.holderIdentity}'; }

burst_nodes "$TESSERA_METRICS_PORT"
burst_start_plugin
OLD_HOLDER="$(holder)"
phase_done "nodes"

burst_pods 1 "$BURST_PODS"
T_BURST=$(now)
wait_until 60 "a fifth of the burst bound" bound_at_least $((BURST_FIT / 5)) || exit 1
((STALL)) && kill -STOP "$PLUGIN_PID"
"$CP" restart --kill "$DIR" kube-scheduler
T_KILL=$(now)
AT_KILL=$(bound_count)
echo "e2e: kube-scheduler killed and restarted $(secs_since "$T_BURST")s into the burst, $AT_KILL of $BURST_FIT bound"
check "the kill came mid-burst (bound $AT_KILL < $BURST_FIT)" test "$AT_KILL" -lt "$BURST_FIT"
phase_done "burst until the kill"

# The new kube-scheduler's identity is a new <host>_<uuid>: it acquires the Lease once the old
# one's expires (15 s after the last renewal). Tessera follows the host name, so it stays the
# leader throughout.
new_holder() { local h; h="$(holder)" && [[ -n "$h" && "$h" != "$OLD_HOLDER" ]]; }
wait_until 60 "the restarted kube-scheduler holds the Lease" new_holder || exit 1
echo "e2e: the restarted kube-scheduler held the Lease $(secs_since "$T_KILL")s after the kill ($(holder))"
if ((STALL)); then
  sleep "$(python3 -c "print(max(0.0, 20 - $(secs_since "$T_KILL")))")"
  kill -CONT "$PLUGIN_PID"
  echo "e2e: the device-plugin stand-in resumed $(secs_since "$T_KILL")s after the kill"
fi
DEADLINE=90
echo "e2e: deadline for every pod that fits to be bound: ${DEADLINE}s after the kill"
if wait_until "$DEADLINE" "all $BURST_FIT pods that fit bound" bound_at_least "$BURST_FIT"; then
  echo "e2e: ok: all $BURST_FIT pods that fit bound $(secs_since "$T_KILL")s after the kill ($(secs_since "$T_BURST")s after the burst began)"
fi
phase_done "rest of the burst"
sleep 2
burst_checks "$TESSERA_METRICS_PORT"
phase_done "checks"
