#!/usr/bin/env python3
"""Hostile and slow clients against `tessera serve` (issue #21, docs/serve.md "Listener limits").

Starts `tessera apisim` and `tessera serve` (plain HTTP, and a second serve with TLS) on
127.0.0.1, or uses --target/--metrics-target/--tls-target of a running serve, then:

  1. measures /healthz, /filter and /metrics with nothing else connected (baseline);
  2. opens the hostile connections: --idle idle connections on the extender port and
     --idle on the metrics port (half send nothing, half a head they never finish), --idle
     TLS connections that never start the handshake, --slowloris connections that send one
     byte of a head every --trickle seconds, --slow-bodies connections that send a /filter
     head declaring Content-Length: 1048576 and then one byte of its body every --trickle
     seconds (issue #41), and --non-readers clients that send a large /filter and never read
     its reply;
  3. measures the same requests again, each on a fresh connection, --samples times spread
     over --duration, while the hostile connections stay open: the trickling ones keep
     trickling, and each connection the server closes (a deadline, shedding) is replaced by a
     new one of the same kind.

Prints one JSON document: latency percentiles (ms) per endpoint and phase, the connections
actually held open at the end, the serve process's resident memory (VmRSS) before and during
and its peak (VmHWM), and "pass": every sampled request under --limit-ms (default 100) and
answered 200 (a 503 from the connection cap counts as a failure). --max-connections is passed
to the serves this script starts, to put them at their cap with fewer connections. Exit status 0 when it passes,
1 when not, 2 on a set-up error. Bounded: at most --idle x 3 + --slowloris + --non-readers
+ --slow-bodies connections, and --duration seconds of hostile load; 127.0.0.1 only.

  python3 test/hostile/hostile.py --tessera build/release/cmd/tessera/tessera
"""

