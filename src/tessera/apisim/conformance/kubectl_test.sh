#!/usr/bin/env bash
# Conformance of an API server with the real kubectl (v1.32 via the version dispatcher, whatever
# the server says its version is). The server under test is either
#   kubectl_test.sh TESSERA_BINARY http|https   `tessera apisim`, started (and killed) here;
#                                               https also turns on a bearer token
#   kubectl_test.sh --kubeconfig FILE           an existing server, e.g. the real kube-apiserver
#                                               of tools/controlplane.sh (test/controlplane/
#                                               apisim_conformance_test.sh runs it so)
# Both run the same assertions in a namespace of their own (conformance-<pid>; nodes
# node-a-<pid>, node-b-<pid>). What only apisim can do (its state file across a restart) is
# marked "apisim only". Against a real server the test stands in for what its control plane may
# lack: the namespace's default ServiceAccount (no kube-controller-manager) and a kubelet that
# finishes a bound pod's graceful deletion when its grace period ends (apisim has that built
# in). Stops by itself (every kubectl call has a timeout), always kills the simulator, and
# removes what it created from an existing server.
set -euo pipefail
usage="usage: kubectl_test.sh TESSERA_BINARY http|https | kubectl_test.sh --kubeconfig FILE"
REAL_KC=""
if [ "${1:-}" = --kubeconfig ]; then
  REAL_KC=${2:?$usage}
  MODE=real
else
  BIN=${1:?$usage}
  MODE=${2:-http}
fi
tmp=$(mktemp -d)
pid=""
wpid=""
kpid=""
RUN=$$
NS=conformance-$RUN
NODE_A=node-a-$RUN
NODE_B=node-b-$RUN
cleanup() {
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null || true
  [ -n "$kpid" ] && kill "$kpid" 2>/dev/null || true
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  if [ "$MODE" = real ]; then
    # No kubelet and (maybe) no namespace controller: force the pods out, then the rest.
    K -n "$NS" delete pods --all --grace-period=0 --force >/dev/null 2>&1 || true
    K delete node "$NODE_A" --ignore-not-found >/dev/null 2>&1 || true
    K delete namespace "$NS" --wait=false --ignore-not-found >/dev/null 2>&1 || true
  fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*" >&2
  if [ "$MODE" != real ]; then echo "--- apisim stderr:" >&2; tail -20 "$tmp/err" >&2 || true; fi
  exit 1
}

