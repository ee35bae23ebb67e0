#!/usr/bin/env python3
"""Checks that the production binary links no development code (cmd/tessera/CMakeLists.txt).

  production_binary_test.py <tessera-scheduler> <tessera>

- `nm -C` of <tessera-scheduler> names no symbol of the API server simulator (tessera::apisim),
  the simulator (tessera::sim), the benchmarks (tessera::bench), the test fixtures
  (tessera::testing, and kube::FakeTransport from testing/fake_transport.h) or cpp-httplib
  (httplib::);
- `ldd` of it lists no libcpp-httplib;
- it runs (`version`) and offers none of the development subcommands (apisim, simulate, bench);
- the all-in-one <tessera> does name tessera::apisim symbols, so the check above can see them.
Exit 77 (ctest SKIP_RETURN_CODE) without nm or ldd.
"""

import re
import shutil
import subprocess
import sys

FORBIDDEN = re.compile(
    r"\btessera::(apisim|sim|bench|testing)::|\btessera::kube::FakeTransport\b|\bhttplib::")


def symbols(binary):
    out = subprocess.run(["nm", "-C", binary], capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def main():
    production, full = sys.argv[1], sys.argv[2]
    if shutil.which("nm") is None or shutil.which("ldd") is None:
        print("SKIP: nm or ldd missing")
        return 77
    failures = []
    bad = [line for line in symbols(production) if FORBIDDEN.search(line)]
    for line in bad[:20]:
        failures.append(f"development symbol in {production}: {line.strip()}")
    if len(bad) > 20:
        failures.append(f"... and {len(bad) - 20} more")
    ldd = subprocess.run(["ldd", production], capture_output=True, text=True, check=True).stdout
    for line in ldd.splitlines():
        if "httplib" in line:
            failures.append(f"{production} loads cpp-httplib: {line.strip()}")
    version = subprocess.run([production, "version"], capture_output=True, text=True)
    if version.returncode != 0 or not version.stdout.startswith("tessera "):
        failures.append(f"`{production} version` failed: {version.returncode} {version.stdout!r}")
    help_text = subprocess.run([production, "--help"], capture_output=True, text=True).stdout
    for command in ("serve", "explain", "why", "top", "decode", "rbac", "version"):
        if not re.search(rf"^\s+{command}\b", help_text, re.M):
            failures.append(f"{production} --help lacks the {command} subcommand")
    for command in ("apisim", "simulate", "bench"):
        if re.search(rf"^\s+{command}\b", help_text, re.M):
            failures.append(f"{production} --help offers the development subcommand {command}")
    if not any(re.search(r"\btessera::apisim::", line) for line in symbols(full)):
        failures.append(f"no tessera::apisim symbol in {full}: the symbol check sees nothing")

    for f in failures:
        print("FAIL:", f)
    print(f"checked {production}: {len(bad)} development symbols")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
