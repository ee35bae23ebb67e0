# Shared by the burst tests (failover_test.sh, scheduler_kill_test.sh); sourced after lib.sh
# (which has brought the control plane up in $DIR). A burst of fractional-GPU pods on GPU nodes
# made as e2e_test.sh makes them, with burst.py standing in for HAMi's device plugin (it ends
# each Allocate: bind-phase success, node lock released) and judging the outcome. docs/e2e.md.
# shellcheck shell=bash

BURST_PY="$ROOT/test/controlplane/burst.py"

# The burst: BURST_NODES nodes of 2 GPUs (8192 MiB, 100 cores, 10 slots each) and BURST_PODS
# pods asking 1 GPU, 1000 MiB and 10 cores. A GPU holds min(10 slots, 8192/1000, 100/10) = 8
# of them, so BURST_FIT pods fit and the rest stay Pending; one node holds 16, so the burst
# needs every node and packing matters.
BURST_NODES=3
BURST_PODS=56
BURST_FIT=$((BURST_NODES * 2 * 8))

no_match() { ! grep -E -q -- "$1" "$2"; }   # no_match REGEX FILE

# A device-plugin stand-in runs for at most 300 s and is stopped before lib.sh's teardown (which
# would otherwise find it alive with $DIR on its command line).
PLUGIN_PID=""
burst_stop_plugin() {
  [[ -n "$PLUGIN_PID" ]] || return 0
  kill "$PLUGIN_PID" 2>/dev/null || true
  kill -CONT "$PLUGIN_PID" 2>/dev/null || true   # a paused one (SIGSTOP) must see the TERM
  wait "$PLUGIN_PID" 2>/dev/null || true
  PLUGIN_PID=""
}
burst_exit() {
  local rc=$?
  burst_stop_plugin
  set +e
  (exit "$rc")
  teardown   # lib.sh's: reads the exit status from $?
}
trap burst_exit EXIT
burst_start_plugin() {
  python3 "$BURST_PY" plugin "$DIR" 300 >"$DIR/plugin.log" 2>&1 &
  PLUGIN_PID=$!
}

ledger_lists_gpus() { # ledger_lists_gpus METRICS_PORT: /debug/ledger names every burst GPU
  local l i
  l="$(curl -fsS --max-time 2 "http://127.0.0.1:$1/debug/ledger")" || return 1
  for ((i = 1; i <= BURST_NODES; i++)); do
    [[ "$l" == *"GPU-gpu-node-$i-0"* && "$l" == *"GPU-gpu-node-$i-1"* ]] || return 1
  done
}

burst_nodes() { # burst_nodes METRICS_PORT...: the nodes, until every Tessera lists their GPUs
  local i p
  for ((i = 1; i <= BURST_NODES; i++)); do make_node "gpu-node-$i" 2; done
  for p in "$@"; do
    wait_until 30 "Tessera (metrics port $p) lists the burst's GPUs" ledger_lists_gpus "$p" || exit 1
  done
}

# The pods name no scheduler: Tessera's webhook sets spec.schedulerName (burst_checks checks
# it; with --replicas the webhook goes through webhook-service to any live Tessera, and its
# failurePolicy Ignore would otherwise leave a pod to the default scheduler, which is not run).
burst_pods() { # burst_pods FIRST LAST: pods b-FIRST ... b-LAST in one kubectl apply
  local i
  for ((i = $1; i <= $2; i++)); do
    echo "---"
    gpu_pod_yaml "b-$i" 1000 10
  done | k apply -f - >/dev/null
}

bound_count() { # the number of pods in e2e with a spec.nodeName
  kubectl --request-timeout=5s -n e2e get pods -o jsonpath='{range .items[*]}{.spec.nodeName}{"\n"}{end}' \
    | grep -c . || true
}
bound_at_least() { (($(bound_count) >= $1)); }

# now: seconds since the epoch with a fraction; secs_since T: seconds since T, one decimal.
now() { date +%s.%N; }
secs_since() { python3 -c "print(f'{$(now) - $1:.1f}')"; }

# The checks of the settled burst against the pods' truth (burst.py check / metrics), given the
# metrics port of the Tessera that leads.
binding_events() { # "<Scheduled> <BindingSucceed>": the binding events counted by burst.py check
  python3 "$BURST_PY" check "$DIR" e2e 2>/dev/null \
    | python3 -c 'import json,sys; e=json.load(sys.stdin)["binding_events"]; print(e["Scheduled"], e["BindingSucceed"])'
}
# Events are sent behind the binds (Tessera's from a queue, seconds behind in a burst): the
# double-binding check waits until the counts hold still for 2 s.
events_settled() {
  local a b
  a="$(binding_events)"; sleep 2; b="$(binding_events)"
  [[ -n "$a" && "$a" == "$b" ]]
}
burst_checks() {
  local mport="$1" summary rc=0
  wait_until 30 "the binding events settle" events_settled || true
  summary="$(python3 "$BURST_PY" check "$DIR" e2e 2>"$DIR/check.err")" || rc=$?
  cat "$DIR/check.err" >&2
  check "no GPU over-committed, every bound pod's annotations name its node, no pod bound twice" \
    test "$rc" = 0
  local bound pending
  bound="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["bound"])' <<<"$summary")"
  pending="$(python3 -c 'import json,sys; print(json.load(sys.stdin)["pending"])' <<<"$summary")"
  # The double-binding check reads events: make sure it had some to read.
  local events
  events="$(python3 -c 'import json,sys; e=json.load(sys.stdin)["binding_events"]; print(e["Scheduled"], e["BindingSucceed"])' <<<"$summary")"
  echo "e2e: binding events seen (Scheduled, BindingSucceed): $events"
  check "the double-binding check saw kube-scheduler's and Tessera's binding events" \
    test "${events% *}" -gt 0 -a "${events#* }" -gt 0
  local others
  others="$(k -n e2e get pods -o jsonpath='{range .items[*]}{.spec.schedulerName}{"\n"}{end}' | grep -vc '^hami-scheduler$' || true)"
  check "the webhook gave every pod spec.schedulerName hami-scheduler ($others did not get it)" test "$others" = 0
  check "$BURST_FIT of $BURST_PODS pods bound (every pod that fits), $((BURST_PODS - BURST_FIT)) Pending (bound $bound, pending $pending)" \
    test "$bound" = "$BURST_FIT" -a "$pending" = "$((BURST_PODS - BURST_FIT))"
  if wait_until 30 "Tessera's metrics equal the pods' truth" \
       python3 "$BURST_PY" metrics "$DIR" e2e "http://127.0.0.1:$mport/metrics"; then
    echo "e2e: ok: Tessera's hami_gpu_memory_allocated_bytes and hami_gpu_shared_count equal the pods' truth on every GPU"
  else
    python3 "$BURST_PY" metrics "$DIR" e2e "http://127.0.0.1:$mport/metrics" || true
  fi
  local f
  for f in "$DIR"/tessera*.log; do
    check "$(basename "$f") has no 403 / forbidden" no_match 'HTTP 403|forbidden' "$f"
  done
  for f in "$DIR"/kube-scheduler*.log; do
    check "$(basename "$f") has no forbidden" no_match 'forbidden' "$f"
  done
}
