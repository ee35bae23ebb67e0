"""`tessera simulate --scenario preemption`, end to end (scenarios/preemption.yaml, issue #36).

The run must pass (no victim of equal or higher priority, none needless, no over-commit, the
ledger converged) and must have exercised what it judges: Tessera preempted, every eviction was
attributed to its preemptor by a `Preempted` event, some preemptions were judged victim by
victim, the emulated kubelet finished evicted pods, and preemptors were bound on the node freed
for them. A run in which Tessera never preempted would pass the oracle vacuously; this fails it.
Usage: simulate_preemption_test.py TESSERA_BINARY
"""
import json
import os
import subprocess
import sys
import tempfile


def main() -> int:
    binary = sys.argv[1]
    with tempfile.TemporaryDirectory(prefix="simulate-preemption-") as report:
        run = subprocess.run([binary, "simulate", "--scenario", "preemption", "--report", report],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             timeout=170)
        print(run.stdout)
        failures = []
        if run.returncode != 0:
            failures.append(f"exit {run.returncode}, want 0")
            print(run.stderr[-4000:], file=sys.stderr)
        with open(os.path.join(report, "summary.json"), encoding="utf-8") as f:
            summary = json.load(f)
        p = summary.get("preemption", {})
        evicted = summary.get("pods", {}).get("evicted", 0)
        checks = [
            (summary.get("passed") is True, "the run passes"),
            (p.get("preemptions", 0) >= 5, f"at least 5 preemptions (got {p.get('preemptions')})"),
            (p.get("unattributed") == 0,
             f"every eviction attributed by a Preempted event (unattributed {p.get('unattributed')})"),
            (p.get("judged", 0) >= 1, f"some preemptions judged (got {p.get('judged')})"),
            (1 <= evicted <= p.get("victims", 0),
             f"the kubelet finished evicted pods ({evicted} of {p.get('victims')} victims; one "
             "that ran out its lifetime first is not counted)"),
            (p.get("preemptors", {}).get("bound_on_freed_node", 0) >= 1,
             "a preemptor bound on the node freed for it"),
        ]
        failures += [what for ok, what in checks if not ok]
        for f in failures:
            print("FAIL:", f, file=sys.stderr)
        return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
