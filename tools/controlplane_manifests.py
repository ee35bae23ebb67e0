#!/usr/bin/env python3
"""deploy/base's manifests, adapted for the local control plane of tools/controlplane.sh.

  split RENDERED OUTDIR                     kubectl kustomize deploy/base's output into the files
                                            `up` applies or reads (see split())
  webhook WEBHOOK_YAML URL CA_FILE          the MutatingWebhookConfiguration with clientConfig.url
                                            and caBundle in place of the in-cluster Service
  scheduler CONFIG_YAML URL CA KUBECONFIG   the KubeSchedulerConfiguration with every extender's
                                            urlPrefix = URL, verified against CA, and its
                                            clientConnection.kubeconfig

Only the addresses, the trust and the credentials change; every other field is deploy/base's.
"""
import base64
import sys

import yaml

# What runs in the cluster in deploy/base and is replaced here by local processes.
SKIPPED_KINDS = {"Deployment", "Job", "Service", "PodDisruptionBudget"}


def load_all(path):
    with open(path) as f:
        return [d for d in yaml.safe_load_all(f) if d]


def dump(path, docs):
    with open(path, "w") as f:
        yaml.safe_dump_all(docs, f, sort_keys=False)


def split(rendered, outdir):
    docs = load_all(rendered)
    namespaces, apply, webhooks = [], [], []
    scheduler_config = device_config = None
    for d in docs:
        kind, name = d["kind"], d["metadata"]["name"]
        if kind == "Namespace":
            namespaces.append(d)
        elif kind == "MutatingWebhookConfiguration":
            webhooks.append(d)
        elif kind in SKIPPED_KINDS:
            print(f"skipped {kind} {name} (a local process stands in for it)")
            continue
        else:
            apply.append(d)
            if kind == "ConfigMap" and "config.yaml" in d.get("data", {}):
                scheduler_config = d["data"]["config.yaml"]
            if kind == "ConfigMap" and "device-config.yaml" in d.get("data", {}):
                device_config = d["data"]["device-config.yaml"]
    if not namespaces or len(webhooks) != 1 or scheduler_config is None or device_config is None:
        sys.exit("deploy/base must render a Namespace, one MutatingWebhookConfiguration and the "
                 "ConfigMaps with config.yaml and device-config.yaml")
    dump(f"{outdir}/base-namespace.yaml", namespaces)
    dump(f"{outdir}/base-apply.yaml", apply)
    dump(f"{outdir}/base-webhook.yaml", webhooks)
    with open(f"{outdir}/scheduler-config-base.yaml", "w") as f:
        f.write(scheduler_config)
    with open(f"{outdir}/device-config.yaml", "w") as f:
        f.write(device_config)
    for d in namespaces + apply:
        print(f"apply {d['kind']} {d['metadata']['name']}")


def webhook(path, url, ca_file):
    (d,) = load_all(path)
    with open(ca_file, "rb") as f:
        ca = base64.b64encode(f.read()).decode()
    for w in d["webhooks"]:
        w["clientConfig"] = {"url": url, "caBundle": ca}
    yaml.safe_dump(d, sys.stdout, sort_keys=False)


def scheduler(path, url, ca_file, kubeconfig):
    with open(path) as f:
        cfg = yaml.safe_load(f)
    if not cfg.get("extenders"):
        sys.exit(f"{path}: no extenders")
    for e in cfg["extenders"]:
        e["urlPrefix"] = url
        e["enableHTTPS"] = True
        e["tlsConfig"] = {"caFile": ca_file}
    cfg.setdefault("clientConnection", {})["kubeconfig"] = kubeconfig
    yaml.safe_dump(cfg, sys.stdout, sort_keys=False)


def main(argv):
    cmds = {"split": (split, 2), "webhook": (webhook, 3), "scheduler": (scheduler, 4)}
    if len(argv) < 2 or argv[1] not in cmds or len(argv) - 2 != cmds[argv[1]][1]:
        sys.exit(__doc__)
    fn, _ = cmds[argv[1]]
    fn(*argv[2:])


if __name__ == "__main__":
    main(sys.argv)
