#!/usr/bin/env bash
# tools/bench_controlplane.sh — pods per second and creation-to-binding latency of the real
# kube-scheduler alone against the real kube-scheduler + Tessera (and optionally + HAMi's
# scheduler), in one control plane, alternating (issue #20; docs/benchmarks.md, "The real
# kube-scheduler"). Not a test: 1,000 nodes and 2,000 pods take minutes.
#
#   tools/bench_controlplane.sh [--nodes N] [--pods P] [--gpus G] [--rounds R]
#       [--columns "alone tessera"] [--tessera PATH] [--hami-bin VERSION=PATH]... [--keep]
#       [--results FILE] [--max-seconds S] [--stall S] [--tuned-args ARGS] [--hami-qps Q]
#       [--alone-tuned-qps Q] [--clients N] [--plugin-workers W] [--base-args ARGS]
#       [--register-cap S] [--register-format json|delimited] [--smoke]
#
# A run ends when every pod is bound, after --max-seconds (default 300), or after --stall
# seconds (default 90) without a binding; pods/s is then bound pods / elapsed time and a
# percentile that falls among the unbound pods is reported as ">end" (null in the JSON).
#
# Columns (each round runs them in order, the next round in reverse, and so on):
#   alone      stock kube-scheduler, deploy/base's configuration without the extender, profile
#              default-scheduler; the pods' namespace is labelled hami.io/webhook=ignore, so the
#              webhook leaves them alone; pods ask nvidia.com/gpu: 1, placed by count against the
#              nodes' allocatable.
#   alone-tuned  as alone, with kube-scheduler's clientConnection qps --alone-tuned-qps (default
#              500, burst twice that) instead of the default 50 that bounds its bindings.
#   tessera    kube-scheduler as `tools/controlplane.sh up` runs it (deploy/base's configuration:
#              Tessera as extender, leader election), the same pods given schedulerName
#              hami-scheduler by Tessera's webhook.
#   hami-VER   HAMi's scheduler (test/hami/VER, built by test/hami/build.sh, or --hami-bin) as
#              the extender of a kube-scheduler with deploy/base's configuration pointed at it;
#              the pods carry schedulerName hami-scheduler themselves (no webhook). HAMi runs
#              with the admin kubeconfig and, from v2.10 on, --kube-qps --hami-qps (default 500):
#              at its default 5 QPS it registers one node every ~2 s. Before its first round
#              the bed waits until HAMi has registered every node (its log's "Node device
#              added"), printing progress every 30 s, for at most --register-cap seconds
#              (default: 300 from v2.10 on; 120 s + 1.6 s per node for v2.5, whose client
#              has no QPS setting: its first pass stamps each node's NVIDIA and DCU handshake,
#              a GET and a PATCH each, 0.8 s per node at 5 QPS); when the next
#              round starts with the same HAMi column (rounds alternate), HAMi and its
#              kube-scheduler keep running, registered, instead of registering again.
#   With a hami-v2.5.* column (or --register-format delimited; the default is json otherwise)
#   the nodes get the delimited register annotation, and
#   `bench_controlplane.py handshakes` emulates every node's v2.5 device plugin for the whole
#   bench (all columns): registration and a `Reported <time>` handshake every 30 s per node,
#   1,000 nodes ~33 patches/s. Without it HAMi v2.5.2 drops every node 60 s after stamping it
#   `Requesting_<time>`, and Tessera's leader marks delimited nodes dead the same way.
#   tessera-tuned  as tessera, with Tessera restarted with deploy/base's flags plus --tuned-args
#              (default "--kube-qps 0 --node-scheduler-policy spread"): an explicitly tuned row;
#              Tessera is restarted with deploy/base's flags for the next tessera column.
#              --base-args ARGS adds ARGS to the tessera column's flags (not to tessera-tuned's),
#              so that two settings of Tessera alternate in one run.
# Every GPU pod bound through the HAMi protocol holds its node's lock until the device plugin's
# Allocate releases it; tools/bench_controlplane.py emulates that part of the plugin for every
# node (in every column, so its cost is on both sides), with --plugin-workers (default 64)
# releases in flight at once: a real cluster has one plugin per node, and 8 (the first
# version) held every lock for seconds and capped a burst at ~25 pods/s. --clients (default
# 32) creating clients: 8 made creation through the webhook the limit.
#
# --smoke is 20 nodes, 40 pods, one round of alone and tessera, checked: exit 0 when every pod
# was bound in both columns, 1 otherwise, 77 when a tool is missing. Everything binds
# 127.0.0.1; everything started is stopped on any exit, and nothing may survive.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CP="$ROOT/tools/controlplane.sh"
PY="$ROOT/tools/bench_controlplane.py"
NODES=1000 PODS=2000 GPUS=4 ROUNDS=3 COLUMNS="alone tessera" TESSERA="" KEEP=0 RESULTS="" SMOKE=0
CLIENTS=32 PLUGIN_WORKERS=64 STALL=90 SCHED_PORT=0 MAX_SECONDS=300
TUNED_ARGS="--kube-qps 0 --node-scheduler-policy spread" BASE_ARGS="" HAMI_QPS=500 ALONE_TUNED_QPS=500
REGISTER_CAP="" REGISTER_FORMAT=""
declare -A HAMI_BIN=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --nodes) NODES="${2:?}"; shift 2 ;;
    --pods) PODS="${2:?}"; shift 2 ;;
    --gpus) GPUS="${2:?}"; shift 2 ;;
    --rounds) ROUNDS="${2:?}"; shift 2 ;;
    --columns) COLUMNS="${2:?}"; shift 2 ;;
    --clients) CLIENTS="${2:?}"; shift 2 ;;
    --plugin-workers) PLUGIN_WORKERS="${2:?}"; shift 2 ;;
    --stall) STALL="${2:?}"; shift 2 ;;   # a run gives up after this many seconds without a binding
    --max-seconds) MAX_SECONDS="${2:?}"; shift 2 ;;   # a run ends this long after it started
    --tuned-args) TUNED_ARGS="${2:?}"; shift 2 ;;
    --base-args) BASE_ARGS="${2:?}"; shift 2 ;;
    --hami-qps) HAMI_QPS="${2:?}"; shift 2 ;;
    --alone-tuned-qps) ALONE_TUNED_QPS="${2:?}"; shift 2 ;;
    --register-cap) REGISTER_CAP="${2:?}"; shift 2 ;;
    --register-format) REGISTER_FORMAT="${2:?}"; shift 2 ;;
    --tessera) TESSERA="${2:?}"; shift 2 ;;
    --hami-bin) HAMI_BIN["${2%%=*}"]="${2#*=}"; shift 2 ;;
    --results) RESULTS="${2:?}"; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --smoke) SMOKE=1; NODES=20; PODS=40; ROUNDS=1; COLUMNS="alone tessera"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | grep '^#' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench_controlplane.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done

