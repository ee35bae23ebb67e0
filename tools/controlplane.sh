#!/usr/bin/env bash
# tools/controlplane.sh — build and run a stock Kubernetes control plane on 127.0.0.1 with
# Tessera inside it (issue #20). See docs/e2e.md and `tools/controlplane.sh --help`.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
MODULE="$ROOT/test/controlplane"
CACHE_ROOT="${TESSERA_CONTROLPLANE_CACHE:-$HOME/.cache/tessera/controlplane}"

die() { echo "controlplane.sh: error: $*" >&2; exit 1; }
log() { echo "controlplane.sh: $*" >&2; }

# The release to build: test/controlplane's go.mod and go.sum pin the default one; another one
# (build --kubernetes NAME, or $TESSERA_K8S) is test/controlplane/k8s/NAME's go.mod and go.sum
# over the same cmd/. A `toolchain` line there names the Go the release needs (GOTOOLCHAIN).
MODFILES="$MODULE"
select_release() {
  MODFILES="$MODULE"
  if [[ -n "$1" ]]; then
    MODFILES="$MODULE/k8s/$1"
    [[ -f "$MODFILES/go.mod" ]] || die "no release $1: $MODFILES/go.mod does not exist (releases: $(ls "$MODULE/k8s" 2>/dev/null | tr '\n' ' '))"
  fi
  # The Kubernetes release (stamped into the binaries' --version), pre-release suffix included.
  K8S_VERSION="$(sed -n 's|^[[:space:]]*k8s.io/kubernetes \(v[0-9][0-9a-z.-]*\).*|\1|p' "$MODFILES/go.mod" | head -n 1)"
  TOOLCHAIN="$(sed -n 's/^toolchain //p' "$MODFILES/go.mod")"
}
select_release "${TESSERA_K8S:-}"

# The cache key: a hash of everything that decides what the binaries are.
cache_key() {
  (cat "$MODFILES/go.mod" "$MODFILES/go.sum" && cd "$MODULE" &&
   cat $(find cmd -name '*.go' | LC_ALL=C sort) && echo "$K8S_VERSION") \
    | sha256sum | cut -c1-16
}

cmd_build() {
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --kubernetes) select_release "${2:?--kubernetes needs a release name}"; shift 2 ;;
      *) die "build: unknown argument $1" ;;
    esac
  done
  [[ -n "$K8S_VERSION" ]] || die "no k8s.io/kubernetes requirement in $MODFILES/go.mod"
  local dir="$CACHE_ROOT/$(cache_key)"
  if [[ -x "$dir/etcd" && -x "$dir/kube-apiserver" && -x "$dir/kube-scheduler" ]]; then
    echo "$dir"; return 0
  fi
  command -v go >/dev/null || die "go is not on PATH; install Go ($(sed -n 's/^go //p' "$MODFILES/go.mod") or newer)"
  mkdir -p "$CACHE_ROOT"
  local tmp; tmp="$(mktemp -d "$CACHE_ROOT/.build.XXXXXX")"
  # Another release builds in a copy of the module with its own go.mod and go.sum.
  local src="$MODULE"
  if [[ "$MODFILES" != "$MODULE" ]]; then
    src="$tmp/src"; mkdir -p "$src"
    cp "$MODFILES/go.mod" "$MODFILES/go.sum" "$src/"; cp -r "$MODULE/cmd" "$src/"
  fi
  log "building etcd, kube-apiserver, kube-scheduler ($K8S_VERSION${TOOLCHAIN:+, Go $TOOLCHAIN from the module proxy}) into $dir (first build takes minutes)"
  local minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
  if ! (cd "$src" && ${TOOLCHAIN:+env GOTOOLCHAIN=$TOOLCHAIN} nice -n 10 go build -trimpath \
        -ldflags "-X k8s.io/component-base/version.gitVersion=$K8S_VERSION -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor" \
        -o "$tmp/" ./cmd/...); then
    rm -rf "$tmp"; die "go build of $MODFILES failed (see the output above)"
  fi
  rm -rf "$tmp/src"
  rm -rf "$dir"
  # A build running in parallel may have got there first; its binaries are the same.
  mv -T "$tmp" "$dir" 2>/dev/null || rm -rf "$tmp"
  echo "$dir"
}

# ---------------------------------------------------------------------------------------------
# up / down

# The processes of a control plane, in start order; `down` stops them in reverse.
PROCS=(etcd kube-apiserver tessera kube-scheduler emulators)
STOP_TIMEOUT="${TESSERA_CONTROLPLANE_STOP_TIMEOUT:-10}"   # seconds between TERM and KILL

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1]); s.close()'
}

