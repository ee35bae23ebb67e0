#!/usr/bin/env python3
"""The API-server side of tools/bench_controlplane.sh (docs/benchmarks.md, "The real kube-scheduler").

  nodes   --dir DIR --nodes N --gpus G [--format json|legacy]
          N GPU nodes as a kubelet and HAMi's device plugin would leave them: one POST each with
          status (capacity/allocatable nvidia.com/gpu = G x 10, Ready=True) and the register
          annotation, then the not-ready taint that the TaintNodesByCondition admission plugin
          added is removed (what the node lifecycle controller does).
  run     --dir DIR --namespace NS --pods P [--scheduler-name NAME] [--bypass-webhook] ...
          Creates NS, then P pods asking nvidia.com/gpu: 1 from parallel clients while a separate
          process watches the namespace; prints one JSON line: pods/s, creation-to-binding
          percentiles, the client's create rate.
  config  --dir DIR --variant alone|extender [--url URL] [--qps Q --burst B] [--percentage P]
          A KubeSchedulerConfiguration derived from the one `up` runs (DIR/scheduler-config.yaml,
          deploy/base's with local addresses), on stdout: `alone` drops the extenders and serves
          the profile default-scheduler; `extender` points every extender at URL over plain HTTP.
          Both without leader election (the Lease stays with `up`'s kube-scheduler's name, so
          Tessera, which follows it, stays a follower while they run).
  handshakes --dir DIR [--period S] [--workers W]
          HAMi v2.5's device plugin's reports for every bench node (registration and `Reported
          <time>` handshake every 30 s), until TERM; see cmd_handshakes.
  clean   --dir DIR --namespace NS
          Force-deletes every pod of NS (no kubelet runs) and waits until none is left.
  summary FILE...
          The JSON lines of `run`, as a table with medians per column and the ratio.

Time of creation = the client's wall clock just before its POST is sent; time of binding = the
watcher's wall clock when it first receives the pod with spec.nodeName set (same host, same
clock, microsecond resolution; the watch adds its delivery delay, a few ms at most). The pod's
creationTimestamp and PodScheduled lastTransitionTime have one-second resolution, too coarse for
a p50 of tens of milliseconds; they are only cross-checked.

Only the Python standard library: http.client over TLS with the admin client certificate of
tools/controlplane.sh's DIR.
"""
import argparse
import http.client
import json
import multiprocessing
import os
import queue
import signal
import ssl
import statistics
import sys
import threading
import time


def load_env(d):
    env = {}
    with open(os.path.join(d, "env")) as f:
        for line in f:
            line = line.strip()
            if line and not line.startswith("#") and "=" in line:
                k, v = line.split("=", 1)
                env[k] = v
    return env


class Api:
    """One keep-alive HTTPS connection to kube-apiserver as the admin of DIR."""

    def __init__(self, d, timeout=30):
        env = load_env(d)
        self.port = int(env["APISERVER_PORT"])
        self.ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.crt"))
        self.ctx.load_cert_chain(os.path.join(d, "admin.crt"), os.path.join(d, "admin.key"))
        self.timeout = timeout
        self.conn = None

    def connect(self):
        self.conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx,
                                                timeout=self.timeout)

    def request(self, method, path, body=None, content_type="application/json", ok=(200, 201)):
        for attempt in range(5):
            if self.conn is None:
                self.connect()
            try:
                data = None if body is None else json.dumps(body).encode()
                headers = {"Accept": "application/json"}
                if data is not None:
                    headers["Content-Type"] = content_type
                self.conn.request(method, path, body=data, headers=headers)
                r = self.conn.getresponse()
                payload = r.read()
            except (OSError, http.client.HTTPException):
                self.conn.close()
                self.conn = None
                if attempt == 4:
                    raise
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status == 429 or r.status >= 500:
                time.sleep(0.2 * (attempt + 1))
                continue
            if r.status not in ok:
                raise RuntimeError(f"{method} {path}: HTTP {r.status}: {payload[:300]!r}")
            return json.loads(payload) if payload else None
        raise RuntimeError(f"{method} {path}: gave up after retries (HTTP {r.status})")