log() { echo "bench: $*" >&2; }
fmt=json
[[ " $COLUMNS " == *" hami-v2.5."* ]] && fmt=legacy   # HAMi before v2.8 reads only that form
case "$REGISTER_FORMAT" in
  "") ;;
  delimited) fmt=legacy ;;
  json) [[ $fmt == json ]] || { log "--register-format json: HAMi v2.5 reads only the delimited form"; exit 2; } ;;
  *) log "--register-format: json or delimited, not $REGISTER_FORMAT"; exit 2 ;;
esac
skip_code=77
[[ "${TESSERA_E2E_REQUIRED:-0}" == 1 ]] && skip_code=1
for t in kubectl openssl python3 curl setsid ss; do
  command -v "$t" >/dev/null || { log "SKIP: $t is not on PATH"; exit "$skip_code"; }
done
python3 -c 'import yaml' 2>/dev/null || { log "SKIP: python3 has no yaml module"; exit "$skip_code"; }

BIN="$(timeout 1500 "$CP" build)"
DIR="$(mktemp -d "${TMPDIR:-/tmp}/tessera-bench.XXXXXX")"
[[ -n "$RESULTS" ]] || RESULTS="$DIR/results.jsonl"
: >"$RESULTS"
OURS=(kube-scheduler-alone kube-scheduler-hami hami)

