#!/usr/bin/python3
"""Writes examples/cluster.yaml: a small GPU cluster as `kubectl get nodes,pods -A -o yaml` prints it.

Run from the repository root: /usr/bin/python3 tools/gen/example_cluster.py
"""
import yaml

from registrations import delimited_register, json_register


def uuid(n, i):
    return "GPU-%08x-%04x-%04x-%04x-%012x" % (0x5e55e000 + n, 0x1000 + i, 0x2000 + i,
                                              0x3000 + n, 0xabc000000000 + n * 16 + i)


def devices(n, count, typ, mem, per_numa=None):
    return [dict(id=uuid(n, i), index=i, count=10, devmem=mem, devcore=100, type=typ,
                 numa=(i // per_numa if per_numa else 0), health=True) for i in range(count)]


A = devices(1, 4, "NVIDIA-Tesla T4", 15360)
B = devices(2, 2, "NVIDIA-NVIDIA A100-SXM4-40GB", 40960)
C = devices(3, 8, "NVIDIA-Tesla V100-SXM2-32GB", 32768, per_numa=4)


def node(name, uid, annotations, gpus):
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "uid": uid, "resourceVersion": "1000",
                     "labels": {"kubernetes.io/hostname": name, "gpu": "on" if gpus else "off"},
                     "annotations": annotations},
        "spec": {},
        "status": {"allocatable": {"cpu": "64", "memory": "256Gi",
                                   **({"nvidia.com/gpu": str(gpus * 10)} if gpus else {})},
                   "conditions": [{"type": "Ready", "status": "True"}]},
    }


def alloc(entries):
    return "".join("".join("%s,NVIDIA,%d,%d:" % e for e in c) + ";" for c in entries)


def pod(name, uid, node_name, phase, entries, containers, extra_annotations=None, deleting=False):
    ann = {}
    if entries is not None:
        s = alloc(entries)
        ann = {"hami.io/vgpu-node": node_name, "hami.io/vgpu-time": "1764670000",
               "hami.io/vgpu-devices-to-allocate": ";" * len(entries),
               "hami.io/vgpu-devices-allocated": s, "hami.io/bind-phase": "success",
               "hami.io/bind-time": "1764670001"}
    ann.update(extra_annotations or {})
    meta = {"name": name, "namespace": "ml", "uid": uid, "resourceVersion": "2000",
            "annotations": ann, "labels": {"app": name.rsplit("-", 1)[0]}}
    if entries is not None:
        meta["labels"]["hami.io/vgpu-node"] = node_name
    if deleting:
        meta["deletionTimestamp"] = "2026-12-02T10:00:00Z"
        meta["deletionGracePeriodSeconds"] = 30
    return {
        "apiVersion": "v1", "kind": "Pod", "metadata": meta,
        "spec": {"nodeName": node_name, "schedulerName": "hami-scheduler",
                 "containers": [{"name": c, "image": "nvcr.io/nvidia/pytorch:24.01-py3",
                                 "resources": {"limits": lim}} for c, lim in containers]},
        "status": {"phase": phase},
    }


items = [
    node("gpu-t4-1", "7d2c9a52-0001-4000-8000-000000000001",
         {"hami.io/node-nvidia-register": json_register(A)}, 4),
    node("gpu-a100-1", "7d2c9a52-0001-4000-8000-000000000002",
         {"hami.io/node-nvidia-register": delimited_register(B),
          "hami.io/node-handshake": "Reported 2026-12-02 09:59:31.120931 +0000 UTC m=+8861.101"},
         2),
    node("gpu-v100-1", "7d2c9a52-0001-4000-8000-000000000003",
         {"hami.io/node-nvidia-register": json_register(C),
          "hami.io/device-cordon": C[7]["id"]}, 8),
    node("cpu-1", "7d2c9a52-0001-4000-8000-000000000004", {}, 0),
    # T4 node: three of four cards carry work.
    pod("train-0", "b1f0c3aa-0000-4000-8000-000000000001", "gpu-t4-1", "Running",
        [[(A[0]["id"], 12000, 50)]], [("main", {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "12000",
                                                "nvidia.com/gpucores": "50"})]),
    pod("train-1", "b1f0c3aa-0000-4000-8000-000000000002", "gpu-t4-1", "Running",
        [[(A[1]["id"], 15360, 100)]], [("main", {"nvidia.com/gpu": "1",
                                                 "nvidia.com/gpucores": "100"})]),
    pod("infer-0", "b1f0c3aa-0000-4000-8000-000000000003", "gpu-t4-1", "Running",
        [[(A[2]["id"], 8000, 30)], []], [("server", {"nvidia.com/gpu": "1",
                                                     "nvidia.com/gpumem": "8000",
                                                     "nvidia.com/gpucores": "30"}),
                                          ("sidecar", {"cpu": "1"})]),
    # A100 node: one 2-GPU job.
    pod("llm-0", "b1f0c3aa-0000-4000-8000-000000000004", "gpu-a100-1", "Running",
        [[(B[0]["id"], 30000, 60), (B[1]["id"], 30000, 60)]],
        [("main", {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "30000",
                   "nvidia.com/gpucores": "60"})]),
    # Finished and terminating pods: the first holds nothing, the second still holds its card.
    pod("batch-0", "b1f0c3aa-0000-4000-8000-000000000005", "gpu-t4-1", "Succeeded",
        [[(A[3]["id"], 15360, 100)]], [("main", {"nvidia.com/gpu": "1"})]),
    pod("notebook-0", "b1f0c3aa-0000-4000-8000-000000000006", "gpu-v100-1", "Running",
        [[(C[0]["id"], 32768, 100)]], [("lab", {"nvidia.com/gpu": "1",
                                                "nvidia.com/gpucores": "100"})], deleting=True),
    pod("web-0", "b1f0c3aa-0000-4000-8000-000000000007", "cpu-1", "Running", None,
        [("nginx", {"cpu": "500m", "memory": "256Mi"})]),
]

doc = {"apiVersion": "v1", "kind": "List", "metadata": {"resourceVersion": ""}, "items": items}
with open("examples/cluster.yaml", "w") as f:
    f.write("# A small GPU cluster as `kubectl get nodes,pods -A -o yaml` prints it.\n")
    f.write("# Generated by tools/gen/example_cluster.py.\n")
    yaml.safe_dump(doc, f, sort_keys=False, width=1000)
