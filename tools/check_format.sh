#!/usr/bin/env bash
# Fails when any tracked C++ file differs from clang-format's output. `--fix` rewrites them.
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.h' '*.cc' | grep -v '^fuzz/corpus/' || true)
if [ "${#files[@]}" -eq 0 ]; then
  echo "check_format: no files"
  exit 0
fi
if [ "${1:-}" = "--fix" ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
clang-format --dry-run --Werror "${files[@]}"
echo "check_format: ${#files[@]} files clean"
