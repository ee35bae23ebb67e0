#!/usr/bin/env python3
"""Helpers of the burst tests on the real control plane (failover_test.sh, scheduler_kill_test.sh).

  plugin DIR SECONDS        a stand-in for HAMi's device plugin: for every node whose
                            hami.io/mutex.lock names a pod bound to that node with
                            hami.io/bind-phase=allocating, what Allocate does at its end
                            (reference/hami-device-plugin.md 3.1, 3.2): patch the pod's
                            bind-phase to success, then remove the lock (a merge patch with the
                            node's resourceVersion). Polls every 0.1 s; exits after SECONDS.
  check DIR NAMESPACE       the pods' truth against the nodes' registered devices. Exit 1, with
                            every violation on stderr, when a device is over-committed (summed
                            memory, cores or pod count of the bound pods'
                            hami.io/vgpu-devices-allocated above its registration), when a bound
                            pod's hami.io/vgpu-node is not its spec.nodeName or it names a device
                            of another node, or when a pod has more than one successful binding
                            (kube-scheduler's Scheduled or Tessera's BindingSucceed events).
                            Prints one JSON line: bound and pending pod counts, the binding
                            events counted, and per device {memory bytes, cores, pods}.
  metrics DIR NAMESPACE URL Tessera's /metrics at URL equal the truth of `check`: per registered
                            device, hami_gpu_memory_allocated_bytes and hami_gpu_shared_count.
                            Exit 1 and say what differs otherwise.
  selftest                  the checks above catch hand-made over-committed, misplaced and
                            double-bound pod sets, and accept a correct one.

DIR is a control plane of tools/controlplane.sh (its env, ca.crt, admin.crt, admin.key).
"""
import collections
import http.client
import json
import ssl
import sys
import time
import urllib.request


class Api:
    """The API server as the admin client (one keep-alive connection, reopened on errors)."""

    def __init__(self, d):
        env = {}
        with open(f"{d}/env") as f:
            for line in f:
                if "=" in line and not line.startswith("#"):
                    k, v = line.strip().split("=", 1)
                    env[k] = v
        self.port = int(env["APISERVER_PORT"])
        self.ctx = ssl.create_default_context(cafile=f"{d}/ca.crt")
        self.ctx.load_cert_chain(f"{d}/admin.crt", f"{d}/admin.key")
        self.conn = None

    def call(self, method, path, body=None, ctype="application/json"):
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPSConnection("127.0.0.1", self.port,
                                                            context=self.ctx, timeout=10)
                headers = {"Accept": "application/json"}
                data = None
                if body is not None:
                    data = json.dumps(body).encode()
                    headers["Content-Type"] = ctype
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                payload = r.read()
                return r.status, (json.loads(payload) if payload else {})
            except (OSError, http.client.HTTPException):
                self.conn = None
                if attempt == 2:
                    raise
                time.sleep(0.2)
        raise AssertionError("unreachable")

    def get(self, path):
        status, obj = self.call("GET", path)
        if status != 200:
            raise RuntimeError(f"GET {path}: HTTP {status}: {obj.get('message')}")
        return obj


LOCK = "hami.io/mutex.lock"
PHASE = "hami.io/bind-phase"
NODE = "hami.io/vgpu-node"
ALLOCATED = "hami.io/vgpu-devices-allocated"
REGISTER = "hami.io/node-nvidia-register"


