#!/usr/bin/env bash
# tools/gen/ascend_vectors.sh [--seed N] [--count N] [--out FILE] — HAMi v2.10.0's answers to
# generated Ascend cases, for Tessera's differential test (schedule_ascend_hami_test).
#
# Generates cases (tools/gen/ascend_cases.py), has HAMi's own Ascend vendor answer them
# (test/hami/v2.10.0/ascendoracle, built by test/hami/build.sh --oracle from $HAMI_GIT or taken
# from its cache) and writes one {"case":…,"hami":…} line per case. The default output is the
# committed file, test/testdata/hami/ascend-v2.10.0.jsonl.gz (seed 1, 3000 cases, gzip); an
# --out not ending in .gz is written plain.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
seed=1
count=3000
out="$ROOT/test/testdata/hami/ascend-v2.10.0.jsonl.gz"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --seed) seed="$2"; shift 2 ;;
    --count) count="$2"; shift 2 ;;
    --out) out="$2"; shift 2 ;;
    *) echo "ascend_vectors.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
cached=(--cached)
[[ -n "${HAMI_GIT:-}" ]] && cached=()
oracle="$(bash "$ROOT/test/hami/build.sh" --oracle "${cached[@]}" v2.10.0)"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
python3 "$ROOT/tools/gen/ascend_cases.py" --seed "$seed" --count "$count" > "$tmp/cases"
"$oracle" < "$tmp/cases" > "$tmp/answers"
python3 - "$tmp/cases" "$tmp/answers" > "$tmp/pairs" <<'PY'
import json, sys
cases = open(sys.argv[1]).read().splitlines()
answers = open(sys.argv[2]).read().splitlines()
if len(cases) != len(answers):
    sys.exit(f"ascend_vectors.sh: {len(cases)} cases but {len(answers)} answers")
for c, a in zip(cases, answers):
    print(json.dumps({"case": json.loads(c), "hami": json.loads(a)}, separators=(",", ":"),
                     sort_keys=True))
PY
if [[ "$out" == *.gz ]]; then
  gzip -9 -n -c "$tmp/pairs" > "$out"
else
  mv "$tmp/pairs" "$out"
fi
echo "ascend_vectors.sh: $count cases (seed $seed) -> $out" >&2