start() {
  local args=(apisim --listen 127.0.0.1:0 --write-kubeconfig "$tmp/kc" --state "$tmp/state.json")
  if [ "$MODE" = https ]; then args+=(--tls-self-signed --token conformance-t0ken); fi
  # A restart must not read the last run's first line: the background shell truncates the file
  # only when it gets to run, which can be after the wait below has looked.
  rm -f "$tmp/out"
  "$BIN" "${args[@]}" >"$tmp/out" 2>"$tmp/err" &
  pid=$!
  for _ in $(seq 300); do [ -s "$tmp/out" ] && break; sleep 0.1; done  # 30 s: a loaded CI machine
  local first
  first=$(head -1 "$tmp/out")
  local scheme=http
  [ "$MODE" = https ] && scheme=https
  [[ "$first" =~ ^listening\ on\ $scheme://127\.0\.0\.1:[0-9]+$ ]] || fail "first line: '$first'"
}
stop() {
  kill -TERM "$pid"
  local rc=0
  wait "$pid" || rc=$?
  pid=""
  [ "$rc" = 0 ] || fail "apisim exited $rc on SIGTERM"
}

if [ "$MODE" = real ]; then
  cp "$REAL_KC" "$tmp/kc"
else
  start
fi
export KUBECONFIG="$tmp/kc"
K() { timeout 30 kubectl --cache-dir "$tmp/cache" --request-timeout=20s "$@"; }

# apply, not `create namespace`: that one sends protobuf, which apisim does not take.
printf 'apiVersion: v1\nkind: Namespace\nmetadata: {name: %s}\n' "$NS" | K apply -f - >/dev/null ||
  fail "create namespace $NS"
if [ "$MODE" = real ]; then
  # The ServiceAccount admission plugin wants the namespace's default ServiceAccount, which
  # kube-controller-manager would create (apisim serves no ServiceAccounts and admits anyway).
  K -n "$NS" create serviceaccount default >/dev/null || fail "create serviceaccount"
  # The kubelet stand-in: a pod being deleted gracefully is deleted for good once its
  # deletionTimestamp (the request's time + the grace period) has passed.
  (
    while :; do
      now=$(date +%s)
      K -n "$NS" get pods -o jsonpath='{range .items[?(@.metadata.deletionTimestamp)]}{.metadata.name} {.metadata.deletionTimestamp}{"\n"}{end}' 2>/dev/null |
        while read -r name ts; do
          [ -n "$name" ] || continue
          if (( now >= $(date -d "$ts" +%s) )); then
            K -n "$NS" delete pod "$name" --grace-period=0 --force >/dev/null 2>&1 || true
          fi
        done
      sleep 0.2
    done
  ) >/dev/null 2>&1 &
  kpid=$!
fi
K config set-context --current --namespace "$NS" >/dev/null || fail "set namespace"

cat >"$tmp/pod.yaml" <<YAML
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  nodeName: $NODE_A
  containers:
  - name: c
    image: nginx
YAML
cat >"$tmp/node.yaml" <<YAML
apiVersion: v1
kind: Node
metadata:
  name: $NODE_A
  labels: {gpu: "true"}
YAML

K apply -f "$tmp/node.yaml" | grep -q "node/$NODE_A created" || fail "apply node"
K apply -f "$tmp/pod.yaml" | grep -q 'pod/web created' || fail "apply pod"
[ "$(K get node "$NODE_A" -o jsonpath='{.metadata.labels.gpu}')" = true ] || fail "get node"
K get pod web -o json >"$tmp/web.json"
grep -q "\"nodeName\": \"$NODE_A\"" "$tmp/web.json" || fail "get -o json: nodeName"
grep -q '"uid": "' "$tmp/web.json" || fail "get -o json: uid"

timeout 40 kubectl --cache-dir "$tmp/cache" get pods -w --output-watch-events >"$tmp/watch.txt" 2>&1 &
wpid=$!
for _ in $(seq 50); do grep -q ADDED "$tmp/watch.txt" 2>/dev/null && break; sleep 0.1; done
grep -q 'ADDED *web' "$tmp/watch.txt" || fail "watch: no ADDED: $(cat "$tmp/watch.txt")"

K annotate pod web example.com/note=hello | grep -q annotated || fail annotate
K label pod web tier=gpu | grep -q labeled || fail label
K patch pod web --type merge -p '{"metadata":{"labels":{"m":"merge"}}}' >/dev/null || fail "patch merge"
K patch pod web --type json -p '[{"op":"add","path":"/metadata/labels/j","value":"json"}]' \
  >/dev/null || fail "patch json"
K patch pod web --type strategic -p '{"metadata":{"labels":{"s":"smp"}},"spec":{"activeDeadlineSeconds":600}}' \
  >/dev/null || fail "patch strategic"
labels=$(K get pod web -o jsonpath='{.metadata.labels}')
for want in '"tier":"gpu"' '"m":"merge"' '"j":"json"' '"s":"smp"'; do
  [[ "$labels" == *"$want"* ]] || fail "labels $labels lack $want"
done
[ "$(K get pod web -o jsonpath='{.metadata.annotations.example\.com/note}')" = hello ] || fail "annotation"
# A failing JSON-patch test is refused and changes nothing.
if K patch pod web --type json -p '[{"op":"test","path":"/metadata/labels/tier","value":"cpu"}]' \
  >/dev/null 2>"$tmp/perr"; then fail "failing json patch test accepted"; fi
# apply of a changed manifest (client-side three-way strategic merge patch).
sed -i 's/app: web/app: web2/' "$tmp/pod.yaml"
K apply -f "$tmp/pod.yaml" | grep -q 'pod/web configured' || fail "re-apply"
[ "$(K get pod web -o jsonpath='{.metadata.labels.app}')" = web2 ] || fail "re-apply label"

# Field selector.
for n in a b; do
  cat <<YAML | K apply -f - >/dev/null || fail "apply extra-$n"
apiVersion: v1
kind: Pod
metadata: {name: extra-$n}
spec:
  nodeName: node-$n-$RUN
  containers: [{name: c, image: busybox}]
YAML
done
got=$(K get pods --field-selector spec.nodeName="$NODE_B" -o name)
[ "$got" = "pod/extra-b" ] || fail "field selector gave '$got'"
got=$(K get pods -l 'app in (web2)' -o name)
[ "$got" = "pod/web" ] || fail "label selector gave '$got'"

# delete waits for the DELETED event; the bound pod goes when its grace period ends.
start_s=$(date +%s)
K delete pod web --grace-period=1 | grep -q 'pod "web" deleted' || fail delete
if K get pod web >/dev/null 2>&1; then fail "pod still there after delete"; fi
(( $(date +%s) - start_s < 15 )) || fail "delete took too long"
for _ in $(seq 50); do grep -q 'DELETED *web' "$tmp/watch.txt" && break; sleep 0.1; done
grep -q 'MODIFIED *web' "$tmp/watch.txt" || fail "watch: no MODIFIED"
grep -q 'DELETED *web' "$tmp/watch.txt" || fail "watch: no DELETED: $(cat "$tmp/watch.txt")"
kill "$wpid" 2>/dev/null || true
wpid=""

if [ "$MODE" != http ]; then
  # The same server and CA, with a wrong bearer token and no other credentials.
  K config view --raw --minify --flatten >"$tmp/kc-wrong" || fail "kubeconfig copy"
  user=$(KUBECONFIG="$tmp/kc-wrong" kubectl config view -o jsonpath='{.users[0].name}')
  KUBECONFIG="$tmp/kc-wrong" kubectl config unset "users.$user" >/dev/null
  KUBECONFIG="$tmp/kc-wrong" kubectl config set-credentials "$user" --token wrong >/dev/null
  if KUBECONFIG="$tmp/kc-wrong" timeout 30 kubectl --cache-dir "$tmp/cache2" --request-timeout=10s \
    get pods >/dev/null 2>"$tmp/autherr"; then fail "wrong token accepted"; fi
  grep -q "provide credentials" "$tmp/autherr" || fail "no Unauthorized: $(cat "$tmp/autherr")"
fi

if [ "$MODE" = real ]; then
  echo "kubectl conformance (existing server, namespace $NS): ok"
  exit 0
fi
# apisim only: its state survives a restart (--state), and the revision only grows.
# (`kubectl get pods -o jsonpath` prints the List kubectl builds itself, whose resourceVersion is
# empty; the server's own list carries the revision.)
rv_before=$(K get --raw "/api/v1/namespaces/$NS/pods" | grep -o '"resourceVersion":"[0-9]*"' | head -1 | tr -dc 0-9)
[[ "$rv_before" =~ ^[0-9]+$ ]] || fail "list resourceVersion '$rv_before'"
stop
start
export KUBECONFIG="$tmp/kc"
K config set-context --current --namespace "$NS" >/dev/null || fail "set namespace"
K get pod extra-a >/dev/null || fail "state not restored"
K annotate pod extra-a x=y >/dev/null || fail "annotate after restart"
rv_after=$(K get pod extra-a -o jsonpath='{.metadata.resourceVersion}')
(( rv_after > rv_before )) || fail "revision went back: $rv_before -> $rv_after"
stop
echo "kubectl conformance ($MODE): ok"