def parallel(d, items, fn, workers):
    """fn(api, item) for every item on `workers` threads, each with its own connection."""
    q = queue.Queue()
    for it in items:
        q.put(it)
    errors = []

    def work():
        api = Api(d)
        while True:
            try:
                it = q.get_nowait()
            except queue.Empty:
                return
            try:
                fn(api, it)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(e)
                return

    ts = [threading.Thread(target=work) for _ in range(workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if errors:
        raise errors[0]


# --- nodes ------------------------------------------------------------------------------------

def register_annotation(name, gpus, fmt):
    if fmt == "legacy":
        # HAMi before v2.6: "UUID,count,MiB,cores,type,numa,health:" per device.
        return "".join(f"GPU-{name}-{i},10,8192,100,NVIDIA-Tesla T4,0,true:" for i in range(gpus))
    devs = []
    for i in range(gpus):
        devs.append({"id": f"GPU-{name}-{i}", "index": i, "count": 10, "devmem": 8192,
                     "devcore": 100, "type": "NVIDIA-Tesla T4", "mode": "hami-core",
                     "health": True})
    return json.dumps(devs, separators=(",", ":"))


HANDSHAKE = "hami.io/node-handshake"
REGISTER = "hami.io/node-nvidia-register"
REPORT_EVERY = 30.0  # seconds: HAMi v2.5's device plugin rewrites its registration this often
_MONO0 = time.monotonic_ns()  # Go's monotonic reading counts from the process start


def go_time_string(wall_ns, mono_ns):
    """Go's time.Time.String() of a UTC instant with a monotonic reading: the layout
    "2006-01-02 15:04:05.999999999 -0700 MST" (fraction without trailing zeros, none when 0)
    followed by " m=+<seconds>.<9 digits>"."""
    secs, frac = divmod(wall_ns, 10**9)
    s = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(secs))
    if frac:
        s += "." + f"{frac:09d}".rstrip("0")
    sign = "-" if mono_ns < 0 else "+"
    m = abs(mono_ns)
    return f"{s} +0000 UTC m={sign}{m // 10**9}.{m % 10**9:09d}"


def reported(wall_ns=None, mono_ns=None):
    """The handshake value HAMi v2.5's device plugin writes: "Reported " + Go's time.Now().String()
    (no '_': its scheduler only looks for "Requesting" and "Deleted" in the value)."""
    wall_ns = time.time_ns() if wall_ns is None else wall_ns
    mono_ns = time.monotonic_ns() - _MONO0 if mono_ns is None else mono_ns
    return "Reported " + go_time_string(wall_ns, mono_ns)


def report_patch(register, value):
    """The merge patch of one report: the plugin writes its registration and the handshake
    together, whatever the handshake held (a scheduler's Requesting_ or Deleted_ included)."""
    return {"metadata": {"annotations": {REGISTER: register, HANDSHAKE: value}}}


def cmd_nodes(a):
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    res = {"cpu": "32", "memory": "128Gi", "pods": "110", "nvidia.com/gpu": str(a.gpus * 10)}

    def make(api, i):
        name = f"{a.prefix}-{i:05d}"
        annotations = {REGISTER: register_annotation(name, a.gpus, a.format)}
        # HAMi's scheduler before v2.6 ignores a node whose device plugin has not reported lately.
        annotations[HANDSHAKE] = reported()
        body = {
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name,
                                                  "gpu": "on", "tessera.dev/bench": "true"},
                         "annotations": annotations},
            "status": {"capacity": res, "allocatable": res,
                       "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                                       "message": "bench", "lastHeartbeatTime": now,
                                       "lastTransitionTime": now}]},
        }
        api.request("POST", "/api/v1/nodes", body)
        # Status in a create is kept for nodes (a kubelet registers that way), but check once.
        api.request("PATCH", f"/api/v1/nodes/{name}",
                    {"spec": {"taints": None}}, content_type="application/merge-patch+json")

    t0 = time.time()
    parallel(a.dir, range(a.nodes), make, a.workers)
    api = Api(a.dir)
    lst = api.request("GET", "/api/v1/nodes?labelSelector=tessera.dev%2Fbench%3Dtrue")
    ready = 0
    for n in lst["items"]:
        alloc = n.get("status", {}).get("allocatable", {}).get("nvidia.com/gpu")
        conds = {c["type"]: c["status"] for c in n.get("status", {}).get("conditions", [])}
        if alloc == res["nvidia.com/gpu"] and conds.get("Ready") == "True" and not n["spec"].get("taints"):
            ready += 1
    took = time.time() - t0
    print(json.dumps({"nodes": len(lst["items"]), "ready_untainted": ready, "seconds": round(took, 2)}))
    if ready != a.nodes:
        sys.exit(f"bench_controlplane.py nodes: {ready} of {a.nodes} nodes are Ready with "
                 f"allocatable nvidia.com/gpu and no taint")


