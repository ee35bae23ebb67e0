#!/usr/bin/env python3
"""Checks the Helm chart deploy/helm/tessera (docs/deploy.md, "Helm chart").

  helm_chart_test.py <tessera binary> <source dir>

With helm and kubeconform from `tools/helm.sh build` and the schemas of `tools/helm.sh schemas`:
  - `helm lint --strict` passes with the default values and with every option on;
  - the default rendering (`helm template tessera -n tessera-system --kube-version <the e2e
    release>`) is deploy/base (`kubectl kustomize`), object by object, once Helm's labels and
    the pod template's checksum annotations are set aside; the Namespace only with
    namespace.create=true; the NetworkPolicy and the ServiceMonitor equal the kustomize
    components' (the ServiceMonitor adding honorLabels);
  - files/rbac.yaml is `tessera rbac`'s output (the rules the chart grants);
  - deploy_test.py's checks of a Deployment (ports, flags, TLS, Lease, webhook, RBAC = the
    API-call table, security) hold for the default rendering and for a release of another name
    in another namespace;
  - kube-scheduler's image tag follows --kube-version unless set; the checksum annotation
    changes with the configuration; priorityClassName; cert-manager; a HAMi-structured values
    file (testdata/hami-values.yaml) carries over, and so do HAMi v2.5's image keys
    (testdata/hami-v25-values.yaml);
  - kubeconform -strict validates every rendering against the schemas of the release the e2e
    tests use (the CRD kinds ServiceMonitor, PrometheusRule, Certificate, Issuer are skipped:
    they have no schema there), and rejects a misspelt field.

Exit 77 (skipped) when helm/kubeconform are not built or kubectl is missing, unless
TESSERA_HELM_REQUIRED=1 (tools/test.sh sets it after building them): then that is a failure.
"""

import copy
import difflib
import os
import re
import subprocess
import sys
import tempfile

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import deploy_test  # noqa: E402  (the kustomize test's checks, reused)
from deploy_test import check, find, one  # noqa: E402

HELM_LABELS = {"helm.sh/chart", "app.kubernetes.io/managed-by", "app.kubernetes.io/instance",
               "app.kubernetes.io/version"}
CRD_KINDS = "ServiceMonitor,PrometheusRule,Certificate,Issuer"


def skip_or_fail(message):
    if os.environ.get("TESSERA_HELM_REQUIRED") == "1":
        print("FAIL:", message, "(TESSERA_HELM_REQUIRED=1)")
        sys.exit(1)
    print("SKIP:", message)
    sys.exit(77)


def run(cmd, **kw):
    return subprocess.run(cmd, capture_output=True, text=True, **kw)


class Chart:
    def __init__(self, source, bindir, schemas, release):
        self.source = source
        self.chart = os.path.join(source, "deploy/helm/tessera")
        self.helm = os.path.join(bindir, "helm")
        self.kubeconform = os.path.join(bindir, "kubeconform")
        self.schemas = schemas
        self.release = release

    def template(self, *args, name="tessera", ns="tessera-system", kube=None, expect_ok=True):
        cmd = [self.helm, "template", name, self.chart, "-n", ns,
               "--kube-version", kube or self.release, *args]
        out = run(cmd)
        if not expect_ok:
            return out
        if out.returncode != 0:
            raise SystemExit(f"FAIL: {' '.join(cmd)}:\n{out.stderr}")
        return out.stdout

    def docs(self, *args, **kw):
        return [d for d in yaml.safe_load_all(self.template(*args, **kw)) if d]

    def kubeconform_ok(self, text, where):
        out = run([self.kubeconform, "-strict", "-summary", "-skip", CRD_KINDS,
                   "-schema-location",
                   os.path.join(self.schemas, "{{.Group}}/{{.ResourceKind}}-{{.ResourceAPIVersion}}.json"),
                   "-"], input=text)
        check(out.returncode == 0, f"{where}: kubeconform:\n{out.stdout}{out.stderr}")
        return out


def key(d):
    return (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])


