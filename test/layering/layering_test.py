#!/usr/bin/env python3
"""Checks the fence between the product and its scaffolding (docs/architecture.md).

  layering_test.py <source dir>

- no product source under src/tessera (every .h/.cc outside apisim/, sim/ and testing/ that is
  not a test, a test helper or a fuzz target) includes a header of tessera/apisim, tessera/sim,
  tessera/testing or bench/;
- no library declared with tessera_cc_library outside those folders depends on tessera::apisim,
  tessera::sim*, tessera::testing* or tessera::bench_*.
cmd/ and the tests may reach them; test/deploy/production_binary_test.py checks the binary.
"""

import os
import re
import sys

SCAFFOLD_DIRS = {"apisim", "sim", "testing"}
TEST_FILE = re.compile(r"(_test\.cc|_fuzz\.cc|_testutil\.h)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"(tessera/(apisim|sim|testing)/[^"]+|bench/[^"]+)"', re.M)
LIBRARY = re.compile(r"tessera_cc_library\((.*?)\)", re.S)
SCAFFOLD_DEP = re.compile(r"\btessera::(apisim\b|sim\w*|testing\w*|bench_\w+)")


def main():
    root = os.path.join(sys.argv[1], "src", "tessera")
    failures = []
    for folder in sorted(os.listdir(root)):
        path = os.path.join(root, folder)
        if folder in SCAFFOLD_DIRS or not os.path.isdir(path):
            continue
        for name in sorted(os.listdir(path)):
            file = os.path.join(path, name)
            if name.endswith((".h", ".cc")) and not TEST_FILE.search(name):
                with open(file) as f:
                    for m in INCLUDE.finditer(f.read()):
                        failures.append(f"src/tessera/{folder}/{name} includes {m.group(1)}")
            if name == "CMakeLists.txt":
                with open(file) as f:
                    for lib in LIBRARY.finditer(f.read()):
                        for dep in SCAFFOLD_DEP.finditer(lib.group(1)):
                            target = re.search(r"NAME\s+(\S+)", lib.group(1))
                            failures.append(f"src/tessera/{folder}: library "
                                            f"{target.group(1) if target else '?'} depends on "
                                            f"{dep.group(0)}")
    for f in failures:
        print("FAIL:", f)
    print(f"{len(failures)} product sources or libraries reach into the scaffolding")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
