#!/usr/bin/env python3
"""What `tessera serve` logs, in both formats (docs/serve.md, "Logs").

  serve_logs_test.py <tessera binary> <source dir>

Starts `tessera apisim` holding examples/cluster.yaml and examples/pod.yaml (loaded with
kubectl), then `tessera serve` twice on 127.0.0.1 port 0:
  - `-v 2 serve --logging-format=json`: every stderr line is one JSON object of klog's shape
    (ts a float of Unix seconds, caller, msg, v or err); the first lines give the version with
    the revision and every effective flag; one line says the informers synced; a /filter and a
    /bind of the example pod each log the pod, the candidate count, the chosen node and the
    devices;
  - `serve` (text, -v 0): klog's text layout, the same start and synced lines, and no
    per-request line.
Exit 77 (ctest SKIP_RETURN_CODE) when kubectl is not installed.
"""

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request

FAILURES = []
KLOG_TEXT = re.compile(r"^[IWEF]\d{4} \d\d:\d\d:\d\d\.\d{6} +\d+ [\w.]+:\d+\] ")


def check(cond, message):
    if not cond:
        FAILURES.append(message)
    return cond


def wait_for(fn, seconds):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if fn():
            return True
        time.sleep(0.05)
    return False


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def start_serve(tessera, kubeconfig, log_path, global_args, serve_args):
    log = open(log_path, "w")
    p = subprocess.Popen([tessera] + global_args + ["serve", "--kubeconfig", kubeconfig,
                         "--leader-elect=false", "--http_bind", "127.0.0.1:0",
                         "--metrics-bind-address", "127.0.0.1:0"] + serve_args,
                         stdout=subprocess.DEVNULL, stderr=log)
    pattern = re.compile(r"extender on \S+ \(port (\d+)\)")

    def port():
        with open(log_path) as f:
            m = pattern.search(f.read())
        return int(m.group(1)) if m else None
    if not wait_for(port, 30) or not wait_for(lambda: ready(port()), 30):
        p.kill()
        raise SystemExit(f"FAIL: tessera serve did not become ready; see {log_path}")
    return p, port()


def stop(p):
    p.send_signal(signal.SIGTERM)
    try:
        p.wait(timeout=20)
    except subprocess.TimeoutExpired:
        p.kill()


def synced_line_appears(path, needle):
    return wait_for(lambda: needle in open(path).read(), 10)


def check_json(tessera, kubeconfig, workdir, pod, counts):
    log_path = os.path.join(workdir, "json.log")
    p, port = start_serve(tessera, kubeconfig, log_path, ["-v", "2"], ["--logging-format=json"])
    try:
        check(synced_line_appears(log_path, '"msg":"informers synced"'),
              "json: no \"informers synced\" line")
        reply = post(port, "/filter", {"Pod": pod, "NodeNames": ["gpu-t4-1", "gpu-a100-1", "cpu-1"]})
        node = (reply.get("NodeNames") or [""])[0]
        check(node == "gpu-a100-1", f"json: /filter chose {reply}")
        bind = post(port, "/bind", {"PodName": "finetune-0", "PodNamespace": "ml",
                                    "PodUID": pod["metadata"]["uid"], "Node": node})
        check(bind.get("Error", "") == "", f"json: /bind: {bind}")
        check(synced_line_appears(log_path, '"msg":"bind"'), "json: no bind line")
    finally:
        stop(p)
    lines = [l for l in open(log_path).read().splitlines() if l]
    objs = []
    for line in lines:
        try:
            obj = json.loads(line)
        except ValueError:
            check(False, f"json: not a JSON line: {line}")
            continue
        objs.append(obj)
        check(list(obj)[:3] == ["ts", "caller", "msg"] and isinstance(obj["ts"], float)
              and abs(obj["ts"] - time.time()) < 600 and ("v" in obj) != ("err" in obj),
              f"json: not klog's shape: {line}")
    by_msg = {}
    for o in objs:
        by_msg.setdefault(o["msg"], []).append(o)
    start = (by_msg.get("starting") or [{}])[0]
    check(start.get("command") == "serve" and re.match(r"^\d+\.\d+\.\d+$", start.get("version", ""))
          and "revision" in start, f"json: the start line: {start}")
    flags = (by_msg.get("flags") or [{}])[0]
    for flag, value in (("--logging-format", "json"), ("--v", "2"), ("--http_bind", "127.0.0.1:0"),
                        ("--leader-elect", "false"), ("--resync-period", None),
                        ("--node-scheduler-policy", "binpack")):
        check(flag in flags and (value is None or flags[flag] == value),
              f"json: the flags line lacks {flag}={value}: {flags}")
    synced = (by_msg.get("informers synced") or [{}])[0]
    check(synced.get("pods") == counts["pods"] and synced.get("nodes") == counts["nodes"],
          f"json: the synced line: {synced}")
    filters = by_msg.get("filter", [])
    check(len(filters) == 1 and filters[0].get("pod") == "ml/finetune-0"
          and filters[0].get("candidates") == 3 and filters[0].get("node") == "gpu-a100-1"
          and re.match(r"^GPU-[0-9a-f-]+:8000:30$", filters[0].get("devices", ""))
          and filters[0].get("v") == 2, f"json: the filter line: {filters}")
    binds = by_msg.get("bind", [])
    check(len(binds) == 1 and binds[0].get("pod") == "ml/finetune-0"
          and binds[0].get("node") == "gpu-a100-1" and "8000,30" in binds[0].get("devices", ""),
          f"json: the bind line: {binds}")