# --- handshakes -------------------------------------------------------------------------------

def report_schedule(names, start, period):
    """(due time, node) of every report, forever: each node once per period, the nodes spread
    evenly over it in the order given (1,000 nodes at 30 s: one report every 30 ms)."""
    k = 0
    while True:
        for i, name in enumerate(names):
            yield start + k * period + i * period / len(names), name
        k += 1


def cmd_handshakes(a):
    """HAMi v2.5's device plugin for every bench node, the part its scheduler checks: every
    --period seconds (the plugin's 30) each node's registration and a fresh `Reported <time>`
    handshake, written whatever the handshake held. HAMi v2.5.2's scheduler stamps a node
    `Requesting_<time>` when it sees a report and drops the node when no report follows within
    60 s; Tessera's leader does the same for delimited nodes. The plugin does not answer the
    stamp, it reports on its own clock: answering each stamp at once would ping-pong with
    Tessera's writer, which stamps every new report within a second. Runs until TERM."""
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    api = Api(a.dir)
    items = api.request("GET", "/api/v1/nodes?labelSelector=tessera.dev%2Fbench%3Dtrue")["items"]
    register = {n["metadata"]["name"]: (n["metadata"].get("annotations") or {}).get(REGISTER)
                for n in items}
    names = sorted(n for n, v in register.items() if v)
    if not names:
        sys.exit("bench_controlplane.py handshakes: no bench node has a register annotation")
    q = queue.Queue()
    lock = threading.Lock()
    stats = {"reports": 0, "errors": 0, "max_lag": 0.0, "last_error": ""}

    def work():
        api = Api(a.dir)
        while True:
            due, name = q.get()
            try:
                api.request("PATCH", f"/api/v1/nodes/{name}", report_patch(register[name], reported()),
                            content_type="application/merge-patch+json")
                lag = time.time() - due
                with lock:
                    stats["reports"] += 1
                    stats["max_lag"] = max(stats["max_lag"], lag)
            except Exception as e:  # noqa: BLE001 - counted and logged; the next period retries
                with lock:
                    stats["errors"] += 1
                    stats["last_error"] = str(e)[:200]

    for _ in range(a.workers):
        threading.Thread(target=work, daemon=True).start()
    print(f"handshakes: {len(names)} nodes, a report each every {a.period:g} s, {a.workers} writers",
          file=sys.stderr, flush=True)
    start = time.time()
    next_log = start + a.period
    for due, name in report_schedule(names, start, a.period):
        now = time.time()
        if due > now:
            time.sleep(due - now)
        q.put((due, name))
        if time.time() >= next_log:
            with lock:
                line = (f"handshakes: {stats['reports']} reports, {stats['errors']} errors, "
                        f"max lag {stats['max_lag']:.2f} s in the last period, {q.qsize()} queued"
                        + (f"; last error: {stats['last_error']}" if stats["errors"] else ""))
                stats["max_lag"] = 0.0
            print(line, file=sys.stderr, flush=True)
            next_log += a.period


# --- run --------------------------------------------------------------------------------------

def watcher(d, ns, rv, want, deadline, stall, out, started):
    """In its own process (no GIL shared with the creators): name -> first time seen bound.
    Gives up at `deadline`, or when `stall` seconds pass without a new binding."""
    env = load_env(d)
    ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.crt"))
    ctx.load_cert_chain(os.path.join(d, "admin.crt"), os.path.join(d, "admin.key"))
    bound, cond = {}, {}
    created = {}
    progress = time.time()
    stalled = False
    while len(bound) < want and time.time() < deadline:
        if time.time() - progress > stall:
            stalled = True
            break
        conn = http.client.HTTPSConnection("127.0.0.1", int(env["APISERVER_PORT"]), context=ctx,
                                           timeout=2.0)
        try:
            conn.request("GET", f"/api/v1/namespaces/{ns}/pods?watch=1&resourceVersion={rv}"
                                f"&allowWatchBookmarks=true&timeoutSeconds=3600")
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"watch: HTTP {r.status}")
            started.set()
            while len(bound) < want:
                if time.time() - progress > stall or time.time() > deadline:
                    break
                try:
                    line = r.readline()
                except TimeoutError:
                    continue
                if not line:
                    break
                now = time.time()
                ev = json.loads(line)
                obj = ev.get("object", {})
                meta = obj.get("metadata", {})
                if meta.get("resourceVersion"):
                    rv = meta["resourceVersion"]
                if ev.get("type") not in ("ADDED", "MODIFIED"):
                    continue
                name = meta.get("name")
                created.setdefault(name, meta.get("creationTimestamp"))
                if obj.get("spec", {}).get("nodeName") and name not in bound:
                    bound[name] = now
                    progress = now
                    for c in obj.get("status", {}).get("conditions", []) or []:
                        if c.get("type") == "PodScheduled":
                            cond[name] = c.get("lastTransitionTime")
        except (OSError, http.client.HTTPException, ValueError):
            time.sleep(0.1)
        finally:
            conn.close()
    out.put({"bound": bound, "cond": cond, "created": created, "stalled": stalled})


