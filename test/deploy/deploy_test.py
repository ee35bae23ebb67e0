#!/usr/bin/env python3
"""Checks the kustomize manifests in deploy/ (docs/deploy.md).

  deploy_test.py <tessera binary> <source dir>

For deploy/base and every directory under deploy/overlays:
  - `kubectl kustomize` renders it;
  - RBAC: the roles bound to the Deployment's ServiceAccount that the manifests define grant
    exactly the calls of `tessera rbac --calls` (cluster calls in a ClusterRole, namespace calls
    in a Role of the Deployment's namespace); other bindings of that account name only the
    built-in roles kube-scheduler needs; deploy/base/rbac.yaml is `tessera rbac`'s output;
  - consistency: the extender urlPrefix, the --http_bind port, the container port, the probes and
    the Services' targetPorts agree; TLS on the listener iff https in the URL; the webhook points
    at a Service of these pods on /webhook and excludes the Deployment's namespace; the
    scheduler profile, the Lease and the managed resources match the serve flags and the device
    config; every `tessera serve` flag used is accepted by `tessera serve --help`;
  - security: replicas 2, a PodDisruptionBudget, non-root, read-only root filesystem, no
    capabilities, resource requests, probes;
  - /debug: --debug-auth=kubernetes with RBAC create on tokenreviews and subjectaccessreviews
    (or, in a Helm rendering, loopback), never on the host network, so that no Service — the
    hami-migration overlay's metrics NodePort included — serves /debug unauthenticated.
overlays/monitoring (and an overlay of the user's that moves Tessera with `namespace:`) has one
ServiceMonitor and one PrometheusRule, both in the tessera-metrics Service's namespace, the
ServiceMonitor selecting that Service with honorLabels on every endpoint; no other overlay has
either. The Grafana dashboard is valid JSON whose queries name only metrics Tessera exports, with
node and namespace variables that every GPU panel uses. An
overlay with a NetworkPolicy (overlays/network-policy) must select the Deployment's pods, admit
the extender port only from ipBlocks (the API server; kube-scheduler calls over localhost) and
the metrics port only from a namespaceSelector, and nothing else. docs/deploy.md's listing of
`tessera rbac --calls` (between the markers) is that command's output; `--fix-docs` rewrites it.

Exit 77 (ctest SKIP_RETURN_CODE) when kubectl is not installed.
"""

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.parse

import yaml

# Flags the manifests use that another branch adds to `tessera serve` (leader election, issue
# 8's companion work). The test fails once `tessera serve --help` knows them, so that this list
# is emptied at the merge.
PENDING_SERVE_FLAGS = set()

# Roles kube-scheduler needs; they exist in every cluster and are not rendered.
BUILTIN_ROLES = {
    ("ClusterRole", "system:kube-scheduler"),
    ("ClusterRole", "system:volume-scheduler"),
    ("Role", "extension-apiserver-authentication-reader"),
}

FAILURES = []


def check(cond, message):
    if not cond:
        FAILURES.append(message)
    return cond


def render(directory):
    out = subprocess.run(["kubectl", "kustomize", directory], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"FAIL: kubectl kustomize {directory}:\n{out.stderr}")
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def find(docs, kind, name=None):
    return [d for d in docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]


def one(docs, kind, name=None, where=""):
    found = find(docs, kind, name)
    if len(found) != 1:
        raise SystemExit(f"FAIL: {where}: want one {kind} {name or ''}, found {len(found)}")
    return found[0]


def flag_values(args):
    """--flag=value and --flag value pairs of a container's args."""
    out = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            if "=" in a:
                k, v = a.split("=", 1)
            elif i + 1 < len(args) and not args[i + 1].startswith("-"):
                k, v = a, args[i + 1]
                i += 1
            else:
                k, v = a, "true"
            out[k] = v
        i += 1
    return out


def port_of(address):
    return int(address.rsplit(":", 1)[1])


def container(pod_spec, name):
    for c in pod_spec["containers"]:
        if c["name"] == name:
            return c
    raise SystemExit(f"FAIL: no container {name}")


def resolve_port(c, port):
    """A probe/Service port (number or name) as a number of container c."""
    if isinstance(port, int):
        return port
    for p in c.get("ports", []):
        if p.get("name") == port:
            return p["containerPort"]
    return None


