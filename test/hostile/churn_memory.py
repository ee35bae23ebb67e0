#!/usr/bin/env python3
"""Resident memory of `tessera serve` under pod churn (issue #41, finding 6; docs/serve.md).

Starts `tessera apisim` and one `tessera serve` on 127.0.0.1, registers node "a" (two 16000 MiB
GPUs), then plays kube-scheduler and the user for --pods pods, one after the other: create the
pod, /filter it, wait for the filter's patch, /bind it, mark it Running, delete it. Samples
serve's VmRSS and CPU time every --every pods. Prints JSON: the RSS at start, each sample, and at
the end, with the serve process's thread count. Nothing stays: every pod is deleted, so a serve whose
memory still grows keeps something per pod (or its allocator does).

With --tunables the serve process runs with that GLIBC_TUNABLES (base/allocator.h: serve
re-executes itself with its own tunables only when the variable is unset).

Bounded: at most 20,000 pods, each request with a 30 s timeout; 127.0.0.1 only.

  python3 test/hostile/churn_memory.py --tessera build/release/cmd/tessera/tessera --pods 3600
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402


def call(port, method, path, body=None, ctype="application/json"):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, body=None if body is None else json.dumps(body),
                     headers={"Content-Type": ctype})
        r = conn.getresponse()
        return r.status, r.read()
    finally:
        conn.close()


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def cpu_seconds(pid):
    """User + system CPU time of the process so far."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tessera", default="build/release/cmd/tessera/tessera")
    parser.add_argument("--pods", type=int, default=3600)
    parser.add_argument("--every", type=int, default=300)
    parser.add_argument("--tunables", default=None,
                        help="GLIBC_TUNABLES for serve (default: serve's own)")
    args = parser.parse_args()
    args.pods = max(1, min(args.pods, 20000))

    workdir = tempfile.mkdtemp(prefix="tessera-churn-memory-")
    kubeconfig = os.path.join(workdir, "kubeconfig")
    procs = []
    try:
        procs.append(subprocess.Popen([args.tessera, "apisim", "--write-kubeconfig", kubeconfig],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        deadline = time.monotonic() + 30
        while not os.path.exists(kubeconfig) and time.monotonic() < deadline:
            time.sleep(0.05)
        server = [line.split()[-1] for line in open(kubeconfig) if "server:" in line][0]
        api = int(server.rsplit(":", 1)[1])
        if not hostile.wait_port(api):
            raise RuntimeError("apisim did not listen")
        register = json.dumps([{"id": "GPU-a-%d" % i, "index": i, "count": 10, "devmem": 16000,
                                "devcore": 100, "type": "NVIDIA-A100", "numa": 0, "health": True}
                               for i in range(2)])
        status, _ = call(api, "POST", "/api/v1/nodes", {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "a", "annotations": {"hami.io/node-nvidia-register": register}},
            "status": {"allocatable": {"nvidia.com/gpu": "20"},
                       "conditions": [{"type": "Ready", "status": "True"}]}})
        if status != 201:
            raise RuntimeError("creating the node: HTTP %d" % status)
        env = dict(os.environ)
        if args.tunables is not None:
            env["GLIBC_TUNABLES"] = args.tunables
        http_port, metrics_port = hostile.free_port(), hostile.free_port()
        serve = subprocess.Popen([args.tessera, "serve", "--kubeconfig", kubeconfig,
                                  "--leader-elect=false",
                                  "--http_bind", "127.0.0.1:%d" % http_port,
                                  "--metrics-bind-address", "127.0.0.1:%d" % metrics_port],
                                 env=env, stdout=subprocess.DEVNULL,
                                 stderr=open(os.path.join(workdir, "serve.log"), "w"))
        procs.append(serve)
        if not hostile.wait_port(http_port) or not hostile.wait_port(metrics_port):
            raise RuntimeError("tessera serve did not listen; see %s" % workdir)
        deadline = time.monotonic() + 30
        while call(http_port, "GET", "/readyz")[0] != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("tessera serve did not get ready; see %s" % workdir)
            time.sleep(0.1)
        result = {"pods": args.pods, "tunables": args.tunables,
                  "start": {"rss_mib": hostile.rss_kib(serve.pid) / 1024.0,
                            "threads": threads(serve.pid)},
                  "samples": [], "errors": 0}
        started = time.monotonic()
        cpu_start = cpu_seconds(serve.pid)
        for i in range(args.pods):
            name = "churn-%d" % i
            status, body = call(api, "POST", "/api/v1/namespaces/default/pods", {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": "default"},
                "spec": {"schedulerName": "hami-scheduler", "containers": [{
                    "name": "c", "image": "cuda", "resources": {"limits": {
                        "nvidia.com/gpu": "1", "nvidia.com/gpumem": "1000"}}}]}})
            pod = json.loads(body)
            status, body = call(http_port, "POST", "/filter",
                                {"Pod": pod, "Nodes": None, "NodeNames": ["a"]})
            if status != 200 or json.loads(body).get("NodeNames") != ["a"]:
                result["errors"] += 1
            for _ in range(200):
                _, body = call(api, "GET", "/api/v1/namespaces/default/pods/" + name)
                annotations = json.loads(body)["metadata"].get("annotations", {})
                if annotations.get("hami.io/vgpu-node") == "a":
                    break
                time.sleep(0.005)
            status, body = call(http_port, "POST", "/bind", {
                "PodName": name, "PodNamespace": "default", "PodUID": pod["metadata"]["uid"],
                "Node": "a"})
            if status != 200 or json.loads(body).get("Error"):
                result["errors"] += 1
            call(api, "PATCH", "/api/v1/namespaces/default/pods/%s/status" % name,
                 {"status": {"phase": "Running"}}, "application/merge-patch+json")
            call(api, "DELETE", "/api/v1/namespaces/default/pods/" + name,
                 {"gracePeriodSeconds": 0})
            if (i + 1) % args.every == 0:
                result["samples"].append({"pods": i + 1,
                                          "rss_mib": hostile.rss_kib(serve.pid) / 1024.0,
                                          "seconds": round(time.monotonic() - started, 1),
                                          "cpu_seconds": round(cpu_seconds(serve.pid) - cpu_start,
                                                               2)})
        time.sleep(2)
        result["end"] = {"rss_mib": hostile.rss_kib(serve.pid) / 1024.0,
                         "threads": threads(serve.pid)}
        print(json.dumps(result, indent=1))
        return 0 if result["errors"] == 0 else 1
    except (RuntimeError, OSError) as e:
        print("churn_memory: %s" % e, file=sys.stderr)
        return 2
    finally:
        hostile.stop_processes(procs)


if __name__ == "__main__":
    sys.exit(main())