def device_plugin(d, ns, deadline, stop, out, started, workers=64):
    """The part of HAMi's device plugin that a bind through the HAMi protocol waits for, for every
    node at once (docs/hami-device-plugin.md §1-2): once a pod is bound with
    hami.io/bind-phase=allocating, consume its vgpu-devices-to-allocate, write bind-phase=success
    and remove the node's hami.io/mutex.lock if it names the pod (a merge patch with a
    resourceVersion precondition). A kubelet calls Allocate only after it has seen the pod, so a
    real node releases the lock later than this; the figures are a best case for the lock."""
    env = load_env(d)
    ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.crt"))
    ctx.load_cert_chain(os.path.join(d, "admin.crt"), os.path.join(d, "admin.key"))
    q = queue.Queue()
    stats = {"released": 0, "conflicts": 0, "errors": 0}

    def allocate(api, pod_name, node):
        api.request("PATCH", f"/api/v1/namespaces/{ns}/pods/{pod_name}",
                    {"metadata": {"annotations": {"hami.io/vgpu-devices-to-allocate": ";",
                                                  "hami.io/bind-phase": "success"}}},
                    content_type="application/merge-patch+json")
        for _ in range(10):
            n = api.request("GET", f"/api/v1/nodes/{node}")
            lock = n["metadata"].get("annotations", {}).get("hami.io/mutex.lock", "")
            if not lock.endswith(f",{ns},{pod_name}"):
                return
            try:
                api.request("PATCH", f"/api/v1/nodes/{node}",
                            {"metadata": {"annotations": {"hami.io/mutex.lock": None},
                                          "resourceVersion": n["metadata"]["resourceVersion"]}},
                            content_type="application/merge-patch+json")
                stats["released"] += 1
                return
            except RuntimeError as e:
                if "HTTP 409" not in str(e):
                    raise
                stats["conflicts"] += 1

    def work():
        api = Api(d)
        while True:
            it = q.get()
            if it is None:
                return
            try:
                allocate(api, *it)
            except Exception:  # noqa: BLE001 - counted; the bind then times out and shows it
                stats["errors"] += 1

    ts = [threading.Thread(target=work, daemon=True) for _ in range(workers)]
    for t in ts:
        t.start()
    done = set()
    rv = None
    while not stop.is_set() and time.time() < deadline:
        conn = http.client.HTTPSConnection("127.0.0.1", int(env["APISERVER_PORT"]), context=ctx,
                                           timeout=1.0)
        try:
            path = f"/api/v1/namespaces/{ns}/pods?watch=1&allowWatchBookmarks=true&timeoutSeconds=3600"
            if rv:
                path += f"&resourceVersion={rv}"
            conn.request("GET", path)
            r = conn.getresponse()
            if r.status != 200:
                raise RuntimeError(f"watch: HTTP {r.status}")
            started.set()
            while not stop.is_set():
                try:
                    line = r.readline()
                except TimeoutError:
                    continue
                if not line:
                    break
                ev = json.loads(line)
                obj = ev.get("object", {})
                meta = obj.get("metadata", {})
                if meta.get("resourceVersion"):
                    rv = meta["resourceVersion"]
                if ev.get("type") not in ("ADDED", "MODIFIED"):
                    continue
                ann = meta.get("annotations") or {}
                node = obj.get("spec", {}).get("nodeName")
                if (node and meta["name"] not in done and ann.get("hami.io/bind-phase") == "allocating"
                        and ann.get("hami.io/vgpu-node") == node):
                    done.add(meta["name"])
                    q.put((meta["name"], node))
        except (OSError, http.client.HTTPException, ValueError, RuntimeError):
            time.sleep(0.1)
        finally:
            conn.close()
    for _ in ts:
        q.put(None)
    for t in ts:
        t.join(10)
    stats["allocated"] = len(done)
    out.put(stats)