# start NAME CMD...: runs CMD in its own session, detached from our stdio, log to DIR/NAME.log.
start() {
  local name="$1"; shift
  # The command line, for `restart` (shell-quoted).
  printf '%q ' "$@" >"$DIR/$name.cmd"
  setsid "$@" </dev/null >>"$DIR/$name.log" 2>&1 &
  local pid=$! i
  echo "$pid" >"$DIR/$name.pid"
  # Until the forked shell has exec'd the program, its command line is still this script's and
  # alive() would not recognise it: wait for the exec (or the exit) before going on.
  for ((i = 0; i < 100; i++)); do
    alive "$name" && return 0
    kill -0 "$pid" 2>/dev/null || return 0
    sleep 0.05
  done
}

# alive NAME: the process recorded in DIR/NAME.pid is running and is still ours.
alive() {
  local pidfile="$DIR/$1.pid" pid
  [[ -f "$pidfile" ]] || return 1
  pid="$(cat "$pidfile")"
  [[ -n "$pid" && -r "/proc/$pid/cmdline" ]] || return 1
  # Guard against a recycled pid: the command line must name this control plane's directory
  # and the process name (every process gets a path under DIR on its command line).
  local cmdline state i
  for ((i = 0; i < 20; i++)); do
    state="$(sed -n 's/.*) \([A-Za-z]\) .*/\1/p' "/proc/$pid/stat" 2>/dev/null)" || return 1
    [[ -n "$state" && "$state" != Z ]] || return 1
    cmdline="$(tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline")" || return 1
    # The command line reads empty while the process is inside execve (its new memory is mapped,
    # its arguments not yet), which the chains setsid → program and unshare → sh → program,
    # and tessera's own re-execution, go through at start: look again, do not call it gone.
    [[ -n "$cmdline" ]] && break
    sleep 0.05
  done
  [[ "$cmdline" == *"$1"* && "$cmdline" == *"$DIR"* ]]
}

stop_one() { # stop_one NAME [SIGNAL]: SIGNAL (default TERM), then KILL after STOP_TIMEOUT
  local name="$1" sig="${2:-TERM}" pid i
  if alive "$name"; then
    pid="$(cat "$DIR/$name.pid")"
    local ports
    ports="$(ss -ltnpH 2>/dev/null | grep "pid=$pid," | awk '{n = split($4, a, ":"); print a[n]}' || true)"
    kill -"$sig" "$pid" 2>/dev/null || true
    for ((i = 0; i < STOP_TIMEOUT * 10; i++)); do
      alive "$name" || break
      sleep 0.1
    done
    if alive "$name"; then
      log "$name (pid $pid) did not stop within ${STOP_TIMEOUT}s of SIGTERM; sending SIGKILL"
      kill -KILL "$pid" 2>/dev/null || true
      for ((i = 0; i < 50; i++)); do alive "$name" || break; sleep 0.1; done
    fi
    alive "$name" && { log "$name (pid $pid) survived SIGKILL"; return 1; }
    # The kernel closes a dead process's listening sockets a little after it turns zombie:
    # wait (bounded) until its ports are free, so that a restart can bind them again.
    local port
    for port in $ports; do
      for ((i = 0; i < 100; i++)); do
        [[ -z "$(ss -ltnH "sport = :$port" 2>/dev/null)" ]] && break
        sleep 0.1
      done
    done
  fi
  rm -f "$DIR/$name.pid"
}

