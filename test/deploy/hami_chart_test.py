#!/usr/bin/env python3
"""HAMi's Helm chart runs the image unchanged (docs/deploy.md, "Migrating with HAMi's chart").

  hami_chart_test.py <tessera binary> <tessera-scheduler binary> <source dir>

For each chart version of testdata/hami_chart_args.json (the command and environment the chart
renders with its default values, and the lines its other values add), the production binary is
started as the chart starts it: invoked as `scheduler`, with the chart's argument list and
environment, against `tessera apisim` (reached through $KUBECONFIG instead of the in-cluster
configuration). The test passes when /readyz answers 200, /filter refuses a pod asking for a
Cambricon MLU (one of the chart's managedResources) naming the vendor, and a SIGTERM stops it
with exit 0.

The values files of deploy/hami-chart are checked against the chart's values
(testdata/hami_chart_values.json): every key they set exists in that chart version with the same
type, the image they render is Tessera's, and the command they render (the chart's, with their
extraArgs in place of the defaults) becomes ready as above.

As root (with unshare, ip, setcap and setpriv), the run is the container's: in a network
namespace of its own, so the chart's ports 443 and 9395 are free, as uid 65532 (the image's
USER) from a copy of the binary carrying the file capability cap_net_bind_service, which the
Dockerfile sets; the ports are the chart's, unchanged. Otherwise both addresses become
127.0.0.1:0 and everything else is the same. Either way the chart's mount paths (/tls/...,
/device-config.yaml) are rewritten into a temporary directory holding a self-signed certificate
and examples/device-config.yaml (the chart's default device configuration).
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
import time
import urllib.error
import urllib.request

IN_NETNS = "--in-netns"
UID = 65532  # the Dockerfile's USER


def container_mode():
    """Whether this process may run the binary as the container does: root, with the tools, and
    allowed to create a network namespace and to set a file capability (a container without
    CAP_SYS_ADMIN or CAP_SETFCAP is not)."""
    if os.geteuid() != 0 or not all(
            shutil.which(t) for t in ("unshare", "ip", "setcap", "setpriv")):
        return False
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        return False
    with tempfile.TemporaryDirectory() as d:
        if os.statvfs(d).f_flag & os.ST_NOSUID:
            return False  # file capabilities are ignored on a nosuid mount
        probe = os.path.join(d, "probe")
        shutil.copy(shutil.which("true"), probe)
        return subprocess.run(["setcap", "cap_net_bind_service=+ep", probe],
                              capture_output=True).returncode == 0


def start_apisim(tessera, kubeconfig):
    p = subprocess.Popen([tessera, "apisim", "--write-kubeconfig", kubeconfig],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    line = p.stdout.readline()
    if not line.startswith("listening on "):
        p.kill()
        raise RuntimeError(f"apisim did not start: {line!r}")
    return p


def make_tls(directory):
    os.makedirs(directory)
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=hami-scheduler", "-keyout", f"{directory}/tls.key",
                    "-out", f"{directory}/tls.crt"], check=True, capture_output=True)


def rewrite(command, root, keep_ports):
    """The chart's command with its mount paths under `root` and, unless `keep_ports`, its
    addresses on free loopback ports. Nothing else changes."""
    out = []
    for arg in command:
        arg = arg.replace("=/tls/", f"={root}/tls/").replace(
            "=/device-config.yaml", f"={root}/device-config.yaml")
        if not keep_ports:
            arg = re.sub(r"^(--http_bind|--metrics-bind-address)=.*$", r"\1=127.0.0.1:0", arg)
        out.append(arg)
    return out


def apply_variant(command, lines):
    """The chart's command with a variant's lines: a flag already present is replaced, the
    webhook-less --http_bind also drops the TLS lines, anything else is added."""
    out = list(command)
    for line in lines:
        flag = line.split("=", 1)[0]
        if flag == "--http_bind" and not line.endswith(":443"):
            out = [a for a in out if not a.startswith(("--cert_file=", "--key_file="))]
        idx = [i for i, a in enumerate(out) if a.split("=", 1)[0] == flag]
        if idx:
            out[idx[0]] = line
        else:
            out.append(line)
    return out


def leaves(tree, prefix=""):
    """{dotted key: value} of a values tree's leaves (lists are leaves, as Helm replaces them)."""
    out = {}
    for key, value in tree.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(leaves(value, path + "."))
        else:
            out[path] = value
    return out


