#!/usr/bin/python3
"""Checks that two tessera binaries decide alike: byte for byte, on generated clusters.

A refactoring of the decision path (docs/decision-cycle.md) must not change a decision, a reason
string or a verdict. This generates random HAMi clusters (NVIDIA nodes in both registration
formats, running pods holding slices of their cards, cordoned and unhealthy cards, namespace
quotas) and one pending pod each (several containers, memory as MiB or percent, cores, type,
UUID, NUMA and policy annotations), runs `explain --cluster ... -o json` and `-o wide` with both
binaries under every node and GPU policy, and compares the exit codes and the outputs (all but
the clock's second in hami.io/vgpu-time).

  /usr/bin/python3 tools/diff_decisions.py --before OLD/tessera --after NEW/tessera --clusters 300

Exit 0 when every output matched (it prints how many decisions were compared and how many found a
node), 1 at the first difference (the cluster and pod are kept in --keep for replay), 2 on bad
arguments.
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "gen"))
from registrations import delimited_register, json_register  # noqa: E402

TYPES = [("NVIDIA-Tesla T4", 15360), ("NVIDIA-NVIDIA A100-SXM4-40GB", 40960),
         ("NVIDIA-Tesla V100-SXM2-32GB", 32768), ("NVIDIA-NVIDIA H100 80GB HBM3", 81920)]
NAMESPACES = ["ml", "research", "prod"]
GPU_POLICIES = ["spread", "binpack", "topology-aware", "numa", "binpack,numa"]


def uuid(n, i):
    return "GPU-%08x-%04x-%04x-%04x-%012x" % (n, i, 0x2000 + i, 0x3000 + n, 0xabc000000000 + i)


def register(devs, as_json):
    return json_register(devs) if as_json else delimited_register(devs)


def cluster(rng, seed):
    items, cards = [], []
    for n in range(rng.randint(1, 10)):
        typ, mem = rng.choice(TYPES)
        count = rng.choice([1, 2, 4, 8])
        devs = [dict(id=uuid(seed * 100 + n, i), index=i, count=rng.choice([4, 10]), devmem=mem,
                     devcore=100, type=typ, numa=i * 2 // count if count > 1 else 0,
                     health=rng.random() > 0.05) for i in range(count)]
        name = "node-%d" % n
        ann = {"hami.io/node-nvidia-register": register(devs, rng.random() < 0.6)}
        if rng.random() < 0.1:
            ann["hami.io/device-cordon"] = rng.choice(devs)["id"]
        items.append({"apiVersion": "v1", "kind": "Node",
                      "metadata": {"name": name, "uid": "node-uid-%d-%d" % (seed, n),
                                   "labels": {"kubernetes.io/hostname": name},
                                   "annotations": ann},
                      "spec": {}, "status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        cards += [(name, d) for d in devs]
    for p in range(rng.randint(0, 3 * len(cards))):
        node, d = rng.choice(cards)
        mem = rng.randint(1, d["devmem"] // 2)
        cores = rng.choice([0, 10, 25, 50, 100])
        items.append(pod(rng, "run-%d" % p, "run-uid-%d-%d" % (seed, p), [(1, mem, cores, None)],
                         bound=(node, "%s,NVIDIA,%d,%d:;" % (d["id"], mem, cores))))
    for ns in NAMESPACES:
        if rng.random() < 0.3:
            items.append({"apiVersion": "v1", "kind": "ResourceQuota",
                          "metadata": {"name": "gpu", "namespace": ns, "uid": "q-" + ns},
                          "spec": {"hard": {"limits.nvidia.com/gpumem":
                                            str(rng.randint(1, 8) * 10000)}}})
    return {"apiVersion": "v1", "kind": "List", "items": items}, cards


def pod(rng, name, uid, containers, bound=None, annotations=None):
    spec = {"schedulerName": "hami-scheduler", "containers": []}
    for i, (gpus, mem, cores, pct) in enumerate(containers):
        limits = {"nvidia.com/gpu": str(gpus)}
        if pct is not None:
            limits["nvidia.com/gpumem-percentage"] = str(pct)
        elif mem:
            limits["nvidia.com/gpumem"] = str(mem)
        if cores:
            limits["nvidia.com/gpucores"] = str(cores)
        spec["containers"].append({"name": "c%d" % i, "image": "x",
                                   "resources": {"limits": limits}})
    meta = {"name": name, "namespace": rng.choice(NAMESPACES), "uid": uid,
            "annotations": dict(annotations or {})}
    status = {"phase": "Pending"}
    if bound:
        spec["nodeName"] = bound[0]
        meta["annotations"].update({"hami.io/vgpu-node": bound[0],
                                    "hami.io/vgpu-time": "1764670000",
                                    "hami.io/vgpu-devices-to-allocate": ";",
                                    "hami.io/vgpu-devices-allocated": bound[1],
                                    "hami.io/bind-phase": "success"})
        status = {"phase": "Running"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": spec, "status": status}


def pending(rng, seed, cards):
    containers = []
    for _ in range(rng.choice([1, 1, 1, 2])):
        pct = rng.choice([None, None, None, 25, 50, 100])
        containers.append((rng.choice([1, 1, 1, 2, 3]), rng.randint(500, 30000), rng.choice(
            [0, 0, 20, 50, 100]), pct))
    ann = {}
    if rng.random() < 0.2:
        ann["nvidia.com/use-gputype"] = rng.choice(TYPES)[0].split("-", 1)[1].split()[0]
    if rng.random() < 0.1:
        ann["nvidia.com/nouse-gputype"] = rng.choice(TYPES)[0].split("-", 1)[1].split()[0]
    if rng.random() < 0.1 and cards:
        ann["nvidia.com/use-gpuuuid"] = rng.choice(cards)[1]["id"]
    if rng.random() < 0.1:
        ann["nvidia.com/numa-bind"] = "true"
    if rng.random() < 0.2:
        ann["hami.io/node-scheduler-policy"] = rng.choice(["binpack", "spread"])
    if rng.random() < 0.2:
        ann["hami.io/gpu-scheduler-policy"] = rng.choice(["binpack", "spread"])
    return pod(rng, "want", "want-uid-%d" % seed, containers, annotations=ann)


# The one field that is not a decision: the wall-clock second of hami.io/vgpu-time.
VGPU_TIME = re.compile(rb'(hami\.io/vgpu-time"?:\s*"?)[0-9]+')


def run(binary, args):
    r = subprocess.run([binary, "explain", *args], capture_output=True, timeout=60)
    return r.returncode, VGPU_TIME.sub(rb"\g<1>TIME", r.stdout), r.stderr


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", required=True, help="the tessera binary before the change")
    ap.add_argument("--after", required=True, help="the tessera binary after the change")
    ap.add_argument("--clusters", type=int, default=200, help="clusters generated (default 200)")
    ap.add_argument("--seed", type=int, default=1, help="the first cluster's seed (default 1)")
    ap.add_argument("--keep", default=tempfile.gettempdir(), help="where a differing case is kept")
    a = ap.parse_args()
    for b in (a.before, a.after):
        if not os.access(b, os.X_OK):
            ap.error("%s is not an executable" % b)
    compared = fits = 0
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seed, a.seed + a.clusters):
            rng = random.Random(seed)
            doc, cards = cluster(rng, seed)
            want = pending(rng, seed, cards)
            cpath, ppath = os.path.join(tmp, "cluster.json"), os.path.join(tmp, "pod.json")
            with open(cpath, "w") as f:
                json.dump(doc, f)
            with open(ppath, "w") as f:
                json.dump(want, f)
            for node_policy in ("binpack", "spread"):
                for gpu_policy in GPU_POLICIES:
                    for output in ("json", "wide"):
                        args = ["--cluster", cpath, ppath, "--node-policy", node_policy,
                                "--gpu-policy", gpu_policy, "-o", output]
                        before, after = run(a.before, args), run(a.after, args)
                        if before != after:
                            keep = os.path.join(a.keep, "diff-decisions-%d" % seed)
                            os.makedirs(keep, exist_ok=True)
                            for name in ("cluster.json", "pod.json"):
                                os.replace(os.path.join(tmp, name), os.path.join(keep, name))
                            print("seed %d: the outputs differ for explain %s (kept in %s)\n"
                                  "before: exit %d\n%s%s\nafter: exit %d\n%s%s" % (
                                      seed, " ".join(args[4:]), keep, before[0],
                                      before[1].decode(errors="replace"),
                                      before[2].decode(errors="replace"), after[0],
                                      after[1].decode(errors="replace"),
                                      after[2].decode(errors="replace")))
                            return 1
                        compared += 1
                        fits += before[0] == 0
    print("%d decisions compared on %d clusters (%d found a node): identical" % (
        compared, a.clusters, fits))
    return 0


if __name__ == "__main__":
    sys.exit(main())