def pct(xs, p):
    if not xs:
        return None
    xs = sorted(xs)
    k = max(0, min(len(xs) - 1, int(round(p / 100.0 * len(xs) + 0.5)) - 1))
    return xs[k]


def proc_cpu(d, names):
    """CPU seconds (user+system) of DIR's processes, by the pid files."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {}
    for n in names:
        try:
            with open(os.path.join(d, n + ".pid")) as f:
                pid = f.read().strip()
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            out[n] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return out


def scrape(d, url):
    """Prometheus text from url (admin client certificate for https), as {series: value}."""
    import urllib.request
    ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.crt"))
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # kube-scheduler's serving certificate is self-signed
    ctx.load_cert_chain(os.path.join(d, "admin.crt"), os.path.join(d, "admin.key"))
    out = {}
    try:
        with urllib.request.urlopen(url, context=ctx if url.startswith("https") else None,
                                    timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line and not line.startswith("#"):
                    k, _, v = line.rpartition(" ")
                    try:
                        out[k] = float(v)
                    except ValueError:
                        pass
    except OSError:
        pass
    return out


def scrape_all(d, scheduler_port):
    env = load_env(d)
    m = scrape(d, f"https://127.0.0.1:{env['APISERVER_PORT']}/metrics")
    m.update(scrape(d, f"http://127.0.0.1:{env['TESSERA_METRICS_PORT']}/metrics"))
    if scheduler_port:
        m.update(scrape(d, f"https://127.0.0.1:{scheduler_port}/metrics"))
    return m


def where_the_time_goes(m0, m1, pods):
    """Deltas of the counters that say where a run's time went, per pod where it helps."""
    import re
    d = {k: m1[k] - m0.get(k, 0.0) for k in m1}

    def total(prefix, **labels):
        t = 0.0
        for k, v in d.items():
            if k.startswith(prefix + "{") or k == prefix:
                if all(f'{lk}="{lv}"' in k for lk, lv in labels.items()):
                    t += v
        return t

    out = {}
    # API requests by verb and resource (watches and lists left out), per pod.
    reqs = {}
    for k, v in d.items():
        if not k.startswith("apiserver_request_total{") or v <= 0:
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', k))
        if lab.get("verb") in ("WATCH", "LIST"):
            continue
        key = f"{lab.get('verb')} {lab.get('resource')}" + (f"/{lab['subresource']}" if lab.get("subresource") else "")
        if lab.get("code", "2").startswith(("4", "5")):
            key += f" {lab['code']}"
        reqs[key] = reqs.get(key, 0) + v
    out["api_requests_per_pod"] = {k: round(v / pods, 2) for k, v in sorted(reqs.items(), key=lambda x: -x[1])
                                   if v / pods >= 0.05}
    # kube-apiserver's own time per request (mean, ms) for the writes a binding takes.
    lat = {}
    for k, v in d.items():
        if not k.startswith("apiserver_request_duration_seconds_count{") or v <= 0:
            continue
        lab = dict(re.findall(r'(\w+)="([^"]*)"', k))
        if lab.get("verb") not in ("POST", "PATCH"):
            continue
        key = f"{lab.get('verb')} {lab.get('resource')}" + (f"/{lab['subresource']}" if lab.get("subresource") else "")
        ssum = d.get(k.replace("_count{", "_sum{"), 0.0)
        n0, s0 = lat.get(key, (0.0, 0.0))
        lat[key] = (n0 + v, s0 + ssum)
    out["apiserver_ms_mean"] = {k: round(1000 * s_ / n, 1) for k, (n, s_) in lat.items() if n / pods >= 0.05}
    wh_n = total("apiserver_admission_webhook_admission_duration_seconds_count")
    if wh_n:
        out["webhook_ms_mean"] = round(1000 * total("apiserver_admission_webhook_admission_duration_seconds_sum") / wh_n, 1)
    att = {r: total("scheduler_schedule_attempts_total", result=r) for r in ("scheduled", "error", "unschedulable")}
    if any(att.values()):
        out["scheduler_attempts"] = {k: int(v) for k, v in att.items() if v}
        n = total("scheduler_scheduling_algorithm_duration_seconds_count")
        if n:
            out["scheduler_algorithm_ms_mean"] = round(1000 * total("scheduler_scheduling_algorithm_duration_seconds_sum") / n, 1)
        n = total("scheduler_framework_extension_point_duration_seconds_count", extension_point="Filter")
        if n:
            out["scheduler_filter_plugins_ms_mean"] = round(1000 * total(
                "scheduler_framework_extension_point_duration_seconds_sum", extension_point="Filter") / n, 1)
    bt = {o: total("tessera_bind_total", outcome=o) for o in ("bound", "rejected", "error")}
    if any(bt.values()):
        out["tessera_binds"] = {k: int(v) for k, v in bt.items() if v}
        n = total("tessera_bind_duration_seconds_count")
        out["tessera_bind_ms_mean"] = round(1000 * total("tessera_bind_duration_seconds_sum") / n, 1) if n else None
        n = total("tessera_filter_duration_seconds_count")
        out["tessera_filter_ms_mean"] = round(1000 * total("tessera_filter_duration_seconds_sum") / n, 2) if n else None
    return out


