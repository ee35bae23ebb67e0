"""HAMi's NVIDIA node registration (hami.io/node-nvidia-register) in both of its formats.

A device is a dict with id, index, count, devmem, devcore, type, numa, health; used by
tools/gen/example_cluster.py and tools/diff_decisions.py.
"""
import json


def json_register(devs):
    out = []
    for d in devs:  # HAMi v2.8+ JSON registration: Go struct order, omitempty
        o = {"id": d["id"]}
        if d["index"]:
            o["index"] = d["index"]
        o.update(count=d["count"], devmem=d["devmem"], devcore=d["devcore"], type=d["type"])
        if d["numa"]:
            o["numa"] = d["numa"]
        o["mode"] = "hami-core"
        if d["health"]:
            o["health"] = True
        out.append(o)
    return json.dumps(out, separators=(",", ":"))


def delimited_register(devs):  # HAMi v2.5 delimited registration, 9 fields
    return "".join("%s,%d,%d,%d,%s,%d,%s,%d,hami-core:" % (
        d["id"], d["count"], d["devmem"], d["devcore"], d["type"], d["numa"],
        "true" if d["health"] else "false", d["index"]) for d in devs)
