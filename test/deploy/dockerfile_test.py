#!/usr/bin/env python3
"""Checks the Dockerfile (docs/deploy.md, "The image").

  dockerfile_test.py <tessera-scheduler binary> <source dir>

- its runtime package list covers every shared library `ldd <tessera>` names (each library
  mapped to its Debian package with `dpkg -S`), and names no package that provides none of them;
- both stages are Debian 12; the build stage runs tools/install_deps.sh and the release preset;
- the runtime stage runs as a non-root user with the uid the manifests use;
- it provides HAMi's program name /usr/local/bin/scheduler and gives the binary the file
  capability cap_net_bind_service (port 443 as that user), without keeping setcap's package.
Docker itself cannot run here; this is what can be checked without it.
Exit 77 (ctest SKIP_RETURN_CODE) without ldd or dpkg.
"""

import os
import re
import shutil
import subprocess
import sys


def packages_of(paths):
    """{library path: Debian package}, from one `dpkg -S` call (it is slow to start)."""
    variants = {}
    for path in paths:
        for v in (path, os.path.realpath(path)):
            # usrmerge: dpkg may know /lib/... as /usr/lib/... or the reverse.
            alt = v[4:] if v.startswith("/usr/") else "/usr" + v
            variants.setdefault(v, path)
            variants.setdefault(alt, path)
    out = subprocess.run(["dpkg", "-S"] + sorted(variants), capture_output=True, text=True)
    owner = {}
    for line in out.stdout.splitlines():
        pkg, _, path = line.partition(": ")
        if path in variants:
            owner.setdefault(variants[path], pkg.split(":")[0].split(",")[0].strip())
    return owner


def main():
    tessera, source = sys.argv[1], sys.argv[2]
    if shutil.which("ldd") is None or shutil.which("dpkg") is None:
        print("SKIP: ldd or dpkg missing")
        return 77
    with open(os.path.join(source, "Dockerfile")) as f:
        dockerfile = f.read()
    failures = []
    block = re.search(r"# BEGIN RUNTIME PACKAGES.*?\n(.*?)# END RUNTIME PACKAGES", dockerfile, re.S)
    if not block:
        print("FAIL: no runtime package block in the Dockerfile")
        return 1
    listed = set(re.findall(r"^\s*([a-z0-9][a-z0-9.+-]+)\s*\\\s*$", block.group(1), re.M))
    ldd = subprocess.run(["ldd", tessera], capture_output=True, text=True, check=True).stdout
    libs = {}
    for line in ldd.splitlines():
        m = re.match(r"\s*(\S+) => (\S+)", line)
        if not m:
            continue
        if m.group(2) == "not":
            failures.append(f"ldd: {m.group(1)} not found")
            continue
        libs[m.group(2)] = m.group(1)
    owner = packages_of(libs)
    needed = {}
    for path, soname in sorted(libs.items()):
        if path not in owner:
            failures.append(f"no Debian package owns {path}")
            continue
        needed.setdefault(owner[path], []).append(soname)
    for pkg, libs in sorted(needed.items()):
        if pkg not in listed:
            failures.append(f"{pkg} (for {', '.join(libs)}) is missing from the runtime packages")
    for pkg in sorted(listed - set(needed)):
        failures.append(f"runtime package {pkg} provides no library tessera loads")

    stages = re.findall(r"^FROM\s+(\S+)", dockerfile, re.M)
    if len(stages) != 2 or not all(re.fullmatch(r"debian:12(-slim)?", s) for s in stages):
        failures.append(f"want two Debian 12 stages, got {stages}")
    if "tools/install_deps.sh" not in dockerfile or "--preset release" not in dockerfile:
        failures.append("the build stage must run tools/install_deps.sh and the release preset")
    runtime = dockerfile.split("FROM", 2)[-1]
    users = re.findall(r"^USER\s+(\S+)", runtime, re.M)
    if not users or users[-1].split(":")[0] in ("0", "root"):
        failures.append(f"the runtime stage must end as a non-root USER, got {users}")
    with open(os.path.join(source, "deploy/base/deployment.yaml")) as f:
        uid = re.search(r"runAsUser: (\d+)", f.read()).group(1)
    if users and users[-1].split(":")[0] != uid:
        failures.append(f"USER {users[-1]} differs from the manifests' runAsUser {uid}")
    if "COPY --from=build" not in runtime:
        failures.append("the runtime stage does not copy the binary from the build stage")
    # HAMi's chart: `command: [scheduler, --http_bind=0.0.0.0:443, ...]`, no securityContext.
    # The name is on PATH and the non-root USER may bind 443 (test/deploy/hami_chart_test.py
    # runs the chart's command that way).
    before_user = runtime.split("\nUSER", 1)[0]
    if not re.search(r"ln -s tessera /usr/local/bin/scheduler\b", before_user):
        failures.append("the runtime stage must link /usr/local/bin/scheduler to tessera")
    setcap = re.search(r"setcap cap_net_bind_service=\+ep /usr/local/bin/tessera\b", before_user)
    if not setcap or before_user.find("COPY --from=build") > setcap.start():
        failures.append("the runtime stage must give /usr/local/bin/tessera "
                        "cap_net_bind_service=+ep after copying it (port 443 as non-root)")
    if "libcap2-bin" in before_user and "purge -y --auto-remove libcap2-bin" not in before_user:
        failures.append("libcap2-bin (setcap) must not stay in the image")

    for f in failures:
        print("FAIL:", f)
    print(f"{len(needed)} packages for {sum(len(v) for v in needed.values())} libraries")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