def mount_for(c, pod_spec, path):
    """The (volume, relative path) a file path of container c lives in."""
    for m in c.get("volumeMounts", []):
        mp = m["mountPath"].rstrip("/") + "/"
        if path.startswith(mp):
            volume = next(v for v in pod_spec["volumes"] if v["name"] == m["name"])
            return volume, path[len(mp):]
    return None, None


def volume_has_key(volume, rel, docs):
    """Whether a ConfigMap/Secret volume provides file `rel`."""
    src = volume.get("configMap") or volume.get("secret")
    if src is None:
        return False
    items = src.get("items")
    if items is not None:
        return any(i["path"] == rel for i in items)
    if "configMap" in volume:
        cms = find(docs, "ConfigMap", volume["configMap"]["name"])
        if not cms:
            return True  # an existing ConfigMap outside these manifests (HAMi's)
        return rel in cms[0].get("data", {})
    return True


def rbac_grants(docs, sa_name, ns, where):
    """(scope, group, resource, verb) granted to the account by roles defined in docs."""
    grants = set()
    for binding in find(docs, "ClusterRoleBinding") + find(docs, "RoleBinding"):
        subjects = binding.get("subjects") or []
        if not any(s["kind"] == "ServiceAccount" and s["name"] == sa_name
                   and s.get("namespace") == ns for s in subjects):
            continue
        ref = binding["roleRef"]
        roles = [d for d in find(docs, ref["kind"], ref["name"])
                 if ref["kind"] == "ClusterRole"
                 or d["metadata"].get("namespace") == binding["metadata"].get("namespace")]
        if not roles:
            check((ref["kind"], ref["name"]) in BUILTIN_ROLES,
                  f"{where}: {binding['kind']} {binding['metadata']['name']} grants "
                  f"{ref['kind']} {ref['name']}, neither rendered nor a known built-in role")
            continue
        if ref["kind"] == "ClusterRole" and binding["kind"] == "ClusterRoleBinding":
            scope = "cluster"
        else:
            scope = "namespace"
            check(binding["metadata"].get("namespace") == ns,
                  f"{where}: {binding['metadata']['name']} is not in the namespace {ns}")
        for rule in roles[0].get("rules", []):
            check(not rule.get("resourceNames") or scope == "namespace",
                  f"{where}: resourceNames in {ref['name']}")
            for g in rule.get("apiGroups", []):
                for r in rule.get("resources", []):
                    for v in rule.get("verbs", []):
                        check("*" not in (g, r, v), f"{where}: wildcard in {ref['name']}")
                        grants.add((scope, g, r, v))
    return grants


def check_rbac(docs, deployment, calls, where):
    ns = deployment["metadata"]["namespace"]
    sa = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    check(find(docs, "ServiceAccount", sa), f"{where}: ServiceAccount {sa} not rendered")
    want = set()
    for verb, group, resource, scope in calls:
        want.add((scope, "" if group == "core" else group, resource, verb))
    got = rbac_grants(docs, sa, ns, where)
    check(got == want, f"{where}: RBAC of {sa} differs from `tessera rbac --calls`:\n"
          f"  missing: {sorted(want - got)}\n  extra:   {sorted(got - want)}")


def kubernetes_release(source):
    """The Kubernetes release test/controlplane builds (its go.mod): the one deploy/ must pin."""
    with open(os.path.join(source, "test/controlplane/go.mod")) as f:
        m = re.search(r"^\s*k8s\.io/kubernetes (v\d+\.\d+\.\d+)\s*$", f.read(), re.M)
    check(m is not None, "test/controlplane/go.mod: no k8s.io/kubernetes requirement")
    return m.group(1) if m else "v?"