import argparse
import json
import multiprocessing
import os
import resource
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import threading
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_port(port, timeout=30.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
        except OSError:
            time.sleep(0.05)
    return False


def filter_body(names):
    pod = ('{"metadata":{"name":"hostile","namespace":"default","uid":"hostile-uid"},'
           '"spec":{"containers":[{"name":"c","resources":{"limits":'
           '{"nvidia.com/gpu":"1","nvidia.com/gpumem":"1000"}}}]}}')
    node_names = ",".join('"node-%d"' % i for i in range(names))
    return ('{"Pod":%s,"Nodes":null,"NodeNames":[%s]}' % (pod, node_names)).encode()


def request_bytes(method, path, body=b""):
    head = "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: %d\r\n" % (method, path, len(body))
    if body:
        head += "Content-Type: application/json\r\n"
    return head.encode() + b"\r\n" + body


def read_reply(sock):
    """Reads one reply with a Content-Length body; returns the status (0 on failure)."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            return 0
        data += chunk
    head, _, rest = data.partition(b"\r\n\r\n")
    length = 0
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            length = int(value.strip())
    while len(rest) < length:
        chunk = sock.recv(65536)
        if not chunk:
            return 0
        rest += chunk
    return int(head.split(b" ")[1])


def timed_request(port, raw, tls_ctx=None, timeout=10.0):
    """Milliseconds for connect + request + whole reply on a fresh connection; None on failure."""
    start = time.monotonic()
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        if tls_ctx is not None:
            sock = tls_ctx.wrap_socket(sock, server_hostname="127.0.0.1")
        with sock:
            sock.sendall(raw)
            status = read_reply(sock)
    except OSError:
        return None
    if status != 200:
        return None
    return (time.monotonic() - start) * 1000.0


def percentiles(values):
    ok = sorted(v for v in values if v is not None)
    failed = sum(1 for v in values if v is None)
    if not ok:
        return {"n": len(values), "failed": failed}

    def pick(q):
        return round(ok[min(len(ok) - 1, int(q * len(ok)))], 2)

    return {"n": len(values), "failed": failed, "p50": pick(0.5), "p99": pick(0.99),
            "max": round(ok[-1], 2)}


def measure(targets, samples):
    out = {}
    for name, (port, raw, ctx) in targets.items():
        out[name] = percentiles([timed_request(port, raw, ctx) for _ in range(samples)])
    return out


def rss_kib(pid, field="VmRSS"):
    if pid is None:
        return None
    try:
        with open("/proc/%d/status" % pid) as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class Hostiles:
    """The hostile connections; a thread keeps the slowloris ones trickling and, like a real
    attacker, opens a new connection of the same kind for each one the server closes."""

    def __init__(self):
        self.conns = []  # [socket, port, first bytes, bytes still to trickle]
        self.stop = threading.Event()
        self.thread = None
        self.reopened = 0

    @staticmethod
    def _open(port, send):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a non-reader fills up fast
        s.settimeout(5)
        s.connect(("127.0.0.1", port))
        if send:
            try:
                s.sendall(send)
            except OSError:
                pass
        s.setblocking(False)
        return s

    def connect(self, port, send=b"", trickle=b""):
        self.conns.append([self._open(port, send), port, send, trickle])

    @staticmethod
    def _closed(sock):
        try:
            return sock.recv(1, socket.MSG_PEEK) == b""
        except BlockingIOError:
            return False
        except OSError:
            return True

    def start(self, every, replace=True):
        def run():
            next_byte = time.monotonic() + every
            while not self.stop.wait(0.5):
                trickle_now = time.monotonic() >= next_byte
                if trickle_now:
                    next_byte += every
                for c in self.conns:
                    if replace and self._closed(c[0]):
                        c[0].close()
                        try:
                            c[0] = self._open(c[1], c[2])
                            self.reopened += 1
                        except OSError:
                            continue
                    elif trickle_now and c[3]:
                        try:
                            c[0].send(c[3][:1])
                        except OSError:
                            pass
                        c[3] = c[3][1:]
        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()

    def still_open(self):
        """How many hostile connections the server has not closed, by port."""
        out = {}
        for c in self.conns:
            if not self._closed(c[0]):
                out[str(c[1])] = out.get(str(c[1]), 0) + 1
        return out

    def close(self):
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        for c in self.conns:
            c[0].close()


def hostile_process(specs, trickle, replace, pipe):
    """Opens the hostile connections (port, first bytes, bytes to trickle), reports how many,
    keeps them trickling and replaced until told to stop, then reports (still open by port,
    reopened) and closes them."""
    hostiles = Hostiles()
    try:
        for port, send, rest in specs:
            hostiles.connect(port, send, rest)
    except OSError as e:
        pipe.send(str(e))
        return
    hostiles.start(trickle, replace=replace)
    pipe.send(len(hostiles.conns))
    pipe.recv()
    hostiles.stop.set()
    hostiles.thread.join()
    pipe.send((hostiles.still_open(), hostiles.reopened))
    hostiles.close()


def stop_processes(procs):
    """SIGTERM to every started process, newest first; SIGKILL to one not gone within 20 s."""
    for p in reversed(procs):
        p.send_signal(signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            p.kill()


def start_processes(args, workdir):
    """Starts apisim and two serves (plain, TLS); returns (procs, ports, serve pid)."""
    procs = []
    kubeconfig = os.path.join(workdir, "kubeconfig")
    apisim = subprocess.Popen([args.tessera, "apisim", "--write-kubeconfig", kubeconfig],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs.append(apisim)
    deadline = time.monotonic() + 30
    while not os.path.exists(kubeconfig) and time.monotonic() < deadline:
        time.sleep(0.05)
    if not os.path.exists(kubeconfig):
        raise RuntimeError("apisim did not write its kubeconfig")
    cert = os.path.join(workdir, "tls.crt")
    key = os.path.join(workdir, "tls.key")
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-subj", "/CN=127.0.0.1", "-keyout", key, "-out", cert],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    ports = {}
    serve_pid = None
    for name, extra in (("plain", []), ("tls", ["--cert_file", cert, "--key_file", key])):
        http, metrics = free_port(), free_port()
        cap = ["--max-connections", str(args.max_connections)] if args.max_connections else []
        p = subprocess.Popen([args.tessera, "serve", "--kubeconfig", kubeconfig,
                              "--leader-elect=false",
                              "--http_bind", "127.0.0.1:%d" % http,
                              "--metrics-bind-address", "127.0.0.1:%d" % metrics] + cap + extra,
                             stdout=subprocess.DEVNULL,
                             stderr=open(os.path.join(workdir, name + ".log"), "w"))
        procs.append(p)
        if not wait_port(http) or not wait_port(metrics):
            raise RuntimeError("tessera serve (%s) did not listen; see %s" % (name, workdir))
        ports[name] = (http, metrics)
        if name == "plain":
            serve_pid = p.pid
    return procs, ports, serve_pid


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tessera", default="build/release/cmd/tessera/tessera")
    parser.add_argument("--target", type=int, help="port of a running serve (plain HTTP)")
    parser.add_argument("--metrics-target", type=int, help="its metrics port")
    parser.add_argument("--tls-target", type=int, help="port of a running serve with TLS")
    parser.add_argument("--idle", type=int, default=1000)
    parser.add_argument("--slowloris", type=int, default=100)
    parser.add_argument("--trickle", type=float, default=5.0, help="seconds between bytes")
    parser.add_argument("--slow-bodies", type=int, default=0,
                        help="connections trickling the body of a /filter declaring 1 MiB")
    parser.add_argument("--max-connections", type=int, default=0,
                        help="--max-connections of the serves started (0: serve's default)")
    parser.add_argument("--non-readers", type=int, default=16)
    parser.add_argument("--non-reader-names", type=int, default=20000,
                        help="candidate names in a non-reader's /filter (its reply is large)")
    parser.add_argument("--samples", type=int, default=200)
    parser.add_argument("--duration", type=float, default=30.0,
                        help="at most this long under hostile load")
    parser.add_argument("--limit-ms", type=float, default=100.0)
    parser.add_argument("--no-replace", action="store_true",
                        help="do not replace the connections the server closes")
    args = parser.parse_args()
    args.idle = min(args.idle, 5000)
    args.slowloris = min(args.slowloris, 2000)
    args.non_readers = min(args.non_readers, 200)
    args.slow_bodies = min(args.slow_bodies, 5000)

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))

    workdir = tempfile.mkdtemp(prefix="tessera-hostile-")
    procs = []
    serve_pid = None
    try:
        if args.target:
            ports = {"plain": (args.target, args.metrics_target or args.target)}
            if args.tls_target:
                ports["tls"] = (args.tls_target, None)
        else:
            procs, ports, serve_pid = start_processes(args, workdir)
        client_tls = ssl.create_default_context()
        client_tls.check_hostname = False
        client_tls.verify_mode = ssl.CERT_NONE
        http, metrics = ports["plain"]
        small_filter = request_bytes("POST", "/filter", filter_body(3))
        targets = {
            "healthz": (http, request_bytes("GET", "/healthz"), None),
            "filter": (http, small_filter, None),
            "metrics": (metrics, request_bytes("GET", "/metrics"), None),
        }
        if "tls" in ports:
            targets["healthz_tls"] = (ports["tls"][0], request_bytes("GET", "/healthz"),
                                      client_tls)
        report = {"idle": args.idle, "slowloris": args.slowloris, "slow_bodies": args.slow_bodies,
                  "max_connections": args.max_connections or None,
                  "replace": not args.no_replace,
                  "non_readers": args.non_readers, "samples": args.samples,
                  "limit_ms": args.limit_ms}
        report["baseline"] = measure(targets, min(args.samples, 50))
        report["rss_kib_before"] = rss_kib(serve_pid)

        # The hostile connections live in a child process, so that reopening thousands of them
        # at once never delays this process's measurements (both would share one interpreter
        # lock in threads): what is timed below is the server, not the load generator.
        specs = []
        for i in range(args.idle):
            specs.append((http, b"" if i % 2 else b"GET /healthz HTTP/1.1\r\nX-Wait: ", b""))
            specs.append((metrics, b"" if i % 2 else b"GET /metrics HTTP/1.1\r\nX-Wait: ", b""))
            if "tls" in ports:
                specs.append((ports["tls"][0], b"", b""))  # never starts the handshake
        head = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: " + b"x" * 200 + b"\r\n\r\n"
        for _ in range(args.slowloris):
            specs.append((http, head[:1], head[1:]))
        # A /filter head declaring the largest body serve takes (1 MiB), its first byte, and
        # then a byte every --trickle seconds: before issue #41 each cost 1 MiB at once.
        slow_head = (b"POST /filter HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 1048576\r\n\r\n{")
        for _ in range(args.slow_bodies):
            specs.append((http, slow_head, b" " * 1000))
        big = request_bytes("POST", "/filter", filter_body(args.non_reader_names))
        for _ in range(args.non_readers):
            specs.append((http, big, b""))  # and never read the reply
        started = time.monotonic()
        parent_end, child_end = multiprocessing.Pipe()
        child = multiprocessing.Process(
            target=hostile_process, args=(specs, args.trickle, not args.no_replace, child_end),
            daemon=True)
        child.start()
        if not parent_end.poll(60):
            raise RuntimeError("the hostile connections were not opened within 60 s")
        opened = parent_end.recv()
        if isinstance(opened, str):
            raise RuntimeError("opening the hostile connections: " + opened)
        report["hostile_connections_opened"] = opened
        report["opening_s"] = round(time.monotonic() - started, 2)

        # Samples spread over --duration, so that they see the deadlines fire and the closed
        # connections replaced.
        under = {name: [] for name in targets}
        pause = args.duration / max(1, args.samples)
        while (time.monotonic() - started < args.duration and
               len(under["healthz"]) < args.samples):
            for name, (port, raw, ctx) in targets.items():
                under[name].append(timed_request(port, raw, ctx))
            time.sleep(pause)
        report["under_load"] = {name: percentiles(v) for name, v in under.items()}
        report["under_load_s"] = round(time.monotonic() - started, 2)
        report["rss_kib_under_load"] = rss_kib(serve_pid)
        report["rss_kib_peak"] = rss_kib(serve_pid, "VmHWM")
        report["ports"] = {name: list(p) for name, p in ports.items()}
        parent_end.send("stop")
        if not parent_end.poll(60):
            raise RuntimeError("the hostile process did not report within 60 s")
        still_open, reopened = parent_end.recv()
        child.join(10)
        report["hostile_still_open"] = still_open
        report["hostile_reopened"] = reopened

        worst = [v.get("max") for v in report["under_load"].values()]
        report["pass"] = all(v.get("failed", 1) == 0 and v.get("max", 1e9) < args.limit_ms
                             for v in report["under_load"].values())
        print(json.dumps(report, indent=2))
        return 0 if report["pass"] and None not in worst else 1
    except (RuntimeError, OSError, subprocess.CalledProcessError) as e:
        print("hostile.py: %s" % e, file=sys.stderr)
        return 2
    finally:
        stop_processes(procs)


if __name__ == "__main__":
    sys.exit(main())
