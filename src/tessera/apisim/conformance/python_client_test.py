#!/usr/bin/python3
"""Conformance of `tessera apisim` with the official Python client (Debian python3-kubernetes).

    /usr/bin/python3 python_client_test.py TESSERA_BINARY [http|https]

Covers: paged list (limit/continue, one snapshot), watch from a resourceVersion, and a
list-watch loop that recovers from 410 Gone by relisting (after a compaction, with a dropped
DELETED event that only the relist reveals). Stops by itself and always kills the simulator.
"""
import json
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

from kubernetes import client, config, watch
from kubernetes.client.rest import ApiException


def fail(msg):
    print("FAIL:", msg, file=sys.stderr)
    sys.exit(1)


def main():
    binary = sys.argv[1]
    mode = sys.argv[2] if len(sys.argv) > 2 else "http"
    tmp = tempfile.mkdtemp()
    kc = os.path.join(tmp, "kc")
    args = [binary, "apisim", "--listen", "127.0.0.1:0", "--write-kubeconfig", kc,
            "--watch-history", "50"]
    if mode == "https":
        args += ["--tls-self-signed", "--token", "py-t0ken"]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    watchdog = threading.Timer(120, proc.kill)
    watchdog.start()
    try:
        first = proc.stdout.readline().strip()
        if not re.fullmatch(r"listening on https?://127\.0\.0\.1:\d+", first):
            fail("first line %r" % first)
        base = first.split(" ")[-1]
        run(base, kc)
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print("python client conformance (%s): ok" % mode)


def run(base, kc):
    config.load_kube_config(config_file=kc)
    cfg = client.Configuration.get_default_copy()
    v1 = client.CoreV1Api()

    def simulator(method, path, body=None):
        ctx = ssl.create_default_context(cafile=cfg.ssl_ca_cert) if base.startswith("https") else None
        req = urllib.request.Request(base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        token = cfg.api_key.get("authorization")
        if token:
            req.add_header("Authorization", token)
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return json.loads(r.read())

    def pod(name, node=None):
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"app": "py"}),
                            spec=client.V1PodSpec(node_name=node,
                                                  containers=[client.V1Container(name="c", image="busybox")]))

    # --- paged list from one snapshot ---
    for i in range(25):
        v1.create_namespaced_pod("default", pod("p%02d" % i))
    names, token, rvs, pages = [], None, set(), 0
    while True:
        lst = v1.list_namespaced_pod("default", limit=10, _continue=token)
        pages += 1
        rvs.add(lst.metadata.resource_version)
        names += [p.metadata.name for p in lst.items]
        if pages == 1:
            v1.create_namespaced_pod("default", pod("zz-late"))  # not in this snapshot
        token = lst.metadata._continue
        if not token:
            break
    if pages != 3 or len(rvs) != 1 or names != ["p%02d" % i for i in range(25)]:
        fail("pagination: pages=%d rvs=%s names=%s" % (pages, rvs, names))

    # --- watch from a resourceVersion ---
    rv = v1.list_namespaced_pod("default").metadata.resource_version
    v1.create_namespaced_pod("default", pod("w1"))
    v1.patch_namespaced_pod("w1", "default", {"metadata": {"labels": {"seen": "yes"}}})
    v1.delete_namespaced_pod("w1", "default")
    seen = []
    for ev in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=rv,
                                   timeout_seconds=2):
        seen.append((ev["type"], ev["object"].metadata.name))
    if seen != [("ADDED", "w1"), ("MODIFIED", "w1"), ("DELETED", "w1")]:
        fail("watch from rv %s saw %s" % (rv, seen))

    # --- list-watch loop that survives 410 by relisting ---
    cache = {p.metadata.name: p for p in v1.list_namespaced_pod("default").items}
    stale_rv = v1.list_namespaced_pod("default").metadata.resource_version
    simulator("PUT", "/simulator/v1/faults",
              {"dropWatchEvents": [{"resource": "pods", "type": "DELETED", "probability": 1.0,
                                    "count": 1}]})
    v1.delete_namespaced_pod("p00", "default")  # its DELETED event is lost for good
    simulator("DELETE", "/simulator/v1/faults")
    for i in range(60):  # push stale_rv out of the 50-event history
        v1.patch_namespaced_pod("p01", "default", {"metadata": {"annotations": {"n": str(i)}}})
    simulator("POST", "/simulator/v1/compact")
    rv, relists, got_410 = stale_rv, 0, False
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            for ev in watch.Watch().stream(v1.list_namespaced_pod, "default", resource_version=rv,
                                           timeout_seconds=2):
                obj = ev["object"]
                rv = obj.metadata.resource_version
                if ev["type"] == "DELETED":
                    cache.pop(obj.metadata.name, None)
                else:
                    cache[obj.metadata.name] = obj
            if got_410:
                break
        except ApiException as e:
            if e.status != 410:
                raise
            got_410 = True
            lst = v1.list_namespaced_pod("default")  # relist replaces the cache
            relists += 1
            cache = {p.metadata.name: p for p in lst.items}
            rv = lst.metadata.resource_version
    if not got_410 or relists != 1:
        fail("no 410 recovery (got_410=%s relists=%d)" % (got_410, relists))
    if "p00" in cache:
        fail("relist did not reveal the dropped deletion")
    if cache["p01"].metadata.annotations.get("n") != "59":
        fail("cache not current after relist")
    stats = simulator("GET", "/simulator/v1/stats")
    if stats["watchEventsDropped"] != 1:
        fail("stats: %s" % stats)


if __name__ == "__main__":
    main()
