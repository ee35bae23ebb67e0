#!/usr/bin/env python3
"""HAMi's own Helm chart, rendered by real Helm, against the facts hami_chart_test.py runs on.

hami_chart_test.py starts the binary with the command lines HAMi's chart renders, recorded in
test/deploy/testdata/hami_chart_args.json and hami_chart_values.json, and with the lines
deploy/hami-chart's values files produce, derived there by Helm's merge rules. This test renders
charts/hami of HAMi v2.5.2 and v2.10.0 with `helm template` (default values, and each values
file) and checks that the extender container's command, fixed environment values and image are
exactly what those facts and that derivation say.

    hami_chart_render_test.py SOURCE_DIR [TESSERA]

With the tessera binary it also reads the device ConfigMap each chart renders by default: the
`vnpus:` section (Huawei Ascend chips, v2.5.2's list and v2.10.0's object) must carry over, which
`tessera explain` of an Ascend910A pod shows (the chart's template for 3000 MiB, vir04).

Needs helm (tools/helm.sh build) and a git repository of HAMi with both tags ($HAMI_GIT, else
/work/.mirror/Project-HAMi+HAMi/repo when it exists); exit 77 (skipped) without either, since
HAMi's chart is not on the Go module proxy or in this repository.
"""
import json
import os
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hami_chart_test  # noqa: E402  (values_file_command, image_of, merged)

MIRROR = "/work/.mirror/Project-HAMi+HAMi/repo"


def helm_binary(source):
    out = subprocess.run(["bash", os.path.join(source, "tools/helm.sh"), "build"],
                         capture_output=True, text=True)
    path = os.path.join(out.stdout.strip(), "helm") if out.returncode == 0 else ""
    return path if os.path.isfile(path) else None


def extender(rendered):
    """The container of the rendered objects whose command starts with `scheduler`."""
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "Deployment":
            for c in doc["spec"]["template"]["spec"]["containers"]:
                if c.get("command", [""])[0] == "scheduler":
                    return c
    return None


ASCEND_NODE = {
    "apiVersion": "v1", "kind": "Node",
    "metadata": {"name": "npu-1", "annotations": {
        "hami.io/node-register-Ascend910A": json.dumps(
            [{"id": "npu-0", "count": 4, "devmem": 32768, "devcore": 30, "type": "Ascend910A",
              "health": True}]),
        "hami-vnpu-core": "false"}},
    "status": {"conditions": [{"type": "Ready", "status": "True"}]},
}
ASCEND_POD = {
    "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "npu-pod", "namespace": "default"},
    "spec": {"containers": [{"name": "main", "resources": {"limits": {
        "huawei.com/Ascend910A": "1", "huawei.com/Ascend910A-memory": "3000"}}}]},
}


def check_device_config(version, rendered, tessera, tmp):
    """The chart's device config, read by tessera: its Ascend910A chip as HAMi's chart has it."""
    config = None
    for doc in yaml.safe_load_all(rendered):
        if doc and doc.get("kind") == "ConfigMap" and "device-config.yaml" in (doc.get("data") or {}):
            config = doc["data"]["device-config.yaml"]
    if config is None:
        return [f"{version}: no ConfigMap with device-config.yaml"]
    paths = {}
    for name, content in (("config", config), ("cluster", json.dumps(ASCEND_NODE)),
                          ("pod", json.dumps(ASCEND_POD))):
        paths[name] = f"{tmp}/{version}-{name}.yaml"
        with open(paths[name], "w") as f:
            f.write(content)
    out = subprocess.run([tessera, "explain", "--cluster", paths["cluster"], "--pod", paths["pod"],
                          "--device-config", paths["config"], "-o", "json", "--now", "1"],
                         capture_output=True, text=True)
    if out.returncode != 0:
        return [f"{version}: tessera explain with the chart's device config exits "
                f"{out.returncode}: {out.stderr.strip()}"]
    doc = json.loads(out.stdout)
    info = doc["annotations"].get("huawei.com/Ascend910A", "")
    if doc["node"] != "npu-1" or '"temp":"vir04"' not in info:
        return [f"{version}: the chart's Ascend910A chip did not carry over: node {doc['node']}, "
                f"huawei.com/Ascend910A {info!r}, webhook {doc['webhook']}"]
    print(f"ok   {version} device config: Ascend910A, 3000 MiB as {info}")
    return []


