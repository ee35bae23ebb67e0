#!/usr/bin/python3
"""tools/diff_decisions.py finds a changed decision and passes an unchanged one.

Usage: diff_decisions_test.py TESSERA SOURCE_DIR
"""
import os
import stat
import subprocess
import sys
import tempfile


def diff(source, before, after, keep, clusters=4):
    return subprocess.run(
        [sys.executable, os.path.join(source, "tools", "diff_decisions.py"), "--before", before,
         "--after", after, "--clusters", str(clusters), "--seed", "3", "--keep", keep],
        capture_output=True, text=True, timeout=300)


def main():
    tessera, source = sys.argv[1], sys.argv[2]
    failures = []
    with tempfile.TemporaryDirectory() as tmp:
        same = diff(source, tessera, tessera, tmp)
        if (same.returncode != 0 or "identical" not in same.stdout or
                "80 decisions" not in same.stdout):
            failures.append("one binary against itself: exit %d\n%s%s" % (
                same.returncode, same.stdout, same.stderr))
        # A binary whose reasons differ by one word: the first differing case is reported and kept.
        changed = os.path.join(tmp, "changed")
        with open(changed, "w") as f:
            f.write("#!/bin/sh\n\"%s\" \"$@\" | sed s/CardInsufficient/CardShort/\n" % tessera)
        os.chmod(changed, os.stat(changed).st_mode | stat.S_IXUSR)
        other = diff(source, tessera, changed, tmp, clusters=20)
        if (other.returncode != 1 or "the outputs differ" not in other.stdout or
                "CardShort" not in other.stdout):
            failures.append("a changed reason: exit %d\n%s%s" % (
                other.returncode, other.stdout[:2000], other.stderr))
        elif not any(n.startswith("diff-decisions-") for n in os.listdir(tmp)):
            failures.append("a changed reason: the differing cluster was not kept")
        bad = diff(source, tessera, os.path.join(tmp, "missing"), tmp)
        if bad.returncode != 2 or "is not an executable" not in bad.stderr:
            failures.append("a missing binary: exit %d\n%s" % (bad.returncode, bad.stderr))
    for f in failures:
        print("FAIL:", f)
    print("diff_decisions_test: %d failures" % len(failures))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