def merged(defaults, values):
    """Helm's merge of a values file over the chart's defaults: maps merge, the rest replaces."""
    out = dict(defaults)
    for key, value in values.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def image_of(version, values):
    """The extender image the chart renders from `values`: v2.5 `<image>:<version>`
    (deployment.yaml); v2.10 `[<global.imageRegistry or image.registry>/]<repository>:<tag or
    global.imageTag>` (_helpers.tpl hami.image, _commons.tpl common.images.image)."""
    ext = values["scheduler"]["extender"]
    if version.startswith("v2.5."):
        return f"{ext['image']}:{values['version']}"
    g = values.get("global", {})
    registry = g.get("imageRegistry") or ext["image"]["registry"]
    tag = str(ext["image"]["tag"] or g.get("imageTag") or "").strip()
    name = f"{ext['image']['repository']}:{tag}"
    return f"{registry}/{name}" if registry else name


def values_file_command(version, facts, chart, source):
    """Checks deploy/hami-chart's values file for `version` against the chart's facts; returns
    the extender command the chart renders with it, or (None, failures)."""
    import yaml  # PyYAML: only this check needs it
    path = os.path.join(source, facts["values_file"])
    with open(path) as f:
        values = yaml.safe_load(f)
    defaults = facts["defaults"]
    failures = []
    known = leaves(defaults)
    for key, value in leaves(values).items():
        if key not in known:
            failures.append(f"{facts['values_file']}: {key} is not a value of HAMi's chart {version}")
        elif type(value) is not type(known[key]) and known[key] not in ("", None):
            failures.append(f"{facts['values_file']}: {key} is a {type(value).__name__}, the chart's "
                            f"is a {type(known[key]).__name__}")
    result = merged(defaults, values)
    image = image_of(version, result)
    if "tessera" not in image or "projecthami" in image:
        failures.append(f"{facts['values_file']}: renders image {image}, not Tessera's")
    default_extra = defaults["scheduler"]["extender"]["extraArgs"]
    command = chart["command"]
    if command[-len(default_extra):] != default_extra:
        failures.append(f"{version}: the recorded command does not end with the default extraArgs")
        return None, failures
    print(f"ok   {version} {facts['values_file']}: image {image}")
    return command[:-len(default_extra)] + result["scheduler"]["extender"]["extraArgs"], failures


def wait_ready(proc, scheme, timeout=30):
    """Reads the serving line, then polls /readyz; returns (port, body) or raises."""
    line = proc.stdout.readline()
    m = re.search(r"\(port (\d+)\); metrics on \S* \(port (\d+)\)", line)
    if not m:
        raise RuntimeError(f"no serving line: {line!r}; stderr: {proc.stderr.read()}")
    port, metrics_port = int(m.group(1)), int(m.group(2))
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/readyz", timeout=2,
                                        context=context if scheme == "https" else None) as r:
                return port, metrics_port, r.read().decode()
        except (urllib.error.URLError, OSError) as e:
            last = e
            time.sleep(0.2)
    raise RuntimeError(f"/readyz not 200 after {timeout}s: {last}")


def check_other_vendor_refused(name, scheme, port):
    """kube-scheduler sends the pods of every resource in the chart's managedResources: a pod
    asking for a Cambricon MLU gets an error naming the vendor, not a node."""
    pod = {"metadata": {"name": "mlu", "namespace": "default", "uid": "u-mlu"},
           "spec": {"schedulerName": "hami-scheduler", "containers": [
               {"name": "main", "resources": {"limits": {"cambricon.com/vmlu": "1"}}}]}}
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    request = urllib.request.Request(
        f"{scheme}://127.0.0.1:{port}/filter",
        data=json.dumps({"Pod": pod, "NodeNames": ["cpu-node"]}).encode(),
        headers={"Content-Type": "application/json"}, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10,
                                    context=context if scheme == "https" else None) as r:
            result = json.loads(r.read())
    except (urllib.error.URLError, OSError, ValueError) as e:
        return [f"{name}: /filter: {e}"]
    error = result.get("Error") or ""
    if "Cambricon MLU devices are not supported" not in error or result.get("NodeNames"):
        return [f"{name}: /filter let an MLU pod through: {result}"]
    return []