def check_text(tessera, kubeconfig, workdir, pod):
    log_path = os.path.join(workdir, "text.log")
    p, port = start_serve(tessera, kubeconfig, log_path, [], [])
    try:
        check(synced_line_appears(log_path, '"informers synced" pods='),
              "text: no \"informers synced\" line")
        post(port, "/filter", {"Pod": pod, "NodeNames": ["gpu-t4-1"]})
    finally:
        stop(p)
    lines = [l for l in open(log_path).read().splitlines() if l]
    for line in lines:
        check(KLOG_TEXT.match(line), f"text: not klog's layout: {line}")
    text = "\n".join(lines)
    check(re.search(r'\] "starting" command="serve" version="[\d.]+" revision="', text),
          "text: no start line")
    check(re.search(r'\] "flags" .*--logging-format="text"', text), "text: no flags line")
    check('"filter"' not in text, "text: a -v=2 filter line at -v 0")


def main():
    tessera, source = sys.argv[1], sys.argv[2]
    if shutil.which("kubectl") is None:
        print("SKIP: kubectl is not installed")
        return 77
    workdir = tempfile.mkdtemp(prefix="tessera-serve-logs-")
    kubeconfig = os.path.join(workdir, "kubeconfig")
    sim = subprocess.Popen([tessera, "apisim", "--write-kubeconfig", kubeconfig],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        if not wait_for(lambda: os.path.exists(kubeconfig), 30):
            raise SystemExit("FAIL: apisim did not write its kubeconfig")
        kubectl = ["kubectl", "--kubeconfig", kubeconfig]
        namespace = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: ml\n"
        for args, stdin in ((["-f", "-"], namespace),
                            (["-f", os.path.join(source, "examples/cluster.yaml")], None),
                            (["-f", os.path.join(source, "examples/pod.yaml")], None)):
            out = subprocess.run(kubectl + ["create", "--validate=false"] + args, input=stdin,
                                 capture_output=True, text=True)
            if out.returncode != 0:
                raise SystemExit(f"FAIL: kubectl create {args}: {out.stderr}")
        pod = json.loads(subprocess.run(kubectl + ["get", "pod", "-n", "ml", "finetune-0", "-o",
                                                   "json"], capture_output=True, text=True,
                                        check=True).stdout)
        counts = {r: len(subprocess.run(kubectl + ["get", r, "-A", "-o", "name"],
                                        capture_output=True, text=True,
                                        check=True).stdout.split())
                  for r in ("pods", "nodes")}
        check_json(tessera, kubeconfig, workdir, pod, counts)
        check_text(tessera, kubeconfig, workdir, pod)
    finally:
        stop(sim)
    for f in FAILURES:
        print("FAIL:", f)
    if FAILURES:
        print(f"logs kept in {workdir}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    print("serve_logs_test: both formats pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
