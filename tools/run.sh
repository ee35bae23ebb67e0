#!/usr/bin/env bash
# The main job on its embedded default: installs the packages, builds the release binary and
# runs `tessera simulate` on its default scenario (quick): a 20-node, 160-GPU cluster on this
# machine — the real `tessera serve` against `tessera apisim`, with emulated kube-scheduler, HAMi
# device plugins, kubelets, churn and watch outages, judged every second by an oracle. Extra
# arguments are passed to `tessera simulate` (for example `--scenario chaos --report /tmp/r`).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/install_deps.sh >&2
cmake --preset release >/dev/null
cmake --build --preset release --target tessera >&2
exec build/release/cmd/tessera/tessera simulate "$@"
