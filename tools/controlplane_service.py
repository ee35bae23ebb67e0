#!/usr/bin/env python3
"""A stand-in for a Kubernetes Service in front of several local replicas (tools/controlplane.sh
up --replicas N): the webhook's one URL must reach whichever Tessera is alive, as deploy/base's
Service tessera-webhook does through kube-proxy.

  controlplane_service.py --tag TAG LISTEN BACKEND...

LISTEN and each BACKEND are HOST:PORT. Every accepted TCP connection goes to the next backend in
turn (round robin); a backend that refuses the connection (its process is dead) is skipped for
the next one, as kube-proxy routes only to ready endpoints. Bytes are relayed unchanged in both
directions (TLS passes through; every replica serves the same certificate). TAG only names the
process (tools/controlplane.sh finds its own processes by their command line). Runs until
SIGTERM or SIGINT; logs one line per connection that no backend accepted.
"""
import argparse
import asyncio
import signal
import sys


def hostport(text):
    host, _, port = text.rpartition(":")
    return host, int(port)


async def relay(reader, writer):
    try:
        while True:
            data = await reader.read(65536)
            if not data:
                break
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


class Service:
    def __init__(self, backends):
        self.backends = backends
        self.next = 0

    async def handle(self, client_r, client_w):
        start = self.next
        self.next = (self.next + 1) % len(self.backends)
        for i in range(len(self.backends)):
            host, port = self.backends[(start + i) % len(self.backends)]
            try:
                back_r, back_w = await asyncio.wait_for(asyncio.open_connection(host, port), 2)
            except (OSError, asyncio.TimeoutError):
                continue
            await asyncio.gather(relay(client_r, back_w), relay(back_r, client_w))
            return
        print(f"controlplane_service: no backend of {self.backends} accepted a connection", flush=True)
        client_w.close()


async def main(args):
    svc = Service([hostport(b) for b in args.backends])
    host, port = hostport(args.listen)
    server = await asyncio.start_server(svc.handle, host, port)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for s in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(s, stop.set)
    print(f"controlplane_service: {args.listen} -> {' '.join(args.backends)}", flush=True)
    async with server:
        await stop.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tag", required=True)
    p.add_argument("listen")
    p.add_argument("backends", nargs="+")
    sys.exit(asyncio.run(main(p.parse_args())))
