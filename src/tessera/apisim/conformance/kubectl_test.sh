#!/usr/bin/env bash
# Conformance of `tessera apisim` with the real kubectl (v1.32 via the version dispatcher).
#   kubectl_test.sh TESSERA_BINARY http|https
# https also turns on a bearer token. Stops by itself (every kubectl call has a timeout) and
# always kills the simulator.
set -euo pipefail
BIN=${1:?usage: kubectl_test.sh TESSERA_BINARY http|https}
MODE=${2:-http}
tmp=$(mktemp -d)
pid=""
wpid=""
cleanup() {
  [ -n "$wpid" ] && kill "$wpid" 2>/dev/null || true
  if [ -n "$pid" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; echo "--- apisim stderr:" >&2; tail -20 "$tmp/err" >&2 || true; exit 1; }

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

start
export KUBECONFIG="$tmp/kc"
K() { timeout 30 kubectl --cache-dir "$tmp/cache" --request-timeout=20s "$@"; }

cat >"$tmp/pod.yaml" <<'YAML'
apiVersion: v1
kind: Pod
metadata:
  name: web
  labels: {app: web}
spec:
  nodeName: node-a
  containers:
  - name: c
    image: nginx
YAML
cat >"$tmp/node.yaml" <<'YAML'
apiVersion: v1
kind: Node
metadata:
  name: node-a
  labels: {gpu: "true"}
YAML

K apply -f "$tmp/node.yaml" | grep -q 'node/node-a created' || fail "apply node"
K apply -f "$tmp/pod.yaml" | grep -q 'pod/web created' || fail "apply pod"
[ "$(K get node node-a -o jsonpath='{.metadata.labels.gpu}')" = true ] || fail "get node"
K get pod web -o json >"$tmp/web.json"
grep -q '"nodeName": "node-a"' "$tmp/web.json" || fail "get -o json: nodeName"
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
  nodeName: node-$n
  containers: [{name: c, image: busybox}]
YAML
done
got=$(K get pods --field-selector spec.nodeName=node-b -o name)
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

if [ "$MODE" = https ]; then
  if kubectl --cache-dir "$tmp/cache2" --request-timeout=10s --token wrong get pods \
    >/dev/null 2>"$tmp/autherr"; then fail "wrong token accepted"; fi
  grep -q "provide credentials" "$tmp/autherr" || fail "no Unauthorized: $(cat "$tmp/autherr")"
fi

# State survives a restart, and the revision only grows.
rv_before=$(K get pods -o jsonpath='{.metadata.resourceVersion}')
stop
start
export KUBECONFIG="$tmp/kc"
K get pod extra-a >/dev/null || fail "state not restored"
K annotate pod extra-a x=y >/dev/null || fail "annotate after restart"
rv_after=$(K get pod extra-a -o jsonpath='{.metadata.resourceVersion}')
(( rv_after > rv_before )) || fail "revision went back: $rv_before -> $rv_after"
stop
echo "kubectl conformance ($MODE): ok"