def cmd_run(a):
    # A TERM (the script's teardown) exits normally, which terminates the daemon processes.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    api = Api(a.dir)
    labels = {"kubernetes.io/metadata.name": a.namespace}
    if a.bypass_webhook:
        # deploy/base's webhook skips a namespace labelled so: these pods keep the schedulerName
        # they are created with.
        labels["hami.io/webhook"] = "ignore"
    api.request("POST", "/api/v1/namespaces",
                {"apiVersion": "v1", "kind": "Namespace",
                 "metadata": {"name": a.namespace, "labels": labels}})
    # No kube-controller-manager: the ServiceAccount admission plugin needs "default".
    api.request("POST", f"/api/v1/namespaces/{a.namespace}/serviceaccounts",
                {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "default"}})
    rv = api.request("GET", f"/api/v1/namespaces/{a.namespace}/pods")["metadata"]["resourceVersion"]

    deadline = time.time() + a.timeout
    out = multiprocessing.Queue()
    started = multiprocessing.Event()
    w = multiprocessing.Process(target=watcher,
                                args=(a.dir, a.namespace, rv, a.pods, deadline, a.stall, out,
                                      started), daemon=True)
    w.start()
    stop = multiprocessing.Event()
    plugin_out = multiprocessing.Queue()
    plugin_started = multiprocessing.Event()
    dp = multiprocessing.Process(target=device_plugin,
                                 args=(a.dir, a.namespace, deadline, stop, plugin_out, plugin_started,
                                       a.plugin_workers),
                                 daemon=True)
    dp.start()
    if not started.wait(30) or not plugin_started.wait(30):
        w.terminate()
        dp.terminate()
        sys.exit("bench_controlplane.py run: the watches did not start within 30 s")

    m0 = scrape_all(a.dir, a.scheduler_port)
    cpu0 = proc_cpu(a.dir, a.procs)
    sent = {}

    def create(api, i):
        name = f"p-{i:05d}"
        spec = {"containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10",
                                "resources": {"limits": {"nvidia.com/gpu": "1"}}}],
                "terminationGracePeriodSeconds": 0}
        if a.scheduler_name:
            spec["schedulerName"] = a.scheduler_name
        body = {"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": a.namespace}, "spec": spec}
        t = time.time()
        obj = api.request("POST", f"/api/v1/namespaces/{a.namespace}/pods", body)
        sent[name] = (t, time.time(), obj["spec"].get("schedulerName"))

    t_start = time.time()
    parallel(a.dir, range(a.pods), create, a.clients)
    t_created = time.time()
    res = None
    try:
        res = out.get(timeout=max(1.0, deadline - time.time()) + 5)
    except queue.Empty:
        pass
    w.join(5)
    if w.is_alive():
        w.terminate()
    cpu1 = proc_cpu(a.dir, a.procs)
    m1 = scrape_all(a.dir, a.scheduler_port)
    stop.set()
    try:
        plugin_stats = plugin_out.get(timeout=20)
    except queue.Empty:
        plugin_stats = None
    dp.join(5)
    if dp.is_alive():
        dp.terminate()
    bound = res["bound"] if res else {}
    # Pods never bound count as infinitely late: a percentile that falls among them is reported
    # as null with "censored" (the run ended at its deadline or stalled).
    lat = [bound[n] - sent[n][0] if n in bound else float("inf") for n in sent]
    fin = lambda x: round(1000 * x, 1) if x is not None and x != float("inf") else None  # noqa: E731
    last = max(bound.values()) if bound else None
    first_bind = min(bound.values()) if bound else None
    sched_names = sorted({v[2] for v in sent.values()})
    r = {
        "column": a.column, "namespace": a.namespace, "pods": a.pods, "bound": len(bound),
        "stalled": bool(res and res["stalled"]),
        "scheduler_name": ",".join(x or "" for x in sched_names),
        "create_seconds": round(t_created - t_start, 3),
        "create_per_s": round(a.pods / (t_created - t_start), 1),
        "create_p50_ms": round(1000 * statistics.median(v[1] - v[0] for v in sent.values()), 1),
        "seconds": round(last - t_start, 3) if last else None,
        "pods_per_s": round(len(bound) / (last - t_start), 1) if last else 0,
        "bind_window_per_s": (round(len(bound) / (last - first_bind), 1)
                              if last and last > first_bind else None),
        "p50_ms": fin(pct(lat, 50)),
        "p99_ms": fin(pct(lat, 99)),
        "max_ms": fin(max(lat)) if lat else None,
        "censored": len(bound) < a.pods,
        "cpu_s": {k: round(cpu1[k] - cpu0[k], 2) for k in cpu1 if k in cpu0},
        "device_plugin": plugin_stats,
        "where": where_the_time_goes(m0, m1, a.pods),
    }
    # Why binds failed: the namespace's Warning events, numbers and names folded, most first.
    try:
        import re
        evs = api.request("GET", f"/api/v1/namespaces/{a.namespace}/events?fieldSelector=type%3DWarning")
        folded = {}
        for e in evs.get("items", []):
            msg = re.sub(r"[0-9]+(\.[0-9]+)?", "N", f"{e.get('reason')}: {e.get('message', '')}")[:160]
            folded[msg] = folded.get(msg, 0) + int(e.get("count") or 1)
        r["warnings"] = dict(sorted(folded.items(), key=lambda x: -x[1])[:6])
    except (RuntimeError, OSError, http.client.HTTPException):
        pass
    # Cross-check with the server's one-second timestamps: PodScheduled's lastTransitionTime is
    # never before creationTimestamp.
    if res:
        bad = [n for n, t in res["cond"].items()
               if t and res["created"].get(n) and t < res["created"][n]]
        r["server_clock_violations"] = len(bad)
    print(json.dumps(r), flush=True)
    if len(bound) != a.pods:
        why = (f"no binding for {a.stall:g}s" if res and res["stalled"] else f"the deadline ({a.timeout:g}s)")
        sys.exit(f"bench_controlplane.py run: {len(bound)} of {a.pods} pods bound; stopped at {why}")