def plugin(d, seconds):
    api = Api(d)
    deadline = time.monotonic() + float(seconds)
    released = 0
    while time.monotonic() < deadline:
        try:
            for n in api.get("/api/v1/nodes")["items"]:
                lock = n["metadata"].get("annotations", {}).get(LOCK)
                if not lock or lock.count(",") != 2:
                    continue
                _, ns, name = lock.split(",")
                status, pod = api.call("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
                if status != 200:
                    continue
                ann = pod["metadata"].get("annotations", {})
                if pod["spec"].get("nodeName") != n["metadata"]["name"] or ann.get(PHASE) != "allocating":
                    continue
                api.call("PATCH", f"/api/v1/namespaces/{ns}/pods/{name}",
                         {"metadata": {"annotations": {PHASE: "success"}}},
                         "application/merge-patch+json")
                status, _ = api.call(
                    "PATCH", f"/api/v1/nodes/{n['metadata']['name']}",
                    {"metadata": {"annotations": {LOCK: None},
                                  "resourceVersion": n["metadata"]["resourceVersion"]}},
                    "application/merge-patch+json")
                if status == 200:
                    released += 1
                    print(f"plugin: released {n['metadata']['name']}'s lock of {ns}/{name}", flush=True)
        except (OSError, RuntimeError, http.client.HTTPException) as e:
            print(f"plugin: {e}", flush=True)
        time.sleep(0.1)
    print(f"plugin: done after {seconds}s, {released} locks released", flush=True)


def parse_allocated(text):
    """hami.io/vgpu-devices-allocated: containers separated by ';', devices by ':',
    each device `UUID,TYPE,MiB,cores`."""
    out = []
    for ctr in text.split(";"):
        for dev in ctr.split(":"):
            if not dev:
                continue
            f = dev.split(",")
            if len(f) < 4:
                raise ValueError(f"bad device entry {dev!r}")
            out.append((f[0], int(f[2]), int(f[3])))
    return out


def capacity(nodes):
    """UUID -> (node, MiB, cores, slots) from the JSON register annotation."""
    cap = {}
    for n in nodes:
        reg = n["metadata"].get("annotations", {}).get(REGISTER)
        if not reg:
            continue
        for dev in json.loads(reg):
            cap[dev["id"]] = (n["metadata"]["name"], dev["devmem"], dev["devcore"], dev["count"])
    return cap


def judge(pods, nodes, events):
    """(violations, summary) for the pods, nodes and events (API objects as dicts)."""
    bad = []
    cap = capacity(nodes)
    used = collections.defaultdict(lambda: [0, 0, 0])
    bound = pending = 0
    for p in pods:
        name = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
        node = p["spec"].get("nodeName")
        if not node:
            pending += 1
            continue
        bound += 1
        ann = p["metadata"].get("annotations", {})
        if ann.get(NODE) != node:
            bad.append(f"{name}: bound to {node} but {NODE} is {ann.get(NODE)!r}")
        try:
            devs = parse_allocated(ann.get(ALLOCATED, ""))
        except ValueError as e:
            bad.append(f"{name}: {ALLOCATED} unreadable: {e}")
            continue
        if not devs:
            bad.append(f"{name}: bound to {node} without {ALLOCATED}")
        for uuid, mem, cores in devs:
            if uuid not in cap or cap[uuid][0] != node:
                bad.append(f"{name}: bound to {node} but allocated {uuid}, "
                           f"{'a device of ' + cap[uuid][0] if uuid in cap else 'an unregistered device'}")
            u = used[uuid]
            u[0] += mem
            u[1] += cores
            u[2] += 1
    for uuid, (mem, cores, n) in sorted(used.items()):
        if uuid not in cap:
            continue
        node, cmem, ccores, slots = cap[uuid]
        if mem > cmem or cores > ccores or n > slots:
            bad.append(f"over-commit on {uuid} ({node}): {mem}/{cmem} MiB, {cores}/{ccores} cores, "
                       f"{n}/{slots} pods")
    # Successful bindings per pod: kube-scheduler's Scheduled events, Tessera's BindingSucceed.
    per = collections.Counter()
    for e in events:
        if e.get("reason") in ("Scheduled", "BindingSucceed") and e["involvedObject"].get("kind") == "Pod":
            n = e.get("count") or 1
            if e.get("series"):
                n = max(n, e["series"].get("count", 1))
            per[(e["reason"], e["involvedObject"]["name"], e["involvedObject"].get("uid"))] += n
    for (reason, pod, _), n in sorted(per.items()):
        if n > 1:
            bad.append(f"{pod}: {n} {reason} events (bound more than once)")
    summary = {"bound": bound, "pending": pending,
               "binding_events": {r: sum(n for (reason, _, _), n in per.items() if reason == r)
                                  for r in ("Scheduled", "BindingSucceed")},
               "devices": {u: {"memory_bytes": used[u][0] * 1048576 if u in used else 0,
                               "cores": used[u][1] if u in used else 0,
                               "pods": used[u][2] if u in used else 0} for u in sorted(cap)}}
    return bad, summary


def fetch(d, ns):
    api = Api(d)
    pods = api.get(f"/api/v1/namespaces/{ns}/pods")["items"]
    nodes = api.get("/api/v1/nodes")["items"]
    events = api.get(f"/api/v1/namespaces/{ns}/events")["items"]
    return pods, nodes, events


def check(d, ns):
    bad, summary = judge(*fetch(d, ns))
    for b in bad:
        print(f"check: {b}", file=sys.stderr)
    print(json.dumps(summary, sort_keys=True))
    return 1 if bad else 0


def parse_metrics(text):
    out = collections.defaultdict(dict)
    for line in text.splitlines():
        if line.startswith("#") or "{" not in line:
            continue
        name, rest = line.split("{", 1)
        labels, value = rest.rsplit("}", 1)
        uuid = None
        for part in labels.split(","):
            if part.startswith("device_uuid="):
                uuid = part.split("=", 1)[1].strip('"')
        if uuid:
            out[name][uuid] = float(value)
    return out


def compare_metrics(summary, m):
    bad = []
    for uuid, t in summary["devices"].items():
        for fam, want in (("hami_gpu_memory_allocated_bytes", t["memory_bytes"]),
                          ("hami_gpu_shared_count", t["pods"])):
            got = m.get(fam, {}).get(uuid)
            if got != want:
                bad.append(f"{fam}{{device_uuid={uuid}}} is {got}, the pods say {want}")
    return bad


def metrics(d, ns, url):
    _, summary = judge(*fetch(d, ns))
    with urllib.request.urlopen(url, timeout=5) as r:
        m = parse_metrics(r.read().decode())
    bad = compare_metrics(summary, m)
    for b in bad:
        print(f"metrics: {b}", file=sys.stderr)
    return 1 if bad else 0


def selftest():
    def node(name, n):
        reg = [{"id": f"GPU-{name}-{i}", "count": 10, "devmem": 8192, "devcore": 100} for i in range(n)]
        return {"metadata": {"name": name, "annotations": {REGISTER: json.dumps(reg)}}}

    def pod(name, node_name, alloc, ann_node=None, uid=None):
        ann = {NODE: ann_node or node_name, ALLOCATED: alloc} if alloc else {}
        return {"metadata": {"namespace": "e2e", "name": name, "uid": uid or name, "annotations": ann},
                "spec": {"nodeName": node_name} if node_name else {}}

    def ev(reason, name, count=1):
        return {"reason": reason, "count": count, "involvedObject": {"kind": "Pod", "name": name, "uid": name}}

    nodes = [node("a", 2), node("b", 1)]
    ok = [pod(f"p{i}", "a", f"GPU-a-{i % 2},NVIDIA,1000,10:;") for i in range(16)]
    ok.append(pod("pending", None, None))
    good, s = judge(ok, nodes, [ev("Scheduled", "p0"), ev("BindingSucceed", "p0")])
    assert not good, good
    assert s["bound"] == 16 and s["pending"] == 1, s
    assert s["devices"]["GPU-a-0"] == {"memory_bytes": 8 * 1000 * 1048576, "cores": 80, "pods": 8}, s
    assert s["devices"]["GPU-b-0"]["pods"] == 0, s
    assert s["binding_events"] == {"Scheduled": 1, "BindingSucceed": 1}, s
    cases = {
        # 9 x 1000 MiB on one 8192 MiB device.
        "memory": (ok + [pod("x", "a", "GPU-a-0,NVIDIA,1000,0:;")], [], "over-commit on GPU-a-0"),
        # 80 + 30 cores.
        "cores": (ok + [pod("x", "a", "GPU-a-1,NVIDIA,10,30:;")], [], "110/100 cores"),
        # 11 pods on a device of 10 slots, within memory and cores.
        "slots": ([pod(f"s{i}", "b", "GPU-b-0,NVIDIA,1,0:;") for i in range(11)], [], "11/10 pods"),
        # Two containers on one device add up.
        "containers": ([pod("c", "b", "GPU-b-0,NVIDIA,5000,0:;GPU-b-0,NVIDIA,5000,0:;")], [], "10000/8192"),
        "wrong node annotation": ([pod("w", "a", "GPU-a-0,NVIDIA,1,0:;", ann_node="b")], [], "but hami.io/vgpu-node"),
        "device of another node": ([pod("w", "a", "GPU-b-0,NVIDIA,1,0:;")], [], "a device of b"),
        "bound without allocation": ([pod("w", "a", None)], [], "without"),
        "two Scheduled": (ok, [ev("Scheduled", "p1"), ev("Scheduled", "p1")], "2 Scheduled events"),
        "BindingSucceed count 2": (ok, [ev("BindingSucceed", "p2", 2)], "2 BindingSucceed events"),
    }
    for what, (pods, events, want) in cases.items():
        bad, _ = judge(pods, nodes, events)
        assert any(want in b for b in bad), f"{what}: expected a violation containing {want!r}, got {bad}"
    # The metrics comparison: equal passes, one byte or one pod off fails, a missing series fails.
    _, s = judge(ok, nodes, [])
    text = "\n".join(
        f'{fam}{{node_name="a",device_uuid="{u}",device_index="0"}} {v}'
        for u, t in s["devices"].items()
        for fam, v in (("hami_gpu_memory_allocated_bytes", t["memory_bytes"]),
                       ("hami_gpu_shared_count", t["pods"])))
    assert not compare_metrics(s, parse_metrics(text))
    assert compare_metrics(s, parse_metrics(text.replace("8388608000", "8388608001")))
    assert compare_metrics(s, parse_metrics(text.replace("shared_count{node_name=\"a\",device_uuid=\"GPU-a-0\",device_index=\"0\"} 8", "shared_count{node_name=\"a\",device_uuid=\"GPU-a-0\",device_index=\"0\"} 7")))
    assert compare_metrics(s, parse_metrics(text.replace("GPU-b-0", "GPU-c-0")))
    print("burst.py selftest: ok")
    return 0


def main(argv):
    cmds = {"plugin": (plugin, 2), "check": (check, 2), "metrics": (metrics, 3), "selftest": (selftest, 0)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        sys.exit(__doc__)
    fn, _ = cmds[argv[1]]
    sys.exit(fn(*argv[2:]) or 0)


if __name__ == "__main__":
    main(sys.argv)