def normalise(d, ignored=HELM_LABELS):
    """d without Helm's labels and the pod template's checksum annotations."""
    d = copy.deepcopy(d)
    labels = d["metadata"].get("labels", {})
    for k in ignored:
        labels.pop(k, None)
    if not labels:
        d["metadata"].pop("labels", None)
    tmpl = d.get("spec", {}).get("template", {}).get("metadata", {})
    ann = tmpl.get("annotations")
    if ann is not None:
        for k in [k for k in ann if k.startswith("checksum/")]:
            ann.pop(k)
        if not ann:
            tmpl.pop("annotations")
    return d


def compare(got_docs, want_docs, where, ignored=HELM_LABELS):
    got = {key(d): normalise(d, ignored) for d in got_docs}
    want = {key(d): d for d in want_docs}
    check(set(got) == set(want), f"{where}: objects differ:\n  only in the chart: "
          f"{sorted(set(got) - set(want))}\n  only in kustomize: {sorted(set(want) - set(got))}")
    for k in sorted(set(got) & set(want)):
        if got[k] != want[k]:
            a = yaml.safe_dump(want[k], sort_keys=True).splitlines()
            b = yaml.safe_dump(got[k], sort_keys=True).splitlines()
            diff = "\n".join(difflib.unified_diff(a, b, "kustomize", "chart", lineterm="", n=2))
            check(False, f"{where}: {k} differs from kustomize:\n{diff}")
    return len(got)


def kustomize(path):
    return deploy_test.render(path)


def pod_annotation(docs, name):
    dep = one(docs, "Deployment")
    return dep["spec"]["template"]["metadata"].get("annotations", {}).get(name)


def container(docs, name):
    return deploy_test.container(one(docs, "Deployment")["spec"]["template"]["spec"], name)


