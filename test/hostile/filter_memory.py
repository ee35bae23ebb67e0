#!/usr/bin/env python3
"""Resident memory of `tessera serve` under huge /filter requests (issue #21, docs/serve.md).

Starts `tessera apisim` and `tessera serve` on 127.0.0.1 (as hostile.py does), then sends
--requests /filter calls of --names candidate names, --concurrency at a time, each on its own
connection, while sampling serve's VmRSS every 20 ms. Prints JSON: RSS before, peak, and 2 s
after the last reply. Bounded: at most 200 requests of at most 100,000 names (the body must stay
under the 1 MiB limit: 60,000 names is about 0.8 MB).

  python3 test/hostile/filter_memory.py --tessera build/release/cmd/tessera/tessera
"""

import argparse
import json
import os
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hostile  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tessera", default="build/release/cmd/tessera/tessera")
    parser.add_argument("--names", type=int, default=60000)
    parser.add_argument("--requests", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=16)
    args = parser.parse_args()
    args.names = min(args.names, 100000)
    args.requests = min(args.requests, 200)

    workdir = tempfile.mkdtemp(prefix="tessera-filter-memory-")
    procs = []
    try:
        procs, ports, pid = hostile.start_processes(args, workdir)
        http = ports["plain"][0]
        raw = hostile.request_bytes("POST", "/filter", hostile.filter_body(args.names))
        time.sleep(1)
        before = hostile.rss_kib(pid)
        peak = [before]
        done = threading.Event()

        def sample():
            while not done.wait(0.02):
                peak[0] = max(peak[0], hostile.rss_kib(pid) or 0)

        sampler = threading.Thread(target=sample)
        sampler.start()
        results = []
        lock = threading.Lock()
        todo = list(range(args.requests))

        def client():
            while True:
                with lock:
                    if not todo:
                        return
                    todo.pop()
                ms = hostile.timed_request(http, raw, timeout=120)
                with lock:
                    results.append(ms)

        clients = [threading.Thread(target=client) for _ in range(args.concurrency)]
        start = time.monotonic()
        for t in clients:
            t.start()
        for t in clients:
            t.join()
        took = time.monotonic() - start
        time.sleep(2)
        done.set()
        sampler.join()
        after = hostile.rss_kib(pid)
        print(json.dumps({
            "names": args.names, "body_bytes": len(raw), "requests": args.requests,
            "concurrency": args.concurrency, "failed": sum(1 for r in results if r is None),
            "seconds": round(took, 2),
            "rss_mib_before": round(before / 1024, 1), "rss_mib_peak": round(peak[0] / 1024, 1),
            "rss_mib_after": round(after / 1024, 1)}, indent=2))
        return 0
    except (RuntimeError, OSError) as e:
        print("filter_memory.py: %s" % e, file=sys.stderr)
        return 2
    finally:
        hostile.stop_processes(procs)


if __name__ == "__main__":
    sys.exit(main())
