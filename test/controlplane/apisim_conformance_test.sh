#!/usr/bin/env bash
# apisim checked against the real kube-apiserver (issue #20): apisim's own conformance tests,
# src/tessera/apisim/conformance/kubectl_test.sh (real kubectl), python_client_test.py (the
# official Python client) and wire_test.py (response bodies), run with the same assertions
# against the stock kube-apiserver v1.37.2 of tools/controlplane.sh that ctest's
# apisim_{kubectl,python_client,wire}_* run against `tessera apisim`. What differed and what was done about it: docs/apisim.md, "Checked against
# kube-apiserver v1.37.2".
#
#   test/controlplane/apisim_conformance_test.sh [--tessera PATH] [--keep] [--up-arg ARG]...
#
# The Python test's 410 case restarts kube-apiserver (tools/controlplane.sh restart --kill): the
# new API server's watch cache starts at the current revision, so a watch from before it is
# answered 410 Expired -- what apisim's /simulator/v1/compact does; wire_test.py's 410 checks
# compact etcd through its JSON gateway and wait for kube-apiserver's compactor (below). Exit 0 = pass, 1 = fail,
# 77 = skipped (a tool is missing). The control plane is always torn down (trap in lib.sh), and
# every wait has a deadline (each conformance script bounds itself; timeout on top).
set -euo pipefail

if ! /usr/bin/python3 -c 'import kubernetes' 2>/dev/null; then
  echo "$(basename "$0"): SKIP: /usr/bin/python3 has no kubernetes module (apt-get install python3-kubernetes)" >&2
  [ "${TESSERA_E2E_REQUIRED:-0}" = 1 ] && exit 1
  exit 77
fi

# kube-apiserver serves exact and continued lists from its watch cache's snapshots and forgets
# those only when its own compactor runs (every --etcd-compaction-interval, 5 minutes by
# default); wire_test.py's 410 checks need it within seconds. Every other request here is over
# within a second of the revision it names.
E2E_UP_ARGS=(--etcd-compaction-interval 2s)
# shellcheck source=test/controlplane/lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

CONFORMANCE="$ROOT/src/tessera/apisim/conformance"
check "kubectl conformance against kube-apiserver" \
  timeout 300 bash "$CONFORMANCE/kubectl_test.sh" --kubeconfig "$KUBECONFIG"
phase_done "kubectl conformance"
check "Python client conformance against kube-apiserver" \
  timeout 300 /usr/bin/python3 "$CONFORMANCE/python_client_test.py" --kubeconfig "$KUBECONFIG" \
  --expire-cmd "$CP restart --kill $DIR kube-apiserver"
phase_done "python client conformance"
check "response bodies (error Status objects, list metadata, watch framing) as kube-apiserver's" \
  timeout 300 /usr/bin/python3 "$CONFORMANCE/wire_test.py" --kubeconfig "$KUBECONFIG" \
  --etcd "http://127.0.0.1:$ETCD_PORT"
phase_done "wire conformance"
exit $FAILED
