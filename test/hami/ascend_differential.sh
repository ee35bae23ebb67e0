#!/usr/bin/env bash
# test/hami/ascend_differential.sh CHECKER [SEED...] — fresh Ascend cases answered by HAMi
# v2.10.0's own code and checked against Tessera's (docs/ascend.md "Proving it").
#
# For each seed (default: 2 3 4), tools/gen/ascend_vectors.sh generates 2000 cases and has HAMi's
# Ascend vendor (test/hami/v2.10.0/ascendoracle) answer them; CHECKER (the
# schedule_ascend_hami_test binary) then requires Tessera's answers to match. The oracle is built
# from $HAMI_GIT, else taken from its cache (~/.cache/tessera/hami); without either this exits 77
# (skipped), since the Go module proxy does not serve HAMi (test/hami/README.md).
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
checker="${1:?usage: ascend_differential.sh CHECKER [SEED...]}"
shift
seeds=("$@")
((${#seeds[@]})) || seeds=(2 3 4)
cached=(--cached)
[[ -n "${HAMI_GIT:-}" ]] && cached=()
if ! bash "$ROOT/test/hami/build.sh" --oracle "${cached[@]}" v2.10.0 >/dev/null 2>&1; then
  echo "ascend_differential.sh: skipped: no HAMi Ascend oracle built here (set HAMI_GIT to a" \
       "git repository of github.com/Project-HAMi/HAMi)" >&2
  exit 77
fi
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for seed in "${seeds[@]}"; do
  bash "$ROOT/tools/gen/ascend_vectors.sh" --seed "$seed" --count 2000 --out "$tmp/$seed.jsonl"
  if ! TESSERA_ASCEND_VECTORS="$tmp/$seed.jsonl" "$checker" > "$tmp/$seed.log" 2>&1; then
    cat "$tmp/$seed.log" >&2
    echo "ascend_differential.sh: seed $seed: Tessera differs from HAMi (reproduce with" \
         "tools/gen/ascend_vectors.sh --seed $seed --count 2000 --out FILE)" >&2
    exit 1
  fi
  echo "ascend_differential.sh: seed $seed: 2000 cases, Tessera answers as HAMi does"
done