# --- processes of our own (the pid-file and command-line checks of controlplane.sh) ----------
alive() { # alive NAME
  local f="$DIR/$1.pid" pid
  [[ -f "$f" ]] || return 1
  pid="$(cat "$f")"
  local cmdline
  cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1   # it may exit meanwhile
  [[ "$cmdline" == *"$DIR"* ]] || return 1
  [[ "$(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null)" != Z ]]
}
start() { # start NAME CMD...
  local name="$1"; shift
  setsid "$@" </dev/null >>"$DIR/$name.log" 2>&1 &
  echo $! >"$DIR/$name.pid"
}
stop() { # stop NAME: TERM, KILL after 10 s; also for up's kube-scheduler (same pid-file layout)
  local name="$1" pid i
  alive "$name" || { rm -f "$DIR/$name.pid"; return 0; }
  pid="$(cat "$DIR/$name.pid")"
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do alive "$name" || break; sleep 0.1; done
  if alive "$name"; then kill -KILL "$pid" 2>/dev/null || true; sleep 0.5; fi
  rm -f "$DIR/$name.pid"
}
wait_for() { # wait_for SECONDS WHAT CMD...
  local secs="$1" what="$2"; shift 2
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || { log "FAIL: $what: not within ${secs}s"; return 1; }
    sleep 0.2
  done
}

teardown() {
  local rc=$? n j
  trap - EXIT INT TERM
  for j in $(jobs -p); do kill -TERM "$j" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for n in "${OURS[@]}" handshakes; do stop "$n"; done
  "$CP" down "$DIR" >/dev/null 2>&1 || rc=1
  if pgrep -f -- "$DIR([/ ]|\$)" >/dev/null; then
    log "FAIL: processes of $DIR survive: $(pgrep -f -a -- "$DIR([/ ]|\$)" | tr '\n' ';')"; rc=1
  fi
  if [[ $rc == 0 && $KEEP == 0 ]]; then
    [[ "$RESULTS" == "$DIR/"* ]] && { log "results:"; cat "$RESULTS" >&2; }
    rm -rf "$DIR"
  else
    log "logs and results in $DIR"
  fi
  exit $rc
}
trap teardown EXIT
trap 'exit 130' INT TERM

# --- control plane, nodes ---------------------------------------------------------------------
log "control plane in $DIR"
up_args=(--bin-dir "$BIN")
[[ -n "$TESSERA" ]] && up_args+=(--tessera "$TESSERA")
timeout 240 "$CP" up "${up_args[@]}" "$DIR" >/dev/null
# shellcheck disable=SC1091
source "$DIR/env"
export KUBECONFIG
log "creating $NODES nodes with $GPUS GPUs each ($fmt register annotation)"
python3 "$PY" nodes --dir "$DIR" --nodes "$NODES" --gpus "$GPUS" --format "$fmt" >&2 &
wait $!
if [[ $fmt == legacy ]]; then
  start handshakes python3 "$PY" handshakes --dir "$DIR"
  wait_for 30 "the emulated v2.5 device plugins' first report line" grep -q 'nodes, a report each' "$DIR/handshakes.log"
fi
metric() { curl -fsS --max-time 2 "http://127.0.0.1:$TESSERA_METRICS_PORT/metrics"; }
ledger_nodes() { # Tessera's ledger knows every node's GPUs
  [[ "$(metric | grep -c '^hami_gpu_memory_limit_bytes{')" -ge $((NODES * GPUS)) ]]
}
wait_for 120 "Tessera's /metrics lists every GPU" ledger_nodes
stop kube-scheduler   # every column starts the kube-scheduler it needs

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}
ready() { # ready PORT: a kube-scheduler's /readyz (its informers synced, handlers registered)
  curl -fsSk --max-time 2 "https://127.0.0.1:$1/readyz"
}
tessera_leads() {
  metric | grep -qx 'tessera_leader 1' &&
    curl -fsS --max-time 2 --cacert "$DIR/ca.crt" "https://127.0.0.1:$TESSERA_PORT/readyz"
}
start_kube_scheduler() { # start_kube_scheduler NAME CONFIG: one of our own kube-schedulers
  local name="$1" config="$2" port
  port="$(free_port)"
  mkdir -p "$DIR/$name-certs"
  start "$name" "$BIN/kube-scheduler" --config="$config" --bind-address=127.0.0.1 \
    --secure-port="$port" --cert-dir="$DIR/$name-certs" \
    --authentication-kubeconfig="$DIR/scheduler.kubeconfig" \
    --authorization-kubeconfig="$DIR/scheduler.kubeconfig"
  SCHED_PORT="$port"
  wait_for 60 "$name /readyz" ready "$port"
}
hami_bin() { # hami_bin VERSION: the binary (built by test/hami/build.sh unless given)
  local v="$1"
  if [[ -n "${HAMI_BIN[$v]:-}" ]]; then echo "${HAMI_BIN[$v]}"; return; fi
  timeout 1500 "$ROOT/test/hami/build.sh" "$v"
}

