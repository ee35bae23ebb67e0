#!/usr/bin/env python3
"""Prometheus' own checks over what Tessera ships (docs/metrics.md).

  promtool_test.py <tessera binary> <source dir>

  - `promtool check metrics` on the /metrics body of a running `tessera serve` (against
    `tessera apisim` holding examples/cluster.yaml, with --legacy-metrics, so that every device
    family has samples), and on a known-bad body, which it must reject (the check can fail);
  - `promtool check rules` on the groups of deploy/components/prometheusrule (rendered by
    `kubectl kustomize deploy/overlays/monitoring`), and `promtool test rules` with
    test/deploy/alerts_test.yaml;
  - every metric an alert names is one Tessera exports.

promtool comes from Debian's `prometheus` package (tools/install_deps.sh). Exit 77 (ctest
SKIP_RETURN_CODE) when promtool or kubectl is not installed.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

import yaml

FAILURES = []


def check(cond, message):
    if not cond:
        FAILURES.append(message)
    return cond


def promtool(args, stdin=None, cwd=None):
    return subprocess.run(["promtool"] + args, input=stdin, capture_output=True, text=True,
                          cwd=cwd, timeout=60)


def wait_for(path_or_fn, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path_or_fn():
            return True
        time.sleep(0.05)
    return False


def get(url):
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            return r.status, r.read().decode()
    except OSError as e:
        return 0, str(e)


def scrape_running_serve(tessera, source, workdir):
    """The /metrics body of serve against apisim with examples/cluster.yaml, after it synced."""
    kubeconfig = os.path.join(workdir, "kubeconfig")
    procs = []
    try:
        procs.append(subprocess.Popen([tessera, "apisim", "--write-kubeconfig", kubeconfig],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        if not wait_for(lambda: os.path.exists(kubeconfig), 30):
            raise SystemExit("FAIL: apisim did not write its kubeconfig")
        kubectl = ["kubectl", "--kubeconfig", kubeconfig]
        namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ml\n"
        for args, stdin in ((["-f", "-"], namespace),
                            (["-f", os.path.join(source, "examples/cluster.yaml")], None)):
            out = subprocess.run(kubectl + ["create", "--validate=false"] + args, input=stdin,
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"FAIL: kubectl create {args}: {out.stderr}")
        log_path = os.path.join(workdir, "serve.log")
        with open(log_path, "w") as log:
            procs.append(subprocess.Popen(
                [tessera, "serve", "--kubeconfig", kubeconfig, "--leader-elect=false",
                 "--legacy-metrics", "--http_bind", "127.0.0.1:0",
                 "--metrics-bind-address", "127.0.0.1:0"],
                stdout=subprocess.DEVNULL, stderr=log))

        def ports():
            with open(log_path) as f:
                m = re.search(r"extender on \S+ \(port (\d+)\), metrics on \S+ \(port (\d+)\)",
                              f.read())
            return (int(m.group(1)), int(m.group(2))) if m else None
        if not wait_for(ports, 30):
            raise SystemExit(f"FAIL: tessera serve did not start; see {log_path}")
        http, metrics = ports()
        if not wait_for(lambda: get(f"http://127.0.0.1:{http}/readyz")[0] == 200, 30):
            raise SystemExit(f"FAIL: tessera serve did not become ready; see {log_path}")
        # The informer gauges are set by serve's housekeeping round (every second) after the
        # sync: wait for the first one rather than race it.
        wait_for(lambda: "\ntessera_informer_last_event_age_seconds{" in
                 get(f"http://127.0.0.1:{metrics}/metrics")[1], 10)
        status, body = get(f"http://127.0.0.1:{metrics}/metrics")
        if status != 200:
            raise SystemExit(f"FAIL: /metrics: {status} {body}")
        return body
    finally:
        for p in reversed(procs):
            p.send_signal(signal.SIGTERM)
        for p in reversed(procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def exported_metrics(body):
    return {m.group(1) for m in re.finditer(r"^# TYPE (\S+) ", body, re.M)}


def check_metrics(tessera, source, workdir):
    body = scrape_running_serve(tessera, source, workdir)
    # The body is a full one: device families (HAMi's and the legacy names) with samples.
    for family in ("hami_gpu_memory_limit_bytes", "hami_vgpu_memory_allocated_bytes",
                   "GPUDeviceMemoryLimit", "tessera_filter_decisions_total", "tessera_build_info"):
        check(re.search(rf"^{family}[{{ ]", body, re.M),
              f"/metrics has no sample of {family}")
    out = promtool(["check", "metrics"], stdin=body)
    # Exit 3 is "lint problems": allowed only for HAMi's own names, which dashboards and alerts
    # built for HAMi query and so must stay as they are (docs/metrics.md): the pre-v2.9 camelCase
    # names and hami_gpu_shared_count (a gauge whose name ends in _count), and the legacy quota
    # family QuotaUsed with its label quotaName (one finding per series: docs/quota.md). Any
    # other finding, or a parse error (exit 1), fails.
    findings = [l for l in (out.stdout + out.stderr).splitlines() if l.strip()]
    quota_used = [l for l in findings
                  if re.match(r"^QuotaUsed (metric|label) names should be written in "
                              r"'snake_case' not 'camelCase'$", l)]
    hami_names = [l for l in findings
                  if re.match(r"^(GPUDevice|nodeGPU|vGPU)\w+ metric names should be written in "
                              r"'snake_case' not 'camelCase'$", l)
                  or l.startswith('hami_gpu_shared_count non-histogram and non-summary metrics '
                                  'should not have "_count" suffix')]
    findings = [l for l in findings if l not in quota_used]
    check(out.returncode in (0, 3) and findings == hami_names,
          f"promtool check metrics on serve's /metrics (exit {out.returncode}):\n"
          f"{out.stdout}{out.stderr}")
    check(len(hami_names) == 10,
          f"promtool check metrics: want the 10 findings of HAMi's names, got {findings}")
    bad = "# HELP requests Requests.\n# TYPE requests counter\nrequests 1\n"
    out = promtool(["check", "metrics"], stdin=bad)
    check(out.returncode != 0 and "_total" in out.stdout + out.stderr,
          f"promtool check metrics accepted a counter without _total: {out.stdout}{out.stderr}")
    return body


def check_rules(source, workdir, exported):
    out = subprocess.run(["kubectl", "kustomize", os.path.join(source, "deploy/overlays/monitoring")],
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"FAIL: kubectl kustomize deploy/overlays/monitoring:\n{out.stderr}")
    rules = [d for d in yaml.safe_load_all(out.stdout) if d and d["kind"] == "PrometheusRule"]
    if not check(len(rules) == 1, f"overlays/monitoring: want one PrometheusRule, found {len(rules)}"):
        return
    with open(os.path.join(workdir, "tessera-rules.yaml"), "w") as f:
        yaml.safe_dump(rules[0]["spec"], f)
    shutil.copy(os.path.join(source, "test/deploy/alerts_test.yaml"), workdir)
    out = promtool(["check", "rules", "tessera-rules.yaml"], cwd=workdir)
    check(out.returncode == 0, f"promtool check rules:\n{out.stdout}{out.stderr}")
    out = promtool(["test", "rules", "alerts_test.yaml"], cwd=workdir)
    check(out.returncode == 0, f"promtool test rules alerts_test.yaml:\n{out.stdout}{out.stderr}")
    alerts = [r for g in rules[0]["spec"]["groups"] for r in g["rules"] if "alert" in r]
    check(len(alerts) >= 6, f"PrometheusRule: {len(alerts)} alerts, docs/metrics.md names 6")
    for r in alerts:
        for name in re.findall(r"\b(tessera_[a-z_]+|hami_[a-z_]+)", r["expr"]):
            check(name in exported, f"alert {r['alert']} uses {name}, which is not exported")


def main():
    tessera, source = sys.argv[1], sys.argv[2]
    for tool in ("promtool", "kubectl"):
        if shutil.which(tool) is None:
            print(f"SKIP: {tool} is not installed (tools/install_deps.sh installs promtool)")
            return 77
    workdir = tempfile.mkdtemp(prefix="tessera-promtool-")
    try:
        body = check_metrics(tessera, source, workdir)
        check_rules(source, workdir, exported_metrics(body))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    for f in FAILURES:
        print("FAIL:", f)
    if not FAILURES:
        print("promtool_test: metrics and rules pass promtool's checks")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