# --- replicas (up --replicas N) ---------------------------------------------------------------
# Pair I (I >= 2) is tessera-I + kube-scheduler-I. all_procs: PROCS, then the other pairs' and
# webhook-service that DIR has command lines for (down stops them first).
all_procs() {
  local f n tesseras=() schedulers=()
  for f in "$DIR"/tessera-[0-9]*.cmd; do
    [[ -e "$f" ]] || continue
    n="$(basename "$f" .cmd)"; n="${n#tessera-}"
    tesseras+=("tessera-$n"); schedulers+=("kube-scheduler-$n")
  done
  local service=(); [[ -e "$DIR/webhook-service.cmd" ]] && service=(webhook-service)
  echo "${PROCS[@]}" "${tesseras[@]}" "${service[@]}" "${schedulers[@]}"
}
# The host name of pair I when there are several: like a pod's, it differs per replica.
replica_host() { echo "tessera-replica-$1"; }
# host_prefix I: sets HOST_PREFIX, the command prefix of pair I. One pair runs as before, under
# the machine's host name. With several, each pair runs in a UTS namespace of its own whose host
# name is replica_host I, as each replica of deploy/base's pod has its own: kube-scheduler's
# Lease identity is then `<that host>_<uuid>` and Tessera (follow mode, identity = host name)
# leads exactly when its own kube-scheduler holds the Lease. Needs root (unshare --uts).
host_prefix() {
  HOST_PREFIX=()
  ((REPLICAS > 1)) || return 0
  # shellcheck disable=SC2016  # $0 and $@ belong to the inner shell
  HOST_PREFIX=(unshare --uts /bin/sh -c 'hostname "$0" && exec "$@"' "$(replica_host "$1")")
}
# start_tessera NAME PORT METRICS_PORT KUBECONFIG: tessera serve of one pair.
start_tessera() {
  start "$1" ${HOST_PREFIX[@]+"${HOST_PREFIX[@]}"} "$TESSERA_BIN" serve \
    --kubeconfig "$4" \
    --http_bind "127.0.0.1:$2" \
    --cert_file "$DIR/tessera.crt" --key_file "$DIR/tessera.key" \
    --metrics-bind-address "127.0.0.1:$3" \
    --scheduler-name hami-scheduler \
    --device-config-file "$DIR/device-config.yaml" \
    --leader-elect-resource-name hami-scheduler \
    --leader-elect-resource-namespace tessera-system ${SERVE_ARGS[@]+"${SERVE_ARGS[@]}"}
  wait_for "$1 /healthz" 30 "$1" \
    curl -fsS --max-time 2 --cacert "$DIR/ca.crt" "https://127.0.0.1:$2/healthz"
}
# start_scheduler NAME CONFIG PORT CERT_DIR KUBECONFIG: kube-scheduler of one pair.
start_scheduler() {
  start "$1" ${HOST_PREFIX[@]+"${HOST_PREFIX[@]}"} "$BINDIR/kube-scheduler" \
    --config="$2" \
    --bind-address=127.0.0.1 --secure-port="$3" \
    --cert-dir="$4" \
    --authentication-kubeconfig="$5" \
    --authorization-kubeconfig="$5"
}
# roles_agree: the Lease has a holder, and the Tessera of the holder's pair says "role: leader"
# in /readyz while every other Tessera says "role: follower".
roles_agree() {
  local holder host i port body
  holder="$(kc -n tessera-system get lease hami-scheduler -o jsonpath='{.spec.holderIdentity}')" || return 1
  [[ -n "$holder" ]] || return 1
  host="${holder%_*}"
  for ((i = 1; i <= REPLICAS; i++)); do
    port="$TESSERA_PORT"; ((i > 1)) && port="${TESSERA_PORTS[i]}"
    body="$(curl -fsS --max-time 2 --cacert "$DIR/ca.crt" "https://127.0.0.1:$port/readyz")" || return 1
    if [[ "$host" == "$(replica_host "$i")" ]]; then
      [[ "$body" == *"role: leader"* ]] || return 1
    else
      [[ "$body" == *"role: follower"* ]] || return 1
    fi
  done
}
# ---------------------------------------------------------------------------------------------