def run_one(name, command, env, binary, root, exact, kubeconfig):
    """Starts `command` (argv[0] = `scheduler`) and checks it becomes ready; returns failures."""
    argv = rewrite(command, root, keep_ports=exact)
    full_env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "KUBECONFIG": kubeconfig}
    full_env.update(env)
    prefix = []
    if exact:
        prefix = ["setpriv", f"--reuid={UID}", f"--regid={UID}", "--clear-groups",
                  "--inh-caps=-all", "--"]
    proc = subprocess.Popen(prefix + [binary] + argv[1:], executable=None, env=full_env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    failures = []
    try:
        scheme = "https" if any(a.startswith("--cert_file=") for a in argv) else "http"
        port, metrics_port, body = wait_ready(proc, scheme)
        if exact:
            want = int(re.search(r"--http_bind=.*:(\d+)$",
                                 [a for a in command if a.startswith("--http_bind=")][0]).group(1))
            if port != want or metrics_port != 9395:
                failures.append(f"{name}: serving on {port}/{metrics_port}, want {want}/9395")
        if "role:" not in body:
            failures.append(f"{name}: /readyz body lacks the role: {body!r}")
        failures += check_other_vendor_refused(name, scheme, port)
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics",
                                        timeout=10) as r:
                metrics = r.read().decode()
            if "tessera_build_info" not in metrics:
                failures.append(f"{name}: /metrics lacks tessera_build_info")
        except (urllib.error.URLError, OSError) as e:
            failures.append(f"{name}: /metrics: {e}")
        print(f"ok   {name}: ready on port {port} ({scheme}), metrics {metrics_port}")
    except RuntimeError as e:
        failures.append(f"{name}: {e}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            _, err = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            _, err = proc.communicate()
            failures.append(f"{name}: did not stop within 20s of SIGTERM")
    if proc.returncode != 0:
        failures.append(f"{name}: exit {proc.returncode}; stderr:\n{err}")
    if "--debug" in command and "flag --debug=true accepted" not in err:
        failures.append(f"{name}: no notice for --debug in the log")
    return failures


def main():
    args = [a for a in sys.argv[1:] if a != IN_NETNS]
    tessera, scheduler_binary, source = args
    exact = container_mode()
    if exact and IN_NETNS not in sys.argv:
        # A network namespace of our own: the chart's fixed ports cannot collide with anything.
        os.execvp("unshare", ["unshare", "--net", "--", sys.executable, os.path.abspath(__file__),
                              *args, IN_NETNS])
    if exact:
        subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
    if shutil.which("openssl") is None:
        print("SKIP: openssl missing")
        return 77
    with open(os.path.join(source, "test/deploy/testdata/hami_chart_args.json")) as f:
        charts = json.load(f)["charts"]
    with open(os.path.join(source, "test/deploy/testdata/hami_chart_values.json")) as f:
        values_facts = json.load(f)["charts"]

    root = tempfile.mkdtemp(prefix="tessera-hami-chart-")
    os.chmod(root, 0o755)
    failures = []
    apisim = None
    try:
        make_tls(f"{root}/tls")
        shutil.copy(os.path.join(source, "examples/device-config.yaml"),
                    f"{root}/device-config.yaml")
        bindir = f"{root}/bin"
        os.makedirs(bindir)
        image_binary = f"{bindir}/tessera"
        shutil.copy(scheduler_binary, image_binary)
        os.symlink("tessera", f"{bindir}/scheduler")  # as the Dockerfile links it
        if exact:
            subprocess.run(["setcap", "cap_net_bind_service=+ep", image_binary], check=True)
        for path, _, files in os.walk(root):
            os.chmod(path, 0o755)
            for name in files:
                os.chmod(os.path.join(path, name), 0o644)
        os.chmod(image_binary, 0o755)
        kubeconfig = f"{root}/kubeconfig"
        apisim = start_apisim(tessera, kubeconfig)
        os.chmod(kubeconfig, 0o644)
        print(f"mode: {'container (netns, uid 65532, chart ports)' if exact else 'free ports'}")

        for version, chart in charts.items():
            command = chart["command"]
            if command[0] != "scheduler":
                failures.append(f"{version}: the chart's program is {command[0]}")
                continue
            failures += run_one(f"{version} default", command, chart["env"],
                                f"{bindir}/scheduler", root, exact, kubeconfig)
            for variant, lines in chart["variants"].items():
                failures += run_one(f"{version} {variant}", apply_variant(command, lines),
                                    chart["env"], f"{bindir}/scheduler", root, exact, kubeconfig)
            for variant, env in chart.get("variant_env", {}).items():
                failures += run_one(f"{version} {variant}", command, {**chart["env"], **env},
                                    f"{bindir}/scheduler", root, exact, kubeconfig)
            try:
                with_values, bad = values_file_command(version, values_facts[version], chart,
                                                       source)
            except ImportError:
                print(f"SKIP {version} values file: PyYAML missing")
                continue
            failures += bad
            if with_values is not None:
                failures += run_one(f"{version} with {values_facts[version]['values_file']}",
                                    with_values, chart["env"], f"{bindir}/scheduler", root,
                                    exact, kubeconfig)
    finally:
        if apisim is not None:
            apisim.terminate()
            apisim.wait(timeout=10)
        shutil.rmtree(root, ignore_errors=True)
    for f in failures:
        print("FAIL", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