TESSERA_EXTRA=""
set_tessera_args() { # set_tessera_args "ARGS": restart Tessera with deploy/base's flags plus ARGS
  local want="$1"
  [[ "$want" == "$TESSERA_EXTRA" ]] && return 0
  [[ -f "$DIR/tessera.cmd.base" ]] || cp "$DIR/tessera.cmd" "$DIR/tessera.cmd.base"
  cp "$DIR/tessera.cmd.base" "$DIR/tessera.cmd"
  [[ -n "$want" ]] && printf -- '%s ' "$want" >>"$DIR/tessera.cmd"
  TESSERA_EXTRA="$want"
  # restart gives a program 5 s to exec; at a load of 60 on 2 cores that can pass while the
  # program does start: its /healthz decides.
  "$CP" restart "$DIR" tessera >/dev/null || log "restart of tessera reported a failure; waiting for /healthz"
  wait_for 60 "tessera serve /healthz after the restart" \
    curl -fsS --max-time 2 --cacert "$DIR/ca.crt" "https://127.0.0.1:$TESSERA_PORT/healthz"
}

hami_registered() { # hami_registered VERSION: wait until HAMi's log says every node was added
  local v="$1" cap="$REGISTER_CAP" t0=$SECONDS next=$((SECONDS + 30)) n=0 dropped
  [[ -n "$cap" ]] || { cap=300; [[ "$v" == v2.5.* ]] && cap=$((120 + NODES * 16 / 10)); }
  log "HAMi $v: waiting for it to register $NODES nodes (at most ${cap}s)"
  while :; do
    n="$(grep -c 'Node device added' "$DIR/hami.log" || true)"
    ((n >= NODES)) && break
    alive hami || { log "FAIL: HAMi $v exited while registering ($n of $NODES nodes); see $DIR/hami.log"; return 1; }
    if ((SECONDS - t0 >= cap)); then
      log "FAIL: HAMi $v registered $n of $NODES nodes in ${cap}s (--register-cap)"; return 1
    fi
    if ((SECONDS >= next)); then
      dropped="$(grep -c 'Removing device from node.*deviceVendor="NVIDIA"' "$DIR/hami.log" || true)"
      log "HAMi $v: $n of $NODES nodes registered after $((SECONDS - t0))s, $dropped dropped for a late handshake"
      next=$((SECONDS + 30))
    fi
    sleep 1
  done
  log "HAMi $v: all $NODES nodes registered in $((SECONDS - t0))s"
}

