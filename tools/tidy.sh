#!/usr/bin/env bash
# Runs clang-tidy with the repository's .clang-tidy over the product sources (src/**/*.cc but
# the *_test.cc and *_fuzz.cc files, and cmd/), using a build's compile_commands.json (default:
# build/dev, the g++ dev build; configure it first). Fails on any finding.
#
# A file that passed is remembered under ~/.cache/tessera/tidy (TESSERA_TIDY_CACHE overrides),
# keyed by a hash of: the clang-tidy version, .clang-tidy, the file's compile command and its
# preprocessed text (comments kept, so a NOLINT counts; every header it includes is in it). A warm
# run therefore re-checks only the files whose content, includes or flags changed; preprocessing
# costs ~0.3 s a file against ~10 s for clang-tidy.
#
# Usage: tools/tidy.sh [-j N] [BUILD_DIR [FILE...]]   (N: the number of cores; FILE: only these)
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
if [ "${1:-}" = "-j" ]; then
  jobs=$2
  shift 2
fi
build=${1:-build/dev}
shift || true
if [ ! -f "$build/compile_commands.json" ]; then
  echo "tidy: $build/compile_commands.json is missing; configure that build first" >&2
  exit 2
fi

exec python3 - "$build" "$jobs" "${TESSERA_TIDY_CACHE:-${HOME}/.cache/tessera/tidy}" "$@" <<'PY'
import concurrent.futures
import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time

build, jobs, cache, only = sys.argv[1], int(sys.argv[2]), sys.argv[3], set(sys.argv[4:])
root = os.getcwd()
os.makedirs(cache, exist_ok=True)

product = re.compile(r"^(src/.*(?<!_test)(?<!_fuzz)\.cc|cmd/.*\.cc)$")


def without_gcc_pch(args):
    """Drops CMake's `-include .../cmake_pch.hxx`: clang would read g++'s .gch beside it."""
    out, i = [], 0
    while i < len(args):
        if args[i] == "-include" and i + 1 < len(args) and args[i + 1].endswith("cmake_pch.hxx"):
            i += 2
            continue
        if args[i] != "-Winvalid-pch":
            out.append(args[i])
        i += 1
    return out


commands = {}
for entry in json.load(open(os.path.join(build, "compile_commands.json"))):
    path = os.path.relpath(os.path.join(entry["directory"], entry["file"]), root)
    if product.match(path) and os.path.exists(path) and (not only or path in only):
        args = entry.get("arguments") or shlex.split(entry["command"])
        commands[path] = (entry["directory"], without_gcc_pch(args))
if not commands:
    sys.exit(f"tidy: no product sources in {build}/compile_commands.json")

# clang-tidy reads the commands from a database of its own: the product files, PCH-free.
database = tempfile.mkdtemp(prefix="tessera-tidy-")
with open(os.path.join(database, "compile_commands.json"), "w") as f:
    json.dump([{"directory": d, "file": os.path.join(root, p), "arguments": a}
               for p, (d, a) in commands.items()], f)

version = subprocess.run(["clang-tidy", "--version"], check=True, capture_output=True).stdout
config = open(".clang-tidy", "rb").read()
# g++'s warning flags that clang does not know would each be a finding; the ones it knows stay.
extra = ["--extra-arg=-Wno-unknown-warning-option"]


def preprocess_args(args):
    """The compile command turned into `-E -C` to stdout."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c":
            out.append(a)
    return out + ["-E", "-C", "-o", "-"]


def check(path):
    directory, args = commands[path]
    key = hashlib.sha256()
    for part in (version, config, "\0".join(args).replace(root, ".").encode()):
        key.update(part)
        key.update(b"\0")
    pre = subprocess.run(preprocess_args(args), cwd=directory, capture_output=True)
    if pre.returncode != 0:
        return path, False, "preprocessing failed:\n" + pre.stderr.decode(errors="replace")
    key.update(pre.stdout.replace(root.encode(), b"."))
    stamp = os.path.join(cache, key.hexdigest())
    if os.path.exists(stamp):
        return path, None, ""
    run = subprocess.run(["clang-tidy", "-p", database, "--quiet", "--warnings-as-errors=*"] + extra +
                         [path], capture_output=True, text=True)
    # "N warnings generated." counts the suppressed ones in system headers; findings are lines
    # with "warning:" or "error:".
    report = "\n".join(line for line in run.stdout.splitlines() + run.stderr.splitlines()
                       if not re.match(r"^\d+ warnings? (and \d+ errors? )?generated\.$", line))
    if run.returncode == 0 and "warning:" not in report and "error:" not in report:
        open(stamp, "w").close()
        return path, True, ""
    return path, False, report


start = time.time()
paths = sorted(commands)
checked = cached = 0
failed = []
with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    for path, ok, report in pool.map(check, paths):
        if ok is None:
            cached += 1
            continue
        checked += 1
        if not ok:
            failed.append(path)
            print(report, flush=True)
elapsed = time.time() - start
print(f"tidy: {len(paths)} files, {checked} checked, {cached} unchanged since they passed, "
      f"{len(failed)} with findings ({elapsed:.0f} s, -j{jobs})")
shutil.rmtree(database, ignore_errors=True)
sys.exit(1 if failed else 0)
PY