cmd_down() {
  DIR="${1:?usage: tools/controlplane.sh down DIR}"
  [[ -d "$DIR" ]] || die "$DIR is not a directory"
  DIR="$(cd "$DIR" && pwd)"
  local rc=0 i procs
  read -r -a procs <<<"$(all_procs)"
  for ((i = ${#procs[@]} - 1; i >= 0; i--)); do
    stop_one "${procs[i]}" || rc=1
  done
  [[ $rc == 0 ]] && log "stopped the control plane in $DIR"
  return $rc
}

# restart [--kill] DIR NAME: stop one process of a running control plane and start it again with the same
# command line (its log continues), e.g. kube-apiserver to sever every watch at once.
cmd_restart() {
  local sig=TERM
  if [[ "${1:-}" == --kill ]]; then sig=KILL; shift; fi
  DIR="${1:?usage: tools/controlplane.sh restart [--kill] DIR NAME}"
  local name="${2:?usage: tools/controlplane.sh restart [--kill] DIR NAME}"
  DIR="$(cd "$DIR" && pwd)"
  [[ -f "$DIR/$name.cmd" ]] || die "$DIR/$name.cmd is missing: was $name started by up in $DIR?"
  stop_one "$name" "$sig" || die "could not stop $name"
  local -a argv
  eval "argv=($(cat "$DIR/$name.cmd"))"
  echo "--- restarted by tools/controlplane.sh restart" >>"$DIR/$name.log"
  start "$name" "${argv[@]}"
  alive "$name" || die "$name exited at once after the restart: read $DIR/$name.log"
  log "restarted $name (pid $(cat "$DIR/$name.pid"))"
}

# wait_for WHAT SECONDS LOG CMD...: retries CMD every 0.2 s until it succeeds.
wait_for() {
  local what="$1" secs="$2" logname="$3"; shift 3
  local deadline=$((SECONDS + secs))
  until "$@" >/dev/null 2>&1; do
    if [[ -n "$logname" ]] && ! alive "$logname"; then
      fail "$logname exited while waiting for $what" "$DIR/$logname.log"
    fi
    ((SECONDS < deadline)) || fail "$what: not within ${secs}s" "${logname:+$DIR/$logname.log}"
    sleep 0.2
  done
}

STEP=""
fail() {
  local msg="$1" logfile="${2:-}"
  echo "controlplane.sh: up failed at step \"$STEP\": $msg" >&2
  if [[ -n "$logfile" && -f "$logfile" ]]; then
    echo "controlplane.sh: read $logfile; its last lines:" >&2
    tail -n 15 "$logfile" | sed 's/^/    /' >&2
  fi
  exit 1
}

step() { STEP="$1"; log "$1"; }

kc() { kubectl --kubeconfig "$DIR/kubeconfig" --request-timeout=20s "$@"; }

# cert NAME CN O SAN EXTKU: a key and a certificate signed by DIR/ca.crt.
cert() {
  local name="$1" cn="$2" org="$3" san="$4" eku="$5"
  local subj="/CN=$cn"; [[ -n "$org" ]] && subj="/O=$org$subj"
  openssl req -new -newkey rsa:2048 -nodes -keyout "$DIR/$name.key" -subj "$subj" \
    -out "$DIR/$name.csr" 2>/dev/null
  {
    echo "basicConstraints=CA:FALSE"
    echo "keyUsage=critical,digitalSignature,keyEncipherment"
    echo "extendedKeyUsage=$eku"
    [[ -n "$san" ]] && echo "subjectAltName=$san"
  } >"$DIR/$name.ext"
  openssl x509 -req -in "$DIR/$name.csr" -CA "$DIR/ca.crt" -CAkey "$DIR/ca.key" \
    -CAcreateserial -days 7 -sha256 -extfile "$DIR/$name.ext" -out "$DIR/$name.crt" 2>/dev/null
  rm -f "$DIR/$name.csr" "$DIR/$name.ext"
}

# kubeconfig FILE then the credentials as kubectl config set-credentials flags.
write_kubeconfig() {
  local file="$1"; shift
  rm -f "$file"
  kubectl config --kubeconfig "$file" set-cluster local --server "https://127.0.0.1:$APISERVER_PORT" \
    --certificate-authority "$DIR/ca.crt" --embed-certs=true >/dev/null
  kubectl config --kubeconfig "$file" set-credentials user "$@" >/dev/null
  kubectl config --kubeconfig "$file" set-context local --cluster local --user user >/dev/null
  kubectl config --kubeconfig "$file" use-context local >/dev/null
}

find_tessera() {
  if [[ -n "${TESSERA_BIN:-}" ]]; then
    [[ -x "$TESSERA_BIN" ]] || die "TESSERA_BIN=$TESSERA_BIN is not an executable"
    echo "$TESSERA_BIN"; return
  fi
  local b
  for b in "$ROOT/build/dev/cmd/tessera/tessera" "$ROOT/build/release/cmd/tessera/tessera"; do
    [[ -x "$b" ]] && { echo "$b"; return; }
  done
  die "no tessera binary: build one (cmake --preset dev && cmake --build --preset dev --target tessera) or pass --tessera PATH / TESSERA_BIN"
}

cmd_up() {
  local compaction="" bindir="" tessera="" cluster="" i
  REPLICAS=1
  SERVE_ARGS=()
  while [[ $# -gt 0 ]]; do
    case "$1" in
      --serve-arg) SERVE_ARGS+=("${2:?}"); shift 2 ;;
      --serve-arg=*) SERVE_ARGS+=("${1#*=}"); shift ;;
      --etcd-compaction-interval) compaction="${2:?}"; shift 2 ;;
      --etcd-compaction-interval=*) compaction="${1#*=}"; shift ;;
      --tessera) tessera="${2:?}"; shift 2 ;;
      --tessera=*) tessera="${1#*=}"; shift ;;
      --bin-dir) bindir="${2:?}"; shift 2 ;;
      --bin-dir=*) bindir="${1#*=}"; shift ;;
      --replicas) REPLICAS="${2:?}"; shift 2 ;;
      --replicas=*) REPLICAS="${1#*=}"; shift ;;
      --cluster) cluster="${2:?}"; shift 2 ;;
      --cluster=*) cluster="${1#*=}"; shift ;;
      -*) die "up: unknown option $1 (see --help)" ;;
      *) [[ -z "${DIR:-}" ]] || die "up: one DIR only"; DIR="$1"; shift ;;
    esac
  done
  [[ -n "${DIR:-}" ]] || die "usage: tools/controlplane.sh up [options] DIR"
  [[ "$REPLICAS" =~ ^[1-9]$ ]] || die "up: --replicas takes 1 to 9, not $REPLICAS"
  if ((REPLICAS > 1)); then
    unshare --uts true 2>/dev/null \
      || die "up: --replicas $REPLICAS runs each pair in its own UTS namespace (unshare --uts), which needs root"
  fi
  for t in kubectl openssl python3 curl setsid ss; do
    command -v "$t" >/dev/null || die "$t is not on PATH"
  done
  [[ -n "$tessera" ]] && TESSERA_BIN="$tessera"
  TESSERA_BIN="$(find_tessera)"
  TESSERA_BIN="$(cd "$(dirname "$TESSERA_BIN")" && pwd)/$(basename "$TESSERA_BIN")"
  # A bad cluster file stops up before anything starts (tessera emulate --check names the error).
  if [[ -n "$cluster" ]]; then
    [[ -r "$cluster" ]] || die "--cluster $cluster: no such readable file"
    cluster="$(cd "$(dirname "$cluster")" && pwd)/$(basename "$cluster")"
    "$TESSERA_BIN" emulate --check --cluster "$cluster" >/dev/null || die "--cluster $cluster is not a usable cluster file (above)"
  fi
  [[ -n "$bindir" ]] || bindir="${TESSERA_CONTROLPLANE_BIN:-}"
  [[ -n "$bindir" ]] || bindir="$(cmd_build)"
  for b in etcd kube-apiserver kube-scheduler; do
    [[ -x "$bindir/$b" ]] || die "$bindir/$b is missing: run tools/controlplane.sh build"
  done

  mkdir -p "$DIR"
  DIR="$(cd "$DIR" && pwd)"
  for p in $(all_procs); do
    alive "$p" && die "$p is already running from $DIR (pid $(cat "$DIR/$p.pid")): run tools/controlplane.sh down $DIR first"
  done
  # A DIR from an earlier run starts from scratch (etcd's member would remember old ports).
  rm -rf "$DIR/etcd-data" "$DIR/apiserver-certs" "$DIR/scheduler-certs" "$DIR"/kube-scheduler-[0-9]*-certs
  rm -f "$DIR"/*.log "$DIR"/*.pid "$DIR"/*.cmd
  # From here on, a failure stops whatever was started.
  trap 'rc=$?; if [[ $rc != 0 ]]; then log "cleaning up after the failure"; cmd_down "$DIR" || true; fi' EXIT
  trap 'exit 130' INT TERM
  # Any other failing command names the step too.
  set -E
  trap 'fail "a command failed at tools/controlplane.sh line $LINENO: $BASH_COMMAND"' ERR

  step "choosing free ports on 127.0.0.1"
  ETCD_PORT="$(free_port)"; ETCD_PEER_PORT="$(free_port)"; APISERVER_PORT="$(free_port)"
  TESSERA_PORT="$(free_port)"; TESSERA_METRICS_PORT="$(free_port)"; SCHEDULER_PORT="$(free_port)"
  cat >"$DIR/env" <<ENV
# Written by tools/controlplane.sh up; source it for the ports and paths.
CONTROLPLANE_DIR=$DIR
ETCD_PORT=$ETCD_PORT
APISERVER_PORT=$APISERVER_PORT
TESSERA_PORT=$TESSERA_PORT
TESSERA_METRICS_PORT=$TESSERA_METRICS_PORT
SCHEDULER_PORT=$SCHEDULER_PORT
TESSERA_BIN=$TESSERA_BIN
CONTROLPLANE_BIN=$bindir
KUBECONFIG=$DIR/kubeconfig
SCHEDULER_NAME=hami-scheduler
TESSERA_NAMESPACE=tessera-system
ENV
  # --replicas: pair I >= 2 listens on TESSERA_PORT_I, TESSERA_METRICS_PORT_I, SCHEDULER_PORT_I.
  TESSERA_PORTS=(); TESSERA_METRICS_PORTS=(); SCHEDULER_PORTS=()
  {
    echo "REPLICAS=$REPLICAS"
    if ((REPLICAS > 1)); then
      for ((i = 1; i <= REPLICAS; i++)); do echo "REPLICA_HOST_$i=$(replica_host "$i")"; done
      WEBHOOK_SERVICE_PORT="$(free_port)"; echo "WEBHOOK_SERVICE_PORT=$WEBHOOK_SERVICE_PORT"
    fi
    for ((i = 2; i <= REPLICAS; i++)); do
      TESSERA_PORTS[i]="$(free_port)"; TESSERA_METRICS_PORTS[i]="$(free_port)"; SCHEDULER_PORTS[i]="$(free_port)"
      echo "TESSERA_PORT_$i=${TESSERA_PORTS[i]}"
      echo "TESSERA_METRICS_PORT_$i=${TESSERA_METRICS_PORTS[i]}"
      echo "SCHEDULER_PORT_$i=${SCHEDULER_PORTS[i]}"
    done
  } >>"$DIR/env"

  step "generating the CA, serving and client certificates and the service-account key pair"
  openssl req -x509 -newkey rsa:2048 -nodes -keyout "$DIR/ca.key" -out "$DIR/ca.crt" -days 7 \
    -subj "/CN=tessera-e2e-ca" -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null || fail "openssl could not make the CA"
  cert apiserver kube-apiserver "" "IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc" serverAuth
  cert tessera tessera "" "IP:127.0.0.1,DNS:localhost" serverAuth
  cert admin admin system:masters "" clientAuth
  cert front-proxy-client front-proxy-client "" "" clientAuth
  openssl genrsa -out "$DIR/sa.key" 2048 2>/dev/null
  openssl rsa -in "$DIR/sa.key" -pubout -out "$DIR/sa.pub" 2>/dev/null
  write_kubeconfig "$DIR/kubeconfig" --client-certificate "$DIR/admin.crt" \
    --client-key "$DIR/admin.key" --embed-certs=true

  step "starting etcd on 127.0.0.1:$ETCD_PORT"
  start etcd "$bindir/etcd" --name tessera-e2e --data-dir "$DIR/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$ETCD_PORT" --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
    --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
    --initial-cluster "tessera-e2e=http://127.0.0.1:$ETCD_PEER_PORT" \
    --quota-backend-bytes=2147483648 --unsafe-no-fsync
  wait_for "etcd /health" 30 etcd curl -fsS --max-time 2 "http://127.0.0.1:$ETCD_PORT/health"

  step "starting kube-apiserver on https://127.0.0.1:$APISERVER_PORT"
  local extra=()
  [[ -n "$compaction" ]] && extra+=("--etcd-compaction-interval=$compaction")
  start kube-apiserver "$bindir/kube-apiserver" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$APISERVER_PORT" \
    --etcd-servers="http://127.0.0.1:$ETCD_PORT" \
    --tls-cert-file="$DIR/apiserver.crt" --tls-private-key-file="$DIR/apiserver.key" \
    --client-ca-file="$DIR/ca.crt" \
    --requestheader-client-ca-file="$DIR/ca.crt" --requestheader-allowed-names=front-proxy-client \
    --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
    --requestheader-extra-headers-prefix=X-Remote-Extra- \
    --proxy-client-cert-file="$DIR/front-proxy-client.crt" \
    --proxy-client-key-file="$DIR/front-proxy-client.key" \
    --service-account-key-file="$DIR/sa.pub" --service-account-signing-key-file="$DIR/sa.key" \
    --service-account-issuer="https://127.0.0.1:$APISERVER_PORT" \
    --authorization-mode=Node,RBAC \
    --service-cluster-ip-range=10.96.0.0/16 \
    --cert-dir="$DIR/apiserver-certs" \
    --profiling=false \
    --endpoint-reconciler-type=none \
    "${extra[@]}"
  wait_for "kube-apiserver /readyz" 90 kube-apiserver \
    curl -fsS --max-time 2 --cacert "$DIR/ca.crt" --cert "$DIR/admin.crt" --key "$DIR/admin.key" \
      "https://127.0.0.1:$APISERVER_PORT/readyz"

  step "applying deploy/base's namespace, ServiceAccount, RBAC and ConfigMaps"
  kubectl kustomize "$ROOT/deploy/base" >"$DIR/deploy-base.yaml" 2>"$DIR/kustomize.log" \
    || fail "kubectl kustomize deploy/base failed" "$DIR/kustomize.log"
  python3 "$ROOT/tools/controlplane_manifests.py" split "$DIR/deploy-base.yaml" "$DIR" \
    >"$DIR/manifests.log" 2>&1 || fail "could not split deploy/base's manifests" "$DIR/manifests.log"
  # The RBAC objects reference the namespace: create it first, then the rest.
  kc apply -f "$DIR/base-namespace.yaml" >"$DIR/apply.log" 2>&1 \
    || fail "kubectl apply of the namespace failed" "$DIR/apply.log"
  kc apply -f "$DIR/base-apply.yaml" >>"$DIR/apply.log" 2>&1 \
    || fail "kubectl apply of deploy/base's RBAC failed" "$DIR/apply.log"

  step "minting a token for ServiceAccount tessera-system/tessera"
  local token
  token="$(kc create token tessera -n tessera-system --duration=24h 2>"$DIR/token.log")" \
    || fail "kubectl create token failed" "$DIR/token.log"
  write_kubeconfig "$DIR/tessera.kubeconfig" --token "$token"

  step "starting tessera serve on https://127.0.0.1:$TESSERA_PORT as ServiceAccount tessera"
  host_prefix 1
  start_tessera tessera "$TESSERA_PORT" "$TESSERA_METRICS_PORT" "$DIR/tessera.kubeconfig"

  local webhook_port="$TESSERA_PORT"
  if ((REPLICAS > 1)); then
    # deploy/base's webhook goes to the Service tessera-webhook, i.e. to any ready replica: a
    # local stand-in relays each connection to the next Tessera that accepts it.
    step "starting webhook-service on 127.0.0.1:$WEBHOOK_SERVICE_PORT (every Tessera in turn, as the Service tessera-webhook)"
    local backends=("127.0.0.1:$TESSERA_PORT")
    for ((i = 2; i <= REPLICAS; i++)); do backends+=("127.0.0.1:${TESSERA_PORTS[i]}"); done
    start webhook-service python3 "$ROOT/tools/controlplane_service.py" --tag "$DIR/webhook-service" \
      "127.0.0.1:$WEBHOOK_SERVICE_PORT" "${backends[@]}"
    wait_for "webhook-service listening" 10 webhook-service \
      bash -c "[[ -n \"\$(ss -ltnH 'sport = :$WEBHOOK_SERVICE_PORT')\" ]]"
    webhook_port="$WEBHOOK_SERVICE_PORT"
  fi
  step "registering Tessera's MutatingWebhookConfiguration (url https://127.0.0.1:$webhook_port/webhook)"
  python3 "$ROOT/tools/controlplane_manifests.py" webhook "$DIR/base-webhook.yaml" \
    "https://127.0.0.1:$webhook_port/webhook" "$DIR/ca.crt" >"$DIR/webhook.yaml" 2>"$DIR/manifests.log" \
    || fail "could not rewrite the webhook" "$DIR/manifests.log"
  kc apply -f "$DIR/webhook.yaml" >>"$DIR/apply.log" 2>&1 \
    || fail "kubectl apply of the MutatingWebhookConfiguration failed" "$DIR/apply.log"

  step "starting kube-scheduler (profile hami-scheduler) as ServiceAccount tessera"
  write_kubeconfig "$DIR/scheduler.kubeconfig" --token "$token"
  python3 "$ROOT/tools/controlplane_manifests.py" scheduler "$DIR/scheduler-config-base.yaml" \
    "https://127.0.0.1:$TESSERA_PORT" "$DIR/ca.crt" "$DIR/scheduler.kubeconfig" \
    >"$DIR/scheduler-config.yaml" 2>"$DIR/manifests.log" \
    || fail "could not rewrite the scheduler configuration" "$DIR/manifests.log"
  BINDIR="$bindir"
  start_scheduler kube-scheduler "$DIR/scheduler-config.yaml" "$SCHEDULER_PORT" "$DIR/scheduler-certs" \
    "$DIR/scheduler.kubeconfig"
  # --replicas: the other pairs, each kube-scheduler's extender being its own Tessera.
  for ((i = 2; i <= REPLICAS; i++)); do
    step "starting pair $i: tessera-$i on https://127.0.0.1:${TESSERA_PORTS[i]} and kube-scheduler-$i (host name $(replica_host "$i"))"
    host_prefix "$i"
    cp "$DIR/tessera.kubeconfig" "$DIR/tessera-$i.kubeconfig"
    start_tessera "tessera-$i" "${TESSERA_PORTS[i]}" "${TESSERA_METRICS_PORTS[i]}" "$DIR/tessera-$i.kubeconfig"
    python3 "$ROOT/tools/controlplane_manifests.py" scheduler "$DIR/scheduler-config-base.yaml" \
      "https://127.0.0.1:${TESSERA_PORTS[i]}" "$DIR/ca.crt" "$DIR/scheduler.kubeconfig" \
      >"$DIR/kube-scheduler-$i-config.yaml" 2>"$DIR/manifests.log" \
      || fail "could not rewrite the scheduler configuration of pair $i" "$DIR/manifests.log"
    start_scheduler "kube-scheduler-$i" "$DIR/kube-scheduler-$i-config.yaml" "${SCHEDULER_PORTS[i]}" \
      "$DIR/kube-scheduler-$i-certs" "$DIR/scheduler.kubeconfig"
  done
  wait_for "kube-scheduler holding the Lease tessera-system/hami-scheduler" 60 kube-scheduler \
    bash -c "[[ -n \"\$(kubectl --kubeconfig '$DIR/kubeconfig' --request-timeout=5s -n tessera-system get lease hami-scheduler -o jsonpath='{.spec.holderIdentity}')\" ]]"

  step "waiting for tessera serve /readyz"
  wait_for "tessera serve /readyz = 200" 60 tessera \
    curl -fsS --max-time 2 --cacert "$DIR/ca.crt" "https://127.0.0.1:$TESSERA_PORT/readyz"
  for ((i = 2; i <= REPLICAS; i++)); do
    wait_for "tessera-$i /readyz = 200" 60 "tessera-$i" \
      curl -fsS --max-time 2 --cacert "$DIR/ca.crt" "https://127.0.0.1:${TESSERA_PORTS[i]}/readyz"
  done
  if ((REPLICAS > 1)); then
    step "waiting until the Tessera of the Lease holder's pair leads and the others follow"
    wait_for "the Lease holder's Tessera reporting role: leader, the others follower" 30 "" roles_agree
  fi
  [[ -z "$cluster" ]] || start_emulators "$cluster"
  trap - EXIT
  echo ready
}

# start_emulators FILE: the nodes and pods of cluster file FILE on this control plane, their
# device plugins and kubelets emulated by `tessera emulate` (process `emulators`, admin
# kubeconfig); waits until every node of FILE is Ready and Tessera's /debug/ledger lists its GPUs.
start_emulators() {
  step "starting tessera emulate for the nodes and pods of $1"
  # A copy in DIR: the command line then names DIR and the process (alive(), restart).
  cp "$1" "$DIR/emulators-cluster.yaml"
  start emulators "$TESSERA_BIN" emulate --kubeconfig "$DIR/kubeconfig" \
    --cluster "$DIR/emulators-cluster.yaml"
  local nodes name uuids
  nodes="$("$TESSERA_BIN" emulate --check --cluster "$DIR/emulators-cluster.yaml" 2>/dev/null)"
  while read -r name uuids; do
    wait_for "node $name Ready" 60 emulators bash -c "[[ \"\$(kubectl --kubeconfig '$DIR/kubeconfig' --request-timeout=5s get node '$name' -o jsonpath='{.status.conditions[?(@.type==\"Ready\")].status}')\" == True ]]"
    # shellcheck disable=SC2086  # one argument per GPU UUID
    wait_for "Tessera's /debug/ledger listing node $name's GPUs" 60 emulators bash -c \
      'l="$(curl -fsS --max-time 2 "$1")" || exit 1; shift; for u; do [[ "$l" == *"$u"* ]] || exit 1; done' \
      _ "http://127.0.0.1:$TESSERA_METRICS_PORT/debug/ledger" $uuids
  done <<<"$nodes"
  # And the file's pods created (the log line that ends tessera emulate's setup).
  wait_for "tessera emulate creating the pods of $1" 60 emulators \
    grep -q "set up; emulating until SIGTERM" "$DIR/emulators.log"
  log "the $(wc -l <<<"$nodes") nodes of $1 are Ready and registered in Tessera"
}

usage() {
  cat <<USAGE
Usage:
  tools/controlplane.sh build [--kubernetes NAME]
  tools/controlplane.sh up [--tessera PATH] [--bin-dir DIR] [--etcd-compaction-interval D]
                          [--replicas N] [--cluster FILE] [--serve-arg ARG]... DIR
  tools/controlplane.sh down DIR
  tools/controlplane.sh restart [--kill] DIR NAME

  build   Build stock etcd, kube-apiserver and kube-scheduler ($K8S_VERSION) from
          test/controlplane once, into \$TESSERA_CONTROLPLANE_CACHE/<key>/ (default
          ~/.cache/tessera/controlplane), <key> being a hash of the module's go.mod, go.sum and
          main files; prints that directory. The same versions are never rebuilt.
            --kubernetes NAME  another release: test/controlplane/k8s/NAME's go.mod and go.sum
                             (or \$TESSERA_K8S; e.g. 1.38, kube-scheduler asking extenders to
                             preempt on nodes without victims of its own)
  up      Start etcd, kube-apiserver (TLS, Node,RBAC, default admission plugins), tessera serve
          (HTTPS, as ServiceAccount tessera-system/tessera under deploy/base's RBAC, its webhook
          registered) and kube-scheduler (deploy/base's configuration, extender = that serve) on
          127.0.0.1 with free ports; print "ready" once kube-scheduler holds its Lease and
          tessera serve's /readyz answers 200. DIR receives certificates, kubeconfig (admin),
          env (ports; source it), and <name>.log / <name>.pid for each process. On a failure
          everything started is stopped and the step and the log to read are named.
            --tessera PATH   the tessera binary (or \$TESSERA_BIN; default: build/dev, then
                             build/release of this checkout)
            --bin-dir DIR    the control-plane binaries (or \$TESSERA_CONTROLPLANE_BIN; default:
                             the output of build, which builds if needed)
            --etcd-compaction-interval D   kube-apiserver's compaction interval (default 5m)
            --replicas N     N tessera serve + kube-scheduler pairs (default 1), as deploy/base
                             runs N replicas of its pod: pair I >= 2 is tessera-I and
                             kube-scheduler-I (logs, pids, .cmd, ports TESSERA_PORT_I ... in env);
                             with N > 1 each pair runs in its own UTS namespace with host name
                             tessera-replica-I (needs root), its kube-scheduler's extender is its
                             own Tessera; "ready" once the Lease holder's Tessera leads and the
                             others follow. The webhook goes through webhook-service
                             (tools/controlplane_service.py), which relays each connection
                             to the next Tessera that accepts it, as the Service would.
            --serve-arg ARG  one more argument for every tessera serve (repeat it; e.g.
                             --serve-arg=--reservation-ttl=5s)
            --cluster FILE   a cluster file (kubectl get nodes,pods -A -o yaml; nodes with
                             HAMi's register annotation): its nodes and pods are created and
                             their device plugins and kubelets emulated by `tessera emulate`
                             (process emulators); "ready" waits for every node Ready and in
                             Tessera's /debug/ledger. A bad file fails before anything starts.
  restart [--kill] DIR NAME
          Stop one process (etcd, kube-apiserver, tessera, kube-scheduler, tessera-I,
          kube-scheduler-I, emulators; SIGTERM, or SIGKILL
          with --kill) and start it again with the same command line, its log continued; does
          not wait for it to be ready.
  down    Stop every process of DIR (SIGTERM, SIGKILL after \$TESSERA_CONTROLPLANE_STOP_TIMEOUT
          seconds, default 10). Safe to repeat.
USAGE
}

case "${1:-}" in
  build) shift; cmd_build "$@" ;;
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  restart) shift; cmd_restart "$@" ;;
  -h|--help|help) usage ;;
  *) usage >&2; exit 2 ;;
esac
