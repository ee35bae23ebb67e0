#!/usr/bin/env python3
"""Random Ascend cases for the differential test against HAMi's own code.

    tools/gen/ascend_cases.py --seed 7 --count 2000 > cases.jsonl

Each line is one case for test/hami/v2.10.0/ascendoracle (HAMi v2.10.0's Ascend vendor) and for
Tessera's checker (src/tessera/device/ascend_hami_test.cc): a chip from HAMi's chart defaults or a
variant of one, and one op — request, admit, register, fit, patch or score — over generated
resources, annotations, registrations and device usage. Deterministic for a seed. The cases stay
inside what HAMi decides deterministically where that is cheap (at most 8 NPUs a node, index
order = registration order); where HAMi breaks ties in Go map order the oracle reports every
answer it saw.
"""
import argparse
import json
import random

# HAMi v2.10.0's chart defaults (charts/hami/templates/scheduler/device-configmap.yaml): name,
# memoryAllocatable, memoryCapacity, aiCore, templates (name, MiB), superPod.
CHART_CHIPS = [
    ("Ascend910A", 32768, 32768, 30,
     [("vir02", 2184), ("vir04", 4369), ("vir08", 8738), ("vir16", 17476)], False),
    ("Ascend910B2", 65536, 65536, 24,
     [("vir03_1c_8g", 8192), ("vir06_1c_16g", 16384), ("vir12_3c_32g", 32768)], False),
    ("Ascend910B3", 65536, 65536, 20, [("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)], False),
    ("Ascend910B4-1", 65536, 65536, 20, [("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)], False),
    ("Ascend910B4", 32768, 32768, 20, [("vir05_1c_8g", 8192), ("vir10_3c_16g", 16384)], False),
    ("Ascend310P", 21527, 24576, 8, [("vir01", 3072), ("vir02", 6144), ("vir04", 12288)], False),
    ("Ascend910C", 65536, 65536, 20, [("vir05_1c_16g", 16384), ("vir10_3c_32g", 32768)], True),
]


def chip(rng):
    word, alloc, cap, core, templates, super_pod = rng.choice(CHART_CHIPS)
    templates = list(templates)
    if rng.random() < 0.3:  # a variant: templates out of order, another factor, env, class
        rng.shuffle(templates)
    c = {
        "commonWord": word,
        "chipName": word.removeprefix("Ascend"),
        "resourceName": f"huawei.com/{word}",
        "resourceMemoryName": f"huawei.com/{word}-memory",
        "resourceCoreName": f"huawei.com/{word}-core" if rng.random() < 0.9 else "",
        "memoryAllocatable": alloc,
        "memoryCapacity": cap,
        "memoryFactor": rng.choice([0, 1, 1, 1, 2]),
        "aiCore": core,
        "overwriteEnv": rng.random() < 0.2,
        "runtimeClassName": rng.choice(["", "", "ascend"]),
        "superPod": super_pod and rng.random() < 0.9,
        "templates": [{"name": n, "memory": m} for n, m in templates],
    }
    return c


def quantity(rng, values):
    v = rng.choice(values)
    return None if v is None else str(v)


COUNTS = [None, 0, 1, 1, 1, 2, 2, 3, 4, 8, -1, "1.5", "3e9", "2k", "1000m"]
MEMS = [None, None, 0, 1000, 2184, 3000, 8192, 16384, 17477, 32768, 40000, 65536, 70000,
        "16Gi", -5, "1.5", "3000m", "1e3", "2147483647"]
CORES = [None, None, None, 0, 5, 10, 50, 100, 150, "1500m", -2]


def resources(rng, c, counts=COUNTS, mems=MEMS, cores=CORES):
    limits, requests = {}, {}
    for name, values in ((c["resourceName"], counts), (c["resourceMemoryName"], mems),
                         (c["resourceCoreName"] or "huawei.com/none-core", cores)):
        v = quantity(rng, values)
        if v is None:
            continue
        r = rng.random()
        if r < 0.7:
            limits[name] = v
        elif r < 0.9:
            requests[name] = v
        else:
            limits[name] = v
            requests[name] = v
    return limits, requests


def pod_annotations(rng, c, devices=()):
    a = {}
    if rng.random() < 0.3:
        a["huawei.com/vnpu-mode"] = rng.choice(["hami-core", "hami-core", "other", ""])
    ids = [d["id"] for d in devices]
    if ids and rng.random() < 0.15:
        a[f"hami.io/use-{c['commonWord']}-uuid"] = ",".join(rng.sample(ids, rng.randint(1, len(ids))))
    if ids and rng.random() < 0.15:
        a[f"hami.io/no-use-{c['commonWord']}-uuid"] = " , ".join(rng.sample(ids, 1))
    if rng.random() < 0.4:
        a["hami.io/gpu-scheduler-policy"] = rng.choice(["binpack", "spread", "mutex"])
    return a


def devices(rng, c, hami_core_node):
    word = c["commonWord"]
    n = rng.choice([1, 2, 4, 4, 8, 8])
    network = word.startswith("Ascend910") and rng.random() < 0.8
    out = []
    for i in range(n):
        d = {"id": f"{word}-npu-{i}", "index": i, "count": rng.choice([1, 4, 7]),
             "devmem": c["memoryAllocatable"], "devcore": 100 if hami_core_node else c["aiCore"],
             "type": word, "numa": 0, "health": rng.random() < 0.92}
        if network and (rng.random() < 0.95):
            d["custominfo"] = {"NetworkID": 0 if word == "Ascend910C" or i <= 3 else 1}
        used = rng.choice([0, 0, 0, 1, 2, d["count"]])
        used = min(used, d["count"])
        d["used"] = used
        d["usedmem"] = 0 if used == 0 else min(d["devmem"], used * rng.choice([2184, 8192, 16384]))
        d["usedcores"] = 0 if used == 0 else min(d["devcore"], used * rng.choice([0, 5, 10, 50]))
        out.append(d)
    return out


def container_devices(rng, c, devs, containers=None):
    templates = [t["memory"] for t in c["templates"]] + [c["memoryAllocatable"]]
    out = []
    for _ in range(containers or rng.randint(1, 3)):
        ctr = []
        for d in rng.sample(devs, rng.randint(0, min(3, len(devs)))):
            ctr.append({"Idx": d["index"], "UUID": d["id"], "Type": c["commonWord"],
                        "Usedmem": rng.choice(templates + [0, 1000]),
                        "Usedcores": rng.choice([0, 0, 5, 100])})
        out.append(ctr)
    return out


def registration(rng, c):
    devs = devices(rng, c, False)
    items = []
    for d in devs:
        item = {k: d[k] for k in ("id", "index", "count", "devmem", "devcore", "type", "numa",
                                  "health") if d[k] or rng.random() < 0.5}
        if "custominfo" in d:
            item["custominfo"] = d["custominfo"]
        if rng.random() < 0.05:
            item["custominfo"] = rng.choice([None, {}, {"NetworkID": "x"}, {"NetworkID": 2.7}])
        items.append(item)
    value = json.dumps(items, separators=(",", ":"))
    r = rng.random()
    if r < 0.04:
        value = "[]"
    elif r < 0.08:
        value = value[:-3]
    elif r < 0.1:
        value = "GPU-1,10,32768,100,NVIDIA,0,true:"
    return value


def case(rng):
    c = chip(rng)
    op = rng.choice(["request", "request", "admit", "admit", "register", "fit", "fit", "fit",
                     "fit", "patch", "score"])
    out = {"op": op, "chip": c, "hamiVnpuCore": rng.random() < 0.3}
    if op in ("request", "admit"):
        out["limits"], out["requests"] = resources(rng, c)
        out["annotations"] = pod_annotations(rng, c)
    elif op == "register":
        out["value"] = registration(rng, c)
    elif op == "fit":
        hami_core_node = rng.random() < 0.4
        devs = devices(rng, c, hami_core_node)
        out["devices"] = devs
        counts = [1, 1, 1, 2, 2, 4, 8] + ([3] if rng.random() < 0.1 else [])
        mems = [None, None, 1000, 2184, 8192, 16384, 32768, 65536]
        cores = [None, None, None, 0, 10, 50, 100]
        limits, requests = resources(rng, c, counts, mems, cores)
        limits.setdefault(c["resourceName"], "1")
        requests.pop(c["resourceName"], None)
        out["limits"], out["requests"] = limits, requests
        out["annotations"] = pod_annotations(rng, c, devs)
        out["nodeAnnotations"] = ({"hami-vnpu-core": "true" if hami_core_node else "false"}
                                  if rng.random() < 0.8 else {})
    elif op == "patch":
        devs = devices(rng, c, False)
        out["podDevices"] = container_devices(rng, c, devs)
        out["annotations"] = pod_annotations(rng, c)
    else:  # score
        devs = devices(rng, c, False)
        out["devices"] = devs
        out["podDevices"] = container_devices(rng, c, devs)
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--count", type=int, default=1000)
    args = p.parse_args()
    rng = random.Random(args.seed)
    for _ in range(args.count):
        print(json.dumps(case(rng), separators=(",", ":"), sort_keys=True))


if __name__ == "__main__":
    main()
