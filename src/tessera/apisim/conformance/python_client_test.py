#!/usr/bin/python3
"""Conformance of an API server with the official Python client (Debian python3-kubernetes).

    /usr/bin/python3 python_client_test.py TESSERA_BINARY [http|https]
        `tessera apisim`, started (and killed) here
    /usr/bin/python3 python_client_test.py --kubeconfig FILE [--expire-cmd CMD]
        an existing server, e.g. the real kube-apiserver of tools/controlplane.sh
        (test/controlplane/apisim_conformance_test.sh); CMD (run by the shell) must make every
        earlier resourceVersion unservable to a watch -- there, restart kube-apiserver

Covers, with the same assertions for both, in a namespace of its own (conformance-py-<pid>):
paged list (limit/continue, one snapshot), watch from a resourceVersion, and a list-watch loop
that recovers from 410 Gone (reason Expired, "too old resource version: RV (...)") by relisting
and finds a deletion its watch never delivered. apisim only: that pod's DELETED event is dropped
by fault injection (the relist alone can reveal it), and /simulator/v1/stats counts the drop.
An existing server gets the namespace's default ServiceAccount (no kube-controller-manager).
Stops by itself, always kills the simulator, and removes its namespace from an existing server.
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
    if len(sys.argv) >= 3 and sys.argv[1] == "--kubeconfig":
        return main_existing(sys.argv[2:])
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
        run(kc, Apisim(base))
    finally:
        watchdog.cancel()
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
        shutil.rmtree(tmp, ignore_errors=True)
    print("python client conformance (%s): ok" % mode)


def main_existing(argv):
    """--kubeconfig FILE [--expire-cmd CMD]: an existing server (e.g. the real kube-apiserver)."""
    kc, expire_cmd = argv[0], None
    rest = argv[1:]
    while rest:
        if rest[0] == "--expire-cmd" and len(rest) > 1:
            expire_cmd, rest = rest[1], rest[2:]
        else:
            fail("unknown argument %r (usage: --kubeconfig FILE [--expire-cmd CMD])" % rest[0])
    # The whole run, like the simulator's watchdog: a stuck call ends the test, not the caller.
    signal.signal(signal.SIGALRM, lambda *_: fail("not done within 180 s"))
    signal.alarm(180)
    run(kc, Existing(expire_cmd))
    signal.alarm(0)
    print("python client conformance (existing server): ok")


class Apisim:
    """The server under test is `tessera apisim`: it can drop an event and forget history."""

    def __init__(self, base):
        self.base = base

    def setup(self, v1, ns):
        pass

    def can_expire(self):
        return True

    def simulator(self, method, path, body=None):
        cfg = client.Configuration.get_default_copy()
        ctx = (ssl.create_default_context(cafile=cfg.ssl_ca_cert)
               if self.base.startswith("https") else None)
        req = urllib.request.Request(self.base + path, method=method,
                                     data=None if body is None else json.dumps(body).encode())
        req.add_header("Content-Type", "application/json")
        token = cfg.api_key.get("authorization")
        if token:
            req.add_header("Authorization", token)
        with urllib.request.urlopen(req, timeout=10, context=ctx) as r:
            return json.loads(r.read())

    def drop_next_pod_deletion(self):
        self.simulator("PUT", "/simulator/v1/faults",
                       {"dropWatchEvents": [{"resource": "pods", "type": "DELETED",
                                             "probability": 1.0, "count": 1}]})

    def clear_faults(self):
        self.simulator("DELETE", "/simulator/v1/faults")

    def expire(self, v1):
        # The 60 patches before this pushed the revision out of the 50-event history already.
        self.simulator("POST", "/simulator/v1/compact")

    def check_stats(self):
        stats = self.simulator("GET", "/simulator/v1/stats")
        if stats["watchEventsDropped"] != 1:
            fail("stats: %s" % stats)


class Existing:
    """An existing server: events cannot be dropped; --expire-cmd makes earlier revisions
    unservable to a watch (for tools/controlplane.sh: restart kube-apiserver, whose new watch
    cache starts at the current revision)."""

    def __init__(self, expire_cmd):
        self.expire_cmd = expire_cmd

    def setup(self, v1, ns):
        # No kube-controller-manager may be running to create it, and the ServiceAccount
        # admission plugin refuses pods without it.
        v1.create_namespaced_service_account(
            ns, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default")))

    def can_expire(self):
        return self.expire_cmd is not None

    def drop_next_pod_deletion(self):
        pass

    def clear_faults(self):
        pass

    def expire(self, v1):
        subprocess.run(self.expire_cmd, shell=True, check=True, timeout=60,
                       stdout=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                v1.api_client.call_api("/readyz", "GET", auth_settings=["BearerToken"],
                                       _request_timeout=5)
                return
            except Exception:  # pylint: disable=broad-except
                if time.time() > deadline:
                    fail("the server is not ready within 60 s of %r" % self.expire_cmd)
                time.sleep(0.5)

    def check_stats(self):
        pass


def run(kc, server):
    config.load_kube_config(config_file=kc)
    v1 = client.CoreV1Api()
    ns = "conformance-py-%d" % os.getpid()
    v1.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
    try:
        server.setup(v1, ns)
        checks(v1, ns, server)
    finally:
        if isinstance(server, Existing):
            cleanup(v1, ns)


def cleanup(v1, ns):
    """Removes what the test created from an existing server (pods first: the namespace
    controller may not run)."""
    try:
        for p in v1.list_namespaced_pod(ns).items:
            v1.delete_namespaced_pod(p.metadata.name, ns, grace_period_seconds=0)
        v1.delete_namespace(ns)
    except ApiException as e:
        print("cleanup of namespace %s: %s" % (ns, e), file=sys.stderr)


def checks(v1, ns, server):
    def pod(name, node=None):
        return client.V1Pod(metadata=client.V1ObjectMeta(name=name, labels={"app": "py"}),
                            spec=client.V1PodSpec(node_name=node,
                                                  containers=[client.V1Container(name="c", image="busybox")]))

    # --- paged list from one snapshot ---
    for i in range(25):
        v1.create_namespaced_pod(ns, pod("p%02d" % i))
    names, token, rvs, pages = [], None, set(), 0
    while True:
        lst = v1.list_namespaced_pod(ns, limit=10, _continue=token)
        pages += 1
        rvs.add(lst.metadata.resource_version)
        names += [p.metadata.name for p in lst.items]
        if pages == 1:
            v1.create_namespaced_pod(ns, pod("zz-late"))  # not in this snapshot
        token = lst.metadata._continue
        if not token:
            break
    if pages != 3 or len(rvs) != 1 or names != ["p%02d" % i for i in range(25)]:
        fail("pagination: pages=%d rvs=%s names=%s" % (pages, rvs, names))

    # --- watch from a resourceVersion ---
    rv = v1.list_namespaced_pod(ns).metadata.resource_version
    v1.create_namespaced_pod(ns, pod("w1"))
    v1.patch_namespaced_pod("w1", ns, {"metadata": {"labels": {"seen": "yes"}}})
    v1.delete_namespaced_pod("w1", ns)
    seen = []
    for ev in watch.Watch().stream(v1.list_namespaced_pod, ns, resource_version=rv,
                                   timeout_seconds=2):
        md = ev["object"].metadata
        seen.append((ev["type"], md.name, md.deletion_timestamp is not None,
                     md.deletion_grace_period_seconds))
    # The delete of an unbound pod is two writes: deletionTimestamp with grace 0, then DELETED
    # (kube-apiserver v1.37.2; apisim sent DELETED alone until 2026-12-05).
    if seen != [("ADDED", "w1", False, None), ("MODIFIED", "w1", False, None),
                ("MODIFIED", "w1", True, 0), ("DELETED", "w1", True, 0)]:
        fail("watch from rv %s saw %s" % (rv, seen))

    # --- list-watch loop that survives 410 by relisting ---
    if not server.can_expire():
        print("SKIPPED: the 410 recovery (no --expire-cmd for this server)")
        return
    cache = {p.metadata.name: p for p in v1.list_namespaced_pod(ns).items}
    stale_rv = v1.list_namespaced_pod(ns).metadata.resource_version
    server.drop_next_pod_deletion()  # apisim only: its DELETED event is lost for good
    v1.delete_namespaced_pod("p00", ns)
    server.clear_faults()
    for i in range(60):  # apisim: pushes stale_rv out of the 50-event history
        v1.patch_namespaced_pod("p01", ns, {"metadata": {"annotations": {"n": str(i)}}})
    server.expire(v1)  # apisim: compact; an existing server: --expire-cmd
    rv, relists, got_410 = stale_rv, 0, False
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            for ev in watch.Watch().stream(v1.list_namespaced_pod, ns, resource_version=rv,
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
            # The watch's ERROR event: a Status with reason Expired and kube-apiserver's message.
            if not got_410 and not str(e.reason).startswith(
                    "Expired: too old resource version: %s (" % stale_rv):
                fail("410 from rv %s with reason %r" % (stale_rv, e.reason))
            got_410 = True
            lst = v1.list_namespaced_pod(ns)  # relist replaces the cache
            relists += 1
            cache = {p.metadata.name: p for p in lst.items}
            rv = lst.metadata.resource_version
    if not got_410 or relists != 1:
        fail("no 410 recovery (got_410=%s relists=%d)" % (got_410, relists))
    if "p00" in cache:
        fail("relist did not reveal the deletion")
    if cache["p01"].metadata.annotations.get("n") != "59":
        fail("cache not current after relist")
    server.check_stats()  # apisim only: exactly the one dropped event


if __name__ == "__main__":
    main()