def check_deployment(docs, serve_help, release, where):
    deployment = one(docs, "Deployment", None, where)
    ns = deployment["metadata"]["namespace"]
    spec = deployment["spec"]
    pod = spec["template"]["spec"]
    pod_labels = spec["template"]["metadata"]["labels"]
    check(spec["replicas"] == 2, f"{where}: replicas {spec['replicas']}, want 2")
    tessera = container(pod, "tessera")
    sched = container(pod, "kube-scheduler")
    want_image = f"registry.k8s.io/kube-scheduler:{release}"
    check(sched["image"] == want_image,
          f"{where}: kube-scheduler image {sched['image']}, want {want_image} (the release "
          "test/controlplane builds and the end-to-end tests run)")
    check(tessera["args"][0] == "serve", f"{where}: tessera args must start with serve")
    flags = flag_values(tessera["args"][1:])

    # Every flag is one `tessera serve` accepts.
    for f in flags:
        if f in PENDING_SERVE_FLAGS:
            check(f not in serve_help, f"{where}: {f} is now accepted by tessera serve: remove "
                  "it from PENDING_SERVE_FLAGS in test/deploy/deploy_test.py")
            continue
        check(re.search(re.escape(f) + r"\b", serve_help) is not None,
              f"{where}: tessera serve does not accept {f}")

    # Security and resources.
    pod_sc = pod.get("securityContext", {})
    for c in pod["containers"]:
        sc = c.get("securityContext", {})
        name = f"{where}: container {c['name']}"
        check(sc.get("runAsNonRoot", pod_sc.get("runAsNonRoot")) is True, f"{name}: not non-root")
        check(sc.get("runAsUser", pod_sc.get("runAsUser", 0)) != 0, f"{name}: runs as uid 0")
        check(sc.get("readOnlyRootFilesystem") is True, f"{name}: root filesystem writable")
        check(sc.get("allowPrivilegeEscalation") is False, f"{name}: privilege escalation")
        check(sc.get("capabilities", {}).get("drop") == ["ALL"] and
              not sc.get("capabilities", {}).get("add"), f"{name}: capabilities not dropped")
        req = c.get("resources", {}).get("requests", {})
        check("cpu" in req and "memory" in req, f"{name}: no cpu/memory requests")
        check("livenessProbe" in c, f"{name}: no liveness probe")
    check("readinessProbe" in tessera, f"{where}: tessera has no readiness probe")

    # PodDisruptionBudget.
    pdbs = [p for p in find(docs, "PodDisruptionBudget")
            if all(pod_labels.get(k) == v for k, v in p["spec"]["selector"]["matchLabels"].items())]
    check(len(pdbs) == 1, f"{where}: want one PodDisruptionBudget for the pods")

    # The listener: --http_bind port, TLS, container port, probes.
    http_port = port_of(flags["--http_bind"])
    tls = "--cert_file" in flags
    check(tls == ("--key_file" in flags), f"{where}: --cert_file without --key_file")
    check(any(p["containerPort"] == http_port for p in tessera["ports"]),
          f"{where}: no containerPort {http_port}")
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = tessera[probe]["httpGet"]
        check(get["path"] == path, f"{where}: {probe} path {get['path']}")
        check(resolve_port(tessera, get["port"]) == http_port, f"{where}: {probe} port")
        check(get.get("scheme", "HTTP") == ("HTTPS" if tls else "HTTP"), f"{where}: {probe} scheme")
    for f in ("--cert_file", "--key_file", "--device-config-file"):
        if f in flags:
            volume, rel = mount_for(tessera, pod, flags[f])
            check(volume is not None and volume_has_key(volume, rel, docs),
                  f"{where}: {f}={flags[f]} is not provided by a mounted volume")
    metrics_port = port_of(flags.get("--metrics-bind-address", ":9395"))
    check(any(p["containerPort"] == metrics_port for p in tessera["ports"]),
          f"{where}: no containerPort {metrics_port} for metrics")

    # kube-scheduler's configuration.
    config_arg = next(a for a in sched["command"] + sched.get("args", []) if a.startswith("--config="))
    volume, rel = mount_for(sched, pod, config_arg.split("=", 1)[1])
    check(volume is not None and "configMap" in volume, f"{where}: scheduler config not mounted")
    cm = one(docs, "ConfigMap", volume["configMap"]["name"], where)
    config = yaml.safe_load(cm["data"][rel])
    check(config["kind"] == "KubeSchedulerConfiguration" and
          config["apiVersion"] == "kubescheduler.config.k8s.io/v1", f"{where}: config kind")
    profiles = [p["schedulerName"] for p in config["profiles"]]
    check(profiles == [flags.get("--scheduler-name", "hami-scheduler")],
          f"{where}: profiles {profiles} vs --scheduler-name")
    le = config["leaderElection"]
    check(le["leaderElect"] is True and le.get("resourceLock", "leases") == "leases",
          f"{where}: kube-scheduler leader election")
    check(le["resourceName"] == flags.get("--leader-elect-resource-name"),
          f"{where}: Lease {le['resourceName']} vs --leader-elect-resource-name")
    check(le["resourceNamespace"] == ns, f"{where}: Lease namespace {le['resourceNamespace']} "
          f"vs the Deployment's {ns}")
    ns_flag = flags.get("--leader-elect-resource-namespace")
    check(ns_flag in (ns, "$(POD_NAMESPACE)"), f"{where}: --leader-elect-resource-namespace")
    # The leader's hami.io/scheduler-role labels (HAMi HEAD): it lists the pods of
    # $POD_NAMESPACE labelled app.kubernetes.io/component=hami-scheduler and finds its own by
    # $POD_NAME, so the pods carry that label and the container both variables.
    env = {e["name"]: e for e in tessera.get("env", [])}
    for var, field in (("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")):
        check(env.get(var, {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == field,
              f"{where}: {var} is not set from {field}")
    check(pod_labels.get("app.kubernetes.io/component") == "hami-scheduler",
          f"{where}: the pods lack app.kubernetes.io/component=hami-scheduler (scheduler-role "
          "labels)")
    check("--scheduler-role-labels=false" not in tessera["args"],
          f"{where}: --scheduler-role-labels=false")
    check(len(config["extenders"]) == 1, f"{where}: want one extender")
    ext = config["extenders"][0]
    url = urllib.parse.urlparse(ext["urlPrefix"])
    check(url.hostname in ("127.0.0.1", "localhost"), f"{where}: urlPrefix not on localhost")
    check(url.port == http_port, f"{where}: urlPrefix port {url.port} vs --http_bind {http_port}")
    check((url.scheme == "https") == tls and ext.get("enableHTTPS", False) == tls,
          f"{where}: urlPrefix scheme/enableHTTPS vs TLS on the listener")
    check(ext["filterVerb"] == "filter" and ext["bindVerb"] == "bind", f"{where}: verbs")
    check(ext["nodeCacheCapable"] is True, f"{where}: nodeCacheCapable")
    check(ext["httpTimeout"] == "30s", f"{where}: httpTimeout")
    check(ext.get("preemptVerb") == "preempt", f"{where}: preemptVerb (docs/preemption.md)")
    check("prioritizeVerb" not in ext, f"{where}: extra verbs")
    managed = {m["name"]: m.get("ignoredByScheduler") for m in ext["managedResources"]}
    check(all(v is True for v in managed.values()), f"{where}: ignoredByScheduler")

    # The device config's resource names are the managed resources.
    dvol, drel = mount_for(tessera, pod, flags["--device-config-file"])
    dcms = find(docs, "ConfigMap", dvol["configMap"]["name"])
    if dcms:
        nvidia = yaml.safe_load(dcms[0]["data"][drel])["nvidia"]
        names = {nvidia.get(k, d) for k, d in (
            ("resourceCountName", "nvidia.com/gpu"), ("resourceMemoryName", "nvidia.com/gpumem"),
            ("resourceCoreName", "nvidia.com/gpucores"),
            ("resourceMemoryPercentageName", "nvidia.com/gpumem-percentage"),
            ("resourcePriorityName", "nvidia.com/priority"))}
        check(names == set(managed), f"{where}: managedResources {sorted(managed)} vs the "
              f"device config {sorted(names)}")
    else:
        check(set(managed) == {"nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores",
                               "nvidia.com/gpumem-percentage", "nvidia.com/priority"},
              f"{where}: managedResources are not HAMi's defaults")

    # Services of these pods: every targetPort is a tessera container port.
    tessera_ports = {p["containerPort"] for p in tessera["ports"]}
    services = [s for s in find(docs, "Service")
                if s["spec"].get("selector") and
                all(pod_labels.get(k) == v for k, v in s["spec"]["selector"].items())]
    check(len(services) >= 3, f"{where}: want Services for the extender, webhook and metrics")
    for s in services:
        for p in s["spec"]["ports"]:
            check(resolve_port(tessera, p.get("targetPort", p["port"])) in tessera_ports,
                  f"{where}: Service {s['metadata']['name']} targetPort {p.get('targetPort')}")
    check(any(resolve_port(tessera, p.get("targetPort")) == metrics_port
              for s in services for p in s["spec"]["ports"]), f"{where}: no metrics Service")

    # The webhooks: HAMi's mutation, then the check of the scheduler-owned annotations.
    hook_cfg = one(docs, "MutatingWebhookConfiguration", None, where)
    check([h["name"] for h in hook_cfg["webhooks"]] ==
          ["vgpu.tessera.dev", "owned-annotations.tessera.dev"],
          f"{where}: want the webhooks vgpu.tessera.dev and owned-annotations.tessera.dev")
    check(tls, f"{where}: the API server calls webhooks over TLS only: give --cert_file")
    for hook in hook_cfg["webhooks"]:
        svc_ref = hook["clientConfig"]["service"]
        check(svc_ref["namespace"] == ns and svc_ref["path"] == "/webhook",
              f"{where}: webhook service namespace/path")
        svc = [s for s in services if s["metadata"]["name"] == svc_ref["name"]]
        check(len(svc) == 1,
              f"{where}: the webhook's Service {svc_ref['name']} does not select the pods")
        if svc:
            port = [p for p in svc[0]["spec"]["ports"] if p["port"] == svc_ref.get("port", 443)]
            check(len(port) == 1 and resolve_port(tessera, port[0]["targetPort"]) == http_port,
                  f"{where}: the webhook Service does not lead to --http_bind's port {http_port}")
        check(hook["failurePolicy"] in ("Ignore", "Fail"), f"{where}: failurePolicy")
        check(hook["sideEffects"] == "None", f"{where}: sideEffects")
        check("v1" in hook["admissionReviewVersions"], f"{where}: admissionReviewVersions")
        excluded = [e for e in hook["namespaceSelector"]["matchExpressions"]
                    if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
        check(excluded and ns in excluded[0]["values"],
              f"{where}: the webhook {hook['name']} does not exclude the namespace {ns}")
    mutate, owned = (hook_cfg["webhooks"] + [None, None])[:2]
    check(mutate["rules"] == [{"operations": ["CREATE"], "apiGroups": [""], "apiVersions": ["v1"],
                               "resources": ["pods"], "scope": "*"}], f"{where}: webhook rules")
    check(spec["template"]["metadata"]["labels"].get("hami.io/webhook") == "ignore",
          f"{where}: the scheduler pods lack hami.io/webhook=ignore")
    check_debug_access(docs, deployment, where)
    if owned is not None:
        check_owned_annotations_hook(owned, ns, spec["template"]["spec"]["serviceAccountName"],
                                     where)
    return deployment


DEBUG_REVIEWS = (("authentication.k8s.io", "tokenreviews"),
                 ("authorization.k8s.io", "subjectaccessreviews"))


def debug_auth_mode(deployment):
    serve = container(deployment["spec"]["template"]["spec"], "tessera")
    return flag_values(serve["args"][1:]).get("--debug-auth")


def check_debug_access(docs, deployment, where):
    """/debug (the ledger lists every GPU pod) is never served unauthenticated beyond the pod:
    --debug-auth is given, kubernetes (with the RBAC of its two reviews) or loopback; the pod is
    not on the host network (every process of the node would be a loopback peer). A Service
    that publishes the metrics port outside the cluster (NodePort, LoadBalancer: the
    hami-migration overlay's HAMi NodePort) then answers /debug only to authorised callers."""
    pod = deployment["spec"]["template"]["spec"]
    mode = debug_auth_mode(deployment)
    check(mode in ("kubernetes", "loopback"),
          f"{where}: tessera serve --debug-auth={mode}: give kubernetes (loopback peers and callers "
          "the API server authorises) or loopback")
    check(not pod.get("hostNetwork"),
          f"{where}: hostNetwork: every process of the node would be a loopback peer of /debug")
    if mode == "kubernetes":
        grants = rbac_grants(docs, pod["serviceAccountName"], deployment["metadata"]["namespace"],
                             where)
        for group, resource in DEBUG_REVIEWS:
            check(("cluster", group, resource, "create") in grants,
                  f"{where}: --debug-auth=kubernetes needs create on {resource} ({group}) in a "
                  "ClusterRole of the pods' account")


def check_owned_annotations_hook(hook, ns, service_account, where):
    """The check of the scheduler-owned annotations: CREATE and UPDATE, no objectSelector (the
    tenant's label must not skip it), kube-system left out, and matchConditions that let the
    Deployment's own ServiceAccount and system:masters through and call it only when an owned
    annotation is set or changed (the key list is webhook_test's business)."""
    check(hook["rules"] == [{"operations": ["CREATE", "UPDATE"], "apiGroups": [""],
                             "apiVersions": ["v1"], "resources": ["pods"], "scope": "*"}],
          f"{where}: owned-annotations rules")
    check("objectSelector" not in hook,
          f"{where}: owned-annotations must not have an objectSelector (tenants set pod labels)")
    excluded = [e for e in hook["namespaceSelector"]["matchExpressions"]
                if e["key"] == "kubernetes.io/metadata.name" and e["operator"] == "NotIn"]
    check(excluded and "kube-system" in excluded[0]["values"],
          f"{where}: owned-annotations does not exclude kube-system")
    conditions = {c["name"]: c["expression"] for c in hook.get("matchConditions", [])}
    check(list(conditions) == ["not-the-scheduler", "not-a-cluster-superuser",
                               "owned-annotation-set-or-changed"],
          f"{where}: owned-annotations matchConditions {list(conditions)}")
    user = f"system:serviceaccount:{ns}:{service_account}"
    check(conditions.get("not-the-scheduler") == f"request.userInfo.username != '{user}'",
          f"{where}: not-the-scheduler must let exactly {user} through: "
          f"{conditions.get('not-the-scheduler')!r}")
    keys = re.findall(r"'((?:hami|tessera)\.io/[a-z-]+)'",
                      conditions.get("owned-annotation-set-or-changed", ""))
    check("hami.io/vgpu-devices-allocated" in keys and len(keys) == len(set(keys)),
          f"{where}: owned-annotation-set-or-changed keys {keys}")


def exported_metrics(source):
    names = set()
    for rel in ("src/tessera/metrics/registry.cc", "src/tessera/metrics/device_families.cc"):
        with open(os.path.join(source, rel)) as f:
            names |= set(re.findall(r'"((?:tessera|hami)_[a-z_]+)"', f.read()))
    return names


def check_monitoring(docs, where):
    """The ServiceMonitor and the PrometheusRule: in the metrics Service's namespace, selecting
    it (and no other namespace), every endpoint with honorLabels."""
    service = one(docs, "Service", "tessera-metrics", where)
    ns = service["metadata"]["namespace"]
    monitor = one(docs, "ServiceMonitor", "tessera", where)
    rule = one(docs, "PrometheusRule", "tessera", where)
    check(monitor["metadata"].get("namespace") == ns,
          f"{where}: the ServiceMonitor is in {monitor['metadata'].get('namespace')}, the "
          f"Service in {ns}")
    check(rule["metadata"].get("namespace") == ns,
          f"{where}: the PrometheusRule is in {rule['metadata'].get('namespace')}, not {ns}")
    spec = monitor["spec"]
    selector = spec.get("namespaceSelector", {})
    check(selector.get("matchNames", [ns]) == [ns] and not selector.get("any"),
          f"{where}: the ServiceMonitor's namespaceSelector {selector} is not {ns}")
    labels = service["metadata"].get("labels", {})
    check(all(labels.get(k) == v for k, v in spec["selector"]["matchLabels"].items()),
          f"{where}: the ServiceMonitor does not select the tessera-metrics Service")
    ports = {p.get("name") for p in service["spec"]["ports"]}
    for e in spec["endpoints"]:
        check(e.get("port") in ports, f"{where}: ServiceMonitor endpoint port {e.get('port')}")
        check(e.get("honorLabels") is True,
              f"{where}: the ServiceMonitor endpoint lacks honorLabels: true (hami_vgpu_*'s "
              f"namespace and pod labels would become exported_namespace / exported_pod)")


def render_moved(source, namespace):
    """An overlay of the user's that moves Tessera with a namespace transformer and adds the
    monitoring components."""
    with tempfile.TemporaryDirectory() as d:
        rel = os.path.relpath(os.path.join(source, "deploy"), d)
        with open(os.path.join(d, "kustomization.yaml"), "w") as f:
            f.write("apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
                    f"namespace: {namespace}\nresources:\n  - {rel}/base\ncomponents:\n"
                    f"  - {rel}/components/servicemonitor\n  - {rel}/components/prometheusrule\n")
        out = subprocess.run(["kubectl", "kustomize", "--load-restrictor", "LoadRestrictionsNone",
                              d], capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"FAIL: kubectl kustomize of a moved overlay:\n{out.stderr}")
    docs = [x for x in yaml.safe_load_all(out.stdout) if x]
    check(one(docs, "Service", "tessera-metrics")["metadata"]["namespace"] == namespace,
          f"the moved overlay did not move the Service to {namespace}")
    return docs


def check_dashboard(source):
    path = os.path.join(source, "deploy/grafana/tessera.json")
    with open(path) as f:
        dash = json.load(f)
    exported = exported_metrics(source)
    check("tessera_leader" in exported and "hami_gpu_memory_limit_bytes" in exported,
          "dashboard: could not read the metric names from the source")
    used = set()
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            for name in re.findall(r"\b((?:tessera|hami)_[a-z_]+)", t["expr"]):
                base = re.sub(r"_(bucket|sum|count)$", "", name)
                used.add(name)
                check(name in exported or base in exported,
                      f"dashboard: panel {panel['title']!r} uses {name}, which is not exported")
    # Node and namespace variables, applied to every GPU panel.
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    for name, family in (("node", "hami_gpu_memory_limit_bytes"),
                         ("namespace", "hami_vgpu_memory_allocated_bytes")):
        v = variables.get(name, {})
        check(v.get("type") == "query" and f", {name})" in v.get("definition", "")
              and family in v.get("definition", "") and v.get("includeAll") and v.get("multi"),
              f"dashboard: no {name} variable over {family}")
    for panel in dash["panels"]:
        for t in panel.get("targets", []):
            for m in re.finditer(r"\b(hami_[a-z_]+)\{([^}]*)\}", t["expr"]):
                check('node=~"$node"' in m.group(2),
                      f"dashboard: panel {panel['title']!r}: {m.group(1)} ignores $node")
                if m.group(1).startswith("hami_vgpu_"):
                    check('namespace=~"$namespace"' in m.group(2),
                          f"dashboard: panel {panel['title']!r}: {m.group(1)} ignores $namespace")
    check({n for n in exported if n.startswith("tessera_")} <=
          {re.sub(r"_(bucket|sum|count)$", "", n) for n in used} | {"tessera_build_info"},
          f"dashboard: tessera_* families without a panel: "
          f"{sorted({n for n in exported if n.startswith('tessera_')} - {re.sub(r'_(bucket|sum|count)$', '', n) for n in used})}")


DOCS_BEGIN = "<!-- generated by `tessera rbac --calls`; test/deploy/deploy_test.py checks it -->"
DOCS_END = "<!-- end of generated listing -->"


def docs_rbac_listing(calls):
    """The RBAC listing of docs/deploy.md for `calls`: the command and its output in columns."""
    lines = ["```", "$ tessera rbac --calls"]
    lines += ["%-7s %-20s %-13s %s" % tuple(c) for c in calls]
    lines += ["$ tessera rbac > deploy/base/rbac.yaml      # after changing the table", "```"]
    return "\n".join(lines)


def check_docs_rbac(source, calls, fix):
    path = os.path.join(source, "docs/deploy.md")
    with open(path) as f:
        text = f.read()
    begin, end = text.find(DOCS_BEGIN), text.find(DOCS_END)
    if not check(0 <= begin < end, "docs/deploy.md: the generated RBAC listing's markers are missing"):
        return
    want = text[:begin + len(DOCS_BEGIN)] + "\n" + docs_rbac_listing(calls) + "\n" + text[end:]
    if fix and want != text:
        with open(path, "w") as f:
            f.write(want)
        text = want
    check(text == want, "docs/deploy.md: the RBAC listing is stale: run "
          "`python3 test/deploy/deploy_test.py <tessera> <source> --fix-docs`")


def check_network_policy(docs, deployment, where):
    """The NetworkPolicy, when the overlay has one: see the module comment."""
    policies = find(docs, "NetworkPolicy")
    if where != "overlays/network-policy":
        check(not policies, f"{where}: a NetworkPolicy outside overlays/network-policy")
        return
    if not check(len(policies) == 1, f"{where}: expected one NetworkPolicy"):
        return
    p = policies[0]
    spec = p["spec"]
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    selector = spec.get("podSelector", {}).get("matchLabels", {})
    check(selector and all(pod_labels.get(k) == v for k, v in selector.items()),
          f"{where}: the NetworkPolicy does not select the Deployment's pods")
    check(p["metadata"].get("namespace") == deployment["metadata"].get("namespace"),
          f"{where}: the NetworkPolicy is not in the Deployment's namespace")
    check(spec.get("policyTypes") == ["Ingress"], f"{where}: policyTypes must be [Ingress]")
    serve = container(deployment["spec"]["template"]["spec"], "tessera")
    flags = flag_values(serve.get("args", []))
    extender_port = port_of(flags.get("--http_bind", ""))
    metrics_port = port_of(flags.get("--metrics-bind-address", ":9395"))
    admitted = {}
    for rule in spec.get("ingress", []):
        ports = [pp.get("port") for pp in rule.get("ports", [])]
        check(ports and rule.get("from"), f"{where}: an ingress rule without ports or sources "
              "admits everything")
        for port in ports:
            admitted.setdefault(port, []).extend(rule.get("from", []))
    check(set(admitted) == {extender_port, metrics_port},
          f"{where}: the NetworkPolicy admits ports {sorted(admitted, key=str)}, want "
          f"{extender_port} and {metrics_port}")
    check(all(set(s) == {"ipBlock"} for s in admitted.get(extender_port, [])),
          f"{where}: port {extender_port} (/filter, /bind, /webhook) must admit only ipBlocks "
          "(the API server)")
    check(all(set(s) == {"namespaceSelector"} for s in admitted.get(metrics_port, [])),
          f"{where}: port {metrics_port} (/metrics, /debug) must admit only selected namespaces")


def main():
    tessera, source = sys.argv[1], sys.argv[2]
    calls = [line.split("\t") for line in subprocess.run(
        [tessera, "rbac", "--calls"], capture_output=True, text=True, check=True).stdout.splitlines()]
    check_docs_rbac(source, calls, "--fix-docs" in sys.argv[3:])
    if shutil.which("kubectl") is None:
        print("SKIP: kubectl is not installed")
        return 77
    deploy = os.path.join(source, "deploy")
    serve_help = subprocess.run([tessera, "serve", "--help"], capture_output=True, text=True,
                                check=True).stdout
    check(len(calls) >= 10 and all(len(c) == 4 for c in calls), "tessera rbac --calls output")
    generated = subprocess.run([tessera, "rbac"], capture_output=True, text=True, check=True).stdout
    with open(os.path.join(deploy, "base/rbac.yaml")) as f:
        check(f.read() == generated,
              "deploy/base/rbac.yaml is stale: regenerate it with `tessera rbac > deploy/base/rbac.yaml`")

    release = kubernetes_release(source)
    dirs = ["base"] + sorted("overlays/" + d for d in os.listdir(os.path.join(deploy, "overlays")))
    for d in dirs:
        docs = render(os.path.join(deploy, d))
        deployment = check_deployment(docs, serve_help, release, d)
        check_rbac(docs, deployment, calls, d)
        check_network_policy(docs, deployment, d)
        check(debug_auth_mode(deployment) == "kubernetes",
              f"{d}: the manifests run tessera serve with --debug-auth=kubernetes (operators "
              "reach /debug with a token through the service proxy, or by port-forward)")
        if d == "overlays/monitoring":
            check_monitoring(docs, d)
        else:
            check(not find(docs, "ServiceMonitor") and not find(docs, "PrometheusRule"),
                  f"{d}: ServiceMonitor and PrometheusRule need the CRDs")
        print(f"ok: {d} ({len(docs)} objects)")
    check_monitoring(render_moved(source, "gpu-system"), "a moved overlay (namespace: gpu-system)")
    check_dashboard(source)

    for f in FAILURES:
        print("FAIL:", f)
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