def main():
    tessera, source = sys.argv[1], sys.argv[2]
    helm_sh = os.path.join(source, "tools/helm.sh")
    built = run(["bash", helm_sh, "path"])
    if built.returncode != 0:
        skip_or_fail("helm and kubeconform are not built: run tools/helm.sh build")
    if run(["which", "kubectl"]).returncode != 0:
        skip_or_fail("kubectl is not installed")
    schemas = run(["bash", helm_sh, "schemas"])
    if schemas.returncode != 0:
        skip_or_fail(f"tools/helm.sh schemas failed:\n{schemas.stderr}")
    release = deploy_test.kubernetes_release(source)
    # Helm's own state (cache, configuration) in a temporary directory, not the user's home.
    home = tempfile.TemporaryDirectory(prefix="helm-chart-test.")
    for var in ("HELM_CACHE_HOME", "HELM_CONFIG_HOME", "HELM_DATA_HOME"):
        os.environ[var] = os.path.join(home.name, var.lower())
    c = Chart(source, built.stdout.strip(), schemas.stdout.strip(), release)
    calls = [line.split("\t") for line in run([tessera, "rbac", "--calls"], check=True)
             .stdout.splitlines()]
    serve_help = run([tessera, "serve", "--help"], check=True).stdout

    # The RBAC rules the chart grants are `tessera rbac`'s.
    with open(os.path.join(c.chart, "files/rbac.yaml")) as f:
        check(f.read() == run([tessera, "rbac"], check=True).stdout,
              "deploy/helm/tessera/files/rbac.yaml is stale: `tessera rbac > "
              "deploy/helm/tessera/files/rbac.yaml`")

    everything = ["--set", "serviceMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
                  "--set", "networkPolicy.enabled=true",
                  "--set", "networkPolicy.apiServerCIDRs={10.0.0.0/24}",
                  "--set", "namespace.create=true", "--set", "scheduler.priorityClassName=high"]
    for args in ([], everything):
        out = run([c.helm, "lint", "--strict", c.chart, *args])
        check(out.returncode == 0, f"helm lint --strict {' '.join(args)}:\n{out.stdout}{out.stderr}")

    # The default rendering is deploy/base.
    default_text = c.template()
    default = [d for d in yaml.safe_load_all(default_text) if d]
    base = kustomize(os.path.join(source, "deploy/base"))
    n = compare(default, [d for d in base if d["kind"] != "Namespace"], "default")
    print(f"ok: the default rendering is deploy/base ({n} objects; the Namespace below)")
    with_ns = c.docs("--set", "namespace.create=true")
    compare(with_ns, base, "namespace.create=true")
    dep = deploy_test.check_deployment(default, serve_help, release, "chart default")
    deploy_test.check_rbac(default, dep, calls, "chart default")
    check(not find(default, "NetworkPolicy") and not find(default, "ServiceMonitor"),
          "default: the NetworkPolicy and the ServiceMonitor are opt-in")
    c.kubeconform_ok(default_text, "default")

    # Options on: the NetworkPolicy and ServiceMonitor are the kustomize components'.
    all_text = c.template(*everything)
    all_docs = [d for d in yaml.safe_load_all(all_text) if d]
    netpol_overlay = kustomize(os.path.join(source, "deploy/overlays/network-policy"))
    # The components' objects lack base's part-of label (kustomize adds it to base's only).
    component_labels = HELM_LABELS | {"app.kubernetes.io/part-of"}
    compare(find(all_docs, "NetworkPolicy"), find(netpol_overlay, "NetworkPolicy"), "networkPolicy",
            component_labels)
    sm = one(all_docs, "ServiceMonitor")
    monitoring = one(kustomize(os.path.join(source, "deploy/overlays/monitoring")), "ServiceMonitor")
    check(sm["spec"]["endpoints"][0].get("honorLabels") is True,
          "serviceMonitor: honorLabels (the per-pod namespace and pod labels survive)")
    sm_cmp, mon_cmp = normalise(sm, component_labels), copy.deepcopy(monitoring)
    for e in sm_cmp["spec"]["endpoints"] + mon_cmp["spec"]["endpoints"]:
        e.pop("honorLabels", None)
    check(sm_cmp == mon_cmp, f"serviceMonitor differs from deploy/components/servicemonitor:\n"
          f"{sm_cmp}\n{mon_cmp}")
    rule = one(all_docs, "PrometheusRule")
    component_rule = one(kustomize(os.path.join(source, "deploy/overlays/monitoring")),
                         "PrometheusRule")
    check(rule["spec"] == component_rule["spec"],
          "prometheusRule: its rules differ from deploy/components/prometheusrule's (the chart's "
          "files/prometheusrule-spec.yaml must be that file's spec)")
    exported = deploy_test.exported_metrics(source)
    for r in rule["spec"]["groups"][0]["rules"]:
        names = set(re.findall(r"\b(tessera_[a-z_]+)", r["expr"]))
        check(names and names <= exported,
              f"prometheusRule {r['alert']}: {sorted(names - exported)} are not exported")
    # promtool (Debian's prometheus package), where installed, checks the rules' syntax.
    if run(["which", "promtool"]).returncode == 0:
        with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
            yaml.safe_dump(rule["spec"], f)
            f.flush()
            out = run(["promtool", "check", "rules", f.name])
            check(out.returncode == 0, f"promtool check rules:\n{out.stdout}{out.stderr}")
    else:
        print("note: promtool is not installed; the PrometheusRule's syntax is not checked")
    check(one(all_docs, "Deployment")["spec"]["template"]["spec"].get("priorityClassName") == "high",
          "scheduler.priorityClassName is not the pods'")
    deploy_test.check_rbac(all_docs, one(all_docs, "Deployment"), calls, "chart everything")
    c.kubeconform_ok(all_text, "everything on")

    # Another release name and namespace: every reference follows.
    other_text = c.template(name="gpu", ns="gpu-system")
    other = [d for d in yaml.safe_load_all(other_text) if d]
    dep = deploy_test.check_deployment(other, serve_help, release, "release gpu in gpu-system")
    deploy_test.check_rbac(other, dep, calls, "release gpu in gpu-system")
    check(dep["metadata"]["name"] == "gpu-tessera" and
          all(d["metadata"].get("namespace") in (None, "gpu-system", "kube-system") for d in other),
          "release gpu: names and namespaces")
    c.kubeconform_ok(other_text, "release gpu")

    # kube-scheduler's image: the cluster's version, or the value.
    # Distributions' versions carry suffixes (k3s, EKS): the tag is vMAJOR.MINOR.PATCH.
    for kube in ("v1.35.4", "v1.35.4+k3s1", "v1.35.4-eks-a737599"):
        image = container(c.docs(kube=kube), "kube-scheduler")["image"]
        check(image == "registry.k8s.io/kube-scheduler:v1.35.4",
              f"kube-scheduler tag from --kube-version {kube}: {image}")
    check(container(c.docs("--set", "scheduler.kubeScheduler.image.tag=v1.36.1"),
                    "kube-scheduler")["image"] == "registry.k8s.io/kube-scheduler:v1.36.1",
          "scheduler.kubeScheduler.image.tag overrides the cluster's version")

    # Checksums: a configuration change changes the pod template.
    before = pod_annotation(default, "checksum/scheduler-config")
    check(before and len(before) == 64, "no checksum/scheduler-config on the pod template")
    for args in (["--set", "devicePlugin.deviceSplitCount=4"], ["--set", "resourceMem=x.com/mem"]):
        check(pod_annotation(c.docs(*args), "checksum/scheduler-config") != before,
              f"checksum/scheduler-config unchanged by {args}")

    # scheduler.preemption=false leaves the preempt verb out of kube-scheduler's configuration.
    def extender_of(docs):
        cm = [d for d in find(docs, "ConfigMap") if d["metadata"]["name"].endswith("scheduler-config")]
        return yaml.safe_load(cm[0]["data"]["config.yaml"])["extenders"][0]
    check(extender_of(default).get("preemptVerb") == "preempt", "default: preemptVerb preempt")
    check("preemptVerb" not in extender_of(c.docs("--set", "scheduler.preemption=false")),
          "scheduler.preemption=false: no preemptVerb")
    # ... and tells tessera so; scheduler.selfPreemption=true (before 1.38) makes it evict itself.
    def preemption_args(docs):
        return [a for a in container(docs, "tessera")["args"] if a.startswith("--preemption")]
    check(preemption_args(default) == [], "default: tessera's own --preemption default (extender)")
    check(preemption_args(c.docs("--set", "scheduler.preemption=false")) == ["--preemption=off"],
          "scheduler.preemption=false: --preemption=off")
    check(preemption_args(c.docs("--set", "scheduler.selfPreemption=true")) ==
          ["--preemption=self"], "scheduler.selfPreemption=true: --preemption=self")

    # The check of the scheduler-owned annotations: its switches, and its webhook left out.
    owned_args = ["--set", "scheduler.admissionWebhook.ownedAnnotations.failurePolicy=Ignore",
                  "--set", "scheduler.admissionWebhook.ownedAnnotations.excludedNamespaces={ops}",
                  "--set", "scheduler.admissionWebhook.ownedAnnotations.trustedWriters="
                  "{system:serviceaccount:gpu:plugin,system:serviceaccount:gpu:mig}"]
    owned_docs = c.docs(*owned_args)
    owned = one(owned_docs, "MutatingWebhookConfiguration")["webhooks"][1]
    owned_flags = deploy_test.flag_values(container(owned_docs, "tessera")["args"][1:])
    check(owned["failurePolicy"] == "Ignore", "ownedAnnotations.failurePolicy not carried over")
    check(owned["namespaceSelector"]["matchExpressions"][0]["values"] ==
          ["kube-system", "tessera-system", "ops"], "ownedAnnotations.excludedNamespaces")
    check(owned_flags.get("--trusted-annotation-writers") ==
          "system:serviceaccount:gpu:plugin,system:serviceaccount:gpu:mig",
          "ownedAnnotations.trustedWriters -> --trusted-annotation-writers")
    c.kubeconform_ok(c.template(*owned_args), "ownedAnnotations options")
    off = c.docs("--set", "scheduler.admissionWebhook.ownedAnnotations.enabled=false")
    check([h["name"] for h in one(off, "MutatingWebhookConfiguration")["webhooks"]] ==
          ["vgpu.tessera.dev"], "ownedAnnotations.enabled=false leaves the second webhook out")

    # cert-manager: an Issuer and a Certificate into the Secret the pods mount, CA injected;
    # no certgen Jobs.
    cm = c.docs("--set", "scheduler.certManager.enabled=true")
    cert = one(cm, "Certificate")
    check(not find(cm, "Job"), "certManager: certgen Jobs still rendered")
    hook = one(cm, "MutatingWebhookConfiguration")
    check(hook["metadata"]["annotations"].get("cert-manager.io/inject-ca-from") ==
          "tessera-system/tessera-tls", "certManager: no CA injection annotation")
    check("tessera-webhook.tessera-system.svc" in cert["spec"]["dnsNames"],
          "certManager: the Certificate does not name the webhook Service")
    dep = deploy_test.check_deployment(cm, serve_help, release, "certManager")
    tls = [v for v in dep["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"][0]
    check(tls["secret"]["secretName"] == cert["spec"]["secretName"] and
          [i["key"] for i in tls["secret"]["items"]] == ["tls.crt", "tls.key"],
          "certManager: the pods do not mount the Certificate's Secret")
    c.kubeconform_ok(c.template("--set", "scheduler.certManager.enabled=true"), "certManager")

    # A values file in HAMi's structure.
    hami_args = ["-f", os.path.join(source, "test/deploy/testdata/hami-values.yaml")]
    hami_text = c.template(*hami_args, name="hami", ns="kube-system")
    hami = [d for d in yaml.safe_load_all(hami_text) if d]
    c.kubeconform_ok(hami_text, "HAMi values")
    dep = one(hami, "Deployment")
    pod = dep["spec"]["template"]["spec"]
    sched, serve = container(hami, "kube-scheduler"), container(hami, "tessera")
    flags = deploy_test.flag_values(serve["args"][1:])
    expect = {
        "fullnameOverride": dep["metadata"]["name"] == "hami-scheduler",
        "schedulerName -> --scheduler-name, Lease": flags.get("--scheduler-name") == "gpu-scheduler"
        and flags.get("--leader-elect-resource-name") == "gpu-scheduler",
        "global.imageRegistry wins, global.imageTag ignored":
            sched["image"] == f"mirror.example.com/google_containers/kube-scheduler:{release}"
            and serve["image"] == "mirror.example.com/example/tessera:0.1.0",
        "imagePullSecrets": pod.get("imagePullSecrets") == [{"name": "regcred"}],
        "pullPolicy": sched.get("imagePullPolicy") == "IfNotPresent",
        "extraNewArgs: --config dropped, -v kept": sched["command"] ==
            ["kube-scheduler", "--config=/etc/kubernetes/scheduler/config.yaml", "-v=4"],
        "extender.extraArgs": serve["args"][-1] == "--kube-qps=100",
        "defaultSchedulerPolicy": flags.get("--node-scheduler-policy") == "spread"
            and flags.get("--gpu-scheduler-policy") == "binpack",
        "nodeLabelSelector": flags.get("--node-label-selector") == "gpu=on",
        "forceOverwriteDefaultScheduler": flags.get("--force-overwrite-default-scheduler") == "false",
        "metricsBindAddress": flags.get("--metrics-bind-address") == ":9396"
            and {"name": "metrics", "containerPort": 9396} in serve["ports"],
        "nodeLockExpire": {"name": "HAMI_NODELOCK_EXPIRE", "value": "3m"} in serve["env"],
        "resources": sched["resources"]["requests"] == {"cpu": "150m", "memory": "200Mi"},
        "tolerations": pod.get("tolerations") == [{"key": "CriticalAddonsOnly", "operator": "Exists"}],
        "podAnnotations": dep["spec"]["template"]["metadata"]["annotations"].get(
            "example.com/scrape") == "true",
        "global.labels": all(d["metadata"]["labels"].get("team") == "gpu" for d in hami),
        "global.annotations": all(d["metadata"].get("annotations", {}).get("owner") == "platform"
                                  for d in hami),
        "patch.runAsUser": all(j["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == 2000
                               for j in find(hami, "Job")),
    }
    hook = one(hami, "MutatingWebhookConfiguration")["webhooks"][0]
    ns_expr = hook["namespaceSelector"]["matchExpressions"]
    expect["whitelistNamespaces"] = ns_expr[0]["values"] == ["kube-system", "istio-system"]
    expect["namespaceSelector.matchExpressions"] = ns_expr[-1]["key"] == "environment"
    expect["failurePolicy, reinvocationPolicy"] = (hook["failurePolicy"], hook["reinvocationPolicy"]) \
        == ("Fail", "IfNeeded")
    svc = one(hami, "Service", "hami-scheduler-extender")
    metrics = one(hami, "Service", "hami-scheduler-metrics")
    expect["service: NodePort 31998, 31993"] = svc["spec"]["type"] == "NodePort" and \
        svc["spec"]["ports"][0]["nodePort"] == 31998 and \
        metrics["spec"]["ports"][0] == {"name": "metrics", "port": 31993, "targetPort": 9396,
                                        "nodePort": 31993}
    expect["service.labels"] = svc["metadata"]["labels"].get("svc") == "hami"
    devcfg = yaml.safe_load(one(hami, "ConfigMap", "hami-scheduler-device-config")
                            ["data"]["device-config.yaml"])["nvidia"]
    expect["overwriteEnv, deviceSplitCount"] = devcfg["overwriteEnv"] is True and \
        devcfg["deviceSplitCount"] == 4
    for what, ok in expect.items():
        check(ok, f"HAMi values: {what} not carried over")
    deploy_test.check_rbac(hami, dep, calls, "HAMi values")

    # HAMi v2.5's image keys (strings, imagePullPolicy, imageTag).
    v25_text = c.template("-f", os.path.join(source, "test/deploy/testdata/hami-v25-values.yaml"))
    v25 = [d for d in yaml.safe_load_all(v25_text) if d]
    sched, serve = container(v25, "kube-scheduler"), container(v25, "tessera")
    jobs = [j["spec"]["template"]["spec"]["containers"][0] for j in find(v25, "Job")]
    check(sched["image"] == "registry.example.com/google_containers/kube-scheduler:v1.36.3" and
          sched.get("imagePullPolicy") == "Always", f"HAMi v2.5 values: kube-scheduler {sched['image']}")
    check(serve["image"] == "registry.example.com/tessera:0.1.0" and
          serve.get("imagePullPolicy") == "IfNotPresent", f"HAMi v2.5 values: tessera {serve['image']}")
    check(len(jobs) == 2 and all(j["image"] == "registry.example.com/kube-webhook-certgen:v1.5.2"
                                 for j in jobs), "HAMi v2.5 values: the certgen image")
    c.kubeconform_ok(v25_text, "HAMi v2.5 values")

    # Refusals: a NetworkPolicy without the API server's range; kube-scheduler off; /debug
    # without authentication (docs/serve.md "Who reads /debug").
    for args, want in ((["--set", "networkPolicy.enabled=true"], "apiServerCIDRs"),
                       (["--set", "scheduler.kubeScheduler.enabled=false"], "kubeScheduler"),
                       (["--set", "scheduler.debugAuth=none"], "scheduler.debugAuth=none")):
        out = c.template(*args, expect_ok=False)
        check(out.returncode != 0 and want in out.stderr, f"{args}: rendered, want an error")
    loopback = [d for d in yaml.safe_load_all(c.template("--set", "scheduler.debugAuth=loopback"))
                if d]
    check(deploy_test.debug_auth_mode(one(loopback, "Deployment")) == "loopback",
          "scheduler.debugAuth=loopback: serve does not get --debug-auth=loopback")

    # kubeconform can fail: a misspelt field is refused.
    bad = default_text.replace("runAsNonRoot: true", "runAsNonRoo: true", 1)
    out = run([c.kubeconform, "-strict", "-schema-location",
               os.path.join(c.schemas, "{{.Group}}/{{.ResourceKind}}-{{.ResourceAPIVersion}}.json"),
               "-"], input=bad)
    check(out.returncode != 0 and "runAsNonRoo" in out.stdout,
          f"kubeconform accepted a misspelt field:\n{out.stdout}")

    for f in deploy_test.FAILURES:
        print("FAIL:", f)
    if not deploy_test.FAILURES:
        print("ok: lint, default = deploy/base, options, HAMi values, kubeconform "
              f"(Kubernetes {release} schemas)")
    return 1 if deploy_test.FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