def cmd_clean(a):
    api = Api(a.dir, timeout=120)
    path = f"/api/v1/namespaces/{a.namespace}/pods"
    api.request("DELETE", path + "?gracePeriodSeconds=0",
                {"kind": "DeleteOptions", "apiVersion": "v1", "gracePeriodSeconds": 0})
    deadline = time.time() + a.timeout
    while time.time() < deadline:
        n = len(api.request("GET", path + "?limit=500")["items"])
        if n == 0:
            return
        time.sleep(0.5)
    sys.exit(f"bench_controlplane.py clean: pods of {a.namespace} still there after {a.timeout}s")


def cmd_config(a):
    import yaml
    with open(os.path.join(a.dir, "scheduler-config.yaml")) as f:
        cfg = yaml.safe_load(f)
    cfg["leaderElection"] = {"leaderElect": False}
    if a.variant == "alone":
        cfg.pop("extenders", None)
        cfg["profiles"] = [{"schedulerName": "default-scheduler"}]
    else:
        for e in cfg["extenders"]:
            e["urlPrefix"] = a.url
            e["enableHTTPS"] = a.url.startswith("https:")
            if not e["enableHTTPS"]:
                e.pop("tlsConfig", None)
    if a.qps:
        cfg["clientConnection"]["qps"] = a.qps
        cfg["clientConnection"]["burst"] = a.burst or int(2 * a.qps)
    if a.percentage is not None:
        cfg["percentageOfNodesToScore"] = a.percentage
    yaml.safe_dump(cfg, sys.stdout, sort_keys=False)


# --- summary ----------------------------------------------------------------------------------