ACTIVE=""
activate() { # activate COLUMN: stop every kube-scheduler and extender, start the column's
  local col="$1" n
  if [[ "$col" == hami-* && "$col" == "$ACTIVE" ]] && alive hami && alive kube-scheduler-hami; then
    log "$col: HAMi and its kube-scheduler keep running from the previous round (registered)"
    return 0
  fi
  ACTIVE=""
  for n in kube-scheduler "${OURS[@]}"; do stop "$n"; done
  case "$col" in
    alone|alone-tuned)
      local q=()
      [[ "$col" == alone-tuned ]] && q=(--qps "$ALONE_TUNED_QPS")
      python3 "$PY" config --dir "$DIR" --variant alone "${q[@]}" >"$DIR/scheduler-config-alone.yaml"
      start_kube_scheduler kube-scheduler-alone "$DIR/scheduler-config-alone.yaml" || return 1 ;;
    tessera|tessera-tuned)
      if [[ "$col" == tessera-tuned ]]; then set_tessera_args "$TUNED_ARGS"; else set_tessera_args "$BASE_ARGS"; fi || return 1
      "$CP" restart "$DIR" kube-scheduler >/dev/null || log "restart of kube-scheduler reported a failure; waiting for /readyz"
      SCHED_PORT="$SCHEDULER_PORT"
      wait_for 60 "kube-scheduler /readyz" ready "$SCHEDULER_PORT" || return 1
      wait_for 60 "Tessera leading (it follows kube-scheduler's Lease) and ready" tessera_leads || return 1 ;;
    hami-*)
      local v="${col#hami-}" bin port
      bin="$(hami_bin "$v")" || return 1
      port="$(free_port)"
      # HAMi's scheduler with the admin kubeconfig: v2.10 also lists ResourceQuotas, which
      # deploy/base's RBAC (Tessera's) does not grant, and HAMi's own chart is not applied here.
      local extra=()
      # HAMi's client runs at client-go's default 5 QPS (its chart sets no --kube-qps), at which
      # it registers one node every ~2 s; v2.10's flag raises it (HAMI_QPS), v2.5.2 has none.
      [[ "$v" != v2.5.* ]] && extra=(--kube-qps "$HAMI_QPS" --kube-burst "$((2 * HAMI_QPS))")
      : >"$DIR/hami.log"
      start hami env KUBECONFIG="$DIR/kubeconfig" "$bin" --http_bind "127.0.0.1:$port" \
        --scheduler-name hami-scheduler --device-config-file "$DIR/device-config.yaml" -v=1 \
        "${extra[@]}"
      wait_for 60 "HAMi /healthz" curl -fsS --max-time 2 "http://127.0.0.1:$port/healthz" || return 1
      hami_registered "$v" || return 1
      python3 "$PY" config --dir "$DIR" --variant extender --url "http://127.0.0.1:$port" \
        >"$DIR/scheduler-config-hami.yaml"
      start_kube_scheduler kube-scheduler-hami "$DIR/scheduler-config-hami.yaml" || return 1 ;;
    *) log "unknown column $col"; return 1 ;;
  esac
  ACTIVE="$col"
}

run_column() { # run_column COLUMN ROUND
  local col="$1" r="$2" ns="bench-${1//./-}-$2" args=()
  case "$col" in
    alone|alone-tuned) args=(--bypass-webhook) ;;
    hami-*) args=(--bypass-webhook --scheduler-name hami-scheduler) ;;
  esac
  activate "$col" || { log "FAIL: round $r $col: could not start the column's schedulers"; return 1; }
  log "round $r: $col ($PODS pods)"
  local rc=0
  # In the background and waited for, so that INT/TERM reach the trap at once.
  python3 "$PY" run --dir "$DIR" --namespace "$ns" --column "$col" --pods "$PODS" \
    --clients "$CLIENTS" --plugin-workers "$PLUGIN_WORKERS" --timeout "$MAX_SECONDS" --stall "$STALL" --scheduler-port "$SCHED_PORT" \
    "${args[@]}" >>"$RESULTS" &
  wait $! || rc=$?
  tail -n 1 "$RESULTS" >&2
  ((rc == 0)) || log "FAIL: round $r $col: not every pod was bound (rc $rc)"
  python3 "$PY" clean --dir "$DIR" --namespace "$ns" >&2 &
  wait $!
  return $rc
}

read -r -a cols <<<"$COLUMNS"
failed=0
for ((r = 1; r <= ROUNDS; r++)); do
  order=("${cols[@]}")
  if ((r % 2 == 0)); then
    order=()
    for ((i = ${#cols[@]} - 1; i >= 0; i--)); do order+=("${cols[i]}"); done
  fi
  for c in "${order[@]}"; do run_column "$c" "$r" || failed=1; done
done
for n in kube-scheduler "${OURS[@]}" handshakes; do stop "$n"; done
[[ -f "$DIR/handshakes.log" ]] && log "emulated v2.5 plugins, last line: $(tail -n 1 "$DIR/handshakes.log")"
python3 "$PY" summary "$RESULTS"
echo "machine: $(nproc) cores, $(uname -r), load average $(cut -d' ' -f1-3 /proc/loadavg)"
exit $failed
