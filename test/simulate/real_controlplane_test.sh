#!/usr/bin/env bash
# `tessera simulate --control-plane=real` end to end (docs/simulate.md, "The real control plane"):
# the scenario's workload, device plugins and kubelets against stock etcd, kube-apiserver and
# kube-scheduler started by tools/controlplane.sh, with tessera serve as their extender.
#
#   test/simulate/real_controlplane_test.sh TESSERA_BINARY SOURCE_DIR SIMULATE_ARGS...
#
# Passes when simulate exits 0 (no over-commit, no divergence outliving the window), its
# summary.json says the real control plane ran with the faults it expects (every fault of the
# schedule injected or reported as skipped), and no process of the run's control plane survives.
# Exit 77 (skipped) when a tool the control plane needs is missing, unless TESSERA_E2E_REQUIRED=1.
set -euo pipefail

binary="${1:?usage: real_controlplane_test.sh TESSERA_BINARY SOURCE_DIR SIMULATE_ARGS...}"
source_dir="${2:?usage: real_controlplane_test.sh TESSERA_BINARY SOURCE_DIR SIMULATE_ARGS...}"
shift 2

skip_code=77
[ "${TESSERA_E2E_REQUIRED:-0}" = 1 ] && skip_code=1
for t in kubectl openssl python3 curl setsid ss; do
  command -v "$t" >/dev/null || { echo "SKIP: $t is not on PATH" >&2; exit "$skip_code"; }
done
python3 -c 'import yaml' 2>/dev/null || { echo "SKIP: python3 has no yaml module" >&2; exit "$skip_code"; }

tmp="$(mktemp -d "${TMPDIR:-/tmp}/simulate-real.XXXXXX")"
work="$tmp/work"
start=$SECONDS
rc=0
"$binary" simulate --control-plane=real --controlplane-script "$source_dir/tools/controlplane.sh" \
  --work-dir "$work" --report "$tmp/report" "$@" || rc=$?
echo "simulate exited $rc after $((SECONDS - start)) s"

failed=0
[[ $rc == 0 ]] || { echo "FAIL: tessera simulate exited $rc, want 0" >&2; failed=1; }
if [[ -f "$tmp/report/summary.json" ]]; then
  python3 - "$tmp/report/summary.json" <<'PY' || failed=1
import json, sys
s = json.load(open(sys.argv[1]))
bad = []
for run in [s] + ([s["comparison"]] if "comparison" in s else []):
    if run.get("control_plane") != "real":
        bad.append(f"control_plane is {run.get('control_plane')!r}, want 'real'")
    if run["pods"]["scheduled"] <= 0 or run["pods"]["allocations"] <= 0:
        bad.append("no pod was scheduled and allocated through the real kube-scheduler")
    if run["compared"] <= 0:
        bad.append("the oracle compared no sample")
    print(f"{run.get('label') or 'run'}: {run['pods']['created']} pods created, "
          f"{run['pods']['scheduled']} scheduled, faults "
          f"{[f['kind'] for f in run['faults']]}, skipped "
          f"{[f['kind'] for f in run['skipped_faults']]}")
for b in bad:
    print("FAIL:", b, file=sys.stderr)
sys.exit(1 if bad else 0)
PY
else
  echo "FAIL: no summary.json in $tmp/report" >&2; failed=1
fi
# Nothing of the control plane survives the run.
if pgrep -f -- "$work/" >/dev/null; then
  echo "FAIL: processes of $work survive: $(pgrep -f -a -- "$work/" | tr '\n' ';')" >&2
  failed=1
fi
if [[ $failed == 0 ]]; then
  rm -rf "$tmp"
  echo PASS
  exit 0
fi
for f in "$work/controlplane/tessera.log" "$work/controlplane/kube-scheduler.log" "$work/controlplane.log"; do
  [[ -f "$f" ]] && { echo "--- last lines of $f" >&2; tail -n 15 "$f" >&2; }
done
echo "FAIL (kept $tmp)" >&2
exit 1