def cmd_summary(a):
    rows = []
    for fn in a.files:
        with open(fn) as f:
            for line in f:
                line = line.strip()
                if line.startswith("{"):
                    rows.append(json.loads(line))
    cols = []
    for r in rows:
        if r["column"] not in cols:
            cols.append(r["column"])
    print(f"{'column':<16} {'runs':>4} {'pods/s':>7} {'(each run)':<26} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'create/s':>8}  bound")
    med = {}
    inf = float("inf")
    for c in cols:
        rs = [r for r in rows if r["column"] == c]
        # A censored percentile (null) is larger than any measured one: it sorts last.
        m = {k: statistics.median([r[k] if r.get(k) is not None else inf for r in rs])
             for k in ("pods_per_s", "p50_ms", "p99_ms", "create_per_s")}
        med[c] = m
        each = ",".join(f"{r['pods_per_s']:g}" + ("*" if r["bound"] < r["pods"] else "") for r in rs)
        ms = lambda x: f"{x:>8.0f}" if x != inf else f"{'>end':>8}"  # noqa: E731
        bound = ",".join(f"{r['bound']}/{r['pods']}" for r in rs)
        print(f"{c:<16} {len(rs):>4} {m['pods_per_s']:>7.1f} {each:<26} {ms(m['p50_ms'])} "
              f"{ms(m['p99_ms'])} {m['create_per_s']:>8.0f}  {bound}")
    if any(r["bound"] < r["pods"] for r in rows):
        print("* the run ended before every pod was bound (deadline or stall): its pods/s is that of "
              "the pods it bound")
    if cols:
        base = "alone" if "alone" in cols else cols[0]
        for c in cols[1:]:
            ratios = []
            # Paired by round: the i-th run of c against the i-th run of the baseline.
            rb = [r for r in rows if r["column"] == base]
            rc = [r for r in rows if r["column"] == c]
            for x, y in zip(rb, rc):
                if x["pods_per_s"]:
                    ratios.append(y["pods_per_s"] / x["pods_per_s"])
            print(f"{c} / {base}: pods/s ratio of medians {med[c]['pods_per_s'] / med[base]['pods_per_s']:.2f}; "
                  f"per round {', '.join(f'{x:.2f}' for x in ratios)} (median {statistics.median(ratios):.2f})"
                  if ratios else f"{c} / {base}: no pairs")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="cmd", required=True)
    n = sub.add_parser("nodes")
    n.add_argument("--dir", required=True)
    n.add_argument("--nodes", type=int, default=1000)
    n.add_argument("--gpus", type=int, default=4)
    n.add_argument("--prefix", default="gpu-node")
    n.add_argument("--format", choices=["json", "legacy"], default="json")
    n.add_argument("--workers", type=int, default=8)
    r = sub.add_parser("run")
    r.add_argument("--dir", required=True)
    r.add_argument("--namespace", required=True)
    r.add_argument("--column", required=True)
    r.add_argument("--pods", type=int, default=2000)
    r.add_argument("--clients", type=int, default=32)
    r.add_argument("--plugin-workers", type=int, default=64,
                   help="the emulated device plugins' releases in flight at once")
    r.add_argument("--scheduler-name", default="")
    r.add_argument("--bypass-webhook", action="store_true")
    r.add_argument("--timeout", type=float, default=600)
    r.add_argument("--scheduler-port", type=int, default=0,
                   help="the kube-scheduler's secure port, for its metrics")
    r.add_argument("--stall", type=float, default=90,
                   help="give up when no pod was bound for this long")
    r.add_argument("--procs", nargs="*", default=["etcd", "kube-apiserver", "tessera",
                                                  "kube-scheduler", "kube-scheduler-alone", "kube-scheduler-hami", "hami",
                                                  "handshakes"])
    g = sub.add_parser("config")
    g.add_argument("--dir", required=True)
    g.add_argument("--variant", choices=["alone", "extender"], required=True)
    g.add_argument("--url", default="")
    g.add_argument("--qps", type=float, default=0)
    g.add_argument("--burst", type=int, default=0)
    g.add_argument("--percentage", type=int, default=None)
    h = sub.add_parser("handshakes")
    h.add_argument("--dir", required=True)
    h.add_argument("--period", type=float, default=REPORT_EVERY)
    h.add_argument("--workers", type=int, default=64)
    c = sub.add_parser("clean")
    c.add_argument("--dir", required=True)
    c.add_argument("--namespace", required=True)
    c.add_argument("--timeout", type=float, default=120)
    s = sub.add_parser("summary")
    s.add_argument("files", nargs="+")
    a = p.parse_args()
    {"nodes": cmd_nodes, "run": cmd_run, "config": cmd_config, "clean": cmd_clean,
     "handshakes": cmd_handshakes, "summary": cmd_summary}[a.cmd](a)


if __name__ == "__main__":
    main()
