#!/usr/bin/env python3
"""A tenant rewrites its running pod's allocation (issue #41 finding 2, docs/self-healing.md).

Starts `tessera apisim` and `tessera serve` on 127.0.0.1 (or uses --target/--metrics-target of
a running serve with --apiserver, its API server), then, as kube-scheduler and a tenant would:

  1. registers node --node with one GPU of --card-mib MiB;
  2. creates pod "tenant-a" asking for --ask-mib MiB, filters it (POST /filter) and binds it
     (POST /bind), and waits until serve has observed it bound;
  3. as the pod's owner, merge-patches its hami.io/vgpu-devices-allocated down to 1 MiB;
  4. waits (at most --wait seconds) for the audit to report the rewrite: the gauge
     tessera_ledger_problems{kind="rewritten"}, the counter tessera_allocation_rewrites_total,
     the pod under /debug/audit's problems.rewritten, and a Warning event AllocationRewritten;
  5. creates pod "tenant-b" asking for the same --ask-mib and filters it: the card still holds
     the first pod's decision, so it must be refused.

Prints one JSON document with what was seen and how long the report took, and "pass". Exit
status 0 when it passes, 1 when not, 2 on a set-up error. 127.0.0.1 only; two pods, one node.

  python3 test/hostile/tenant_rewrite.py --tessera build/release/cmd/tessera/tessera
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hostile import free_port, wait_port  # noqa: E402


def http(method, url, body=None, content_type="application/json", timeout=10):
    """(status, body text); a refused connection raises OSError."""
    data = None if body is None else (body if isinstance(body, bytes) else json.dumps(body).encode())
    req = urllib.request.Request(url, data=data, method=method)
    if data is not None:
        req.add_header("Content-Type", content_type)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def eventually(check, timeout, pause=0.1):
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value or time.monotonic() >= deadline:
            return value
        time.sleep(pause)


def metric(text, family, labels=""):
    """The value of the sample `family{labels}` (labels as rendered) or None."""
    pattern = re.escape(family) + (r"\{" + re.escape(labels) + r"\}" if labels else "") + r" (\S+)$"
    for line in text.splitlines():
        m = re.match(pattern, line)
        if m:
            return float(m.group(1))
    return None


def node_object(name, card_mib):
    devices = [{"id": "GPU-%s-0" % name, "index": 0, "count": 10, "devmem": card_mib,
                "devcore": 100, "type": "NVIDIA-A100", "numa": 0, "health": True}]
    return {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name,
                         "annotations": {"hami.io/node-nvidia-register": json.dumps(devices)}},
            "status": {"allocatable": {"nvidia.com/gpu": "10"},
                       "conditions": [{"type": "Ready", "status": "True"}]}}


def pod_object(name, mib):
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": "default"},
            "spec": {"schedulerName": "hami-scheduler",
                     "containers": [{"name": "c", "image": "cuda",
                                     "resources": {"limits": {"nvidia.com/gpu": "1",
                                                              "nvidia.com/gpumem": str(mib)}}}]}}


def start_processes(args, workdir):
    """Starts apisim and serve; returns (procs, apiserver URL, http port, metrics port)."""
    procs = []
    kubeconfig = os.path.join(workdir, "kubeconfig")
    procs.append(subprocess.Popen([args.tessera, "apisim", "--write-kubeconfig", kubeconfig],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    if not eventually(lambda: os.path.exists(kubeconfig) and os.path.getsize(kubeconfig) > 0, 30):
        raise RuntimeError("apisim did not write its kubeconfig")
    with open(kubeconfig) as f:
        m = re.search(r"server:\s*(\S+)", f.read())
    if not m:
        raise RuntimeError("no server in %s" % kubeconfig)
    apiserver = m.group(1).strip("'\"")
    port, metrics = free_port(), free_port()
    procs.append(subprocess.Popen(
        [args.tessera, "serve", "--kubeconfig", kubeconfig, "--leader-elect=false",
         "--audit-period", "%ds" % args.audit_period,
         "--http_bind", "127.0.0.1:%d" % port, "--metrics-bind-address", "127.0.0.1:%d" % metrics],
        stdout=subprocess.DEVNULL, stderr=open(os.path.join(workdir, "serve.log"), "w")))
    if not wait_port(port) or not wait_port(metrics):
        raise RuntimeError("tessera serve did not listen; see %s" % workdir)
    return procs, apiserver, port, metrics


def stop_processes(procs):
    for p in reversed(procs):
        p.terminate()
    for p in reversed(procs):
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tessera", default="build/release/cmd/tessera/tessera")
    parser.add_argument("--target", type=int, help="extender port of a running serve")
    parser.add_argument("--metrics-target", type=int, help="its metrics port")
    parser.add_argument("--apiserver", help="its API server URL (no authentication)")
    parser.add_argument("--node", default="tenant-node")
    parser.add_argument("--card-mib", type=int, default=16000)
    parser.add_argument("--ask-mib", type=int, default=12000)
    parser.add_argument("--audit-period", type=int, default=2, help="seconds (started serve)")
    parser.add_argument("--wait", type=float, default=30.0, help="seconds for each report")
    args = parser.parse_args()

    workdir = tempfile.mkdtemp(prefix="tessera-tenant-rewrite-")
    procs = []
    report = {}
    try:
        if args.target:
            if not (args.metrics_target and args.apiserver):
                raise RuntimeError("--target needs --metrics-target and --apiserver")
            apiserver, port, metrics = args.apiserver, args.target, args.metrics_target
        else:
            procs, apiserver, port, metrics = start_processes(args, workdir)
        extender = "http://127.0.0.1:%d" % port
        debug = "http://127.0.0.1:%d" % metrics
        pods = apiserver + "/api/v1/namespaces/default/pods"
        uuid = "GPU-%s-0" % args.node

        status, text = http("POST", apiserver + "/api/v1/nodes",
                            node_object(args.node, args.card_mib))
        if status not in (200, 201, 409):
            raise RuntimeError("creating the node: %d %s" % (status, text[:200]))

        def schedule(name):
            """Creates and filters pod `name`; the filter's reply."""
            status, text = http("POST", pods, pod_object(name, args.ask_mib))
            if status not in (200, 201):
                raise RuntimeError("creating pod %s: %d %s" % (name, status, text[:200]))
            pod = json.loads(text)
            # Retried until serve's informers have synced and it has seen the node.
            def filtered():
                s, t = http("POST", extender + "/filter",
                            {"Pod": pod, "Nodes": None, "NodeNames": [args.node]})
                reply = json.loads(t) if s == 200 else {}
                waiting = reply.get("Error") or \
                    (reply.get("FailedNodes") or {}).get(args.node) == "node unregistered"
                return reply if s == 200 and not waiting else None
            reply = eventually(filtered, args.wait, 0.2)
            if not reply:
                raise RuntimeError("no /filter answer for %s" % name)
            return pod, reply

        pod_a, reply = schedule("tenant-a")
        report["filter_a"] = reply.get("NodeNames")
        if reply.get("NodeNames") != [args.node]:
            raise RuntimeError("tenant-a was not placed: %s" % reply)
        allocated = eventually(lambda: json.loads(http("GET", pods + "/tenant-a")[1])
                               ["metadata"].get("annotations", {})
                               .get("hami.io/vgpu-devices-allocated"), args.wait)
        report["decided"] = allocated
        s, t = http("POST", extender + "/bind",
                    {"PodName": "tenant-a", "PodNamespace": "default",
                     "PodUID": pod_a["metadata"]["uid"], "Node": args.node})
        report["bind_a"] = json.loads(t).get("Error", t) if s == 200 else "%d %s" % (s, t)
        if report["bind_a"] != "":
            raise RuntimeError("tenant-a was not bound: %s" % report["bind_a"])

        def allocated_mib():
            s, t = http("GET", debug + "/metrics")
            v = metric(t, "hami_gpu_memory_allocated_bytes",
                       'deviceidx="0",deviceuuid="%s",nodeid="%s"' % (uuid, args.node)) \
                if s == 200 else None
            if v is None and s == 200:  # label order differs between families: any sample
                for line in t.splitlines():
                    if line.startswith("hami_gpu_memory_allocated_bytes{") and uuid in line:
                        v = float(line.rsplit(" ", 1)[1])
            return None if v is None else v / 1048576.0

        def observed_bound():
            s, t = http("GET", debug + "/debug/ledger")
            return s == 200 and not json.loads(t).get("reservations")
        eventually(observed_bound, args.wait)
        report["allocated_mib_before"] = allocated_mib()

        # The tenant: a merge patch of its own running pod's allocation.
        rewritten = "%s,NVIDIA,1,0:;" % uuid
        patched_at = time.monotonic()
        s, t = http("PATCH", pods + "/tenant-a",
                    {"metadata": {"annotations": {"hami.io/vgpu-devices-allocated": rewritten}}},
                    content_type="application/merge-patch+json")
        report["tenant_patch"] = s
        if s != 200:
            raise RuntimeError("the tenant's patch failed: %d %s" % (s, t[:200]))

        def reported():
            s, t = http("GET", debug + "/metrics")
            if s != 200:
                return None
            gauge = metric(t, "tessera_ledger_problems", 'kind="rewritten"')
            total = metric(t, "tessera_allocation_rewrites_total")
            return (gauge, total) if gauge == 1 and total and total >= 1 else None
        seen = eventually(reported, args.wait)
        report["metrics_reported_after_s"] = round(time.monotonic() - patched_at, 2) if seen \
            else None
        report["allocated_mib_after"] = allocated_mib()

        s, t = http("GET", debug + "/debug/audit")
        if s == 200:
            rewrites = json.loads(t).get("audit", {}).get("problems", {}).get("rewritten", [])
            report["debug_audit_rewritten"] = [
                {"name": r.get("name"), "kept": r.get("kept", {}).get("devices"),
                 "rewritten": r.get("rewritten", {}).get("devices")} for r in rewrites]
        else:
            report["debug_audit_rewritten"] = "GET /debug/audit: %d" % s

        def event():
            s, t = http("GET", apiserver + "/api/v1/namespaces/default/events")
            if s != 200:
                return None
            for e in json.loads(t).get("items", []):
                if e.get("reason") == "AllocationRewritten" and \
                        e.get("involvedObject", {}).get("name") == "tenant-a":
                    return {"type": e.get("type"), "message": e.get("message")}
            return None
        report["event"] = eventually(event, args.wait)

        _, reply = schedule("tenant-b")
        report["filter_b"] = {"NodeNames": reply.get("NodeNames"),
                              "FailedNodes": reply.get("FailedNodes")}

        audit_ok = isinstance(report["debug_audit_rewritten"], str) or any(
            r["name"] == "tenant-a" and r["rewritten"] == rewritten
            for r in report["debug_audit_rewritten"])
        report["pass"] = bool(
            seen and audit_ok and report["event"] and report["event"]["type"] == "Warning"
            and report["allocated_mib_after"] == args.ask_mib
            and not reply.get("NodeNames") and args.node in (reply.get("FailedNodes") or {}))
        print(json.dumps(report, indent=2))
        return 0 if report["pass"] else 1
    except (RuntimeError, OSError, ValueError, subprocess.CalledProcessError) as e:
        print("tenant_rewrite.py: %s (workdir %s)" % (e, workdir), file=sys.stderr)
        if report:
            print(json.dumps(report, indent=2), file=sys.stderr)
        return 2
    finally:
        stop_processes(procs)


if __name__ == "__main__":
    sys.exit(main())