def main():
    source = sys.argv[1]
    tessera = sys.argv[2] if len(sys.argv) > 2 else None
    helm = helm_binary(source)
    git = os.environ.get("HAMI_GIT") or (MIRROR if os.path.isdir(MIRROR) else "")
    if not helm or not git:
        print(f"SKIP: {'helm (tools/helm.sh build)' if not helm else 'HAMI_GIT'} missing")
        return 77
    with open(os.path.join(source, "test/deploy/testdata/hami_chart_args.json")) as f:
        charts = json.load(f)["charts"]
    with open(os.path.join(source, "test/deploy/testdata/hami_chart_values.json")) as f:
        values_facts = json.load(f)["charts"]
    failures = []
    with tempfile.TemporaryDirectory(prefix="tessera-hami-render-") as tmp:
        env = {**os.environ, "HELM_CACHE_HOME": f"{tmp}/cache", "HELM_CONFIG_HOME": f"{tmp}/cfg",
               "HELM_DATA_HOME": f"{tmp}/data"}
        for version, chart in charts.items():
            root = f"{tmp}/{version}"
            os.makedirs(root)
            archive = subprocess.run(["git", "--git-dir", git, "archive", version, "charts/hami"],
                                     capture_output=True)
            if archive.returncode != 0:
                print(f"SKIP: {git} has no tag {version}: {archive.stderr.decode().strip()}")
                return 77
            subprocess.run(["tar", "-x", "-C", root], input=archive.stdout, check=True)

            def render(*extra):
                out = subprocess.run([helm, "template", "hami", f"{root}/charts/hami",
                                      "--namespace", "hami-system", *extra],
                                     capture_output=True, text=True, env=env)
                if out.returncode != 0:
                    failures.append(f"{version}: helm template {extra}: {out.stderr.strip()}")
                    return None
                if tessera and not extra:
                    failures.extend(check_device_config(version, out.stdout, tessera, tmp))
                c = extender(out.stdout)
                if c is None:
                    failures.append(f"{version}: no container runs `scheduler`")
                return c

            c = render()
            if c is not None:
                if c["command"] != chart["command"]:
                    failures.append(f"{version} default: helm renders {c['command']}, the facts "
                                    f"say {chart['command']}")
                rendered_env = {e["name"]: e.get("value") for e in c.get("env") or []}
                for name, value in chart["env"].items():
                    # Downward-API values (POD_NAME, POD_NAMESPACE) are examples in the facts.
                    if name in rendered_env and rendered_env[name] is not None \
                            and rendered_env[name] != value:
                        failures.append(f"{version} default: env {name}={rendered_env[name]}, "
                                        f"the facts say {value}")
                    if name not in rendered_env:
                        failures.append(f"{version} default: no env {name}")
                print(f"ok   {version} default: {len(c['command'])} arguments")
            facts = values_facts[version]
            want, bad = hami_chart_test.values_file_command(version, facts, chart, source)
            failures += bad
            c = render("-f", os.path.join(source, facts["values_file"]))
            if c is not None and want is not None:
                with open(os.path.join(source, facts["values_file"])) as f:
                    image = hami_chart_test.image_of(
                        version, hami_chart_test.merged(facts["defaults"], yaml.safe_load(f)))
                if c["command"] != want:
                    failures.append(f"{version} {facts['values_file']}: helm renders "
                                    f"{c['command']}, the test derives {want}")
                if c["image"] != image:
                    failures.append(f"{version} {facts['values_file']}: helm renders image "
                                    f"{c['image']}, the test derives {image}")
                print(f"ok   {version} {facts['values_file']}: {c['image']}")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
